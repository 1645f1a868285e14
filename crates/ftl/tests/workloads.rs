//! Workload parameters (issue 19): write and capacity shares do what they say, the interleave and
//! delete rules change what they should, known answers hold with them, steady state means the
//! same for every workload, and workload files round-trip and are refused naming the key.

use spillway_ftl::bios::{self, BiosParams, DeleteRule};
use spillway_ftl::mapping::Mapping;
use spillway_ftl::replay::{self, LogEvent, ReplayParams};
use spillway_ftl::report::{RunReport, UserSummary};
use spillway_ftl::synthetic::{self, Skew, SyntheticParams};
use spillway_ftl::volume::FileSystemModel;
use spillway_ftl::workload::{WorkloadError, WorkloadKind, WorkloadSpec};
use spillway_ftl::{analytic, GcPlacement, SsdConfig, VictimPolicy};
use spillway_types::{SegmentId, StreamKey, KIB, MIB};

/// 2 SSDs × 4 users × 1 thread (8 users, 8 streams), 4 MiB files, small enough for a test.
fn small_bios() -> BiosParams {
    let mut ssd = SsdConfig::with_overprovisioning(1024, 64, 16 * 1024, 0.127);
    ssd.gc_reserve_blocks = 2;
    ssd.gc_placement = GcPlacement::PerStream;
    ssd.streams = 8;
    BiosParams {
        nodes: 2,
        users_per_node: 4,
        threads_per_user: 1,
        file_bytes: 4 * MIB,
        stripe_count: 2,
        configuration: 1,
        samples: 20,
        ..BiosParams::bios_setup(ssd, 256 * KIB, 4.0, 9)
    }
}

/// Sum of `field` over the users whose write share is `share`.
fn sum_by_share(users: &[UserSummary], share: f64, field: impl Fn(&UserSummary) -> f64) -> f64 {
    users.iter().filter(|u| u.write_share == share).map(field).sum()
}

#[test]
fn twice_the_write_share_writes_about_twice_the_pages() {
    let params = BiosParams { write_shares: vec![1.0, 2.0], ..small_bios() };
    let report = bios::run(&params, Mapping::Legacy).unwrap();
    let slow = sum_by_share(&report.users, 1.0, |u| u.host_bytes as f64);
    let fast = sum_by_share(&report.users, 2.0, |u| u.host_bytes as f64);
    let ratio = fast / slow;
    eprintln!("host bytes share 2 / share 1: {ratio:.3}");
    assert!((1.85..2.15).contains(&ratio), "share-2 users wrote {ratio:.3}× the share-1 users");
    let total: u64 = report.users.iter().map(|u| u.host_bytes).sum();
    assert_eq!(total, report.host_pages * 16 * 1024, "per-user bytes add up to the host pages");
    // Equal shares: every user writes about the same.
    let equal = bios::run(&small_bios(), Mapping::Legacy).unwrap();
    let bytes: Vec<f64> = equal.users.iter().map(|u| u.host_bytes as f64).collect();
    let (min, max) = bytes.iter().fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
    assert!(max / min < 1.1, "equal shares wrote {bytes:?}");
}

#[test]
fn twice_the_capacity_share_gets_twice_the_quota_and_keeps_files_twice_as_long() {
    let params = BiosParams { capacity_shares: vec![1.0, 2.0], ..small_bios() };
    let report = bios::run(&params, Mapping::Legacy).unwrap();
    let (small, large): (Vec<&UserSummary>, Vec<&UserSummary>) =
        report.users.iter().partition(|u| u.user % 2 == 0);
    for (s, l) in small.iter().zip(&large) {
        let quota_ratio = l.quota_bytes as f64 / s.quota_bytes as f64;
        assert!((quota_ratio - 2.0).abs() < 1e-6, "quota ratio {quota_ratio}");
    }
    let mean = |users: &[&UserSummary]| {
        users.iter().map(|u| u.mean_file_lifetime_s).sum::<f64>() / users.len() as f64
    };
    let lifetime_ratio = mean(&large) / mean(&small);
    eprintln!("mean file lifetime capacity share 2 / share 1: {lifetime_ratio:.3}");
    // Same write rate, twice the quota: a file lives about twice as long (modelled time).
    assert!((1.7..2.3).contains(&lifetime_ratio), "lifetime ratio {lifetime_ratio:.3}");
}

