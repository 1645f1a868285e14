//! The manager's operations against a real SQLite file, without processes: authorization,
//! quotas, placement, streams, heartbeat bookkeeping, and state surviving a restart.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use spillway_config::{JobOwnerCheck, ManagerKnobs, StreamKeyKind};
use spillway_manager::db::Db;
use spillway_manager::heartbeat::{heartbeat_round, Prober};
use spillway_manager::service::{
    ApiError, CreateReservationError, DestroyError, LookupError, Probe,
};
use spillway_manager::*;

const MIB: u64 = 1 << 20;

struct TestClock(AtomicU64);
impl Clock for TestClock {
    fn now_unix_s(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Test knobs: small fragments; job ownership unchecked unless a test gives a fake Slurm.
fn knobs() -> ManagerKnobs {
    ManagerKnobs {
        fragment_bytes: 8 * MIB,
        stripe_servers_max: 2,
        streams_max: 2,
        job_owner_check: JobOwnerCheck::Unchecked,
        ..Default::default()
    }
}

fn open(path: &Path, knobs: ManagerKnobs) -> Manager {
    Manager::new(Db::open(path).unwrap(), knobs, None, Arc::new(TestClock(AtomicU64::new(1000))))
        .unwrap()
}

fn root() -> Caller {
    Caller::new(0, 0, vec![0], true)
}
fn user(uid: u32) -> Caller {
    Caller::new(uid, uid, vec![uid], false)
}

/// Two pools of two servers, 64 MiB each.
fn setup(manager: &Manager) {
    for (pool, base) in [("fast", 7001), ("slow", 7101)] {
        manager
            .create_pool(&root(), &CreatePool { name: pool.into(), granularity_bytes: 8 * MIB })
            .unwrap();
        for port in [base, base + 1] {
            manager
                .add_server(
                    &root(),
                    &AddServer {
                        address: format!("127.0.0.1:{port}"),
                        pool: pool.into(),
                        capacity_bytes: 64 * MIB,
                        pfs_dir: None,
                    },
                )
                .unwrap();
        }
    }
}

fn request(capacity_bytes: u64) -> CreateReservation {
    CreateReservation { capacity_bytes, ..Default::default() }
}

#[test]
fn only_admins_manage_pools_and_servers() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    let error = manager
        .create_pool(&user(1000), &CreatePool { name: "p".into(), granularity_bytes: MIB })
        .unwrap_err();
    assert_eq!(error.status(), 403);
    assert!(error.to_string().contains("uid 1000 may not manage pools"), "{error}");
    setup(&manager);
    let error = manager
        .add_server(
            &user(1000),
            &AddServer {
                address: "127.0.0.1:9".into(),
                pool: "fast".into(),
                capacity_bytes: MIB,
                pfs_dir: None,
            },
        )
        .unwrap_err();
    assert_eq!(error.status(), 403);
    let error = manager
        .add_server(
            &root(),
            &AddServer {
                address: "127.0.0.1:9".into(),
                pool: "nope".into(),
                capacity_bytes: MIB,
                pfs_dir: None,
            },
        )
        .unwrap_err();
    assert!(error.to_string().contains("no pool named \"nope\""), "{error}");
    let error = manager
        .add_server(
            &root(),
            &AddServer {
                address: "0.0.0.0:9".into(),
                pool: "fast".into(),
                capacity_bytes: MIB,
                pfs_dir: None,
            },
        )
        .unwrap_err();
    assert!(error.to_string().contains("not the address of one server"), "{error}");
    let error = manager
        .create_pool(&root(), &CreatePool { name: "fast".into(), granularity_bytes: MIB })
        .unwrap_err();
    assert_eq!(error.status(), 409);
}

#[test]
fn users_see_and_destroy_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let mine = create_job_42(&manager);
    assert_hidden_from_another_user(&manager, &mine);
    let other = user(1001);
    // The owner and root see it.
    assert_eq!(manager.show_reservation(&user(1000), "job-42").unwrap().id, mine.id);
    assert_eq!(manager.list_reservations(&root(), true).unwrap().len(), 1);
    assert!(
        manager.list_reservations(&root(), false).unwrap().is_empty(),
        "root's own only without --all"
    );
    // A user may not act for another uid; root may.
    let error = manager
        .create_reservation(
            &other,
            &CreateReservation { owner: Some(1000), group: Some(1000), ..request(MIB) },
        )
        .unwrap_err();
    assert!(matches!(error, CreateReservationError::NotAuthorized { uid: 1001, owner: 1000 }));
    let for_user = manager.create_reservation(&root(), &job_43_for_uid_1001()).unwrap();
    assert_eq!((for_user.owner, for_user.group), (1001, 1001));
    assert_eq!(manager.show_reservation(&other, "job-43").unwrap().id, for_user.id);
    // Wrong job at teardown is refused; the right one destroys.
    let error = manager.destroy_reservation(&root(), "job-42", Some("99"), false).unwrap_err();
    assert!(matches!(error, DestroyError::JobMismatch { .. }), "{error}");
    let destroyed = manager.destroy_reservation(&user(1000), "job-42", Some("42"), false).unwrap();
    assert_eq!(destroyed.reservation.state, ReservationState::Destroyed);
    assert!(
        manager.show_reservation(&user(1000), "job-42").is_err(),
        "names resolve to active reservations only"
    );
    // A second reservation for the same job while the first is active is refused.
    let error = manager.create_reservation(&root(), &job_43_for_uid_1001()).unwrap_err();
    assert!(
        matches!(
            error,
            CreateReservationError::NameTaken { .. }
                | CreateReservationError::JobHasReservation { .. }
        ),
        "{error}"
    );
}

/// Uid 1000 creates the reservation of job 42 (20 MiB), checked for name, owner and placement.
fn create_job_42(manager: &Manager) -> Reservation {
    let mine = manager
        .create_reservation(
            &user(1000),
            &CreateReservation { job: Some("42".into()), ..request(20 * MIB) },
        )
        .unwrap();
    assert_eq!(mine.name, "job-42");
    assert_eq!(mine.owner, 1000);
    assert_eq!(mine.fragments, 3, "20 MiB in 8 MiB fragments");
    assert_eq!(mine.capacity_bytes, 24 * MIB);
    assert_eq!(mine.servers.len(), 2, "striped over stripe_servers_max = 2");
    assert_eq!(mine.server_fragments.iter().sum::<u64>(), 3);
    mine
}

