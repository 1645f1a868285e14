//! Dependency-free SVG charts for reports (FTL write amplification over time, simulator sweeps,
//! characterization pages).
//!
//! Output is plain SVG text so that a report is one self-contained file (or inline in HTML) and
//! tests can inspect it. Scales are linear; axes get "nice" round ticks.

/// One named line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One named bar of a bar chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: f64,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 420.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 170.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 55.0;
/// Colour-blind-safe palette (Okabe–Ito), cycled.
const COLOURS: [&str; 8] =
    ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"];

/// A line chart of `series` against shared linear axes.
pub fn line_chart_svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let finite = |v: &f64| v.is_finite();
    let xs: Vec<f64> =
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(finite).collect();
    let ys: Vec<f64> =
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).filter(finite).collect();
    let x_axis = Axis::fit(&xs, false);
    let y_axis = Axis::fit(&ys, true);
    let mut svg = open_svg(title, x_label, y_label, &x_axis, &y_axis);
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let path: Vec<String> = line
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", x_axis.to_px_x(x), y_axis.to_px_y(y)))
            .collect();
        if path.len() == 1 {
            let (x, y) = path[0].split_once(',').expect("formatted above");
            svg.push_str(&format!(r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#));
        } else if !path.is_empty() {
            svg.push_str(&format!(
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            ));
        }
        legend_entry(&mut svg, index, &line.name, colour);
    }
    svg.push_str("</svg>\n");
    svg
}

