//! The committed `include/spillway.h` must be exactly what cbindgen generates from the code.
//!
//! Regenerate after changing the ABI with `SPILLWAY_BLESS_HEADER=1 cargo test -p spillway-capi
//! --test header` and commit the result.

use std::path::PathBuf;

fn generate() -> String {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("crates/capi/cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header from crates/capi/src/lib.rs");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

fn header_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../include/spillway.h")
}

#[test]
fn committed_header_matches_the_code() {
    let generated = generate();
    let path = header_path();
    if std::env::var_os("SPILLWAY_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/spillway.h drifted from crates/capi/src/lib.rs (first difference at line {}):\n  committed: {:?}\n  generated: {:?}\n\
             Regenerate it with: SPILLWAY_BLESS_HEADER=1 cargo test -p spillway-capi --test header\n\
             then review `git diff include/spillway.h` and commit it.",
            first + 1,
            committed.lines().nth(first).unwrap_or("<end of file>"),
            generated.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn header_carries_the_do_not_edit_banner_and_every_export() {
    let generated = generate();
    assert!(generated.contains("do not edit"), "banner missing");
    let source =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
            .unwrap();
    let mut exported = 0;
    for line in source.lines() {
        let Some(rest) = line
            .strip_prefix("pub unsafe extern \"C\" fn ")
            .or_else(|| line.strip_prefix("pub extern \"C\" fn "))
        else {
            continue;
        };
        let name = rest.split('(').next().unwrap();
        assert!(generated.contains(&format!("{name}(")), "{name} is not declared in the header");
        exported += 1;
    }
    assert!(exported >= 18, "found only {exported} exported functions");
}
