//! Rescue reservations at the manager, without Slurm: a job reservation whose stage-out failed
//! is kept for its owner (listed with the error, invisible to others, still counted against the
//! quota), teardown's destroy is refused, and only its owner may destroy it before the expiry
//! knob allows root and admins to reclaim it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use spillway_config::{JobOwnerCheck, ManagerKnobs};
use spillway_manager::db::Db;
use spillway_manager::rescue::MarkRescueError;
use spillway_manager::service::{ApiError, CreateReservationError, DestroyError, LookupError};
use spillway_manager::*;

const MIB: u64 = 1 << 20;
const EXPIRY_S: u64 = 3_600;
const START_S: u64 = 10_000;

struct TestClock(AtomicU64);
impl Clock for TestClock {
    fn now_unix_s(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn root() -> Caller {
    Caller::new(0, 0, vec![0], true)
}
fn user(uid: u32) -> Caller {
    Caller::new(uid, uid, vec![uid], false)
}

/// A manager on `path` with one pool of two 64 MiB servers (made once), and its clock.
fn open(path: &std::path::Path, fresh: bool) -> (Manager, Arc<TestClock>) {
    let knobs = ManagerKnobs {
        fragment_bytes: 8 * MIB,
        stripe_servers_max: 2,
        job_owner_check: JobOwnerCheck::Unchecked,
        rescue_expiry_s: EXPIRY_S,
        ..Default::default()
    };
    let clock = Arc::new(TestClock(AtomicU64::new(START_S)));
    let manager = Manager::new(Db::open(path).unwrap(), knobs, None, clock.clone()).unwrap();
    if fresh {
        manager
            .create_pool(&root(), &CreatePool { name: "fast".into(), granularity_bytes: MIB })
            .unwrap();
        for port in [7001, 7002] {
            let server = AddServer {
                address: format!("127.0.0.1:{port}"),
                pool: "fast".into(),
                capacity_bytes: 64 * MIB,
                pfs_dir: None,
            };
            manager.add_server(&root(), &server).unwrap();
        }
    }
    (manager, clock)
}

/// What the Slurm setup hook does: job 12's reservation for uid 1000.
fn job_12(manager: &Manager) -> Reservation {
    let request = CreateReservation {
        capacity_bytes: 16 * MIB,
        job: Some("12".into()),
        owner: Some(1000),
        group: Some(1000),
        ..Default::default()
    };
    manager.create_reservation(&root(), &request).unwrap()
}

fn failed_stage_out() -> MarkRescue {
    MarkRescue {
        error: "stage-out failed: /pfs/out/.x.spillway-part: Permission denied (os error 13)"
            .into(),
        stage_outs: vec![StageOutPair {
            src: "ckpt".into(),
            dst: "/pfs/out/ckpt".into(),
            node: None,
        }],
    }
}

#[test]
fn a_rescue_is_listed_to_its_owner_only_and_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _clock) = open(&dir.path().join("m.db"), true);
    let job = job_12(&manager);
    assert!(job.rescue.is_none());

    // Only root and admins (the stage-out hook) mark; the owner cannot make it undestroyable.
    let error = manager.mark_rescue(&user(1000), "job-12", &failed_stage_out()).unwrap_err();
    assert!(matches!(error, MarkRescueError::NotAuthorized { uid: 1000 }), "{error}");
    assert_eq!(error.status(), 403);
    let empty = MarkRescue { error: " ".into(), ..failed_stage_out() };
    assert!(matches!(
        manager.mark_rescue(&root(), "job-12", &empty),
        Err(MarkRescueError::Invalid { .. })
    ));

    // A private reservation's stage-outs name their node, which must be a node name.
    for node in ["", "a/b"] {
        let mut bad = failed_stage_out();
        bad.stage_outs[0].node = Some(node.into());
        let error = manager.mark_rescue(&root(), "job-12", &bad).unwrap_err();
        assert!(error.to_string().contains("is not a node name"), "{node:?}: {error}");
    }
    let mut per_node = failed_stage_out();
    per_node.stage_outs[0].node = Some("n1".into());
    let marked = manager.mark_rescue(&root(), "job-12", &per_node).unwrap();
    assert_eq!(marked.rescue.expect("marked").stage_outs[0].node.as_deref(), Some("n1"));

    let marked = manager.mark_rescue(&root(), "job-12", &failed_stage_out()).unwrap();
    let rescue = marked.rescue.clone().expect("marked");
    assert_eq!(rescue.since_unix_s, START_S);
    assert_eq!(rescue.reclaimable_unix_s, START_S + EXPIRY_S, "knob manager.rescue_expiry_s");
    assert_eq!(rescue.stage_outs, failed_stage_out().stage_outs);
    assert!(rescue.error.contains("Permission denied"));