/// Another user (uid 1001) cannot see `mine` by id or name nor destroy it; its lists are empty.
fn assert_hidden_from_another_user(manager: &Manager, mine: &Reservation) {
    let other = user(1001);
    assert!(matches!(
        manager.show_reservation(&other, "job-42"),
        Err(LookupError::NotFound { .. })
    ));
    assert!(matches!(
        manager.show_reservation(&other, &mine.id.to_string()),
        Err(LookupError::NotFound { .. })
    ));
    let error = manager.destroy_reservation(&other, "job-42", None, false).unwrap_err();
    assert!(matches!(error, DestroyError::NotFound { .. }));
    assert_eq!(error.status(), 404);
    assert!(manager.list_reservations(&other, true).unwrap().is_empty());
}

/// The request root makes for job 43, owned by uid 1001.
fn job_43_for_uid_1001() -> CreateReservation {
    CreateReservation {
        owner: Some(1001),
        group: Some(1001),
        job: Some("43".into()),
        ..request(MIB)
    }
}

#[test]
fn persistent_reservations_are_shared_with_allowed_users_only() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let shared = manager
        .create_reservation(
            &user(1000),
            &CreateReservation {
                persistent: Some("dataset".into()),
                allowed_uids: vec![1002],
                allowed_gids: vec![500],
                ..request(MIB)
            },
        )
        .unwrap();
    assert!(shared.persistent);
    assert_eq!(manager.show_reservation(&user(1002), "dataset").unwrap().id, shared.id);
    let in_group = Caller::new(1003, 1003, vec![1003, 500], false);
    assert_eq!(manager.show_reservation(&in_group, "dataset").unwrap().id, shared.id);
    assert!(manager.show_reservation(&user(1004), "dataset").is_err());
    // Allowed users use it but do not destroy it.
    let error = manager.destroy_reservation(&user(1002), "dataset", None, false).unwrap_err();
    assert!(matches!(error, DestroyError::NotAuthorized { .. }), "{error}");
    let error = manager
        .create_reservation(
            &user(1000),
            &CreateReservation { persistent: Some("dataset".into()), ..request(MIB) },
        )
        .unwrap_err();
    assert!(matches!(error, CreateReservationError::NameTaken { .. }));
    for bad in ["12", "job-x", "a b", ""] {
        let error = manager
            .create_reservation(
                &user(1000),
                &CreateReservation { persistent: Some(bad.into()), ..request(MIB) },
            )
            .unwrap_err();
        assert!(matches!(error, CreateReservationError::Invalid { .. }), "{bad:?}: {error}");
    }
}

#[test]
fn quota_exceeded_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let manager =
        open(&dir.path().join("m.db"), ManagerKnobs { quota_bytes_default: 32 * MIB, ..knobs() });
    setup(&manager);
    manager.create_reservation(&user(1000), &request(24 * MIB)).unwrap();
    let error = manager.create_reservation(&user(1000), &request(9 * MIB)).unwrap_err();
    assert_eq!(error.status(), 403);
    assert_eq!(error.kind(), "quota_exceeded");
    assert_eq!(
        error.to_string(),
        "quota exceeded for uid 1000: 24.0 MiB in use + 16.0 MiB asked > quota 32.0 MiB"
    );
    // Per-user row overrides the default; only admins set it.
    assert!(manager.set_quota(&user(1000), 1000, &SetQuota { bytes: 0 }).is_err());
    manager.set_quota(&root(), 1000, &SetQuota { bytes: 0 }).unwrap();
    manager.create_reservation(&user(1000), &request(9 * MIB)).unwrap();
    let quotas = manager.quotas(&user(1000)).unwrap();
    assert_eq!(quotas, vec![Quota { uid: 1000, bytes: 0, used_bytes: 40 * MIB, default: false }]);
}

#[test]
fn capacity_runs_out_with_the_shortfall_named() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    // Each pool: 2 × 64 MiB = 16 fragments; stripe width 2.
    let error = manager.create_reservation(&user(1), &request(200 * MIB)).unwrap_err();
    assert_eq!(error.kind(), "no_capacity");
    assert!(error.to_string().contains("pool fast: 25 fragments"), "{error}");
    let error = manager
        .create_reservation(
            &user(1),
            &CreateReservation { pool: Some("none".into()), ..request(MIB) },
        )
        .unwrap_err();
    assert!(matches!(error, CreateReservationError::NoSuchPool { .. }));
}

#[test]
fn pools_by_algorithm_2_and_streams_by_algorithm_1() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    // Idle pool first (lowest id), then the other idle pool, then one without this user.
    let a = manager.create_reservation(&user(1), &request(MIB)).unwrap();
    let b = manager.create_reservation(&user(1), &request(MIB)).unwrap();
    let c = manager.create_reservation(&user(2), &request(MIB)).unwrap();
    assert_eq!((a.pool.as_str(), b.pool.as_str()), ("fast", "slow"));
    assert_eq!(c.pool, "fast", "both busy, neither has user 2: least used, lowest id");
    // Streams per pool, keyed by user: user 1 and user 2 in "fast" get different streams;
    // user 1's second job in "fast" keeps its stream.
    assert_ne!(a.stream, c.stream);
    let d = manager
        .create_reservation(
            &user(1),
            &CreateReservation { pool: Some("fast".into()), ..request(MIB) },
        )
        .unwrap();
    assert_eq!(d.stream, a.stream);
    // Epochs and namespace ids are unique.
    let mut epochs = vec![a.epoch, b.epoch, c.epoch, d.epoch];
    epochs.sort();
    epochs.dedup();
    assert_eq!(epochs.len(), 4, "every reservation has its own epoch");
    let mut namespaces = vec![a.namespace_id, b.namespace_id, c.namespace_id, d.namespace_id];
    namespaces.sort();
    namespaces.dedup();
    assert_eq!(namespaces.len(), 4, "every reservation has its own namespace id");
    let pools = manager.list_pools(&root()).unwrap();
    assert_eq!(pools[0].keys_per_stream, vec![1, 1]);
    // Keyed by job, every reservation is its own key: with 2 streams the third shares.
    let dir = tempfile::tempdir().unwrap();
    let manager =
        open(&dir.path().join("m.db"), ManagerKnobs { stream_key: StreamKeyKind::Job, ..knobs() });
    setup(&manager);
    let streams: Vec<u16> = (0..3)
        .map(|_| {
            manager
                .create_reservation(
                    &user(1),
                    &CreateReservation { pool: Some("fast".into()), ..request(MIB) },
                )
                .unwrap()
                .stream
        })
        .collect();
    assert_eq!(streams, vec![0, 1, 0]);
}

