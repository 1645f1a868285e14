//! Every crate takes the workspace's lints and minimum Rust version, and the LICENSE file is the
//! license the workspace declares.

use spillway_tidy::{read_repository_file, repository_root};

/// `crates/<name>/Cargo.toml` of every crate directory.
fn crate_manifests() -> Vec<(String, String)> {
    let mut manifests: Vec<(String, String)> = std::fs::read_dir(repository_root().join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("Cargo.toml"))
        .filter(|path| path.exists())
        .map(|path| (path.display().to_string(), std::fs::read_to_string(&path).unwrap()))
        .collect();
    manifests.sort();
    manifests
}

#[test]
fn every_crate_uses_the_workspace_lints_and_rust_version() {
    let manifests = crate_manifests();
    assert!(manifests.len() >= 20, "found only {} crates", manifests.len());
    let workspace = read_repository_file("Cargo.toml");
    for (path, text) in &manifests {
        assert!(
            text.contains("[lints]\nworkspace = true"),
            "{path}: no `[lints] workspace = true`"
        );
        assert!(
            text.contains("rust-version.workspace = true"),
            "{path}: no workspace rust-version"
        );
        let member = path.rsplit_once("/crates/").unwrap().1.trim_end_matches("/Cargo.toml");
        assert!(
            workspace.contains(&format!("\"crates/{member}\"")),
            "{path} is not a workspace member"
        );
    }
}

#[test]
fn the_license_file_is_the_declared_license() {
    let workspace = read_repository_file("Cargo.toml");
    assert!(workspace.contains("license = \"Apache-2.0\""), "the workspace declares Apache-2.0");
    let license = read_repository_file("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is not the Apache License 2.0 text"
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"), "LICENSE is truncated");
}
