//! The C example (examples/c/checkpoint.c) compiled with `cc` against the committed header and
//! the built `libspillway.so` (flags from the generated pkg-config file), run against real
//! `spillway serve` processes on loopback ports: N-N striped, N-1 local, N-1 striped with delete.
//!
//! Artefacts are found next to this test binary (`<target>/<profile>/deps/`): cargo builds the
//! cdylib of this package there before running its tests. The `spillway` binary is built by a
//! nested `cargo build` into the same target dir (a no-op when up to date);
//! `SPILLWAY_BIN=/path/to/spillway` overrides.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use spillway_harness::ServerProcess;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// `<target>/<profile>`, the directory holding `libspillway.so` for this test run.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a parent");
    let dir =
        if deps.file_name().is_some_and(|n| n == "deps") { deps.parent().unwrap() } else { deps };
    dir.to_path_buf()
}

/// The cdylib cargo built for this test run: `cargo test` leaves it in `deps/` (only `cargo build`
/// copies it up to the profile directory, possibly from an older build, so `deps/` comes first).
fn shared_library() -> PathBuf {
    let candidates =
        [profile_dir().join("deps/libspillway.so"), profile_dir().join("libspillway.so")];
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| {
        panic!(
            "{} is missing: cargo should have built the cdylib of spillway-capi before its tests",
            candidates[0].display()
        )
    })
}

/// The `spillway` server binary: `$SPILLWAY_BIN`, else built (or found up to date) by cargo in
/// this test's own target dir and profile. Cargo releases its build lock before running tests, so
/// the nested build does not deadlock; under `cargo test --workspace` it is a no-op.
fn spillway_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SPILLWAY_BIN") {
        return PathBuf::from(path);
    }
    let profile_dir = profile_dir();
    let target = profile_dir.parent().expect("profile dir has a parent");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["build", "--quiet", "-p", "spillway", "--bin", "spillway", "--profile", &profile])
        .env("CARGO_TARGET_DIR", target)
        .status()
        .expect("running cargo build for the spillway binary");
    assert!(
        status.success(),
        "cargo build -p spillway failed (set SPILLWAY_BIN to use another build)"
    );
    let built = profile_dir.join("spillway");
    assert!(built.exists(), "{} missing after cargo build", built.display());
    built
}

/// A server on an ephemeral loopback port, logging only warnings (nothing greps its log here).
fn start_server(binary: &Path, dir: &Path, name: &str) -> ServerProcess {
    ServerProcess::builder(binary, dir, name).rust_log("warn").start()
}

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Compiles the example with the flags pkg-config gives for a generated spillway.pc.
fn compile_example(dir: &Path) -> PathBuf {
    for (tool, package) in [("cc", "gcc"), ("pkg-config", "pkg-config")] {
        assert!(
            Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success()),
            "`{tool}` is missing: install the Debian package {package} (scripts/install-deps.sh)"
        );
    }
    let root = workspace_root();
    let library = shared_library();
    let libdir = library.parent().unwrap();
    let pc = run(Command::new("sh")
        .arg(root.join("scripts/gen-pkgconfig.sh"))
        .arg(dir)
        .arg(libdir)
        .arg(root.join("include")));
    std::fs::write(dir.join("spillway.pc"), &pc.stdout).unwrap();
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "spillway"])
        .env("PKG_CONFIG_PATH", dir));
    let flags = String::from_utf8(flags.stdout).unwrap();
    assert!(flags.contains("-lspillway"), "pkg-config flags: {flags}");
    let program = dir.join("checkpoint");
    run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&program)
        .arg(root.join("examples/c/checkpoint.c"))
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", libdir.display())));
    program
}

#[test]
fn c_checkpoint_example_writes_commits_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile_example(dir.path());
    let binary = spillway_binary();
    let servers = [start_server(&binary, dir.path(), "a"), start_server(&binary, dir.path(), "b")];
    let endpoints: Vec<String> = servers.iter().map(|s| s.endpoint().to_string()).collect();
    let cases: [&[&str]; 3] = [
        &["--mode", "nn", "--placement", "striped", "--epoch", "1", "--transfer-bytes", "100000"],
        &["--mode", "n1", "--placement", "local", "--epoch", "2", "--durability", "memory"],
        &[
            "--mode",
            "n1",
            "--placement",
            "striped",
            "--epoch",
            "3",
            "--ranks",
            "3",
            "--bytes-per-rank",
            "700001",
            "--delete",
        ],
    ];
    for case in cases {
        let output = run(Command::new(&program).args(case).args(&endpoints));
        let stdout = String::from_utf8_lossy(&output.stdout);
        for step in [
            "connect:",
            "write+commit:",
            "list_epochs:",
            "list_files:",
            "read+verify:",
            "open missing file: -ENOENT",
            "OK",
        ] {
            assert!(stdout.contains(step), "{case:?}: step {step:?} missing from:\n{stdout}");
        }
    }
    // Writing into epoch 1 again after its commit must fail with EROFS and a non-zero exit.
    let again = Command::new(&program).args(cases[0]).args(&endpoints).output().unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success(),
        "rewriting a committed epoch succeeded:\n{}",
        String::from_utf8_lossy(&again.stdout)
    );
    assert!(
        stderr.contains("FAIL") && stderr.contains(&format!("errno {}", libc::EROFS)),
        "expected EROFS:\n{stderr}"
    );
}

