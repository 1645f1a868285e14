//! Human-facing output of the planning tools: terminal tables, the self-contained HTML
//! characterization report (inline SVG, no scripts, no external files) and the sweep chart.
//!
//! Kept apart from the computations so that JSON, tables and HTML all render the same
//! [`Characterization`] and [`SweepPoint`] values; nothing here computes a metric.

use std::fmt::Write as _;

use spillway_plot::{bar_chart_svg, escape, line_chart_svg, Bar, Series};
use spillway_types::format_bytes;

use crate::characterize::{Bound, Characterization, FileGroup, Namespace};
use crate::model::SweepPoint;
use crate::policy::PolicyKind;
use spillway_trace::JobMeta;

const MIB: f64 = 1024.0 * 1024.0;

/// Short power-of-two size labels for crowded chart axes: 512, 4K, 1M, 2G.
fn size_label(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024 && value & 1023 == 0 && unit + 1 < UNITS.len() {
        value /= 1024;
        unit += 1;
    }
    format!("{value}{}", UNITS[unit])
}

fn optional(value: Option<u64>) -> String {
    value.map_or_else(|| "never".to_string(), |value| value.to_string())
}

/// What one "pipeline" is: the trace's whole job when it has several ranks.
fn pipelines_label(result: &Characterization) -> String {
    match result.ranks {
        0 | 1 => "Pipelines".to_string(),
        ranks => format!("Jobs of {ranks} ranks"),
    }
}

/// The characterization as an aligned terminal table (the rows of the paper's Table 2 and 3).
pub fn characterization_table(result: &Characterization) -> String {
    let rows = metric_rows(result);
    let width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (label, value) in rows {
        let _ = writeln!(out, "{label:<width$}  {value}");
    }
    write_recommendation_summary(&mut out, result);
    out
}

/// The (label, value) rows of the table: the inputs, then the derived metrics.
fn metric_rows(result: &Characterization) -> Vec<(String, String)> {
    let metrics = &result.metrics;
    let profile = &result.profile;
    let peaks = &result.peaks;
    vec![
        ("Trace".into(), format!("{} ({})", result.job.executable, result.job.source)),
        (
            "Synthesized (not recorded)".into(),
            if result.job.synthesized { "yes".into() } else { "no".into() },
        ),
        (
            "Partial (input incomplete)".into(),
            result.job.partial_warning().map_or("no".into(), |missing| format!("YES: {missing}")),
        ),
        ("Wall time (s)".into(), format!("{:.2}", profile.wall_seconds)),
        ("I/O time (%)".into(), format!("{:.1}", metrics.io_time_percent)),
        ("I/O time in data operations (s)".into(), format!("{:.3}", profile.data_time_seconds)),
        (
            "I/O time in metadata operations (s)".into(),
            format!("{:.3}", profile.metadata_time_seconds),
        ),
        ("I/O (MiB)".into(), format!("{:.1}", metrics.io_bytes as f64 / MIB)),
        ("Read/write operations".into(), metrics.data_ops.to_string()),
        (
            "Mean read/write transaction size (KiB)".into(),
            format!("{:.0}", metrics.mean_transfer_bytes / 1024.0),
        ),
        ("Metadata operations".into(), profile.metadata_ops.to_string()),
        ("Bandwidth (MiB/s)".into(), format!("{:.0}", metrics.bandwidth_bytes_per_second / MIB)),
        (
            format!("% of peak bandwidth ({:.0} MiB/s)", peaks.bandwidth_bytes_per_second / MIB),
            format!("{:.1}", metrics.percent_peak_bandwidth),
        ),
        ("Read/write rate (operations/s)".into(), format!("{:.0}", metrics.data_ops_per_second)),
        (
            format!("% of peak IOPS ({:.0})", peaks.iops),
            format!("{:.1}", metrics.percent_peak_iops),
        ),
        ("Metadata rate (operations/s)".into(), format!("{:.0}", metrics.metadata_ops_per_second)),
        (
            format!("% of peak metadata rate ({:.0})", peaks.metadata_ops_per_second),
            format!("{:.1}", metrics.percent_peak_metadata),
        ),
        (
            format!("{} to saturate data performance", pipelines_label(result)),
            optional(metrics.pipelines_to_saturate_data),
        ),
        (
            format!("{} to saturate metadata performance", pipelines_label(result)),
            optional(metrics.pipelines_to_saturate_metadata),
        ),
        (
            "I/O at one fragment's peaks (s): bandwidth, IOPS, metadata".into(),
            format!(
                "{:.4}, {:.4}, {:.4}",
                metrics.seconds_at_peaks.bandwidth,
                metrics.seconds_at_peaks.iops,
                metrics.seconds_at_peaks.metadata
            ),
        ),
        ("Bound (the largest of the three above)".into(), metrics.bound.name().into()),
        ("Total file size (MiB)".into(), format!("{:.1}", profile.file_bytes as f64 / MIB)),
        ("Data reuse".into(), metrics.data_reuse.map_or("-".into(), |value| format!("{value:.1}"))),
        (
            "Read:write I/O".into(),
            metrics.read_write_ratio.map_or("no writes".into(), |value| format!("{value:.1}")),
        ),
    ]
}