    // The owner sees it, with the error, in its list and its status.
    let listed = manager.list_reservations(&user(1000), false).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].rescue.as_ref().map(|r| r.error.as_str()), Some(rescue.error.as_str()));
    let status = manager.status(&user(1000), StatusView::Caller).unwrap();
    assert!(status.reservations.iter().any(|r| r.name == "job-12" && r.rescue.is_some()));

    // Another user neither sees nor reaches it (a retry starts with this lookup).
    let other = user(1001);
    assert!(manager.list_reservations(&other, false).unwrap().is_empty());
    let status = manager.status(&other, StatusView::Caller).unwrap();
    assert!(status.reservations.is_empty());
    assert!(matches!(
        manager.show_reservation(&other, "job-12"),
        Err(LookupError::NotFound { .. })
    ));
    assert!(matches!(
        manager.destroy_reservation(&other, "job-12", None, false),
        Err(DestroyError::NotFound { .. })
    ));

    // It still holds its capacity against the owner's quota.
    manager.set_quota(&root(), 1000, &SetQuota { bytes: 20 * MIB }).unwrap();
    let more = CreateReservation { capacity_bytes: 8 * MIB, ..Default::default() };
    let error = manager.create_reservation(&user(1000), &more).unwrap_err();
    assert!(matches!(error, CreateReservationError::QuotaExceeded { .. }), "{error}");
}

#[test]
fn teardown_never_destroys_a_rescue_and_admins_wait_for_its_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let (manager, clock) = open(&path, true);
    job_12(&manager);
    manager.mark_rescue(&root(), "job-12", &failed_stage_out()).unwrap();

    // Teardown's destroy (naming the job) is refused whoever asks, before and after expiry.
    let error = manager.destroy_reservation(&root(), "job-12", Some("12"), false).unwrap_err();
    assert!(matches!(error, DestroyError::RescueKept { .. }), "{error}");
    assert_eq!((error.status(), error.kind()), (409, "rescue_kept"));
    assert!(error.to_string().contains("spillway stage-out --retry job-12"), "{error}");

    // Root, even forcing, waits for the expiry.
    clock.0.store(START_S + EXPIRY_S - 1, Ordering::Relaxed);
    for force in [false, true] {
        let error = manager.destroy_reservation(&root(), "job-12", None, force).unwrap_err();
        assert!(
            matches!(
                error,
                DestroyError::RescueNotExpired { owner: 1000, reclaimable_unix_s, .. }
                    if reclaimable_unix_s == START_S + EXPIRY_S
            ),
            "{error}"
        );
    }

    // Marking again (a retried hook) replaces the error, never extends the owner's period.
    let again = MarkRescue { error: "stage-out failed again".into(), ..failed_stage_out() };
    let marked = manager.mark_rescue(&root(), "job-12", &again).unwrap();
    let rescue = marked.rescue.unwrap();
    assert_eq!(rescue.error, "stage-out failed again");
    assert_eq!(rescue.reclaimable_unix_s, START_S + EXPIRY_S);

    // The rescue survives a manager restart.
    drop(manager);
    let (manager, clock) = open(&path, false);
    clock.0.store(START_S + EXPIRY_S, Ordering::Relaxed);
    let shown = manager.show_reservation(&user(1000), "job-12").unwrap();
    assert_eq!(shown.rescue.as_ref().map(|r| r.error.as_str()), Some("stage-out failed again"));
    assert!(manager.destroy_reservation(&root(), "job-12", Some("12"), false).is_err());
    // Expired: root may reclaim it now (by hand; nothing does it automatically).
    let destroyed = manager.destroy_reservation(&root(), "job-12", None, false).unwrap();
    assert_eq!(destroyed.reservation.state, ReservationState::Destroyed);
}

#[test]
fn the_owner_releases_its_rescue_and_persistent_ones_are_not_marked() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, _clock) = open(&dir.path().join("m.db"), true);
    job_12(&manager);
    manager.mark_rescue(&root(), "job-12", &failed_stage_out()).unwrap();
    // What `stage-out --retry` does once every file is copied and verified.
    manager.destroy_reservation(&user(1000), "job-12", None, false).unwrap();
    assert!(manager.list_reservations(&user(1000), false).unwrap().is_empty());

    let persistent = CreateReservation {
        capacity_bytes: 8 * MIB,
        persistent: Some("shared".into()),
        ..Default::default()
    };
    manager.create_reservation(&user(1000), &persistent).unwrap();
    let error = manager.mark_rescue(&root(), "shared", &failed_stage_out()).unwrap_err();
    assert!(matches!(error, MarkRescueError::Persistent { .. }), "{error}");
    let error = manager.mark_rescue(&root(), "job-99", &failed_stage_out()).unwrap_err();
    assert_eq!(error.status(), 404);
}
