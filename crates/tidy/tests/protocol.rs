//! docs/design/protocol.md documents every frame kind the codec speaks: each kind has a table
//! row `| Name | 0xNN |` with the byte the codec uses, and no row names a kind the codec lacks.

use spillway_proto::Kind;
use spillway_tidy::read_repository_file;

/// `(name, byte)` of every table row whose second cell is a hex byte.
fn documented_kinds(text: &str) -> Vec<(String, u8)> {
    text.lines()
        .filter_map(|line| {
            let mut cells = line.split('|').map(str::trim).skip(1);
            let name = cells.next()?;
            let byte = cells.next()?.strip_prefix("0x")?;
            Some((name.to_string(), u8::from_str_radix(byte, 16).ok()?))
        })
        .collect()
}

#[test]
fn protocol_md_has_a_row_for_every_frame_kind() {
    let documented = documented_kinds(&read_repository_file("docs/design/protocol.md"));
    let mut problems = Vec::new();
    for kind in Kind::ALL {
        let name = format!("{kind:?}");
        match documented.iter().find(|(n, _)| *n == name) {
            None => problems.push(format!("{name} (0x{:02X}) has no row", kind as u8)),
            Some((_, byte)) if *byte != kind as u8 => problems.push(format!(
                "{name} is 0x{:02X} in the codec, 0x{byte:02X} in the document",
                kind as u8
            )),
            Some(_) => {}
        }
    }
    for (name, byte) in &documented {
        if !Kind::ALL.iter().any(|k| format!("{k:?}") == *name) {
            problems.push(format!("the document's {name} (0x{byte:02X}) is not a codec kind"));
        }
    }
    assert!(problems.is_empty(), "protocol.md drift:\n  {}", problems.join("\n  "));
}
