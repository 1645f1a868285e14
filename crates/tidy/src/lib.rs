//! Repository checks that keep documents and configuration honest, run as this crate's tests
//! (`crates/tidy/tests/`) by `make test`:
//!
//! - `architecture`: the crate graph written in ARCHITECTURE.md is exactly Cargo's (every
//!   workspace crate, and each one's workspace dependencies);
//! - `protocol`: docs/design/protocol.md has a row for every frame kind the codec knows, with
//!   its byte;
//! - `workspace`: every crate takes the workspace's lints and `rust-version`, and the LICENSE
//!   file is the license Cargo.toml names.
//!
//! Rules a compiler or clippy can check are in `[workspace.lints]` and clippy.toml instead.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// The repository root (two levels above this crate's manifest).
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/tidy is two deep")
        .into()
}

/// A file of the repository as text, naming it when it cannot be read.
pub fn read_repository_file(relative: &str) -> String {
    let path = repository_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