#[test]
fn one_stream_per_user_stays_at_waf_one_with_unequal_shares() {
    // 8 users on 8 streams; each deletes its own files oldest first, so every block of a stream
    // dies whole whatever the users' rates and quotas.
    for delete_rule in [DeleteRule::BIOS, DeleteRule::OldestUntilWithinQuota] {
        let params = BiosParams {
            write_shares: vec![1.0, 3.0, 0.5],
            capacity_shares: vec![2.0, 1.0, 1.0, 5.0],
            delete_rule,
            rows_per_turn: 3,
            ..small_bios()
        };
        let report = bios::run(&params, Mapping::UserId).unwrap();
        assert!(report.erases > 0, "GC must have run for the test to mean anything");
        assert_eq!(report.gc_copied_pages, 0, "{delete_rule:?}: copies with perfect separation");
        let legacy = bios::run(&params, Mapping::Legacy).unwrap();
        assert!(legacy.waf_steady > 1.0, "legacy WAF {}", legacy.waf_steady);
    }
}

#[test]
fn whole_file_turns_mix_users_less_than_one_row_turns() {
    // Interleave: a 4 MiB file in 256 KiB units over 2 SSDs is 8 stripe rows. With one row per
    // turn users' units alternate on each SSD; with 8 (a whole file per turn) each file lies
    // contiguous on each SSD, so a deletion frees whole runs of pages.
    let params = BiosParams { capacity_shares: vec![1.0, 2.0, 4.0, 8.0], ..small_bios() };
    let row = bios::run(&params, Mapping::Legacy).unwrap();
    let file = bios::run(&BiosParams { rows_per_turn: 8, ..params }, Mapping::Legacy).unwrap();
    eprintln!("legacy WAF one row per turn {} whole file {}", row.waf_steady, file.waf_steady);
    assert!(file.waf_steady < row.waf_steady, "{} vs {}", file.waf_steady, row.waf_steady);
    // The run stops at the first turn past its page budget; a turn is now up to a whole file.
    assert!(file.host_pages.abs_diff(row.host_pages) <= 4 * MIB / (16 * KIB));
}

#[test]
fn deleting_only_what_is_needed_keeps_files_longer_than_deleting_fifteen_percent() {
    let fraction = bios::run(&small_bios(), Mapping::Legacy).unwrap();
    let params = BiosParams { delete_rule: DeleteRule::OldestUntilWithinQuota, ..small_bios() };
    let until = bios::run(&params, Mapping::Legacy).unwrap();
    let mean = |r: &RunReport| {
        r.users.iter().map(|u| u.mean_file_lifetime_s).sum::<f64>() / r.users.len() as f64
    };
    eprintln!("mean lifetime: 15 % rule {} until within quota {}", mean(&fraction), mean(&until));
    assert!(mean(&until) > mean(&fraction));
    assert!(until.users.iter().all(|u| u.files_deleted > 0));
}

/// Desnoyers, "Analytic modeling of SSD write performance" (SYSTOR 2012): for LRW (FIFO)
/// cleaning under hot/cold traffic in one log, his model (reported exact against simulation)
/// gives the WAF as the fixed point of A = Σ rᵢ/(1 − exp(−(rᵢ/fᵢ)·α/A)), here
/// `analytic::fifo_classes_waf`. Our FIFO simulation must land within 2 % of it for 80/20 and
/// 90/10 skews, as the uniform case does against the closed form.
#[test]
fn fifo_hot_cold_matches_desnoyers_lrw_model() {
    for (op, hot_space, hot_writes) in [(0.14, 0.2, 0.8), (0.28, 0.2, 0.8), (0.14, 0.1, 0.9)] {
        let mut ssd = SsdConfig::with_overprovisioning(4096, 32, 4096, op);
        ssd.victim = VictimPolicy::Fifo;
        ssd.gc_reserve_blocks = 1;
        let alpha = ssd.physical_pages() as f64 / ssd.logical_pages as f64;
        let params = SyntheticParams {
            ssd,
            skew: Skew::HotCold { hot_space_fraction: hot_space, hot_write_fraction: hot_writes },
            device_writes: 6.0,
            samples: 4,
            seed: 5,
        };
        let simulated = synthetic::run(&params, Mapping::Legacy).unwrap().waf_steady;
        let model = analytic::fifo_classes_waf(
            alpha,
            &[(hot_space, hot_writes), (1.0 - hot_space, 1.0 - hot_writes)],
        );
        let error = (simulated - model) / model;
        eprintln!("OP {op} {hot_writes}/{hot_space}: model {model:.3} FIFO sim {simulated:.3}");
        assert!(error.abs() < 0.02, "OP {op}: model {model:.3} sim {simulated:.3}");
        assert!(model > analytic::fifo_uniform_waf(alpha), "skew costs copies under FIFO");
    }
}