#[test]
fn state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let (kept, stream) = {
        let manager = open(&path, knobs());
        setup(&manager);
        manager.set_quota(&root(), 7, &SetQuota { bytes: 100 * MIB }).unwrap();
        let kept = manager
            .create_reservation(
                &user(7),
                &CreateReservation { persistent: Some("keep".into()), ..request(20 * MIB) },
            )
            .unwrap();
        let gone = manager.create_reservation(&user(8), &request(MIB)).unwrap();
        manager.destroy_reservation(&user(8), &gone.id.to_string(), None, false).unwrap();
        (kept.clone(), kept.stream)
    };
    let manager = open(&path, knobs());
    assert_eq!(manager.list_pools(&root()).unwrap().len(), 2);
    assert_eq!(manager.list_servers().unwrap().len(), 4);
    let shown = manager.show_reservation(&user(7), "keep").unwrap();
    assert_eq!(shown, kept);
    assert_eq!(manager.list_reservations(&root(), true).unwrap().len(), 1);
    assert_eq!(manager.quotas(&user(7)).unwrap()[0].bytes, 100 * MIB);
    // The stream table was rebuilt: user 7 keeps its stream in that pool, and the next id
    // counters continue (no epoch reused).
    let again = manager
        .create_reservation(
            &user(7),
            &CreateReservation { pool: Some(kept.pool.clone()), ..request(MIB) },
        )
        .unwrap();
    assert_eq!(again.stream, stream);
    assert!(again.epoch > kept.epoch + 1);
    let used: u64 = manager.list_servers().unwrap().iter().map(|s| s.used_bytes).sum();
    assert_eq!(used, 24 * MIB + 8 * MIB, "the destroyed reservation's capacity stays free");
}

struct FlakyProber {
    down: std::sync::Mutex<Vec<String>>,
}
impl Prober for FlakyProber {
    fn probe(&self, address: &str) -> Result<Probe, String> {
        if self.down.lock().unwrap().iter().any(|a| a == address) {
            Err(format!("{address}: connection refused"))
        } else {
            Ok(Probe {
                drains_in_flight: 1,
                auth: "munge".into(),
                identity: format!("{:032x} #1", address.len()),
                failure_domain: None,
                epoch_bytes: Default::default(),
            })
        }
    }
}

#[test]
fn a_server_missing_heartbeats_is_marked_down_and_avoided() {
    let dir = tempfile::tempdir().unwrap();
    let manager =
        open(&dir.path().join("m.db"), ManagerKnobs { heartbeat_misses_max: 2, ..knobs() });
    setup(&manager);
    let prober = FlakyProber { down: std::sync::Mutex::new(vec!["127.0.0.1:7001".into()]) };
    heartbeat_round(&manager, &prober);
    let server = |m: &Manager| {
        m.list_servers().unwrap().into_iter().find(|s| s.address == "127.0.0.1:7001").unwrap()
    };
    assert!(server(&manager).healthy, "one miss is not enough");
    heartbeat_round(&manager, &prober);
    let down = server(&manager);
    assert!(!down.healthy);
    assert_eq!(down.misses, 2);
    let fast = manager
        .create_reservation(
            &user(1),
            &CreateReservation { pool: Some("fast".into()), ..request(16 * MIB) },
        )
        .unwrap();
    assert_eq!(
        fast.servers,
        vec!["127.0.0.1:7002".to_string()],
        "the down server gets no fragment"
    );
    assert_eq!(
        manager.status(&root(), StatusView::Caller).unwrap().drains_in_flight,
        3,
        "from the three live servers"
    );
    prober.down.lock().unwrap().clear();
    heartbeat_round(&manager, &prober);
    assert!(server(&manager).healthy);
    assert!(server(&manager).last_seen_unix_s.is_some());
    assert_eq!(server(&manager).auth.as_deref(), Some("munge"), "what the heartbeat saw");
    let identity = format!("{:032x} #1", "127.0.0.1:7001".len());
    assert_eq!(server(&manager).identity, Some(identity), "what the heartbeat saw");
}

/// Slurm as the unit tests see it: job 42 belongs to uid 1000, job 43 to uid 1001, any other
/// job is unknown; or Slurm cannot be asked at all. Counts the questions.
struct FakeSlurm {
    reachable: bool,
    asked: AtomicU64,
}

impl JobOwners for FakeSlurm {
    fn owner_of(&self, job: &str) -> Result<u32, JobOwnerError> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        if !self.reachable {
            return Err(JobOwnerError::Unavailable {
                reason: "squeue --jobs=5 --format=%U: no answer within 5000 ms".into(),
            });
        }
        match job {
            "42" => Ok(1000),
            "43" => Ok(1001),
            _ => Err(JobOwnerError::UnknownJob { job: job.into() }),
        }
    }
}

fn with_fake_slurm(manager: Manager, reachable: bool) -> (Manager, Arc<FakeSlurm>) {
    let slurm = Arc::new(FakeSlurm { reachable, asked: AtomicU64::new(0) });
    (manager.with_job_owners(Some(slurm.clone())), slurm)
}

fn for_job(job: &str) -> CreateReservation {
    CreateReservation { job: Some(job.into()), ..request(MIB) }
}

