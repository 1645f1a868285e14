//! Prometheus metrics, scraped by a real Prometheus (Debian's package): a server's and the
//! manager's `/metrics` are up, a checkpoint moves the ingest counter by exactly its size, its
//! drain moves the PFS counter by the same, and a reservation shows with its capacity.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_client::{Client, ClientOptions};
use spillway_harness::{pattern, ManagerProcess, ServerProcess};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const PROMETHEUS: &str = "/usr/bin/prometheus";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A Prometheus process of this test; killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &Path, targets: &[(&str, u16)]) -> Prometheus {
        assert!(
            Path::new(PROMETHEUS).exists(),
            "metrics_e2e needs {PROMETHEUS} (Debian package prometheus; scripts/install-deps.sh installs it)"
        );
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (job, port) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            ));
        }
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus { child, port }
    }

    /// The value of an instant query that returns one sample; `None` while it returns none.
    fn value(&self, query: &str) -> Option<f64> {
        let encoded: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let request = format!(
            "GET /api/v1/query?query={encoded} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let body = answer.split_once("\r\n\r\n")?.1;
        let json: serde_json::Value = serde_json::from_str(body).ok()?;
        let result = json["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{query}: {} samples", result.len());
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Waits (bounded) until `query` has a sample for which `done` holds; returns it.
    fn wait(&self, query: &str, what: &str, done: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let value = self.value(query);
            if let Some(value) = value.filter(|v| done(*v)) {
                return value;
            }
            assert!(Instant::now() < deadline, "{what}: {query} is {value:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn cli(manager: &ManagerProcess, args: &[&str]) {
    let output = manager.cli(Path::new(BIN), None).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "spillway {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn prometheus_scrapes_the_server_and_the_manager_and_a_checkpoint_moves_the_byte_counters() {
    let dir = tempfile::tempdir().unwrap();
    let pfs = dir.path().join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let (server_port, manager_port) = (free_port(), free_port());
    let server_metrics = format!("127.0.0.1:{server_port}");
    let server = ServerProcess::builder(BIN, dir.path(), "bb")
        .pfs_dir(&pfs)
        .dram_bytes("64M")
        .env("SPILLWAY_SERVER_METRICS_LISTEN_ADDRESS", &server_metrics)
        .start();
    let manager_metrics = format!("127.0.0.1:{manager_port}");
    let manager = ManagerProcess::start(
        Path::new(BIN),
        &dir.path().join("manager"),
        &[
            ("SPILLWAY_MANAGER_JOB_OWNER_CHECK", "none"),
            ("SPILLWAY_MANAGER_METRICS_LISTEN_ADDRESS", &manager_metrics),
            ("SPILLWAY_MANAGER_FRAGMENT_BYTES", "8388608"),
            ("SPILLWAY_MANAGER_HEARTBEAT_MS", "200"),
        ],
    );
    let prometheus = Prometheus::start(
        dir.path(),
        &[("spillway_server", server_port), ("spillway_manager", manager_port)],
    );
    prometheus.wait("up{job=\"spillway_server\"}", "the server scraped", |v| v == 1.0);
    prometheus.wait("up{job=\"spillway_manager\"}", "the manager scraped", |v| v == 1.0);

    checkpoint_moves_the_counters(&prometheus, &server);

    // The manager: a pool, a server and a reservation, with its granted capacity.
    cli(&manager, &["pool", "create", "fast", "--granularity", "1MiB"]);
    let address = server.endpoint().to_string();
    cli(&manager, &["server", "add", &address, "--pool", "fast", "--capacity", "1GiB"]);
    let created = manager
        .cli(Path::new(BIN), None)
        .args(["reservation", "create", "--capacity", "16MiB", "--persistent", "metrics-test"])
        .arg("--json")
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let reservation: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let granted = prometheus.wait(
        "spillway_manager_reservation_capacity_bytes{reservation=\"metrics-test\"}",
        "the reservation's capacity",
        |_| true,
    );
    assert!(granted >= 16.0 * f64::from(1 << 20), "{granted}");
    // A checkpoint into the reservation's epoch shows as its bytes written, at the heartbeat.
    let written = 3 * (1 << 20) + 777;
    let epoch = EpochId(reservation["epoch"].as_u64().unwrap());
    let mut client = Client::connect(server.endpoints(), ClientOptions::default()).unwrap();
    let mut file = client.create_file(epoch, "rank0/ckpt").unwrap();
    client.write(&mut file, 0, &pattern(9, written)).unwrap();
    client.commit_epoch(epoch).unwrap();
    prometheus.wait(
        "spillway_manager_reservation_written_bytes{reservation=\"metrics-test\"}",
        "the reservation's bytes written",
        |v| v == written as f64,
    );
    prometheus.wait("spillway_manager_pool_capacity_bytes{pool=\"fast\"}", "the pool", |v| {
        v == f64::from(1 << 30)
    });
    prometheus
        .wait("spillway_manager_request_duration_seconds_count", "API latencies", |v| v >= 3.0);

    every_series_of_the_dashboard_is_exported(server_port, manager_port);
}

/// `GET /metrics` of a daemon.
fn scrape(port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// The `spillway_…` names in a text.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("spillway_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// A checkpoint of an odd size moves the ingest counter by exactly that, its drain the PFS
/// counter by the same, and the lag comes and goes.
fn checkpoint_moves_the_counters(prometheus: &Prometheus, server: &ServerProcess) {
    let ingest = "spillway_server_ingest_bytes_total";
    let before = prometheus.wait(ingest, "the ingest counter", |_| true);
    let bytes: u64 = 5 * (1 << 20) + 12_345;
    let mut client = Client::connect(server.endpoints(), ClientOptions::default()).unwrap();
    let epoch = EpochId(7);
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, "rank0/ckpt").unwrap();
    let data = pattern(7, bytes as usize);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        client.write(&mut file, (i as u64) << 20, chunk).unwrap();
    }
    client.commit_epoch(epoch).unwrap();
    let after = prometheus.wait(ingest, "the checkpoint counted", |v| v >= before + bytes as f64);
    assert_eq!(after - before, bytes as f64, "the ingest counter moved by the checkpoint's size");
    prometheus.wait("spillway_server_drain_lag_bytes", "the lag of the committed epoch", |v| {
        v >= bytes as f64
    });

    // Its drain writes the same bytes to the PFS, and the lag goes back to 0.
    client.request_drain(epoch, 1).unwrap();
    let drained =
        prometheus.wait("spillway_server_drain_pfs_bytes_total", "the drain counted", |v| v > 0.0);
    assert_eq!(drained, bytes as f64, "the drain counter moved by the checkpoint's size");
    prometheus.wait("spillway_server_drain_lag_bytes", "no lag once drained", |v| v == 0.0);
    prometheus.wait(
        "sum(spillway_server_request_duration_seconds_count{kind=\"write\"})",
        "write latencies observed",
        |v| v >= 6.0,
    );
}

/// Every series the Grafana dashboard draws is one the daemons export.
fn every_series_of_the_dashboard_is_exported(server_port: u16, manager_port: u16) {
    let exported = format!("{}{}", scrape(server_port), scrape(manager_port));
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops/grafana/spillway.json"),
    )
    .unwrap();
    let names = metric_names(&dashboard);
    assert!(names.len() >= 15, "{names:?}");
    for name in names {
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            exported.contains(&format!("# TYPE {base} ")),
            "the dashboard draws {name}, which no daemon exports"
        );
    }
}
