//! `spillway bench io500 --json` with tiny shapes: real servers, real FUSE mounts, real worker
//! processes (with and without the LD_PRELOAD library) and the plain-directory baseline. Every phase reads back and checks every byte it
//! wrote, so a run that finishes moved the right bytes; rates and ratios are timings, so only
//! their presence and sign are checked, never their values.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

const PHASES: [&str; 11] = [
    "ior_easy_write",
    "mdtest_easy_write",
    "ior_hard_write",
    "mdtest_hard_write",
    "ior_easy_read",
    "mdtest_easy_stat",
    "ior_hard_read",
    "mdtest_hard_stat",
    "mdtest_easy_delete",
    "mdtest_hard_read",
    "mdtest_hard_delete",
];

#[test]
fn every_shape_runs_through_every_subject_and_reads_back_what_it_wrote() {
    assert!(
        Path::new("/dev/fuse").exists() && nix_is_root(),
        "bench io500 mounts FUSE: it needs /dev/fuse (the fuse kernel module) and root"
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let library = spillway_harness::preload_library();
    let output = Command::new(BIN)
        .args(["bench", "io500", "--json", "--processes", "3", "--ior-easy-bytes", "3M"])
        .arg("--preload-lib")
        .arg(&library)
        .args(["--ior-hard-transfers", "7", "--mdtest-easy-files", "20"])
        .args(["--mdtest-hard-files", "9", "--work-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let subjects = report["subjects"].as_array().unwrap();
    let names: Vec<&str> = subjects.iter().map(|s| s["subject"].as_str().unwrap()).collect();
    assert_eq!(names, ["dir", "native", "mount", "mount_uncached", "preload"]);
    for subject in subjects {
        for phase in PHASES {
            let score = subject["phases"][phase]["score"].as_f64();
            assert!(score.is_some_and(|s| s > 0.0), "{phase} in {subject}");
        }
        assert!(subject["score"].as_f64().is_some_and(|s| s > 0.0), "{subject}");
    }
    for phase in PHASES.iter().copied().chain(["bandwidth", "metadata", "score"]) {
        for pair in [
            "native_vs_dir",
            "mount_vs_dir",
            "mount_vs_native",
            "preload_vs_dir",
            "preload_vs_native",
            "preload_vs_mount",
            "mount_uncached_vs_dir",
            "preload_vs_mount_uncached",
        ] {
            let key = format!("{pair}_{phase}");
            let ratio = report["ratios"][&key].as_f64();
            assert!(ratio.is_some_and(|r| r > 0.0), "{key} in {}", report["ratios"]);
        }
    }
    for target in [
        "preload_vs_native",
        "preload_over_mount_creates",
        "preload_over_mount_stats",
        "preload_over_cached_mount_creates",
        "preload_over_cached_mount_stats",
    ] {
        assert!(report["ratios"][target].as_f64().is_some_and(|r| r > 0.0), "{target}");
    }
    // Nothing of the run is left mounted.
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(dir.path().to_str().unwrap()), "{mounts}");
}

#[test]
fn bad_shapes_are_refused_naming_the_flag() {
    let output =
        Command::new(BIN).args(["bench", "io500", "--ior-easy-bytes", "1000"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--ior-easy-bytes (1000) must be a positive multiple of 1 MiB"),
        "{stderr}"
    );
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}
