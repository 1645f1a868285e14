//! How the binary behaves at its edges: a reader of stdout that goes away, log files without
//! terminal escape codes, JSON logs on request.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use spillway_harness::ServerProcess;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

#[test]
fn a_closed_stdout_ends_the_command_quietly_like_sigpipe_not_with_a_panic() {
    for args in [&["config-doc"][..], &["sim", "ias", "--jobs", "2"][..]] {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the first line is printed.
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(141), "spillway {args:?}: {status}; stderr: {stderr}");
        assert!(!stderr.contains("panicked"), "spillway {args:?} panicked: {stderr}");
    }
}

/// The server's log once it holds `needle` (it is written after the `listening` line).
fn logged(server: &ServerProcess, needle: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = server.log_text();
        if text.contains(needle) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "no {needle:?} in the log: {text}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn daemon_logs_carry_no_escape_codes_and_json_logs_are_json() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        ServerProcess::builder(BIN, dir.path(), "plain").dram_bytes("16M").rust_log("info").start();
    let text = logged(&server, "serving");
    assert!(!text.contains('\u{1b}'), "escape codes in a log file: {text:?}");
    drop(server);

    let json = ServerProcess::builder(BIN, dir.path(), "json")
        .dram_bytes("16M")
        .rust_log("info")
        .env("SPILLWAY_LOG_FORMAT", "json")
        .start();
    let text = logged(&json, "serving");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line:?}"));
        assert!(value["level"].is_string(), "{line}");
    }
    assert!(Path::new(json.log_path()).exists());
}
