//! The arithmetic the benchmarks share.

/// The median of `values` (the mean of the two middle ones for an even count).
///
/// # Panics
/// On an empty slice: every benchmark measures at least one repeat.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = values.into_iter().collect();
    assert!(!sorted.is_empty(), "median of no measurements");
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

/// `bytes` moved in `seconds`, in GB/s (1 GB = 1e9 bytes).
pub fn gigabytes_per_second(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Busy CPU time of the whole machine (every core; user, system, interrupts and steal, not
/// idle or I/O wait) from `/proc/stat`, in seconds. Differences over a timed region give the
/// CPU a subject cost there, kernel threads (writeback, softirqs) included, on a quiet machine.
pub fn machine_busy_cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow::anyhow!("/proc/stat has no aggregate cpu line"))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).map(|t| t.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let busy: u64 =
        ticks.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, t)| t).sum();
    Ok(busy as f64 / spillway_sys::time::clock_ticks_per_second() as f64)
}

/// The machine's busy CPU since [`BusyCpu::start`]: what a timed region cost, per GB it moved.
pub struct BusyCpu {
    at_start: f64,
}

impl BusyCpu {
    pub fn start() -> anyhow::Result<BusyCpu> {
        Ok(BusyCpu { at_start: machine_busy_cpu_seconds()? })
    }

    /// Busy CPU seconds since the start per GB (1e9 bytes) of `bytes`.
    pub fn seconds_per_gb(&self, bytes: u64) -> anyhow::Result<f64> {
        Ok((machine_busy_cpu_seconds()? - self.at_start) / (bytes as f64 / 1e9))
    }
}

/// The smallest and largest of `values`.
pub fn spread(values: &[f64]) -> (f64, f64) {
    values.iter().fold((f64::MAX, f64::MIN), |(low, high), &v| (low.min(v), high.max(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median([7.0]), 7.0);
        assert_eq!(spread(&[2.0, -1.0, 5.0]), (-1.0, 5.0));
        assert_eq!(gigabytes_per_second(3_000_000_000, 2.0), 1.5);
    }

    #[test]
    #[should_panic(expected = "median of no measurements")]
    fn the_median_of_nothing_is_a_bug() {
        median(Vec::new());
    }
}
