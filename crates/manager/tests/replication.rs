//! Replication in the manager, without processes: failure domains learnt from heartbeats,
//! `replicas=k` placement and accounting, servers declared lost (by an admin or after
//! `manager.server_lost_after_s` down) and the degraded reservations they leave.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spillway_config::{JobOwnerCheck, ManagerKnobs};
use spillway_manager::db::Db;
use spillway_manager::heartbeat::{heartbeat_round, Prober};
use spillway_manager::service::{ApiError, CreateReservationError, Probe};
use spillway_manager::*;

const MIB: u64 = 1 << 20;

struct TestClock(AtomicU64);
impl Clock for TestClock {
    fn now_unix_s(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Servers answer with the failure domain of their port, unless listed as down.
struct HostProber {
    down: Mutex<Vec<String>>,
    probed: Mutex<Vec<String>>,
}
impl Prober for HostProber {
    fn probe(&self, address: &str) -> Result<Probe, String> {
        self.probed.lock().unwrap().push(address.to_string());
        if self.down.lock().unwrap().iter().any(|a| a == address) {
            return Err(format!("{address}: connection refused"));
        }
        Ok(Probe {
            drains_in_flight: 0,
            auth: "none".into(),
            identity: String::new(),
            failure_domain: Some(domain_of(address).into()),
            epoch_bytes: Default::default(),
        })
    }
}

/// 7001 and 7002 share host h1; 7003 is on h2, 7004 on h3.
fn domain_of(address: &str) -> &'static str {
    match address {
        "127.0.0.1:7001" | "127.0.0.1:7002" => "h1",
        "127.0.0.1:7003" => "h2",
        _ => "h3",
    }
}

fn root() -> Caller {
    Caller::new(0, 0, vec![0], true)
}

struct Setup {
    manager: Manager,
    clock: Arc<TestClock>,
    prober: HostProber,
    _dir: tempfile::TempDir,
}

/// One pool of four servers (64 MiB each) on three hosts; `with_domains`: one heartbeat round
/// taught the manager the hosts.
fn setup(knobs: ManagerKnobs, with_domains: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(TestClock(AtomicU64::new(1000)));
    let db = Db::open(&dir.path().join("m.db")).unwrap();
    let manager = Manager::new(db, knobs, None, clock.clone()).unwrap();
    manager
        .create_pool(&root(), &CreatePool { name: "p".into(), granularity_bytes: 8 * MIB })
        .unwrap();
    for port in [7001, 7002, 7003, 7004] {
        let server = AddServer {
            address: format!("127.0.0.1:{port}"),
            pool: "p".into(),
            capacity_bytes: 64 * MIB,
            pfs_dir: None,
        };
        manager.add_server(&root(), &server).unwrap();
    }
    let prober = HostProber { down: Mutex::new(Vec::new()), probed: Mutex::new(Vec::new()) };
    if with_domains {
        heartbeat_round(&manager, &prober);
    }
    Setup { manager, clock, prober, _dir: dir }
}

fn knobs() -> ManagerKnobs {
    ManagerKnobs {
        fragment_bytes: 8 * MIB,
        stripe_servers_max: 2,
        job_owner_check: JobOwnerCheck::Unchecked,
        ..Default::default()
    }
}

fn replicated(capacity_bytes: u64, replicas: u32) -> CreateReservation {
    CreateReservation { capacity_bytes, replicas: Some(replicas), ..Default::default() }
}

#[test]
fn heartbeats_teach_failure_domains_and_stripes_spread_over_hosts() {
    let s = setup(knobs(), false);
    assert!(s.manager.list_servers().unwrap().iter().all(|v| v.failure_domain.is_none()));
    // Unknown hosts: two copies cannot be promised.
    let error = s.manager.create_reservation(&root(), &replicated(8 * MIB, 2)).unwrap_err();
    assert_eq!(error.status(), 507, "{error}");
    heartbeat_round(&s.manager, &s.prober);
    let servers = s.manager.list_servers().unwrap();
    let domains: Vec<Option<&str>> = servers.iter().map(|v| v.failure_domain.as_deref()).collect();
    assert_eq!(domains, vec![Some("h1"), Some("h1"), Some("h2"), Some("h3")]);
    // Two stripes of one copy go to two hosts, not to 7001 and 7002 (both on h1).
    let one = s
        .manager
        .create_reservation(
            &root(),
            &CreateReservation { capacity_bytes: 16 * MIB, ..Default::default() },
        )
        .unwrap();
    assert_eq!(one.replicas, 1);
    assert_eq!(one.servers, vec!["127.0.0.1:7001".to_string(), "127.0.0.1:7003".to_string()]);
    assert_eq!(one.server_domains, vec![Some("h1".to_string()), Some("h2".to_string())]);
}

#[test]
fn replicas_count_k_copies_on_k_hosts() {
    let s = setup(knobs(), true);
    let r = s.manager.create_reservation(&root(), &replicated(16 * MIB, 2)).unwrap();
    assert_eq!(r.replicas, 2);
    assert_eq!(r.capacity_bytes, 16 * MIB, "the user's capacity is one copy");
    assert_eq!(r.fragments, 4, "two fragments, twice");
    assert_eq!(r.server_fragments.iter().sum::<u64>(), 4);
    let hosts: std::collections::BTreeSet<_> = r.server_domains.iter().collect();
    assert_eq!(hosts.len(), r.servers.len(), "every server on its own host: {r:?}");
    let used: u64 = s.manager.list_servers().unwrap().iter().map(|v| v.used_bytes).sum();
    assert_eq!(used, 32 * MIB, "the servers hold both copies");
    let quota = s.manager.quotas(&root()).unwrap();
    assert_eq!(quota.iter().find(|q| q.uid == 0).unwrap().used_bytes, 32 * MIB);
    assert_eq!(s.manager.show_reservation(&root(), &r.name).unwrap().replicas, 2, "stored");
    // Three copies need three hosts in the stripe: the width allows two.
    let error = s.manager.create_reservation(&root(), &replicated(8 * MIB, 3)).unwrap_err();
    assert!(error.to_string().contains("replicas=3 needs 3 servers"), "{error}");
    for bad in [0, 5] {
        let error = s.manager.create_reservation(&root(), &replicated(8 * MIB, bad)).unwrap_err();
        assert!(matches!(error, CreateReservationError::Invalid { .. }), "{error}");
        assert!(error.to_string().contains("1 to 4 copies"), "{error}");
    }
}

#[test]
fn four_copies_need_four_hosts() {
    let s = setup(ManagerKnobs { stripe_servers_max: 4, ..knobs() }, true);
    let error = s.manager.create_reservation(&root(), &replicated(8 * MIB, 4)).unwrap_err();
    assert_eq!(error.status(), 507);
    assert!(error.to_string().contains("4 distinct failure domains"), "{error}");
    assert!(error.to_string().contains("only 3 available"), "{error}");
    let three = s.manager.create_reservation(&root(), &replicated(8 * MIB, 3)).unwrap();
    assert_eq!(three.servers.len(), 3);
}

#[test]
fn a_lost_server_degrades_its_reservations_and_never_comes_back() {
    let s = setup(knobs(), true);
    let r = s.manager.create_reservation(&root(), &replicated(8 * MIB, 2)).unwrap();
    assert_eq!(r.servers, vec!["127.0.0.1:7001".to_string(), "127.0.0.1:7003".to_string()]);
    assert!(r.degraded.is_none());
    let user = Caller::new(1000, 1000, vec![1000], false);
    let error = s.manager.declare_server_lost(&user, "127.0.0.1:7003").unwrap_err();
    assert_eq!(error.status(), 403);
    let error = s.manager.declare_server_lost(&root(), "127.0.0.1:9").unwrap_err();
    assert_eq!(error.status(), 404);
    let lost = s.manager.declare_server_lost(&root(), "127.0.0.1:7003").unwrap();
    assert_eq!(lost.lost_unix_s, Some(1000));
    assert!(!lost.healthy);
    let shown = s.manager.show_reservation(&root(), &r.name).unwrap();
    let degraded = shown.degraded.expect("degraded");
    assert_eq!(degraded.lost_servers, vec!["127.0.0.1:7003".to_string()]);
    assert_eq!(degraded.replicas_left, 1);
    // 7004 (h3): a host the reservation does not use; 7002 shares h1 with 7001.
    assert_eq!(degraded.replacement.as_deref(), Some("127.0.0.1:7004"));
    let status = s.manager.status(&root(), StatusView::Caller).unwrap();
    assert!(status.reservations[0].degraded.is_some(), "status shows it too");
    // It is no longer probed (nor would an answer bring it back); new reservations avoid it.
    s.prober.probed.lock().unwrap().clear();
    heartbeat_round(&s.manager, &s.prober);
    let probed = s.prober.probed.lock().unwrap().clone();
    assert_eq!(probed.len(), 3, "{probed:?}");
    assert!(!probed.contains(&"127.0.0.1:7003".to_string()));
    let again = s.manager.list_servers().unwrap();
    assert!(!again.iter().find(|v| v.address == "127.0.0.1:7003").unwrap().healthy);
    let other = s.manager.create_reservation(&root(), &replicated(8 * MIB, 2)).unwrap();
    assert!(!other.servers.contains(&"127.0.0.1:7003".to_string()), "{other:?}");
    // Declaring again keeps the first time.
    s.clock.0.store(2000, Ordering::Relaxed);
    let lost = s.manager.declare_server_lost(&root(), "3").unwrap();
    assert_eq!(lost.lost_unix_s, Some(1000));
}

#[test]
fn no_replacement_is_said_in_the_degraded_state() {
    let s = setup(knobs(), true);
    let r = s.manager.create_reservation(&root(), &replicated(8 * MIB, 2)).unwrap();
    // 7004 is the only server on a host the reservation does not use; lose it too.
    s.manager.declare_server_lost(&root(), "127.0.0.1:7004").unwrap();
    s.manager.declare_server_lost(&root(), "127.0.0.1:7003").unwrap();
    let degraded = s.manager.show_reservation(&root(), &r.name).unwrap().degraded.unwrap();
    assert_eq!(degraded.replacement, None);
    assert!(degraded.detail.contains("no replacement"), "{}", degraded.detail);
}

#[test]
fn a_server_down_too_long_is_declared_lost() {
    let s =
        setup(ManagerKnobs { server_lost_after_s: 600, heartbeat_misses_max: 1, ..knobs() }, true);
    let r = s.manager.create_reservation(&root(), &replicated(8 * MIB, 2)).unwrap();
    s.prober.down.lock().unwrap().push("127.0.0.1:7001".into());
    s.clock.0.store(1599, Ordering::Relaxed);
    heartbeat_round(&s.manager, &s.prober);
    let server = |s: &Setup| {
        s.manager
            .list_servers()
            .unwrap()
            .into_iter()
            .find(|v| v.address == "127.0.0.1:7001")
            .unwrap()
    };
    assert!(!server(&s).healthy, "down");
    assert_eq!(server(&s).lost_unix_s, None, "not yet: seen 599 s ago");
    assert!(s.manager.show_reservation(&root(), &r.name).unwrap().degraded.is_none());
    s.clock.0.store(1600, Ordering::Relaxed);
    heartbeat_round(&s.manager, &s.prober);
    assert_eq!(server(&s).lost_unix_s, Some(1600));
    let degraded = s.manager.show_reservation(&root(), &r.name).unwrap().degraded.unwrap();
    assert_eq!(degraded.lost_servers, vec!["127.0.0.1:7001".to_string()]);
    // The lost server's own host (h1, 7002) qualifies, and has the most room with 7004.
    assert!(degraded.replacement.is_some());
}

#[test]
fn losing_automatically_is_off_at_zero() {
    let s =
        setup(ManagerKnobs { server_lost_after_s: 0, heartbeat_misses_max: 1, ..knobs() }, true);
    s.prober.down.lock().unwrap().push("127.0.0.1:7001".into());
    s.clock.0.store(10_000_000, Ordering::Relaxed);
    heartbeat_round(&s.manager, &s.prober);
    let servers = s.manager.list_servers().unwrap();
    assert!(servers.iter().all(|v| v.lost_unix_s.is_none()));
}
