//! The Debian package: `scripts/package/deb.sh` builds it with cargo-deb (from this test's own
//! binary), and `scripts/package/test-install.sh` installs it into a clean Debian 12 root,
//! checks every file it ships, starts the manager and a server as their systemd units would,
//! stops them with the units' KillSignal, then removes and purges it.
//!
//! Needs root, cargo-deb, debootstrap and Debian's archive (scripts/install-deps.sh installs the
//! first two; the clean root is built once and cached). It fails, naming what is missing, rather
//! than skip.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

#[test]
fn the_deb_installs_starts_stops_and_purges_in_a_clean_root() {
    assert_eq!(
        spillway_sys::user::euid(),
        0,
        "the package test must run as root (debootstrap, chroot); run `make test` as root, as CI does"
    );
    // deb.sh takes the LD_PRELOAD library from next to the binary.
    spillway_harness::preload_library();
    let built = Command::new(repo().join("scripts/package/deb.sh")).arg(BIN).output().unwrap();
    assert!(
        built.status.success(),
        "scripts/package/deb.sh failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_string();
    let deb = repo().join(deb);
    assert!(deb.is_file(), "deb.sh named {} but it is not there", deb.display());

    let installed =
        Command::new(repo().join("scripts/package/test-install.sh")).arg(&deb).output().unwrap();
    let stdout = String::from_utf8_lossy(&installed.stdout);
    assert!(
        installed.status.success(),
        "scripts/package/test-install.sh {} failed:\n{stdout}\n{}",
        deb.display(),
        String::from_utf8_lossy(&installed.stderr)
    );
    for check in [
        "ok: installed with its dependencies",
        "ok: binary, units, configuration, man pages, completions and Slurm scripts in place",
        "ok: the LD_PRELOAD library loads and --print-preload-env names it",
        "ok: spillway runs; fuse3 came with it; the configuration is a conffile",
        "ok: spillway-manager.service started",
        "ok: spillway-server.service started",
        "ok: both stopped cleanly",
        "ok: removed (configuration kept), then purged (configuration gone)",
    ] {
        assert!(stdout.contains(check), "missing {check:?} in:\n{stdout}");
    }
}
