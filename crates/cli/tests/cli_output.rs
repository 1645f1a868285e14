//! How the binary behaves at its edges: a reader of stdout that goes away, log files without
//! terminal escape codes, JSON logs on request.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use spillway_harness::ServerProcess;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

#[test]
fn a_closed_stdout_ends_the_command_quietly_like_sigpipe_not_with_a_panic() {
    for args in
        [&["config-doc"][..], &["sim", "ias", "--jobs", "2"][..], &["completions", "bash"][..]]
    {
        // The reader is gone before the command starts: its first print meets EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child =
            Command::new(BIN).args(args).stdout(writer).stderr(Stdio::piped()).spawn().unwrap();
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

#[test]
fn completions_and_man_pages_come_from_the_command_line_definition() {
    let bash = Command::new(BIN).args(["completions", "bash"]).output().unwrap();
    assert!(bash.status.success(), "{}", String::from_utf8_lossy(&bash.stderr));
    let script = String::from_utf8(bash.stdout).unwrap();
    for word in ["stage-out", "reservation", "--tiering-job", "--epochs"] {
        assert!(script.contains(word), "the bash completion lacks {word}");
    }
    let check = Command::new("bash").arg("-n").stdin(Stdio::piped()).spawn().and_then(|mut c| {
        use std::io::Write;
        c.stdin.take().unwrap().write_all(script.as_bytes())?;
        c.wait()
    });
    assert!(check.unwrap().success(), "bash -n refuses the completion script");
    for shell in ["zsh", "fish"] {
        let out = Command::new(BIN).args(["completions", shell]).output().unwrap();
        assert!(out.status.success() && out.stdout.len() > 1000, "{shell}");
    }

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN).arg("man").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for page in ["spillway.1", "spillway-mount.1", "spillway-stage-out.1", "spillway-server-add.1"]
    {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is not roff: {text:.200}");
    }
    let mount = std::fs::read_to_string(dir.path().join("spillway-mount.1")).unwrap();
    assert!(mount.contains("tiering\\-job"), "the mount page documents --tiering-job");
    // Hidden commands (the benchmark's application) get no page.
    assert!(!dir.path().join("spillway-bench-ias-app.1").exists());
}

#[test]
fn an_absurd_stage_out_timeout_is_refused_by_name_before_anything_runs() {
    for value in ["0", "18446744073709551615"] {
        let out = Command::new(BIN)
            .args(["stage-out", "--reservation", "r", "/a", "/tmp/b", "--drain-timeout-s", value])
            .env("SPILLWAY_MANAGER", "/nonexistent/manager.sock")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {stderr}");
        assert!(stderr.contains("--drain-timeout-s") && !stderr.contains("panicked"), "{stderr}");
    }
}
