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