#[test]
fn a_user_cannot_reserve_for_another_users_job() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, slurm) = with_fake_slurm(open(&dir.path().join("m.db"), knobs()), true);
    setup(&manager);
    // Uid 1001 squatting job 42 (uid 1000's) is refused, naming the job's owner.
    let error = manager.create_reservation(&user(1001), &for_job("42")).unwrap_err();
    assert!(matches!(error, CreateReservationError::NotJobOwner { owner: 1000, .. }), "{error}");
    assert_eq!((error.status(), error.kind()), (403, "not_job_owner"));
    assert_eq!(
        error.to_string(),
        "job 42 belongs to uid 1000; only its owner or root can reserve for it"
    );
    // Nor may an admin give job 42's reservation to someone other than its owner.
    let admin = Caller::new(1005, 1005, vec![1005], true);
    let error = manager
        .create_reservation(
            &admin,
            &CreateReservation { owner: Some(1001), group: Some(1001), ..for_job("42") },
        )
        .unwrap_err();
    assert!(matches!(error, CreateReservationError::NotJobOwner { .. }), "{error}");
    // A job Slurm does not know, and a job id Slurm cannot be asked about.
    let error = manager.create_reservation(&user(1000), &for_job("77")).unwrap_err();
    assert_eq!((error.status(), error.kind()), (404, "unknown_job"), "{error}");
    let error = manager.create_reservation(&user(1000), &for_job("x-1")).unwrap_err();
    assert!(error.to_string().contains("is not a Slurm job id"), "{error}");
    // The owner may; root may for anyone without Slurm being asked.
    let asked = slurm.asked.load(Ordering::Relaxed);
    assert_eq!(manager.create_reservation(&user(1000), &for_job("42")).unwrap().owner, 1000);
    assert_eq!(slurm.asked.load(Ordering::Relaxed), asked + 1);
    let mine = manager.create_reservation(&root(), &job_43_for_uid_1001()).unwrap();
    assert_eq!(mine.owner, 1001);
    assert_eq!(slurm.asked.load(Ordering::Relaxed), asked + 1, "root's request asks no one");
    // A reservation without a job asks no one either.
    manager.create_reservation(&user(1001), &request(MIB)).unwrap();
    assert_eq!(slurm.asked.load(Ordering::Relaxed), asked + 1);
}

#[test]
fn without_slurm_job_reservations_are_refused_unless_the_check_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _) = with_fake_slurm(open(&dir.path().join("m.db"), knobs()), false);
    setup(&manager);
    let error = manager.create_reservation(&user(1000), &for_job("42")).unwrap_err();
    assert_eq!((error.status(), error.kind()), (503, "job_owner_unavailable"));
    let message = error.to_string();
    assert!(message.contains("cannot ask Slurm who owns job 42"), "{message}");
    assert!(message.contains("manager.job_owner_check"), "{message}");
    // The knob's "none": nobody is asked (the setup hook still refuses a squatted job-N).
    let dir = tempfile::tempdir().unwrap();
    let unchecked = open(&dir.path().join("m.db"), knobs());
    setup(&unchecked);
    unchecked.create_reservation(&user(1001), &for_job("42")).unwrap();
}

/// Uid 1000's persistent reservation `dataset`, used by Slurm job 7 (registered by root).
fn dataset_used_by_job_7(manager: &Manager) -> Reservation {
    manager
        .create_reservation(
            &user(1000),
            &CreateReservation { persistent: Some("dataset".into()), ..request(MIB) },
        )
        .unwrap();
    let error = manager.register_job(&user(1000), "dataset", "7").unwrap_err();
    assert_eq!((error.status(), error.kind()), (403, "not_authorized"), "{error}");
    let registered = manager.register_job(&root(), "dataset", "7").unwrap();
    assert_eq!(registered.jobs, vec!["7".to_string()]);
    assert_eq!(manager.register_job(&root(), "dataset", "7").unwrap().jobs.len(), 1, "again");
    registered
}

#[test]
fn a_persistent_reservation_in_use_is_destroyed_only_by_root_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    dataset_used_by_job_7(&manager);
    // Its owner cannot destroy it under the job, nor can root without force.
    for caller in [user(1000), root()] {
        let error = manager.destroy_reservation(&caller, "dataset", None, false).unwrap_err();
        assert_eq!((error.status(), error.kind()), (409, "in_use"), "{error}");
        assert!(error.to_string().starts_with("reservation dataset is used by job 7"), "{error}");
    }
    let error = manager.destroy_reservation(&user(1000), "dataset", None, true).unwrap_err();
    assert!(matches!(error, DestroyError::ForceNotAuthorized { uid: 1000, .. }), "{error}");
    // Once the job is gone (teardown unregisters it, twice is harmless) the owner may.
    manager.unregister_job(&root(), "dataset", "7").unwrap();
    assert!(manager.unregister_job(&root(), "dataset", "7").unwrap().jobs.is_empty());
    manager.destroy_reservation(&user(1000), "dataset", None, false).unwrap();
    // Root with force destroys one in use; job reservations record no jobs.
    dataset_used_by_job_7(&manager);
    let destroyed = manager.destroy_reservation(&root(), "dataset", None, true).unwrap();
    assert_eq!(destroyed.reservation.state, ReservationState::Destroyed);
    manager.create_reservation(&user(1000), &for_job("42")).unwrap();
    let error = manager.register_job(&root(), "job-42", "42").unwrap_err();
    assert_eq!(error.kind(), "not_persistent", "{error}");
}

#[test]
fn status_shows_a_user_only_their_own_reservations() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let mine = create_job_42(&manager);
    let other = manager.status(&user(1001), StatusView::Caller).unwrap();
    assert!(other.reservations.is_empty(), "{:?}", other.reservations);
    assert_eq!(other.used_bytes, mine.capacity_bytes, "aggregate capacity is everyone's");
    for pool in other.pools.iter().chain(&manager.list_pools(&user(1001)).unwrap()) {
        assert_eq!(pool.reservations, 0, "pool {}: another user's reservation counted", pool.name);
        assert!(pool.keys_per_stream.is_empty(), "pool {}: stream keys shown", pool.name);
    }
    let json = serde_json::to_string(&other).unwrap();
    assert!(!json.contains("job-42"), "{json}");
    // The owner sees theirs; root sees all; the aggregate view shows none, even to root.
    let own = manager.status(&user(1000), StatusView::Caller).unwrap();
    assert_eq!(own.reservations.iter().map(|r| r.id).collect::<Vec<_>>(), vec![mine.id]);
    assert_eq!(own.pools.iter().map(|p| p.reservations).sum::<u64>(), 1);
    assert_eq!(manager.status(&root(), StatusView::Caller).unwrap().reservations.len(), 1);
    let aggregate = manager.status(&root(), StatusView::Aggregate).unwrap();
    assert!(aggregate.reservations.is_empty());
    assert!(aggregate.pools.iter().all(|p| p.reservations == 0 && p.keys_per_stream.is_empty()));
    assert_eq!(aggregate.used_bytes, mine.capacity_bytes);
}

