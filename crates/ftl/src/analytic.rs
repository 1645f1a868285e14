//! Closed forms the simulator is validated against.
//!
//! For uniformly random overwrites and a FIFO (circular log) cleaner, the steady-state write
//! amplification depends only on α = physical pages ÷ logical pages:
//! `WAF = α / (α + W₀(−α·e^(−α)))` (Desnoyers, "Analytic models of SSD write performance";
//! Hu et al. 2009 for the greedy comparison), where W₀ is the principal branch of the Lambert W
//! function. We implement W₀ ourselves with Halley's iteration.

/// Principal branch W₀(x) for x ≥ −1/e: the w ≥ −1 with w·e^w = x.
pub fn lambert_w0(x: f64) -> f64 {
    let branch_point = -1.0 / std::f64::consts::E;
    assert!(x >= branch_point - 1e-12, "W0 is undefined below -1/e (got {x})");
    if x <= branch_point {
        return -1.0;
    }
    if x == 0.0 {
        return 0.0;
    }
    // Start from the series around the branch point for x < 0, else from log1p.
    let mut w = if x < 0.0 {
        let p = (2.0 * (std::f64::consts::E * x + 1.0)).sqrt();
        -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p * p * p
    } else {
        (1.0 + x).ln()
    };
    for _ in 0..64 {
        let ew = w.exp();
        let f = w * ew - x;
        let denominator = ew * (w + 1.0) - (w + 2.0) * f / (2.0 * w + 2.0);
        if denominator == 0.0 || !denominator.is_finite() {
            break;
        }
        let next = w - f / denominator;
        if (next - w).abs() <= 1e-15 * (1.0 + next.abs()) {
            return next;
        }
        w = next;
    }
    w
}

/// Steady-state WAF of uniform random writes with FIFO cleaning, α = physical ÷ logical.
pub fn fifo_uniform_waf(alpha: f64) -> f64 {
    assert!(alpha > 1.0, "alpha = physical/logical must exceed 1 (got {alpha})");
    alpha / (alpha + lambert_w0(-alpha * (-alpha).exp()))
}

/// Steady-state WAF of random writes in traffic classes (hot/cold) mixed in one FIFO log:
/// Desnoyers' LRW model for non-uniform traffic ("Analytic modeling of SSD write performance",
/// SYSTOR 2012; reported exact against simulation). Class `i` holds `space_i` of the logical
/// pages and receives `writes_i` of the host writes. A page stays in the log for α·L NAND
/// writes, i.e. α·L/A host writes, and survives them with probability
/// `s_i = exp(−(writes_i/space_i)·α/A)`; copies of class `i` per host write are then
/// `writes_i·s_i/(1−s_i)`, so A solves `A = Σ writes_i / (1 − s_i(A))`. For one class this is
/// the uniform closed form. Solved by bisection (the right side minus A falls monotonically).
pub fn fifo_classes_waf(alpha: f64, classes: &[(f64, f64)]) -> f64 {
    assert!(alpha > 1.0, "alpha = physical/logical must exceed 1 (got {alpha})");
    let excess = |waf: f64| -> f64 {
        classes
            .iter()
            .map(|&(space, writes)| writes / (1.0 - (-(writes / space) * alpha / waf).exp()))
            .sum::<f64>()
            - waf
    };
    let (mut low, mut high) = (1.0, 2.0);
    while excess(high) > 0.0 {
        high *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (low + high);
        if excess(mid) > 0.0 {
            low = mid;
        } else {
            high = mid;
        }
    }
    0.5 * (low + high)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_class_is_the_uniform_closed_form() {
        for alpha in [1.0753, 1.1628, 1.3889] {
            let classes = fifo_classes_waf(alpha, &[(1.0, 1.0)]);
            assert!((classes - fifo_uniform_waf(alpha)).abs() < 1e-9, "α {alpha}");
            // Splitting uniform traffic into classes changes nothing.
            let split = fifo_classes_waf(alpha, &[(0.2, 0.2), (0.8, 0.8)]);
            assert!((split - classes).abs() < 1e-9, "α {alpha}");
        }
        // Skew in one log costs copies: 80/20 lies above uniform.
        assert!(fifo_classes_waf(1.1628, &[(0.2, 0.8), (0.8, 0.2)]) > fifo_uniform_waf(1.1628));
    }

    #[test]
    fn w0_solves_its_equation() {
        for &x in &[-0.3678, -0.35, -0.2, -0.01, 0.0, 0.5, 1.0, 10.0] {
            let w = lambert_w0(x);
            assert!((w * w.exp() - x).abs() < 1e-12, "x={x} w={w}");
            assert!(w >= -1.0);
        }
        assert!((lambert_w0(1.0) - 0.567_143_290_409_783_8).abs() < 1e-14);
        assert_eq!(lambert_w0(-1.0 / std::f64::consts::E), -1.0);
    }

    #[test]
    fn fifo_waf_falls_with_overprovisioning() {
        let w7 = fifo_uniform_waf(1.0 / (1.0 - 0.07));
        let w28 = fifo_uniform_waf(1.0 / (1.0 - 0.28));
        assert!(w7 > w28 && w28 > 1.0);
        // Known values of the model: ≈7.7 at 7 % spare, ≈2.1 at 28 %.
        assert!((7.0..8.5).contains(&w7), "{w7}");
        assert!((1.9..2.4).contains(&w28), "{w28}");
    }
}