#[test]
fn every_workload_measures_steady_state_over_the_second_half_of_host_writes() {
    // Synthetic: fill (1) + 5 overwrites = 6 device-writes, window 3–6.
    let ssd = SsdConfig::with_overprovisioning(256, 32, 4096, 0.1);
    let params = SyntheticParams {
        ssd: ssd.clone(),
        skew: Skew::Uniform,
        device_writes: 5.0,
        samples: 4,
        seed: 1,
    };
    let report = synthetic::run(&params, Mapping::Legacy).unwrap();
    let w = &report.steady_window;
    assert!((w.start_device_writes - 3.0).abs() < 0.01 && (w.end_device_writes - 6.0).abs() < 0.01);
    assert!(w.reached && w.note.is_none(), "{w:?}");
    // BIOS: 4 device-writes, window from 2.
    let report = bios::run(&small_bios(), Mapping::Legacy).unwrap();
    let w = &report.steady_window;
    assert!((w.start_device_writes - 2.0).abs() < 0.01, "{w:?}");
    assert!(w.reached);
    // Replay shorter than needed: the report says so.
    let events: Vec<LogEvent> = (0..4)
        .map(|i| LogEvent::Write {
            stream: StreamKey(1),
            segment: SegmentId(i),
            offset_bytes: 0,
            length_bytes: MIB,
        })
        .collect();
    let replay_params = ReplayParams { ssd, ssds: 1, stripe_unit_bytes: 64 * KIB, samples: 4 };
    let short = replay::replay(&replay_params, &events, Mapping::Legacy).unwrap();
    let w = &short.steady_window;
    assert!(!w.reached, "{w:?}");
    assert!(w.note.as_deref().unwrap().contains("not reached"), "{w:?}");
    assert!((w.start_device_writes - w.end_device_writes / 2.0).abs() < 0.01, "{w:?}");
}

const EXAMPLE: &str = r#"
workload = "bios"
users_per_node = 4
threads_per_user = 1
write_shares = [1.0, 2.0]
capacity_shares = [1.0, 1.0, 2.0]
file_bytes = 4194304
stripe_count = 2
rows_per_turn = 2
delete_rule = "oldest_fraction"
delete_fraction = 0.25
device_utilisation = 0.9
device_writes = 3.0
seed = 7
"#;

#[test]
fn workload_file_round_trips_and_builds_the_run() {
    let spec = WorkloadSpec::parse(EXAMPLE, "example.toml").unwrap();
    let again = WorkloadSpec::parse(&spec.to_toml(), "round-trip.toml").unwrap();
    assert_eq!(spec, again);
    assert_eq!(spec.kind().unwrap(), WorkloadKind::Bios);
    let ssd = small_bios().ssd;
    let params = spec.bios_params(ssd.clone(), 2, 256 * KIB, FileSystemModel::default()).unwrap();
    assert_eq!(params.write_shares, vec![1.0, 2.0]);
    assert_eq!(params.delete_rule, DeleteRule::OldestFraction { fraction: 0.25 });
    assert_eq!((params.users(), params.rows_per_turn, params.seed), (8, 2, 7));
    // Flags override the file.
    let flags = WorkloadSpec { rows_per_turn: Some(5), ..WorkloadSpec::default() };
    let merged = spec.overridden_by(flags);
    assert_eq!(merged.rows_per_turn, Some(5));
    assert_eq!(merged.device_utilisation, Some(0.9));
    let report = bios::run(&params, Mapping::UserId).unwrap();
    assert_eq!(report.users.len(), 8);
}