#[test]
fn a_reservation_keeps_the_tiering_strategy_it_was_made_with() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let manager = open(&path, knobs());
    setup(&manager);
    let strategy = Some(spillway_policy::Strategy::InterferenceAware);
    let made = manager
        .create_reservation(
            &user(1000),
            &CreateReservation { job: Some("44".into()), tiering: strategy, ..request(MIB) },
        )
        .unwrap();
    assert_eq!(made.tiering, strategy);
    let plain = manager
        .create_reservation(
            &user(1000),
            &CreateReservation { job: Some("45".into()), ..request(MIB) },
        )
        .unwrap();
    assert_eq!(plain.tiering, None, "no strategy named: the site's default");
    drop(manager);
    // Kept in the database across a restart.
    let manager = open(&path, knobs());
    assert_eq!(manager.show_reservation(&user(1000), "job-44").unwrap().tiering, strategy);
    assert_eq!(manager.show_reservation(&user(1000), "job-45").unwrap().tiering, None);
}

/// A prober that finds every server up, with `drains` in flight, each holding `epoch_bytes`.
struct UpProber {
    drains: u32,
    epoch_bytes: std::collections::BTreeMap<u64, u64>,
}
impl UpProber {
    fn drains(drains: u32) -> UpProber {
        UpProber { drains, epoch_bytes: Default::default() }
    }
}
impl Prober for UpProber {
    fn probe(&self, address: &str) -> Result<Probe, String> {
        Ok(Probe {
            drains_in_flight: self.drains,
            auth: "none".into(),
            identity: format!("{:032x} #1", address.len()),
            failure_domain: None,
            epoch_bytes: self.epoch_bytes.clone(),
        })
    }
}

#[test]
fn written_bytes_sum_the_reservations_epoch_over_its_servers() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let request = CreateReservation { pool: Some("fast".into()), ..request(16 * MIB) };
    let striped = manager.create_reservation(&user(1000), &request).unwrap();
    assert_eq!(striped.servers.len(), 2);
    assert_eq!(manager.written_bytes().unwrap()[&striped.id], 0, "no heartbeat yet");
    let epoch_bytes = [(striped.epoch, 1000), (striped.epoch + 100, 7)].into_iter().collect();
    heartbeat_round(&manager, &UpProber { drains: 0, epoch_bytes });
    assert_eq!(manager.written_bytes().unwrap()[&striped.id], 2000, "1000 on each of 2 servers");
}

fn listed(manager: &Manager, address: &str) -> Option<Server> {
    manager.list_servers().unwrap().into_iter().find(|s| s.address == address)
}

#[test]
fn a_pool_is_deleted_only_when_empty_and_its_name_is_free_again() {
    use spillway_manager::admin::DeletePoolError;
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let error = manager.delete_pool(&user(1000), "fast").unwrap_err();
    assert!(matches!(error, DeletePoolError::NotAuthorized { uid: 1000 }), "{error}");
    let error = manager.delete_pool(&root(), "nope").unwrap_err();
    assert_eq!(error.status(), 404, "{error}");
    let error = manager.delete_pool(&root(), "fast").unwrap_err();
    assert!(
        error.to_string().contains("127.0.0.1:7001, 127.0.0.1:7002")
            && error.to_string().contains("spillway server remove"),
        "{error}"
    );
    for address in ["127.0.0.1:7001", "127.0.0.1:7002"] {
        let removal = manager.remove_server(&root(), address).unwrap();
        assert!(removal.removed && removal.waiting_for.is_empty(), "{removal:?}");
        assert!(listed(&manager, address).is_none());
    }
    manager.delete_pool(&root(), "fast").unwrap();
    assert_eq!(
        manager.list_pools(&root()).unwrap().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["slow"]
    );
    assert_eq!(manager.delete_pool(&root(), "fast").unwrap_err().status(), 404, "gone");
    // Name and addresses are free for new ones.
    manager
        .create_pool(&root(), &CreatePool { name: "fast".into(), granularity_bytes: MIB })
        .unwrap();
    let again = AddServer {
        address: "127.0.0.1:7001".into(),
        pool: "fast".into(),
        capacity_bytes: 64 * MIB,
        pfs_dir: None,
    };
    let server = manager.add_server(&root(), &again).unwrap();
    assert_eq!((server.pool.as_str(), server.retiring_unix_s), ("fast", None));
    // The state survives a restart.
    drop(manager);
    let manager = open(&dir.path().join("m.db"), knobs());
    assert_eq!(manager.list_servers().unwrap().len(), 3);
    assert_eq!(manager.list_pools(&root()).unwrap().len(), 2);
}

