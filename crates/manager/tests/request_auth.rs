//! The manager's API over TCP with `manager.auth = munge`, against a real `munged`
//! (`spillway_harness::Munged`, its own key): every request carries an `Authorization: MUNGE`
//! credential bound to its method, target and body; missing, forged, replayed and misbound
//! credentials get a 401; the Unix socket keeps `SO_PEERCRED`; `ApiClient` signs when told to
//! and when a 401 asks for it.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use spillway_config::{Authentication, ManagerKnobs};
use spillway_harness::Munged;
use spillway_manager::api::{ApiClient, ApiClientError, RequestSigning};
use spillway_manager::db::Db;
use spillway_manager::model::Whoami;
use spillway_manager::request_auth::authorization;
use spillway_manager::{Manager, SystemClock};
use spillway_proto::{transport, Endpoint};

/// A manager serving on `0.0.0.0:0` (TCP, munge) and a Unix socket in `dir`; stopped on drop.
struct Served {
    tcp: SocketAddr,
    unix: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(dir: &Path, munged: &Munged) -> Served {
    let knobs = ManagerKnobs {
        auth: Authentication::Munge,
        munge_socket: munged.socket().display().to_string(),
        listen_address: "0.0.0.0:0".into(),
        ..ManagerKnobs::default()
    };
    knobs.validate().expect("a munge manager may listen on any address");
    let db = Db::open(&dir.join("manager.db")).unwrap();
    let manager = Arc::new(Manager::new(db, knobs, None, Arc::new(SystemClock)).unwrap());
    let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let tcp = transport::bind(&Endpoint::Tcp(any), true).unwrap();
    let Endpoint::Tcp(bound) = tcp.endpoint() else { panic!("not TCP") };
    let unix = dir.join("manager.sock");
    let unix_listener = transport::bind(&Endpoint::Unix(unix.clone()), false).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            spillway_manager::http::serve(manager, vec![tcp, unix_listener], stop)
        })
    };
    Served {
        tcp: SocketAddr::from(([127, 0, 0, 1], bound.port())),
        unix,
        stop,
        thread: Some(thread),
    }
}

/// One raw HTTP exchange over TCP: status line and whole reply.
fn raw(address: SocketAddr, method: &str, target: &str, body: &[u8], auth: Option<&str>) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let header = auth.map(|value| format!("Authorization: {value}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n{header}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

fn status(reply: &str) -> u16 {
    reply.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

#[test]
fn munge_authenticates_every_tcp_request() {
    let munged = Munged::started();
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), &munged);
    let context = munged.context();
    let me = spillway_sys::user::euid();

    // Signed by the CLI's client: the credential's uid is the caller.
    let signed = ApiClient::new(&served.tcp.to_string())
        .unwrap()
        .with_signing(RequestSigning::Always, Some(munged.socket().to_path_buf()));
    let whoami: Whoami = signed.get("/v1/whoami").unwrap();
    assert_eq!(whoami.uid, me);

    // Unset: a 401 naming munge makes the client sign and send again.
    let asked = ApiClient::new(&served.tcp.to_string())
        .unwrap()
        .with_signing(RequestSigning::WhenAsked, Some(munged.socket().to_path_buf()));
    assert_eq!(asked.get::<Whoami>("/v1/whoami").unwrap().uid, me);

    // Never signing: refused with the manager's explanation.
    let unsigned =
        ApiClient::new(&served.tcp.to_string()).unwrap().with_signing(RequestSigning::Never, None);
    match unsigned.get::<Whoami>("/v1/whoami") {
        Err(ApiClientError::Api { status: 401, kind, message }) => {
            assert_eq!(kind, "munge_required");
            assert!(message.contains("Authorization: MUNGE"), "{message}");
        }
        other => panic!("an unsigned request over TCP must get a 401, got {other:?}"),
    }

    // Raw: no header.
    let reply = raw(served.tcp, "GET", "/v1/whoami", b"", None);
    assert_eq!(status(&reply), 401, "{reply}");
    assert!(reply.contains("WWW-Authenticate: MUNGE"), "{reply}");

    // A valid credential works once; the same header again is a replay.
    let header = authorization(&context, "GET", "/v1/whoami", b"").unwrap();
    let first = raw(served.tcp, "GET", "/v1/whoami", b"", Some(&header));
    assert_eq!(status(&first), 200, "{first}");
    let replayed = raw(served.tcp, "GET", "/v1/whoami", b"", Some(&header));
    assert_eq!(status(&replayed), 401, "{replayed}");
    assert!(replayed.to_lowercase().contains("replay"), "{replayed}");

    // Bound to method, target and body: moved elsewhere it is refused.
    let body = br#"{"name":"p","granularity_bytes":8388608}"#;
    let for_pools = authorization(&context, "POST", "/v1/pools", body).unwrap();
    let other_body = br#"{"name":"q","granularity_bytes":8388608}"#;
    let moved = raw(served.tcp, "POST", "/v1/pools", other_body, Some(&for_pools));
    assert_eq!(status(&moved), 401, "{moved}");
    assert!(moved.contains("another request"), "{moved}");
    let for_whoami = authorization(&context, "GET", "/v1/whoami", b"").unwrap();
    let moved = raw(served.tcp, "GET", "/v1/status", b"", Some(&for_whoami));
    assert_eq!(status(&moved), 401, "{moved}");
    let for_list = authorization(&context, "GET", "/v1/reservations", b"").unwrap();
    let moved = raw(served.tcp, "GET", "/v1/reservations?all=1", b"", Some(&for_list));
    assert_eq!(status(&moved), 401, "{moved}");

    // Forged: a credential of another munged (another key).
    let forger = Munged::started();
    let forged = authorization(&forger.context(), "GET", "/v1/whoami", b"").unwrap();
    let reply = raw(served.tcp, "GET", "/v1/whoami", b"", Some(&forged));
    assert_eq!(status(&reply), 401, "{reply}");
    assert!(reply.contains("munge credential refused"), "{reply}");

    // Garbage and another scheme.
    let reply = raw(served.tcp, "GET", "/v1/whoami", b"", Some("MUNGE MUNGE:not-a-credential:"));
    assert_eq!(status(&reply), 401, "{reply}");
    let reply = raw(served.tcp, "GET", "/v1/whoami", b"", Some("Bearer abc"));
    assert_eq!(status(&reply), 401, "{reply}");

    // The Unix socket keeps SO_PEERCRED: no header needed.
    let local = ApiClient::new(&served.unix.display().to_string())
        .unwrap()
        .with_signing(RequestSigning::Never, None);
    assert_eq!(local.get::<Whoami>("/v1/whoami").unwrap().uid, me);
}

#[test]
fn only_a_munge_manager_listens_beyond_loopback() {
    let knobs = |auth| ManagerKnobs {
        auth,
        listen_address: "0.0.0.0:7999".into(),
        ..ManagerKnobs::default()
    };
    let refused = knobs(Authentication::None).validate().unwrap_err().to_string();
    assert!(refused.contains("munge"), "{refused}");
    knobs(Authentication::Munge).validate().unwrap();
    ManagerKnobs { listen_address: "127.0.0.1:7999".into(), ..ManagerKnobs::default() }
        .validate()
        .unwrap();
}