/// Each bad file must be refused with an error naming `key`.
fn refused(toml: &str, key: &str) -> String {
    // The test volume has 2 SSDs, so 2 SSDs per pool unless the case sets its own.
    let stripe = if toml.contains("stripe_count") { "" } else { "stripe_count = 2\n" };
    let text = format!("workload = \"bios\"\n{stripe}{toml}\n");
    let error = match WorkloadSpec::parse(&text, "bad.toml") {
        Err(e) => e.to_string(),
        Ok(spec) => spec
            .bios_params(small_bios().ssd, 2, 256 * KIB, FileSystemModel::default())
            .map(|_| ())
            .expect_err(toml)
            .to_string(),
    };
    assert!(error.contains(key), "{toml:?}: error {error:?} does not name {key}");
    error
}

#[test]
fn bad_workload_files_are_refused_naming_the_key_and_range() {
    let e = refused("users_per_node = 0", "users_per_node");
    assert!(e.contains("bad.toml") && e.contains("≥ 1"), "{e}");
    refused("threads_per_user = 0", "threads_per_user");
    refused("users_per_node = -3", "users_per_node");
    refused("write_shares = [1.0, 0.0]", "write_shares");
    refused("write_shares = [-1.0]", "write_shares");
    refused("write_shares = [nan]", "write_shares");
    refused("write_shares = []", "write_shares");
    refused("capacity_shares = [inf]", "capacity_shares");
    let e = refused("device_utilisation = 1.5", "device_utilisation");
    assert!(e.contains("(0, 1]"), "{e}");
    refused("delete_fraction = 0.0", "delete_fraction");
    refused("delete_rule = \"newest\"", "delete_rule");
    refused(
        "delete_rule = \"oldest_until_within_quota\"\ndelete_fraction = 0.2",
        "delete_fraction",
    );
    refused("configuration = 7", "configuration");
    refused("stripe_count = 3", "stripe_count");
    refused("device_writes = -1.0", "device_writes");
    refused("rows_per_turn = 0", "rows_per_turn");
    refused("hot_space_fraction = 0.3", "hot_space_fraction");
    refused("user_count = 3", "user_count");
    // 4 users per node on 2 SSDs: at most 8 shares.
    let e = refused(
        "users_per_node = 4\nwrite_shares = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]",
        "write_shares",
    );
    assert!(e.contains("8 users"), "{e}");
    // Files the capacity cannot hold, or larger than a quota, are refused before anything runs.
    let e = refused("file_bytes = 1099511627776", "file_bytes");
    assert!(e.contains("in flight"), "{e}");
    let e = refused("file_bytes = 4194304\ncapacity_shares = [1.0, 1000.0]", "file_bytes");
    assert!(e.contains("quota"), "{e}");
    // An unreadable file names the path.
    let missing = WorkloadSpec::read_file(std::path::Path::new("/nonexistent/w.toml"));
    assert!(matches!(missing, Err(WorkloadError::Read { .. })));
}

#[test]
fn bios_params_built_in_code_are_refused_naming_the_parameter() {
    let nan_fraction = DeleteRule::OldestFraction { fraction: f64::NAN };
    for (bad, key) in [
        (BiosParams { write_shares: vec![f64::NAN], ..small_bios() }, "write_shares"),
        (BiosParams { write_shares: Vec::new(), ..small_bios() }, "write_shares"),
        (BiosParams { capacity_shares: vec![0.0], ..small_bios() }, "capacity_shares"),
        (BiosParams { users_per_node: 0, ..small_bios() }, "users_per_node"),
        (BiosParams { nodes: 0, ..small_bios() }, "nodes"),
        (BiosParams { device_utilisation: 1.5, ..small_bios() }, "device_utilisation"),
        (BiosParams { device_utilisation: f64::NAN, ..small_bios() }, "device_utilisation"),
        (BiosParams { delete_rule: nan_fraction, ..small_bios() }, "delete_fraction"),
        (BiosParams { rows_per_turn: 0, ..small_bios() }, "rows_per_turn"),
        (BiosParams { file_bytes: 1 << 40, ..small_bios() }, "file_bytes"),
    ] {
        let error = bios::run(&bad, Mapping::Legacy).unwrap_err().to_string();
        assert!(error.contains(key), "{key}: {error}");
    }
}