#[test]
fn a_removed_server_waits_for_its_reservations_and_drains_and_gets_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let create = |uid: u32| {
        let request = CreateReservation { pool: Some("fast".into()), ..request(16 * MIB) };
        manager.create_reservation(&user(uid), &request).unwrap()
    };
    let before = create(1000);
    assert_eq!(before.servers.len(), 2, "striped over both servers of the pool");
    let removal = manager.remove_server(&root(), "127.0.0.1:7001").unwrap();
    assert!(!removal.removed);
    assert_eq!(removal.waiting_for, [format!("reservation {} (uid 1000)", before.name)]);
    assert!(removal.server.retiring_unix_s.is_some());
    assert_eq!(
        manager.remove_server(&user(1000), "127.0.0.1:7001").unwrap_err().status(),
        403,
        "admins only"
    );
    // New reservations avoid it; the pool's other server takes them.
    let after = create(1001);
    assert_eq!(after.servers, ["127.0.0.1:7002"]);
    // Heartbeats leave it retiring while the reservation lives, and while drains are in flight.
    heartbeat_round(&manager, &UpProber::drains(0));
    assert!(listed(&manager, "127.0.0.1:7001").is_some_and(|s| s.retiring_unix_s.is_some()));
    manager.destroy_reservation(&user(1000), &before.name, None, false).unwrap();
    heartbeat_round(&manager, &UpProber::drains(2));
    let removal = manager.remove_server(&root(), "127.0.0.1:7001").unwrap();
    assert_eq!(removal.waiting_for, ["2 drains in flight"]);
    heartbeat_round(&manager, &UpProber::drains(0));
    assert!(listed(&manager, "127.0.0.1:7001").is_none(), "removed by the heartbeat round");
    // The destroyed reservation still reads back (its server shown by the kept row's name).
    let shown = manager.show_reservation(&root(), &before.id.to_string()).unwrap();
    assert_eq!(shown.state, ReservationState::Destroyed);
    assert_eq!(manager.remove_server(&root(), "127.0.0.1:7001").unwrap_err().status(), 404);
}

#[test]
fn a_reservation_grows_in_place_and_a_persistent_one_is_shared() {
    use spillway_manager::admin::ModifyReservationError as E;
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    let dataset = CreateReservation {
        persistent: Some("dataset".into()),
        pool: Some("fast".into()),
        ..request(8 * MIB)
    };
    let made = manager.create_reservation(&user(1000), &dataset).unwrap();
    assert_eq!((made.servers.len(), made.server_fragments.clone()), (1, vec![1]));
    let grow = |uid: u32, bytes: u64| {
        let change = ModifyReservation { capacity_bytes: Some(bytes), ..Default::default() };
        manager.modify_reservation(&user(uid), "dataset", &change)
    };
    // 24 MiB = 3 fragments, on the one server it has (its data's layout is its server list).
    let grown = grow(1000, 24 * MIB).unwrap();
    assert_eq!((grown.capacity_bytes, grown.servers.clone()), (24 * MIB, made.servers.clone()));
    assert_eq!(grown.server_fragments, vec![3]);
    assert!(matches!(grow(1000, 16 * MIB).unwrap_err(), E::Invalid { .. }), "never shrinks");
    assert!(matches!(grow(1001, 32 * MIB).unwrap_err(), E::NotFound { .. }), "not visible");
    let error = grow(1000, 72 * MIB).unwrap_err();
    assert!(matches!(error, E::NoCapacity { .. }) && error.to_string().contains("fit"), "{error}");
    manager.set_quota(&root(), 1000, &SetQuota { bytes: 32 * MIB }).unwrap();
    let error = grow(1000, 40 * MIB).unwrap_err();
    assert!(matches!(error, E::QuotaExceeded { .. }), "{error}");
    assert!(error.to_string().contains("24.0 MiB in use"), "human sizes: {error}");

    // Sharing: user 1001 sees it once shared, not after unsharing; a visitor may not change it.
    let share =
        |change: ModifyReservation| manager.modify_reservation(&user(1000), "dataset", &change);
    share(ModifyReservation { share_uids: vec![1001, 1001], ..Default::default() }).unwrap();
    assert!(manager.show_reservation(&user(1001), "dataset").is_ok());
    assert!(matches!(grow(1001, 32 * MIB).unwrap_err(), E::NotAuthorized { owner: 1000, .. }));
    let unshared = share(ModifyReservation {
        unshare_uids: vec![1001],
        share_gids: vec![77],
        ..Default::default()
    })
    .unwrap();
    assert_eq!((unshared.allowed_uids.clone(), unshared.allowed_gids.clone()), (vec![], vec![77]));
    assert!(manager.show_reservation(&user(1001), "dataset").is_err());
    assert!(matches!(share(ModifyReservation::default()).unwrap_err(), E::Invalid { .. }));

    // A job's reservation grows but is not shared.
    let job = manager.create_reservation(&user(1000), &for_job("9")).unwrap();
    let error = manager
        .modify_reservation(
            &user(1000),
            &job.name,
            &ModifyReservation { share_uids: vec![1001], ..Default::default() },
        )
        .unwrap_err();
    assert!(error.to_string().contains("only persistent reservations are shared"), "{error}");
    // Growing on a retiring server is refused by name.
    manager.remove_server(&root(), &made.servers[0]).unwrap();
    let error = grow(1000, 32 * MIB).unwrap_err();
    assert!(error.to_string().contains("being removed"), "{error}");
}

#[test]
fn a_server_of_another_cluster_is_not_added_and_the_cluster_id_is_the_databases() {
    use spillway_manager::heartbeat::ServerFacts;
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    let ours = manager.cluster_id();
    let other = open(&dir.path().join("other.db"), knobs());
    assert_ne!(other.cluster_id(), ours, "another database is another cluster");
    manager.create_pool(&root(), &CreatePool { name: "p".into(), granularity_bytes: MIB }).unwrap();
    let add = |serves: [u8; 16]| {
        let request = AddServer {
            address: "127.0.0.1:7001".into(),
            pool: "p".into(),
            capacity_bytes: 0,
            pfs_dir: None,
        };
        let facts =
            ServerFacts { server_id: "ab".into(), ssd_bytes_max: 64 * MIB, cluster_id: serves };
        manager.add_server_probed(&root(), &request, &|_| Ok(facts.clone()))
    };
    let error = add(other.cluster_id()).unwrap_err();
    assert_eq!((error.status(), error.kind()), (409, "other_cluster"), "{error}");
    assert!(error.to_string().contains("wiped"), "{error}");
    assert_eq!(add(ours).unwrap().capacity_bytes, 64 * MIB);
    drop(manager);
    assert_eq!(open(&dir.path().join("m.db"), knobs()).cluster_id(), ours, "kept across restarts");
}

