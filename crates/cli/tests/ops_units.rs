//! The systemd units and the example configuration in `ops/`, used as systemd would use them:
//! each unit's `ExecStart` runs (its `/usr/bin/spillway` replaced by this build, its
//! `/etc/spillway/spillway.toml` by `ops/spillway.toml`, and the paths of that file moved into a
//! temporary directory through the environment, which overrides the file), the daemon comes up,
//! and the unit's `KillSignal` stops it with exit status 0 within its `TimeoutStopSec`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `[Service]` keys of a unit in ops/systemd.
fn service_keys(unit: &str) -> HashMap<String, String> {
    let text = std::fs::read_to_string(repo().join("ops/systemd").join(unit)).unwrap();
    let mut section = String::new();
    let mut keys = HashMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("{unit}: {line:?}"));
        if section == "Service" {
            keys.insert(key.to_string(), value.to_string());
        }
    }
    for required in ["ExecStart", "KillSignal", "TimeoutStopSec", "Restart"] {
        assert!(keys.contains_key(required), "{unit}: no {required}=");
    }
    keys
}

/// Runs the unit's ExecStart with `environment`, waits for `ready` in its output, sends its
/// KillSignal and checks that it exits 0 in time.
fn start_and_stop(unit: &str, environment: &[(&str, String)], ready: &str) {
    let keys = service_keys(unit);
    let words: Vec<&str> = keys["ExecStart"].split_whitespace().collect();
    assert_eq!(words[0], "/usr/bin/spillway", "{unit}: the package installs /usr/bin/spillway");
    let example = repo().join("ops/spillway.toml");
    let args: Vec<String> = words[1..]
        .iter()
        .map(|w| {
            if *w == "/etc/spillway/spillway.toml" {
                example.display().to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    let mut child = Command::new(BIN)
        .args(&args)
        .envs(environment.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Both streams into one channel of lines (the server says `listening` on stdout, the
    // manager on stderr).
    let (sender, lines) = std::sync::mpsc::channel::<String>();
    let readers: Vec<Box<dyn Read + Send>> =
        vec![Box::new(child.stdout.take().unwrap()), Box::new(child.stderr.take().unwrap())];
    for reader in readers {
        let sender = sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
    }
    // Only the readers send: the channel closes when the daemon's output does (it exited).
    drop(sender);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains(ready)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().unwrap();
                panic!("{unit}: no {ready:?} ({status}); output:\n{}", seen.join("\n"));
            }
        }
    }
    let signal = match keys["KillSignal"].as_str() {
        "SIGTERM" => libc::SIGTERM,
        "SIGINT" => libc::SIGINT,
        other => panic!("{unit}: KillSignal={other} is not one the daemons handle"),
    };
    let timeout_s: u64 = keys["TimeoutStopSec"].parse().unwrap();
    // SAFETY: kill(2) on our own child's pid, which it still is (not waited for yet).
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
    let stop_deadline = Instant::now() + Duration::from_secs(timeout_s);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > stop_deadline {
            let _ = child.kill();
            panic!("{unit}: still running {timeout_s} s after {}", keys["KillSignal"]);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    while let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
        seen.push(line);
    }
    assert!(status.success(), "{unit}: exit {status} after its KillSignal:\n{}", seen.join("\n"));
}

#[test]
fn the_example_configuration_is_valid() {
    let path = repo().join("ops/spillway.toml");
    let config = spillway_config::Config::load(Some(&path), std::iter::empty()).unwrap();
    config.validate().unwrap();
    config.manager.validate().unwrap();
    assert!(config.server.managed, "the example runs managed servers");
}

#[test]
fn the_server_unit_starts_and_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let environment = [
        ("SPILLWAY_STORE_SSD_DIRECTORY", dir.path().join("ssd").display().to_string()),
        ("SPILLWAY_STORE_SSD_BYTES_MAX", (512u64 << 20).to_string()),
        ("SPILLWAY_STORE_SEGMENT_BYTES_MAX", (32u64 << 20).to_string()),
        ("SPILLWAY_STORE_DRAM_BYTES_MAX", (64u64 << 20).to_string()),
        ("SPILLWAY_SERVER_LISTEN_ADDRESS", "127.0.0.1:0".to_string()),
    ];
    start_and_stop("spillway-server.service", &environment, "listening");
}

#[test]
fn the_manager_unit_starts_and_stops_the_manager() {
    let dir = tempfile::tempdir().unwrap();
    let environment = [
        ("SPILLWAY_MANAGER_SOCKET_PATH", dir.path().join("manager.sock").display().to_string()),
        ("SPILLWAY_MANAGER_DATABASE_PATH", dir.path().join("manager.db").display().to_string()),
    ];
    start_and_stop("spillway-manager.service", &environment, "spillway manager listening");
}
