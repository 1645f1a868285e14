//! One logging setup for every command, and a quiet end when stdout's reader goes away.
//!
//! Logs go to stderr through `tracing`: `RUST_LOG` filters (default `info` for the
//! long-running commands, `warn` for the rest), colours only when stderr is a terminal (log
//! files and Slurm's captured output carry no escape codes) and `NO_COLOR` is unset, and JSON
//! lines with `SPILLWAY_LOG_FORMAT=json` (or a daemon's `--log-json`).

use std::io::IsTerminal;

/// `SPILLWAY_LOG_FORMAT`: `json` for JSON lines, anything else (or unset) for text.
pub const LOG_FORMAT_ENV: &str = "SPILLWAY_LOG_FORMAT";

/// How much a command logs unless `RUST_LOG` says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verbosity {
    /// Daemons and mounts: what they do, at `info`.
    Service,
    /// Commands that answer and exit: warnings and errors only.
    Command,
}

/// Installs the process's log subscriber (once; later calls do nothing).
pub fn init(verbosity: Verbosity, json_flag: bool) {
    let default = match verbosity {
        Verbosity::Service => "info",
        Verbosity::Command => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let json = json_flag || std::env::var(LOG_FORMAT_ENV).is_ok_and(|v| v == "json");
    let ansi = !json && std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// What a shell shows for a process killed by SIGPIPE (128 + 13).
const EXIT_SIGPIPE: i32 = 141;

/// `spillway status | head`: once the reader of stdout is gone, a print fails with EPIPE and
/// Rust's `println!` panics. End the process as a C tool killed by SIGPIPE would (status
/// 128 + 13, nothing on stderr) instead of printing a panic. SIGPIPE itself stays ignored, so
/// a peer closing a socket or a child's pipe is an error the command reports, never a silent
/// death.
pub fn exit_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(EXIT_SIGPIPE);
        }
        default(info);
    }));
}
