//! Which Slurm a test cluster runs: the machine's, or Debian 13's in a cached Debian root.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Builds (once; later runs reuse it) the Debian 13 root and prints its path.
const DEBIAN13_ROOT_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/slurm/debian13-root.sh");

/// A Slurm release the Slurm end-to-end tests run against (docs/design/slurm.md, "Test clusters").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlurmRelease {
    /// Debian 12's Slurm 22.05, installed on the machine.
    Host2205,
    /// Debian 13's Slurm 24.11, in the root scripts/slurm/debian13-root.sh builds.
    Debian13,
}

impl SlurmRelease {
    /// The Debian root to run Slurm in (built now if it is not cached), or `None` for the
    /// machine's. Panics, naming what failed, when the root cannot be built: the tests that
    /// ask for it need it.
    pub fn root(self) -> Option<PathBuf> {
        match self {
            SlurmRelease::Host2205 => None,
            SlurmRelease::Debian13 => {
                let output =
                    Command::new(DEBIAN13_ROOT_SCRIPT).stdin(Stdio::null()).output().unwrap();
                assert!(
                    output.status.success(),
                    "{DEBIAN13_ROOT_SCRIPT} failed (it needs root, debootstrap and Debian's archive): {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                Some(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
            }
        }
    }

    /// What `scontrol --version` says for this release.
    pub fn version_prefix(self) -> &'static str {
        match self {
            SlurmRelease::Host2205 => "slurm-wlm 22.05.",
            SlurmRelease::Debian13 => "slurm-wlm 24.11.",
        }
    }
}
