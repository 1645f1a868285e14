//! Build products the tests need besides the `spillway` binary: `libspillway_preload.so`, which
//! no crate links (linking it would put its libc wrappers into the binary). The `spillway`
//! package has it as a dev-dependency that no test names, so that `cargo test` builds it with
//! the tests without linking it into them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

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

/// `libspillway_preload.so` of this test run's target directory and profile, never stale.
///
/// The `spillway` package's tests have `spillway-preload` as a dev-dependency, and cargo builds
/// every crate type of a dependency: the `cargo test` that built the test binary also built
/// `<profile>/deps/libspillway_preload.so`, with the same profile and features as the rest of
/// the stack. It is used (linked into the profile directory, next to the `spillway` binary)
/// when it is newer than every file of the preload crate (its sources, `build.rs`,
/// `Cargo.toml`: an edit since that build, with the test binary run without cargo).
/// Otherwise (missing: another package's test) it is built here with `cargo build -p
/// spillway-preload`, which compiles the stack it needs once more with the plain `dev` profile
/// (about a minute on a cold target directory).
///
/// # Panics
/// If cargo cannot build it: the preload tests cannot run without it.
pub fn preload_library() -> PathBuf {
    let profile_dir = profile_dir();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dependency = profile_dir.join("deps").join(PRELOAD_LIBRARY);
    let built = profile_dir.join(PRELOAD_LIBRARY);
    if newer_than_sources(&dependency, &workspace.join("crates/preload")) {
        uplift(&dependency, &built);
        return built;
    }
    let target = profile_dir.parent().expect("the profile directory has a parent");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .current_dir(&workspace)
        .args(["build", "--quiet", "-p", "spillway-preload", "--lib", "--profile", &profile])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .expect("running cargo build for spillway-preload");
    assert!(status.success(), "cargo build -p spillway-preload failed");
    assert!(built.exists(), "{} missing after cargo build", built.display());
    built
}

/// Makes `to` (the profile directory's library, which `spillway bench io500` and
/// scripts/package/deb.sh take from next to the binary) the same file as `from`, as cargo does
/// with what it builds at the top level: a hard link (a copy where that fails), renamed into
/// place so that a concurrent test never sees half a library.
///
/// # Panics
/// If neither works.
fn uplift(from: &Path, to: &Path) {
    use std::os::unix::fs::MetadataExt;
    let same = match (std::fs::metadata(from), std::fs::metadata(to)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    };
    if same {
        return;
    }
    let staged = to.with_extension(format!("so.{}", std::process::id()));
    let _ = std::fs::remove_file(&staged);
    let linked =
        std::fs::hard_link(from, &staged).or_else(|_| std::fs::copy(from, &staged).map(drop));
    if let Err(e) = linked.and_then(|()| std::fs::rename(&staged, to)) {
        panic!("putting {} at {}: {e}", from.display(), to.display());
    }
}

/// Whether `library` exists and no file under `crate_dir` (but `target`) changed after it.
fn newer_than_sources(library: &Path, crate_dir: &Path) -> bool {
    fn newest(dir: &Path) -> Option<SystemTime> {
        let mut latest = SystemTime::UNIX_EPOCH;
        for entry in std::fs::read_dir(dir).ok()? {
            let entry = entry.ok()?;
            let kind = entry.file_type().ok()?;
            let changed = if kind.is_dir() {
                if entry.file_name() == "target" {
                    continue;
                }
                newest(&entry.path())?
            } else {
                entry.metadata().ok()?.modified().ok()?
            };
            latest = latest.max(changed);
        }
        Some(latest)
    }
    let built = std::fs::metadata(library).and_then(|m| m.modified());
    match (built, newest(crate_dir)) {
        (Ok(built), Some(changed)) => changed <= built,
        _ => false,
    }
}
