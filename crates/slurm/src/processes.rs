//! A job's mounts and processes as the kernel lists them: whether its mount point is mounted
//! (`/proc/self/mountinfo`), which `spillway mount`/`stage-in`/`stage-out` processes are still its
//! (`/proc/<pid>/cmdline`, matched by their exact arguments), and killing those (SIGTERM, then
//! SIGKILL after a grace).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long a leftover process gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(3);

/// Is `path` a mount point (listed in /proc/self/mountinfo)?
pub(crate) fn is_mounted(path: &Path) -> anyhow::Result<bool> {
    let Ok(canonical) = path.canonicalize() else {
        // A dead FUSE mount fails stat with ENOTCONN: compare the path as given.
        return mountinfo_has(path);
    };
    mountinfo_has(&canonical)
}

fn mountinfo_has(path: &Path) -> anyhow::Result<bool> {
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let wanted = path.to_string_lossy();
    Ok(text
        .lines()
        .any(|line| line.split(' ').nth(4).map(unescape_mountinfo).as_deref() == Some(&*wanted)))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Does this command line belong to a `spillway mount … MOUNTPOINT` of this mount point?
pub(crate) fn is_mount_of(args: &[OsString], mountpoint: &Path) -> bool {
    is_spillway(args)
        && args.get(1).is_some_and(|a| a == "mount")
        && args.last().is_some_and(|last| Path::new(last) == mountpoint)
}

/// Does this command line belong to a `spillway stage-in|stage-out --reservation NAME …`?
pub(crate) fn is_stage_of(args: &[OsString], reservation: &str) -> bool {
    if !is_spillway(args) || !args.get(1).is_some_and(|a| a == "stage-in" || a == "stage-out") {
        return false;
    }
    let long = format!("--reservation={reservation}");
    args.windows(2).any(|w| w[0] == "--reservation" && w[1] == reservation)
        || args.iter().any(|a| *a == *long)
}

fn is_spillway(args: &[OsString]) -> bool {
    args.first().and_then(|a| Path::new(a).file_name()).is_some_and(|name| name == "spillway")
}

/// Pids (other than ours) in our mount namespace whose command line matches. Hosts of a
/// test cluster may share one pid namespace while each has its own mounts: another host's
/// `spillway mount` of the same path is not this host's to kill.
pub(crate) fn find_processes(matches: impl Fn(&[OsString]) -> bool) -> anyhow::Result<Vec<u32>> {
    let me = std::process::id();
    let our_mounts = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("listing /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        // The process may exit between listing and reading: skip it then.
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<OsString> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| std::ffi::OsStr::from_bytes(a).to_os_string())
            .collect();
        let same_mounts = our_mounts.is_none()
            || std::fs::read_link(entry.path().join("ns/mnt")).ok() == our_mounts;
        if same_mounts && matches(&args) {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// SIGTERM each pid, SIGKILL whatever is left after [`KILL_GRACE`].
pub(crate) fn kill_all(pids: &[u32]) {
    use spillway_sys::signal::{send, Signal};
    if pids.is_empty() {
        return;
    }
    // A process may have exited since it was found: failures to signal are expected.
    for &pid in pids {
        // SIGCONT: a stopped process only acts on SIGTERM once it runs again.
        let _ = send(pid, Signal::SIGTERM);
        let _ = send(pid, Signal::SIGCONT);
    }
    let deadline = Instant::now() + KILL_GRACE;
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
    while Instant::now() < deadline && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &pid in pids {
        if alive(pid) {
            let _ = send(pid, Signal::SIGKILL);
        }
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn recognises_leftover_processes_exactly() {
        let mp = Path::new("/mnt/spillway/job-7");
        assert!(is_mount_of(
            &args(&[
                "/usr/bin/spillway",
                "mount",
                "--servers",
                "a",
                "--background",
                "/mnt/spillway/job-7"
            ]),
            mp
        ));
        assert!(!is_mount_of(
            &args(&["/usr/bin/spillway", "mount", "--background", "/mnt/spillway/job-70"]),
            mp
        ));
        assert!(!is_mount_of(&args(&["/usr/bin/other", "mount", "/mnt/spillway/job-7"]), mp));
        assert!(is_stage_of(
            &args(&["spillway", "stage-in", "--reservation", "job-7", "/a", "b"]),
            "job-7"
        ));
        assert!(is_stage_of(
            &args(&["spillway", "stage-out", "--reservation=job-7", "a", "/b"]),
            "job-7"
        ));
        assert!(!is_stage_of(
            &args(&["spillway", "stage-in", "--reservation", "job-71", "/a", "b"]),
            "job-7"
        ));
        assert!(!is_stage_of(
            &args(&["spillway", "reservation", "--reservation", "job-7"]),
            "job-7"
        ));
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/mnt/plain"), "/mnt/plain");
        assert_eq!(unescape_mountinfo("/mnt/x\\"), "/mnt/x\\");
    }
}
