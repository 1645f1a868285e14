//! The manager's API under load, over a real Unix socket in this process: a manager at its
//! connection limit answers `503` with `Retry-After` (and the client reads it, no reset), and
//! slow clients cannot hold it: 70 connections trickling a request that never ends are cut off
//! by the whole-request deadline, and a normal client (which retries a busy answer) gets its
//! status.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spillway_config::{JobOwnerCheck, ManagerKnobs};
use spillway_manager::db::Db;
use spillway_manager::{ApiClient, Manager, Status, SystemClock};
use spillway_proto::Endpoint;

/// A manager serving its API on `<dir>/manager.sock` from a thread; stopped when dropped.
struct Served {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    fn start(dir: &Path, knobs: ManagerKnobs) -> Served {
        let socket = dir.join("manager.sock");
        let db = Db::open(&dir.join("manager.db")).unwrap();
        let manager = Arc::new(Manager::new(db, knobs, None, Arc::new(SystemClock)).unwrap());
        let listener =
            spillway_proto::transport::bind(&Endpoint::Unix(socket.clone()), false).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_for_thread = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            spillway_manager::http::serve(manager, vec![listener], stop_for_thread)
        });
        Served { socket, stop, thread: Some(thread) }
    }

    /// A connection that sends nothing yet.
    fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.socket).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn knobs(connections_max: u32, request_timeout_ms: u64) -> ManagerKnobs {
    ManagerKnobs {
        connections_max,
        connections_per_uid_max: connections_max,
        request_timeout_ms,
        job_owner_check: JobOwnerCheck::Unchecked,
        ..Default::default()
    }
}

/// Waits until the manager holds `count` connections open (they get no answer).
fn wait_until_held(connections: &mut [UnixStream]) {
    for connection in connections.iter_mut() {
        connection.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut byte = [0u8; 1];
        match connection.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a held connection was answered or closed: {other:?}"),
        }
    }
}

#[test]
fn a_busy_manager_answers_503_with_retry_after_and_no_reset() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(dir.path(), knobs(2, 60_000));
    let mut held = vec![served.connect(), served.connect()];
    wait_until_held(&mut held);
    for attempt in 0..20 {
        let mut client = served.connect();
        client
            .write_all(b"GET /v1/status HTTP/1.1\r\nHost: m\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        let mut reply = Vec::new();
        // The whole reply, then end-of-file: a reset here is what a busy manager must not do.
        client
            .read_to_end(&mut reply)
            .unwrap_or_else(|e| panic!("attempt {attempt}: reading the busy answer: {e}"));
        let text = String::from_utf8_lossy(&reply);
        assert!(text.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{text}");
        assert!(text.contains("\r\nRetry-After: 1\r\n"), "{text}");
        assert!(text.contains("\"kind\":\"busy\""), "{text}");
        assert!(text.contains("knob manager.connections_max"), "{text}");
    }
    // Once a connection is free again, a request is served.
    drop(held);
    let status: Status =
        ApiClient::new(served.socket.to_str().unwrap()).unwrap().get("/v1/status").unwrap();
    assert!(status.reservations.is_empty());
}

#[test]
fn seventy_slow_clients_do_not_starve_a_normal_one() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(dir.path(), knobs(64, 1_000));
    // 70 connections that each send a request head one byte every 100 ms and never end it: a
    // per-read timeout would never fire; only the whole-request deadline cuts them off.
    let mut slow: Vec<UnixStream> = (0..70).map(|_| served.connect()).collect();
    for connection in &mut slow {
        connection.write_all(b"GET /v1/status HTTP/1.1\r\nX-Slow: ").unwrap();
    }
    let trickling = Arc::new(AtomicBool::new(true));
    let trickler = {
        let trickling = Arc::clone(&trickling);
        std::thread::spawn(move || {
            while trickling.load(Ordering::Relaxed) {
                for connection in &mut slow {
                    let _ = connection.write(b"a"); // cut off: the write fails, fine
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let client = ApiClient::new(served.socket.to_str().unwrap()).unwrap();
    let outcome = client.get::<Status>("/v1/status");
    trickling.store(false, Ordering::Relaxed);
    trickler.join().unwrap();
    let status = outcome.expect("a normal client's status while 70 slow clients are attached");
    assert!(status.pools.is_empty());
}