/// Appends the recommendation after the table: the allocation to ask for, then the advice.
fn write_recommendation_summary(out: &mut String, result: &Characterization) {
    let recommendation = &result.recommendation;
    let _ = writeln!(
        out,
        "\nRecommendation for {} pipeline(s): {} fragment(s) of {}, {} namespace",
        recommendation.pipelines,
        recommendation.fragments,
        format_bytes(recommendation.fragment_bytes),
        match recommendation.namespace {
            Namespace::Striped => "striped",
            Namespace::Private => "private",
        }
    );
    for line in &recommendation.advice {
        let _ = writeln!(out, "  - {line}");
    }
}

fn gauge(label: &str, percent: f64, detail: &str, highlight: bool) -> String {
    let shown = percent.clamp(0.0, 100.0);
    let colour = if highlight { "#D55E00" } else { "#0072B2" };
    format!(
        r#"<div class="gauge"><div class="gauge-label">{label}<span>{detail}</span></div><div class="track" role="img" aria-label="{label}: {percent:.1}% of peak"><div class="fill" style="width:{shown:.2}%;background:{colour}"></div><span class="value">{percent:.1}% of peak</span></div></div>"#
    )
}

fn group_row(title: &str, group: &FileGroup, why: &str) -> String {
    let examples: Vec<String> = group
        .examples
        .iter()
        .take(4)
        .map(|name| format!("<code>{}</code>", escape(name)))
        .collect();
    format!(
        "<tr><th>{title}</th><td>{}</td><td>{}</td><td>{why}</td><td>{}</td></tr>",
        group.files,
        format_bytes(group.bytes),
        examples.join("<br>")
    )
}

/// "job 42 · uid 1000 · 4 process(es) · " for what the header knows (profiles know nothing).
fn job_line(job: &JobMeta) -> String {
    let mut parts = Vec::new();
    if job.job_id != 0 {
        parts.push(format!("job {}", job.job_id));
    }
    if job.uid != 0 {
        parts.push(format!("uid {}", job.uid));
    }
    if job.nprocs != 0 {
        parts.push(format!("{} process(es)", job.nprocs));
    }
    parts.iter().map(|part| format!("{part} · ")).collect()
}

/// The characterization as one self-contained HTML page.
pub fn characterization_html(result: &Characterization) -> String {
    let mut html = String::new();
    write_page_head(&mut html, result);
    write_synthesized_warning(&mut html, &result.job);
    write_verdict_cards(&mut html, result);
    write_peak_gauges(&mut html, result);
    write_time_and_bytes_charts(&mut html, result);
    write_recommendation_section(&mut html, result);
    write_all_metrics_table(&mut html, result);
    write_largest_files_table(&mut html, result);
    write_method_footer(&mut html, result);
    html
}

