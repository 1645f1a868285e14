//! Build products the tests need besides the `spillway` binary: `libspillway_preload.so`, which
//! no crate links (linking it would put its libc wrappers into the binary), so `cargo test -p
//! spillway` alone would not build it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The interception library's file name.
pub const PRELOAD_LIBRARY: &str = "libspillway_preload.so";

/// `<target>/<profile>` of the running test binary (`<target>/<profile>/deps/<test>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test binary has a parent");
    let dir =
        if deps.file_name().is_some_and(|n| n == "deps") { deps.parent().unwrap() } else { deps };
    dir.to_path_buf()
}

/// `libspillway_preload.so` of this test run's target directory and profile, built (a no-op when
/// up to date: cargo releases its build lock before it runs tests) so that it is never stale.
///
/// # Panics
/// If cargo cannot build it: the preload tests cannot run without it.
pub fn preload_library() -> PathBuf {
    let profile_dir = profile_dir();
    let target = profile_dir.parent().expect("the profile directory has a parent");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .current_dir(&workspace)
        .args(["build", "--quiet", "-p", "spillway-preload", "--lib", "--profile", &profile])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .expect("running cargo build for spillway-preload");
    assert!(status.success(), "cargo build -p spillway-preload failed");
    let built = profile_dir.join(PRELOAD_LIBRARY);
    assert!(built.exists(), "{} missing after cargo build", built.display());
    built
}
