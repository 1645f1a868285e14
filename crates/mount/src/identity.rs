//! Who is calling: the FUSE request's uid/gid/pid plus the supplementary groups of that process.
//!
//! The kernel passes only the filesystem uid, gid and pid with each request; POSIX permission
//! checks also need the supplementary groups, which we read from `/proc/<pid>/status`
//! (`Groups:` line). A request the kernel makes on its own behalf (pid 0) or from a process that
//! has exited meanwhile gets no supplementary groups: the check then errs on the side of denial.

use spillway_namespace::Caller;

/// Supplementary groups of `pid`, from `/proc/<pid>/status`; empty if the process is gone or
/// the line is missing.
pub fn supplementary_groups(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    parse_groups(&status)
}

/// The `Groups:` line of a `/proc/<pid>/status` text, parsed.
pub fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|rest| rest.split_whitespace().filter_map(|g| g.parse().ok()).collect())
        .unwrap_or_default()
}

/// The caller of a FUSE request.
pub fn caller(uid: u32, gid: u32, pid: u32) -> Caller {
    // Root bypasses every check; skip the /proc read.
    let groups = if uid == 0 { Vec::new() } else { supplementary_groups(pid) };
    Caller { uid, gid, groups, pid }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_groups_line() {
        let status =
            "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 1000 \nVmPeak:\t1 kB\n";
        assert_eq!(parse_groups(status), vec![4, 24, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
    }

    #[test]
    fn reads_our_own_groups() {
        let ours = supplementary_groups(std::process::id());
        assert_eq!(ours, spillway_sys::user::process_groups().unwrap());
    }
}
