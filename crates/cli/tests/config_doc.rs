//! docs/reference/config.md is generated from the knob declarations; this fails when a knob was
//! added or changed without regenerating it (`make config-doc`).

use std::process::Command;

#[test]
fn committed_config_reference_matches_the_knobs() {
    let output = Command::new(env!("CARGO_BIN_EXE_spillway")).arg("config-doc").output().unwrap();
    assert!(output.status.success(), "spillway config-doc failed: {output:?}");
    let generated = String::from_utf8(output.stdout).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reference/config.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if generated != committed {
        let first_difference = generated
            .lines()
            .zip(committed.lines())
            .position(|(a, b)| a != b)
            .map(|line| format!("first difference at line {}", line + 1))
            .unwrap_or_else(|| "one is a prefix of the other".to_string());
        panic!("docs/reference/config.md is stale ({first_difference}); run `make config-doc`");
    }
}
