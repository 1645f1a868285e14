//! Wall-clock conversions that need the C library's time zone rules.

/// A local calendar time (in this machine's time zone, daylight saving decided by the C
/// library) as Unix seconds; `None` when it does not exist.
pub fn local_time_unix_s(
    year: i32,
    month: i32,
    day: i32,
    hour: i32,
    minute: i32,
    second: i32,
) -> Option<i64> {
    // SAFETY: an all-zero `tm` is a valid value of this plain C struct.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    tm.tm_sec = second;
    tm.tm_isdst = -1;
    // SAFETY: `tm` is a valid, initialised struct tm; mktime only reads and normalises it.
    let seconds = unsafe { libc::mktime(&mut tm) };
    (seconds != -1).then_some(seconds as i64)
}

/// The kernel's clock ticks per second (`USER_HZ`): the unit of `/proc/stat` and
/// `/proc/<pid>/stat` CPU times.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a constant of the C library.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // POSIX allows -1 for "unknown"; Linux has been 100 everywhere that matters.
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_times_are_an_hour_apart_and_follow_the_clock() {
        let a = local_time_unix_s(2026, 1, 15, 10, 0, 0).unwrap();
        let b = local_time_unix_s(2026, 1, 15, 11, 0, 0).unwrap();
        assert_eq!(b - a, 3600);
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
                as i64;
        assert!(a < now, "2026-01-15 is in the past of the machine's clock");
    }
}