#[test]
fn header_compiles_as_cxx() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("header.cpp");
    assert!(
        Command::new("c++").arg("--version").output().is_ok_and(|o| o.status.success()),
        "no C++ compiler `c++`: install g++ (Debian) to check that spillway.h is valid C++"
    );
    std::fs::write(&source, "#include \"spillway.h\"\nint main() { spillway_options o; return spillway_options_init(&o); }\n").unwrap();
    run(Command::new("c++")
        .args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
        .arg(workspace_root().join("include"))
        .arg(&source));
}

#[test]
fn c_example_exits_non_zero_when_no_server_answers() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile_example(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let output = Command::new(&program).arg(format!("127.0.0.1:{port}")).output().unwrap();
    assert!(!output.status.success(), "the example succeeded without a server");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("FAIL connect")
            && stderr.contains(&format!("errno {}", libc::ECONNREFUSED)),
        "{stderr}"
    );
}

/// The shared library exports exactly the functions the header declares (no Rust symbols leak,
/// none is missing).
#[test]
fn shared_library_exports_exactly_the_header_functions() {
    let header = std::fs::read_to_string(workspace_root().join("include/spillway.h")).unwrap();
    let mut declared: Vec<String> = header
        .lines()
        .filter(|line| {
            !line.starts_with("//") && !line.starts_with(' ') && !line.starts_with("typedef")
        })
        .filter_map(|line| line.split('(').next().filter(|_| line.contains('(')))
        .filter_map(|before| before.rsplit([' ', '*']).next())
        .filter(|name| name.starts_with("spillway_"))
        .map(str::to_string)
        .collect();
    declared.sort();
    let output = run(Command::new("nm").args(["-D", "--defined-only"]).arg(shared_library()));
    let mut exported: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() == 3 && fields[1] == "T").then(|| fields[2].to_string())
        })
        .collect();
    exported.sort();
    assert!(declared.len() >= 18, "parsed only {declared:?} from the header");
    assert_eq!(exported, declared, "libspillway.so exports differ from include/spillway.h");
}

/// The C ABI schedules its phases with the strategy the job's environment names
/// (`SPILLWAY_TIERING`, which Slurm's `tiering=` sets): the manager hears each phase's end,
/// and measures the burst buffer's bandwidth from it; a strategy it does not know is refused
/// at connect, naming the variable.
#[test]
fn c_example_reports_its_phases_when_the_environment_turns_tiering_on() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile_example(dir.path());
    let binary = spillway_binary();
    let server = start_server(&binary, dir.path(), "t");
    let manager = spillway_harness::ManagerProcess::start(
        &binary,
        &dir.path().join("manager"),
        &[("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none")],
    );
    let api = spillway_manager::ApiClient::new(&manager.socket.to_string_lossy()).unwrap();
    let tiers = || -> spillway_manager::tiering::TiersView { api.get("/v1/tiers").unwrap() };
    assert_eq!(tiers().snapshot.burst_buffer.bandwidth_bytes_per_s, 0);
    let endpoint = server.endpoint().to_string();
    let case = ["--mode", "nn", "--placement", "striped", "--epoch", "7"];
    run(Command::new(&program)
        .args(case)
        .arg(&endpoint)
        .env("SPILLWAY_TIERING", "high-priority")
        .env("SPILLWAY_TIERING_JOB", "c-job")
        .env("SPILLWAY_MANAGER", &manager.socket));
    let view = tiers();
    assert!(view.snapshot.burst_buffer.bandwidth_bytes_per_s > 0, "{view:?}");
    assert!(view.phases.is_empty(), "every phase ended: {view:?}");

    let refused = Command::new(&program)
        .args(["--mode", "nn", "--placement", "striped", "--epoch", "8"])
        .arg(&endpoint)
        .env("SPILLWAY_TIERING", "fastest")
        .env("SPILLWAY_TIERING_JOB", "c-job")
        .env("SPILLWAY_MANAGER", &manager.socket)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "an unknown strategy was accepted");
}