/// Page head: title, style sheet, heading and the line on where the trace comes from.
fn write_page_head(html: &mut String, result: &Characterization) {
    let title = if result.job.executable.is_empty() {
        "workflow pipeline".to_string()
    } else {
        result.job.executable.clone()
    };
    let _ = write!(
        html,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Spillway characterization: {}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #1d2330; background: #fafbfc; }}
h1 {{ font-size: 1.5rem; margin-bottom: .2rem; }} .sub {{ color: #5a6372; margin-top: 0; }}
.verdict {{ display: flex; gap: 1rem; flex-wrap: wrap; margin: 1.2rem 0; }}
.card {{ background: #fff; border: 1px solid #dde2ea; border-radius: 10px; padding: 1rem 1.2rem; flex: 1 1 200px; }}
.card .big {{ font-size: 2rem; font-weight: 700; }} .card .what {{ color: #5a6372; font-size: .9rem; }}
.bound {{ color: #D55E00; }} .warn {{ background: #fff4e0; border: 1px solid #f0c36d; padding: .6rem 1rem; border-radius: 8px; }}
.gauge {{ margin: .6rem 0; }} .gauge-label {{ font-weight: 600; display: flex; justify-content: space-between; }}
.gauge-label span {{ font-weight: 400; color: #5a6372; font-size: .9rem; }}
.track {{ position: relative; height: 24px; background: #eceff3; border-radius: 6px; overflow: hidden; margin-top: .25rem; }}
.fill {{ height: 100%; border-radius: 6px; }} .value {{ position: absolute; left: .6rem; top: 3px; font-size: .85rem; color: #1d2330; }}
.charts {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 1rem; }}
.charts svg {{ width: 100%; height: auto; background: #fff; border: 1px solid #dde2ea; border-radius: 10px; }}
table {{ border-collapse: collapse; background: #fff; width: 100%; margin: .5rem 0 1.5rem; }}
th, td {{ border-bottom: 1px solid #e6e9ef; padding: .35rem .6rem; text-align: left; vertical-align: top; font-size: .92rem; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }} code {{ font-size: .82rem; }}
ul.advice li {{ margin: .35rem 0; }}
</style></head><body>
<h1>{}</h1><p class="sub">{}source <code>{}</code> · {} operations</p>"#,
        escape(&title),
        escape(&title),
        job_line(&result.job),
        escape(&result.job.source),
        result.op_counts.values().sum::<u64>()
    );
}

/// Warning that the operations were synthesized, saying from what, when they were, and that
/// the producer's input was incomplete, saying what is missing, when it was.
fn write_synthesized_warning(html: &mut String, job: &JobMeta) {
    if let Some(missing) = job.partial_warning() {
        let _ = write!(
            html,
            r#"<p class="warn"><b>Partial trace.</b> The producer's input was incomplete: {}. Figures below are built on what the trace has.</p>"#,
            escape(missing)
        );
    }
    if job.synthesized {
        if job.source.starts_with("darshan") {
            html.push_str(
                r#"<p class="warn"><b>Synthesized trace.</b> The operations were reconstructed from aggregate Darshan counters, not recorded one by one: counts, bytes and times are right in total; their order and individual sizes are estimates.</p>"#,
            );
        } else {
            html.push_str(
                r#"<p class="warn"><b>Synthesized trace.</b> The operations were generated by a workload model, not recorded from a real run.</p>"#,
            );
        }
    }
}

/// The verdict cards: the bound, pipelines to saturate, and the allocation to ask for.
fn write_verdict_cards(html: &mut String, result: &Characterization) {
    let metrics = &result.metrics;
    let recommendation = &result.recommendation;
    let bound_text = match metrics.bound {
        Bound::None => "no I/O".to_string(),
        bound => format!("{}-bound", bound.name()),
    };
    let _ = write!(
        html,
        r#"<div class="verdict">
<div class="card"><div class="what">One pipeline is</div><div class="big bound">{}</div><div class="what">{:.1}% of wall time in I/O</div></div>
<div class="card"><div class="what">{} to saturate data / metadata</div><div class="big">{} / {}</div><div class="what">per allocation unit with these peaks</div></div>
<div class="card"><div class="what">Ask for ({} pipeline(s))</div><div class="big">{} × {}</div><div class="what">{} namespace</div></div>
</div>"#,
        bound_text,
        metrics.io_time_percent,
        escape(&pipelines_label(result)),
        optional(metrics.pipelines_to_saturate_data),
        optional(metrics.pipelines_to_saturate_metadata),
        recommendation.pipelines,
        recommendation.fragments,
        format_bytes(recommendation.fragment_bytes),
        match recommendation.namespace {
            Namespace::Striped => "striped",
            Namespace::Private => "private (one per node)",
        }
    );
}

/// Section "Share of each peak used by one pipeline": one gauge per peak, the bound highlighted.
fn write_peak_gauges(html: &mut String, result: &Characterization) {
    let metrics = &result.metrics;
    let peaks = &result.peaks;
    html.push_str("<h2>Share of each peak used by one pipeline</h2>");
    html.push_str(&gauge(
        "Bandwidth",
        metrics.percent_peak_bandwidth,
        &format!(
            "{:.0} of {:.0} MiB/s",
            metrics.bandwidth_bytes_per_second / MIB,
            peaks.bandwidth_bytes_per_second / MIB
        ),
        metrics.bound == Bound::Bandwidth,
    ));
    html.push_str(&gauge(
        "IOPS",
        metrics.percent_peak_iops,
        &format!("{:.0} of {:.0} operations/s", metrics.data_ops_per_second, peaks.iops),
        metrics.bound == Bound::Iops,
    ));
    html.push_str(&gauge(
        "Metadata",
        metrics.percent_peak_metadata,
        &format!(
            "{:.0} of {:.0} operations/s",
            metrics.metadata_ops_per_second, peaks.metadata_ops_per_second
        ),
        metrics.bound == Bound::Metadata,
    ));
}

/// Section "Where the time and bytes go": the time split, then charts of bytes and operations.
fn write_time_and_bytes_charts(html: &mut String, result: &Characterization) {
    let metrics = &result.metrics;
    let profile = &result.profile;
    html.push_str(r#"<h2>Where the time and bytes go</h2><div class="charts">"#);
    let compute = (profile.wall_seconds - metrics.io_time_seconds).max(0.0);
    html.push_str(&bar_chart_svg(
        "Time of one pipeline",
        "seconds",
        &[
            Bar { label: "data I/O".into(), value: profile.data_time_seconds },
            Bar { label: "metadata I/O".into(), value: profile.metadata_time_seconds },
            Bar { label: "not in I/O".into(), value: compute },
        ],
    ));
    let read: Vec<(f64, f64)> =
        result.cumulative_bytes.iter().map(|&(t, r, _)| (t, r as f64 / MIB)).collect();
    let written: Vec<(f64, f64)> =
        result.cumulative_bytes.iter().map(|&(t, _, w)| (t, w as f64 / MIB)).collect();
    if result.cumulative_bytes.len() > 1 {
        html.push_str(&line_chart_svg(
            "Cumulative I/O over the run",
            "seconds since start",
            "MiB",
            &[
                Series { name: "read".into(), points: read },
                Series { name: "written".into(), points: written },
            ],
        ));
    }
    let sizes: Vec<Bar> = result
        .transfer_size_histogram
        .iter()
        .map(|&(size, count)| Bar { label: size_label(size), value: count as f64 })
        .collect();
    if !sizes.is_empty() {
        html.push_str(&bar_chart_svg(
            "Read/write transfer sizes (power-of-two classes)",
            "operations",
            &sizes,
        ));
    }
    let ops: Vec<Bar> = result
        .op_counts
        .iter()
        .map(|(name, &count)| Bar { label: name.clone(), value: count as f64 })
        .collect();
    html.push_str(&bar_chart_svg("Operations by kind", "operations", &ops));
    html.push_str("</div>");
}

/// Section "Recommendation": the advice, then the staging groups as a table.
fn write_recommendation_section(html: &mut String, result: &Characterization) {
    let recommendation = &result.recommendation;
    html.push_str(r#"<h2>Recommendation</h2><ul class="advice">"#);
    for line in &recommendation.advice {
        let _ = write!(html, "<li>{}</li>", escape(line));
    }
    html.push_str("</ul><table><tr><th>Data</th><th>Files</th><th>Size</th><th>Why</th><th>Examples</th></tr>");
    html.push_str(&group_row(
        "Keep persistent",
        &recommendation.keep_persistent,
        "software environment and inputs reused across pipelines or ranks",
    ));
    html.push_str(&group_row(
        "Stage in",
        &recommendation.stage_in,
        "read before written: must be ready when the pipeline starts",
    ));
    html.push_str(&group_row("Stage out", &recommendation.stage_out, "written and kept"));
    html.push_str(&group_row(
        "Discard",
        &recommendation.discard,
        "written and removed by the pipeline",
    ));
    html.push_str("</table>");
}

/// Section "All metrics": the rows of the terminal table, as an HTML table.
fn write_all_metrics_table(html: &mut String, result: &Characterization) {
    html.push_str("<h2>All metrics</h2><table>");
    for line in characterization_table(result).lines().take_while(|line| !line.is_empty()) {
        let (label, value) = line.split_at(line.rfind("  ").map_or(line.len(), |at| at));
        let _ = write!(
            html,
            "<tr><th>{}</th><td class=\"num\">{}</td></tr>",
            escape(label.trim()),
            escape(value.trim())
        );
    }
    html.push_str("</table>");
}

/// Section "Largest files": the 25 files with the most I/O, with their roles.
fn write_largest_files_table(html: &mut String, result: &Characterization) {
    html.push_str("<h2>Largest files</h2><table><tr><th>File</th><th>Role</th><th>Read</th><th>Written</th><th>Size</th><th>Ranks</th><th>Metadata ops</th></tr>");
    for file in result.files.iter().take(25) {
        let _ = write!(
            html,
            "<tr><td><code>{}</code></td><td>{:?}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(&file.name),
            file.role,
            format_bytes(file.bytes_read),
            format_bytes(file.bytes_written),
            format_bytes(file.size_bytes),
            file.ranks,
            file.metadata_ops
        );
    }
    html.push_str("</table>");
}

/// Page foot: the method and the peaks compared against, then the end of the page.
fn write_method_footer(html: &mut String, result: &Characterization) {
    let peaks = &result.peaks;
    let _ = writeln!(
        html,
        "<p class=\"sub\">Method: Daley et al., DataWarp workflow characterization (see docs/design/characterize.md). Peaks: {:.0} MiB/s, {:.0} IOPS, {:.0} metadata ops/s.</p></body></html>",
        peaks.bandwidth_bytes_per_second / MIB,
        peaks.iops,
        peaks.metadata_ops_per_second
    );
}

/// The sweep as a terminal table: one row per (policy, fraction).
pub fn sweep_table(points: &[SweepPoint]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:>11} {:>12} {:>10} {:>14} {:>9} {:>12} {:>12}",
        "policy",
        "bb_fraction",
        "capacity",
        "io_time_s",
        "throughput",
        "relative",
        "hit_ratio",
        "to_pfs"
    );
    for point in points {
        let report = &point.report;
        let _ = writeln!(
            out,
            "{:<6} {:>11.2} {:>12} {:>10.4} {:>12}/s {:>9.3} {:>12.4} {:>12}",
            point.policy.name(),
            point.bb_fraction,
            format_bytes(point.capacity_bytes),
            report.io_time_seconds,
            format_bytes(report.throughput_bytes_per_second as u64),
            point.relative_throughput,
            report.hit_ratio,
            format_bytes(report.bytes_bb_to_pfs)
        );
    }
    out
}

/// Relative throughput against buffer size, one line per policy.
pub fn sweep_svg(points: &[SweepPoint], title: &str) -> String {
    let series: Vec<Series> = PolicyKind::ALL
        .iter()
        .filter(|policy| points.iter().any(|point| point.policy == **policy))
        .map(|&policy| Series {
            name: policy.name().to_uppercase(),
            points: points
                .iter()
                .filter(|point| point.policy == policy)
                .map(|point| (point.bb_fraction, point.relative_throughput))
                .collect(),
        })
        .collect();
    line_chart_svg(
        title,
        "burst buffer size / access space",
        "throughput relative to ideal",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::characterize::{characterize, AllocationTarget, Peaks};
    use crate::synth::{workflow, WorkflowShape};

    #[test]
    fn size_labels_are_short() {
        assert_eq!(size_label(0), "0");
        assert_eq!(size_label(512), "512");
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(8 << 20), "8M");
    }

    #[test]
    fn html_report_is_self_contained_and_names_the_bound() {
        let shape = WorkflowShape {
            pipelines: 1,
            inputs_per_pipeline: 2,
            software_files: 3,
            input_bytes: 1 << 20,
            ..WorkflowShape::default()
        };
        let trace = workflow(&shape).unwrap();
        let result =
            characterize(&trace, &Peaks::datawarp_cori(), AllocationTarget::default()).unwrap();
        let html = characterization_html(&result);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<svg"));
        assert!(html.contains("Synthesized trace"));
        assert!(html.contains(&format!("{}-bound", result.metrics.bound.name())));
        assert!(!html.contains("<script"), "no scripts");
        assert!(!html.contains(" src=") && !html.contains("<link"), "no external resources");
        let table = characterization_table(&result);
        assert!(table.contains("Pipelines to saturate metadata performance"));
    }
}