#[test]
fn server_peaks_are_recorded_by_admins_only_checked_and_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let manager = open(&path, knobs());
    setup(&manager);
    let peaks = SetServerPeaks {
        bandwidth_bytes_per_s: 2 << 30,
        iops: 40_000,
        metadata_ops_per_s: 12_000,
        conditions: "spillway bench peaks --servers 127.0.0.1:7001 --threads-max 4".into(),
        metadata_striped_ops_per_s: Some(5_000),
        metadata_private_ops_per_s: Some(9_000),
    };
    let error = manager.set_server_peaks(&user(1000), "1", &peaks).unwrap_err();
    assert_eq!(error.status(), 403, "{error}");
    let error = manager.set_server_peaks(&root(), "127.0.0.1:9", &peaks).unwrap_err();
    assert_eq!(error.status(), 404, "{error}");
    for (bad, named) in [
        (SetServerPeaks { iops: 0, ..peaks.clone() }, "iops must be between 1"),
        (
            SetServerPeaks { bandwidth_bytes_per_s: u64::MAX, ..peaks.clone() },
            "bandwidth_bytes_per_s",
        ),
        (SetServerPeaks { conditions: "a\nb".into(), ..peaks.clone() }, "control character"),
        (SetServerPeaks { conditions: "x".repeat(1025), ..peaks.clone() }, "1025 bytes"),
        (SetServerPeaks { metadata_private_ops_per_s: None, ..peaks.clone() }, "both or neither"),
        (
            SetServerPeaks { metadata_striped_ops_per_s: Some(0), ..peaks.clone() },
            "metadata_striped_ops_per_s must be between 1",
        ),
    ] {
        let error = manager.set_server_peaks(&root(), "127.0.0.1:7001", &bad).unwrap_err();
        assert_eq!(error.status(), 400, "{error}");
        assert!(error.to_string().contains(named), "{error} should name {named}");
    }
    assert!(
        manager.list_servers().unwrap().iter().all(|s| s.peaks.is_none()),
        "refused: none kept"
    );
    let server = manager.set_server_peaks(&root(), "127.0.0.1:7001", &peaks).unwrap();
    let recorded = server.peaks.expect("recorded");
    assert_eq!(recorded.bandwidth_bytes_per_s, 2 << 30);
    assert_eq!((recorded.iops, recorded.metadata_ops_per_s), (40_000, 12_000));
    assert_eq!(recorded.measured_unix_s, 1000, "stamped by the manager's clock");
    assert_eq!(recorded.conditions, peaks.conditions);
    let modes = (recorded.metadata_striped_ops_per_s, recorded.metadata_private_ops_per_s);
    assert_eq!(modes, (Some(5_000), Some(9_000)));
    drop(manager);
    let manager = open(&path, knobs());
    let servers = manager.list_servers().unwrap();
    assert_eq!(servers.iter().filter(|s| s.peaks.is_some()).count(), 1, "{servers:?}");
    assert_eq!(servers[0].peaks.as_ref(), Some(&recorded));
}

/// Peaks on the pool `fast` (servers 1 and 2): 1 GiB/s, 10k IOPS, 2k metadata ops/s each.
fn measure_fast(manager: &Manager) {
    for server in ["127.0.0.1:7001", "127.0.0.1:7002"] {
        let peaks = SetServerPeaks {
            bandwidth_bytes_per_s: 1 << 30,
            iops: 10_000,
            metadata_ops_per_s: 2_000,
            conditions: "test".into(),
            metadata_striped_ops_per_s: None,
            metadata_private_ops_per_s: None,
        };
        manager.set_server_peaks(&root(), server, &peaks).unwrap();
    }
}

/// Metadata peaks per namespace mode, as a measurement through the namespace service records
/// them, decide the mode and the servers; without them the one metadata rate stands for both.
#[test]
fn metadata_peaks_per_namespace_mode_choose_the_mode_and_the_servers() {
    let dir = tempfile::tempdir().unwrap();
    let knobs = ManagerKnobs { targets_user_share_percent_max: 100, ..knobs() };
    let manager = open(&dir.path().join("m.db"), knobs);
    setup(&manager);
    measure_fast(&manager);
    // One rate for both modes (2k): 3k is above every striped peak, private on both servers.
    let both = manager.create_reservation(&user(1000), &by_targets(None, Some(3_000))).unwrap();
    assert_eq!((both.access, both.servers.len()), (Access::Private, 2), "{both:?}");
    manager.destroy_reservation(&user(1000), &both.name, None, false).unwrap();
    for server in ["127.0.0.1:7001", "127.0.0.1:7002"] {
        let peaks = SetServerPeaks {
            bandwidth_bytes_per_s: 1 << 30,
            iops: 10_000,
            metadata_ops_per_s: 2_000,
            conditions: "test".into(),
            metadata_striped_ops_per_s: Some(1_000),
            metadata_private_ops_per_s: Some(4_000),
        };
        manager.set_server_peaks(&root(), server, &peaks).unwrap();
    }
    // Measured per mode: one server's private namespaces give 4k, enough for 3k alone…
    let private = manager.create_reservation(&user(1000), &by_targets(None, Some(3_000))).unwrap();
    assert_eq!((private.access, private.servers.len()), (Access::Private, 1), "{private:?}");
    manager.destroy_reservation(&user(1000), &private.name, None, false).unwrap();
    // …and 1.5k, within the old single rate, is beyond a striped namespace's 1k now.
    let above = manager.create_reservation(&user(1000), &by_targets(None, Some(1_500))).unwrap();
    assert_eq!(above.access, Access::Private, "{above:?}");
    let striped = manager.create_reservation(&user(1001), &by_targets(None, Some(800))).unwrap();
    assert_eq!(striped.access, Access::Striped, "{striped:?}");
}

fn by_targets(bandwidth: Option<u64>, metadata: Option<u64>) -> CreateReservation {
    CreateReservation {
        pool: Some("fast".into()),
        bandwidth_bytes_per_s: bandwidth,
        metadata_ops_per_s: metadata,
        ..request(0)
    }
}