/// A vertical bar chart with one bar per entry.
pub fn bar_chart_svg(title: &str, y_label: &str, bars: &[Bar]) -> String {
    let values: Vec<f64> = bars.iter().map(|b| b.value).filter(|v| v.is_finite()).collect();
    let y_axis = Axis::fit(&values, true);
    let x_axis = Axis { min: 0.0, max: bars.len().max(1) as f64, ticks: Vec::new() };
    let mut svg = open_svg(title, "", y_label, &x_axis, &y_axis);
    let slot = (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) / bars.len().max(1) as f64;
    for (index, bar) in bars.iter().enumerate() {
        let value = if bar.value.is_finite() { bar.value } else { 0.0 };
        let top = y_axis.to_px_y(value);
        let bottom = y_axis.to_px_y(y_axis.min);
        let left = MARGIN_LEFT + slot * index as f64 + slot * 0.15;
        svg.push_str(&format!(
            r#"<rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
            slot * 0.7,
            (bottom - top).max(0.0),
            COLOURS[index % COLOURS.len()],
            escape(&bar.label),
            format_tick(value)
        ));
        svg.push_str(&format!(
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"#,
            left + slot * 0.35,
            HEIGHT - MARGIN_BOTTOM + 16.0,
            escape(&bar.label)
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

/// Escapes text for SVG/HTML element content and attributes.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

struct Axis {
    min: f64,
    max: f64,
    ticks: Vec<f64>,
}

impl Axis {
    /// Fits an axis with round ticks around `values`; `from_zero` anchors it at zero when all
    /// values are positive (bars and ratios read wrongly otherwise).
    fn fit(values: &[f64], from_zero: bool) -> Axis {
        let (mut low, mut high) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if !low.is_finite() {
            (low, high) = (0.0, 1.0);
        }
        if from_zero && low > 0.0 {
            low = 0.0;
        }
        // `high >= low` here, so the difference needs no `abs`.
        #[allow(clippy::float_equality_without_abs)]
        if high - low < f64::EPSILON {
            high = low + if low == 0.0 { 1.0 } else { low.abs() * 0.1 };
        }
        let step = nice_step((high - low) / 5.0);
        let min = (low / step).floor() * step;
        let max = (high / step).ceil() * step;
        let ticks =
            (0..=((max - min) / step).round() as usize).map(|i| min + step * i as f64).collect();
        Axis { min, max, ticks }
    }

    fn to_px_x(&self, x: f64) -> f64 {
        MARGIN_LEFT + (x - self.min) / (self.max - self.min) * (WIDTH - MARGIN_LEFT - MARGIN_RIGHT)
    }

    fn to_px_y(&self, y: f64) -> f64 {
        HEIGHT
            - MARGIN_BOTTOM
            - (y - self.min) / (self.max - self.min) * (HEIGHT - MARGIN_TOP - MARGIN_BOTTOM)
    }
}

fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn format_tick(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude != 0.0 && !(1e-3..1e6).contains(&magnitude) {
        format!("{value:.2e}")
    } else if value.fract().abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn open_svg(title: &str, x_label: &str, y_label: &str, x_axis: &Axis, y_axis: &Axis) -> String {
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">"#
    );
    svg.push_str(&format!(r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#));
    svg.push_str(&format!(
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        (WIDTH - MARGIN_RIGHT + MARGIN_LEFT) / 2.0,
        escape(title)
    ));
    let (left, right) = (MARGIN_LEFT, WIDTH - MARGIN_RIGHT);
    let (top, bottom) = (MARGIN_TOP, HEIGHT - MARGIN_BOTTOM);
    for &tick in &y_axis.ticks {
        let y = y_axis.to_px_y(tick);
        svg.push_str(&format!(
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
            left - 6.0,
            y + 4.0,
            format_tick(tick)
        ));
    }
    for &tick in &x_axis.ticks {
        let x = x_axis.to_px_x(tick);
        svg.push_str(&format!(
            r##"<line x1="{x:.1}" y1="{bottom}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"##,
            bottom + 5.0,
            bottom + 18.0,
            format_tick(tick)
        ));
    }
    svg.push_str(&format!(
        r##"<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>"##
    ));
    svg.push_str(&format!(
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{}</text>"#,
        (left + right) / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    ));
    svg.push_str(&format!(
        r#"<text x="18" y="{:.1}" text-anchor="middle" font-size="13" transform="rotate(-90 18 {:.1})">{}</text>"#,
        (top + bottom) / 2.0,
        (top + bottom) / 2.0,
        escape(y_label)
    ));
    svg
}

fn legend_entry(svg: &mut String, index: usize, name: &str, colour: &str) {
    let x = WIDTH - MARGIN_RIGHT + 15.0;
    let y = MARGIN_TOP + 10.0 + 20.0 * index as f64;
    svg.push_str(&format!(
        r#"<line x1="{x}" y1="{y}" x2="{:.1}" y2="{y}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
        x + 20.0,
        x + 26.0,
        y + 4.0,
        escape(name)
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_chart_has_one_polyline_per_series_and_a_legend() {
        let series = vec![
            Series { name: "legacy".into(), points: vec![(0.0, 1.0), (1.0, 1.5), (2.0, 1.9)] },
            Series { name: "user <id>".into(), points: vec![(0.0, 1.0), (2.0, 1.1)] },
        ];
        let svg = line_chart_svg("WAF", "time", "WAF", &series);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("user &lt;id&gt;"));
    }

    #[test]
    fn axis_ticks_are_round_and_cover_the_data() {
        let axis = Axis::fit(&[0.13, 9.7], true);
        assert_eq!(axis.min, 0.0);
        assert!(axis.max >= 9.7);
        assert!(axis.ticks.iter().all(|t| (t / 2.0).fract().abs() < 1e-9));
    }

    #[test]
    fn degenerate_inputs_do_not_break_the_chart() {
        let svg = line_chart_svg("empty", "x", "y", &[]);
        assert!(svg.contains("</svg>"));
        let flat = line_chart_svg(
            "flat",
            "x",
            "y",
            &[Series { name: "a".into(), points: vec![(1.0, 2.0)] }],
        );
        assert!(flat.contains("<circle"));
        let bars = bar_chart_svg(
            "bars",
            "ops/s",
            &[Bar { label: "a".into(), value: 3.0 }, Bar { label: "b".into(), value: f64::NAN }],
        );
        assert_eq!(bars.matches("<rect").count(), 3, "background plus two bars");
    }
}