#[test]
fn reservations_by_target_are_placed_promised_held_and_refused_by_the_pools_peaks() {
    let dir = tempfile::tempdir().unwrap();
    let knobs = ManagerKnobs { targets_user_share_percent_max: 100, ..knobs() };
    let manager = open(&dir.path().join("m.db"), knobs);
    setup(&manager);
    // Unmeasured: refused, naming what to do.
    let error =
        manager.create_reservation(&user(1000), &by_targets(Some(1 << 30), None)).unwrap_err();
    assert_eq!(error.status(), 422, "{error}");
    assert!(error.to_string().contains("spillway server measure --pool fast"), "{error}");
    measure_fast(&manager);
    // 1.5 GiB/s needs both servers (each carries half), capacity left out: one fragment each.
    let wide = manager.create_reservation(&user(1000), &by_targets(Some(3 << 29), None)).unwrap();
    assert_eq!(wide.servers.len(), 2, "{wide:?}");
    let targets = wide.targets.as_ref().expect("a reservation by targets says so");
    assert_eq!(targets.asked.bandwidth_bytes_per_s, Some(3 << 29));
    assert!(targets.promised.iter().all(|p| p.bandwidth_bytes_per_s == 3 << 28), "{targets:?}");
    assert!(!targets.why.is_empty());
    assert_eq!(wide.capacity_bytes, 16 * MIB, "n servers × one fragment");
    let servers = manager.list_servers().unwrap();
    let promised: Vec<_> =
        servers.iter().filter(|s| s.pool == "fast").map(|s| s.promised).collect();
    assert!(
        promised.iter().all(|p| p.is_some_and(|p| p.bandwidth_bytes_per_s == 3 << 28)),
        "{promised:?}"
    );
    // Another 1 GiB/s fits the peaks but not beside the first: it waits (Slurm holds the job).
    let error =
        manager.create_reservation(&user(1001), &by_targets(Some(1 << 30), None)).unwrap_err();
    assert_eq!(error.status(), 507, "{error}");
    assert_eq!(error.kind(), "targets_busy");
    assert!(error.to_string().contains("not now"), "{error}");
    // 4 GiB/s: never, whatever ends.
    let error =
        manager.create_reservation(&user(1001), &by_targets(Some(4 << 30), None)).unwrap_err();
    assert_eq!(error.kind(), "targets_unmeetable", "{error}");
    assert!(error.to_string().contains("never"), "{error}");
    // A dry run answers the same, and creates nothing either way.
    let dry = |bandwidth| CreateReservation { dry_run: true, ..by_targets(Some(bandwidth), None) };
    let error = manager.create_reservation(&user(1001), &dry(1 << 30)).unwrap_err();
    assert_eq!(error.kind(), "targets_busy", "{error}");
    // Once the first ends, the second fits.
    manager.destroy_reservation(&user(1000), &wide.name, None, false).unwrap();
    let would = manager.create_reservation(&user(1001), &dry(1 << 30)).unwrap();
    assert_eq!((would.id, would.servers.len()), (0, 1), "{would:?}");
    let active = manager.list_reservations(&root(), true).unwrap();
    assert!(active.is_empty(), "a dry run created {active:?}");
    let later = manager.create_reservation(&user(1001), &by_targets(Some(1 << 30), None)).unwrap();
    assert!(later.epoch > 0 && later.id > 0, "{later:?}");
    assert_eq!(later.servers.len(), 1, "1 GiB/s: one server's peak {later:?}");
}

#[test]
fn a_metadata_target_beyond_one_server_gets_private_namespaces_and_an_explicit_striped_is_refused()
{
    let dir = tempfile::tempdir().unwrap();
    let knobs = ManagerKnobs { targets_user_share_percent_max: 100, ..knobs() };
    let manager = open(&dir.path().join("m.db"), knobs);
    setup(&manager);
    measure_fast(&manager);
    let striped =
        CreateReservation { access: Some(Access::Striped), ..by_targets(None, Some(3_000)) };
    let error = manager.create_reservation(&user(1001), &striped).unwrap_err();
    assert_eq!(error.status(), 400, "{error}");
    assert!(error.to_string().contains("access=striped cannot meet"), "{error}");
    let private = manager.create_reservation(&user(1000), &by_targets(None, Some(3_000))).unwrap();
    assert_eq!(private.access, Access::Private, "{private:?}");
    assert_eq!(private.servers.len(), 2);
    manager.destroy_reservation(&user(1000), &private.name, None, false).unwrap();
    // A quota counts the plan's fragments, not the capacity left out.
    manager.set_quota(&root(), 1002, &SetQuota { bytes: 8 * MIB }).unwrap();
    let error =
        manager.create_reservation(&user(1002), &by_targets(Some(3 << 29), None)).unwrap_err();
    assert_eq!(error.kind(), "quota_exceeded", "{error}");
    // Zero targets and none at all are the request's fault.
    let zero = manager.create_reservation(&user(1002), &by_targets(Some(0), None)).unwrap_err();
    assert_eq!(zero.status(), 400, "{zero}");
    let none = manager.create_reservation(&user(1002), &request(0)).unwrap_err();
    assert_eq!(none.status(), 400, "{none}");
}

#[test]
fn no_user_holds_more_than_its_share_of_a_pools_promises() {
    let dir = tempfile::tempdir().unwrap();
    let manager = open(&dir.path().join("m.db"), knobs());
    setup(&manager);
    measure_fast(&manager);
    // The pool's peak is 2 GiB/s; half of it is one user's share (the default 50%).
    let error =
        manager.create_reservation(&user(1000), &by_targets(Some(3 << 29), None)).unwrap_err();
    assert_eq!(error.kind(), "targets_share_exceeded", "{error}");
    assert!(error.to_string().contains("uid 1000 would hold"), "{error}");
    assert!(error.to_string().contains("targets_user_share_percent_max"), "{error}");
    manager.create_reservation(&user(1000), &by_targets(Some(1 << 30), None)).unwrap();
    // Its share is used up, in every reservation it adds…
    let more = manager.create_reservation(&user(1000), &by_targets(Some(1 << 20), None));
    assert_eq!(more.unwrap_err().kind(), "targets_share_exceeded");
    // …while another user gets the rest, and root is not bound.
    manager.create_reservation(&user(1001), &by_targets(Some(1 << 29), None)).unwrap();
    manager.create_reservation(&root(), &by_targets(Some(1 << 29), None)).unwrap();
}
