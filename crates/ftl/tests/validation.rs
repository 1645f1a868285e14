//! Validation of the FTL model (issue 7): the closed form for uniform random writes under FIFO,
//! greedy below it and converging as blocks grow, WAF exactly 1.0 with one stream per user and
//! FIFO deletes, determinism, and the write-log parser and replay.

use spillway_ftl::bios::{self, BiosParams};
use spillway_ftl::mapping::Mapping;
use spillway_ftl::replay::{self, parse_log, LogEvent, ReplayParams};
use spillway_ftl::synthetic::{self, Skew, SyntheticParams};
use spillway_ftl::volume::FileSystemModel;
use spillway_ftl::{analytic, GcPlacement, SsdConfig, VictimPolicy};
use spillway_types::{SegmentId, StreamKey, KIB, MIB};

fn uniform_waf(
    op: f64,
    victim: VictimPolicy,
    pages_per_block: u32,
    physical_pages: u32,
) -> (f64, f64) {
    let mut ssd = SsdConfig::with_overprovisioning(
        physical_pages / pages_per_block,
        pages_per_block,
        4096,
        op,
    );
    ssd.victim = victim;
    ssd.gc_reserve_blocks = 1;
    let alpha = ssd.physical_pages() as f64 / ssd.logical_pages as f64;
    let params =
        SyntheticParams { ssd, skew: Skew::Uniform, device_writes: 6.0, samples: 4, seed: 42 };
    (alpha, synthetic::run(&params, Mapping::Legacy).unwrap().waf_steady)
}

#[test]
fn fifo_matches_the_closed_form_within_two_percent() {
    for op in [0.07, 0.14, 0.21, 0.28] {
        let (alpha, simulated) = uniform_waf(op, VictimPolicy::Fifo, 32, 1 << 17);
        let closed = analytic::fifo_uniform_waf(alpha);
        let error = (simulated - closed).abs() / closed;
        assert!(error < 0.02, "OP {op}: α {alpha:.4} closed form {closed:.3}, FIFO simulated {simulated:.3} ({:.2} %)", error * 100.0);
    }
}

#[test]
fn greedy_lies_below_fifo_and_approaches_it_as_blocks_grow() {
    let op = 0.14;
    let physical = 1 << 17;
    let (alpha, _) = uniform_waf(op, VictimPolicy::Fifo, 32, physical);
    let closed = analytic::fifo_uniform_waf(alpha);
    let gaps: Vec<f64> = [8, 32, 128]
        .iter()
        .map(|&ppb| {
            let (_, greedy) = uniform_waf(op, VictimPolicy::Greedy, ppb, physical);
            assert!(
                greedy < closed,
                "greedy {greedy:.3} at {ppb} pages/block not below FIFO closed form {closed:.3}"
            );
            closed - greedy
        })
        .collect();
    assert!(
        gaps[0] > gaps[1] && gaps[1] > gaps[2],
        "gap to the closed form must shrink with block size: {gaps:?}"
    );
}

fn small_bios(mapping_streams: u16, users_per_node: u16) -> BiosParams {
    let mut ssd = SsdConfig::with_overprovisioning(1024, 64, 16 * 1024, 0.127);
    ssd.streams = mapping_streams;
    ssd.gc_reserve_blocks = 2;
    BiosParams {
        nodes: 2,
        users_per_node,
        file_bytes: 4 * MIB,
        stripe_count: 2,
        device_writes: 4.0,
        samples: 20,
        ..BiosParams::bios_setup(ssd, 256 * KIB, 4.0, 9)
    }
}

#[test]
fn one_stream_per_user_with_fifo_deletes_gives_waf_exactly_one() {
    // 8 users, 8 streams: every user owns a stream on each SSD; each user deletes its own files
    // oldest first, so every block of a stream dies whole.
    let mut params = small_bios(8, 4);
    params.threads_per_user = 1;
    // Configuration 1 spreads the 8 users over 4 lifetime classes (quotas 1:2:4:8).
    params.configuration = 1;
    params.ssd.gc_placement = GcPlacement::PerStream;
    let report = bios::run(&params, Mapping::UserId).unwrap();
    assert!(report.erases > 0, "GC must have run for the test to mean anything");
    assert_eq!(report.gc_copied_pages, 0, "copies with perfect separation");
    assert_eq!(report.waf_cumulative, 1.0);
    // The same workload on one shared stream copies pages.
    let legacy = bios::run(&params, Mapping::Legacy).unwrap();
    assert!(legacy.waf_steady > 1.0, "legacy WAF {}", legacy.waf_steady);
}

#[test]
fn same_seed_same_numbers() {
    let params = small_bios(4, 4);
    for mapping in [Mapping::Legacy, Mapping::LifetimeAware] {
        let mut a = bios::run(&params, mapping).unwrap();
        let mut b = bios::run(&params, mapping).unwrap();
        a.wall = None;
        b.wall = None;
        assert_eq!(a, b, "{mapping:?} not deterministic");
    }
    let mut other = params.clone();
    other.seed = 10;
    let mut c = bios::run(&other, Mapping::Legacy).unwrap();
    let mut a = bios::run(&params, Mapping::Legacy).unwrap();
    a.wall = None;
    c.wall = None;
    assert_ne!(a, c, "the seed must matter");
}

#[test]
fn sharing_streams_across_lifetimes_costs_copies_and_grouping_helps() {
    // 16 users on 4 streams, configuration 3 (each stream mixes all lifetimes).
    let params = small_bios(4, 8);
    let legacy = bios::run(&params, Mapping::Legacy).unwrap();
    let user = bios::run(&params, Mapping::UserId).unwrap();
    let lifetime = bios::run(&params, Mapping::LifetimeAware).unwrap();
    eprintln!(
        "config 3: legacy {} user {} lifetime {}",
        legacy.waf_steady, user.waf_steady, lifetime.waf_steady
    );
    assert!(
        user.waf_steady > lifetime.waf_steady,
        "user {} lifetime {}",
        user.waf_steady,
        lifetime.waf_steady
    );
    assert!(
        legacy.waf_steady > lifetime.waf_steady,
        "legacy {} lifetime {}",
        legacy.waf_steady,
        lifetime.waf_steady
    );
    assert!(legacy.file_write_latency.is_some() && legacy.throughput_mib_per_s.unwrap() > 0.0);
    // Configuration 1 (same lifetime per stream): user-ID separation beats one shared stream.
    let params = BiosParams { configuration: 1, ..params };
    let legacy = bios::run(&params, Mapping::Legacy).unwrap();
    let user = bios::run(&params, Mapping::UserId).unwrap();
    eprintln!("config 1: legacy {} user {}", legacy.waf_steady, user.waf_steady);
    assert!(
        legacy.waf_steady > user.waf_steady,
        "legacy {} user {}",
        legacy.waf_steady,
        user.waf_steady
    );
}

const SMALL_LOG: &str = "# spillway ssd write log v1
write 1 0 0 1048576
write 2 1 0 1048576

# a comment line
write 1 0 1048576 524288
delete 0 1572864
write 2 1 1048576 4096
write 2 1 1048576 4096
delete 1 1052672
";

#[test]
fn write_log_parses() {
    let events = parse_log(SMALL_LOG.as_bytes(), "small.log").unwrap();
    assert_eq!(events.len(), 7);
    assert_eq!(
        events[0],
        LogEvent::Write {
            stream: StreamKey(1),
            segment: SegmentId(0),
            offset_bytes: 0,
            length_bytes: 1 << 20
        }
    );
    assert_eq!(events[3], LogEvent::Delete { segment: SegmentId(0), length_bytes: 1572864 });
}

#[test]
fn write_log_errors_name_file_and_line() {
    let error = parse_log("# wrong header\n".as_bytes(), "a.log").unwrap_err().to_string();
    assert!(error.contains("a.log") && error.contains("first line"), "{error}");
    let text = "# spillway ssd write log v1\nwrite 1 2 3\n";
    let error = parse_log(text.as_bytes(), "b.log").unwrap_err().to_string();
    assert!(error.contains("b.log:2"), "{error}");
    let text = "# spillway ssd write log v1\nwrite 1 2 x 4\n";
    let error = parse_log(text.as_bytes(), "c.log").unwrap_err().to_string();
    assert!(error.contains("c.log:2") && error.contains("offset_bytes"), "{error}");
    let text = "# spillway ssd write log v1\nerase 1\n";
    assert!(parse_log(text.as_bytes(), "d.log").is_err());
}

#[test]
fn replay_counts_pages_and_trims_deleted_segments() {
    let events = parse_log(SMALL_LOG.as_bytes(), "small.log").unwrap();
    let mut ssd = SsdConfig::with_overprovisioning(64, 16, 16 * 1024, 0.25);
    ssd.streams = 2;
    let params = ReplayParams { ssd, ssds: 2, stripe_unit_bytes: 64 * KIB, samples: 4 };
    let report = replay::replay(&params, &events, Mapping::UserId).unwrap();
    // 1 MiB + 1 MiB + 512 KiB + two single-page writes, in 16 KiB pages.
    assert_eq!(report.host_pages, 64 + 64 + 32 + 1 + 1);
    assert_eq!(report.waf_cumulative, 1.0);
    let error = replay::replay(&params, &events, Mapping::PerJob).unwrap_err().to_string();
    assert!(error.contains("per_job"), "{error}");
    // Deleting an unknown segment is an error naming the event.
    let bad = vec![LogEvent::Delete { segment: SegmentId(5), length_bytes: 0 }];
    let error = replay::replay(&params, &bad, Mapping::Legacy).unwrap_err().to_string();
    assert!(error.contains("segment 5"), "{error}");
    // A write far beyond the volume is refused, not allocated.
    let huge = vec![LogEvent::Write {
        stream: StreamKey(1),
        segment: SegmentId(1),
        offset_bytes: 1 << 60,
        length_bytes: 1,
    }];
    let error = replay::replay(&params, &huge, Mapping::Legacy).unwrap_err().to_string();
    assert!(error.contains("beyond"), "{error}");
    assert!(error.contains("--blocks-per-ssd (now 64) or --ssds (now 2)"), "{error}");
    // More segments than the volume holds: out of space, naming the knobs too.
    let full: Vec<LogEvent> = (0..64u64)
        .map(|segment| LogEvent::Write {
            stream: StreamKey(1),
            segment: SegmentId(segment),
            offset_bytes: 0,
            length_bytes: MIB,
        })
        .collect();
    let error = replay::replay(&params, &full, Mapping::Legacy).unwrap_err().to_string();
    assert!(
        error.contains("does not fit") && error.contains("--blocks-per-ssd (now 64)"),
        "{error}"
    );
}

#[test]
fn replay_churn_triggers_gc_and_lifetime_grouping_helps() {
    // Two keys write 256 KiB segments interleaved; key 0's segments live 20 segments, key 1's 4.
    let mut events = Vec::new();
    for segment in 0..600u64 {
        let stream = StreamKey(segment % 2);
        for piece in 0..4 {
            events.push(LogEvent::Write {
                stream,
                segment: SegmentId(segment),
                offset_bytes: piece * 65536,
                length_bytes: 65536,
            });
        }
        for (key, lifetime) in [(0u64, 20u64), (1, 4)] {
            if segment >= lifetime && (segment - lifetime) % 2 == key {
                events.push(LogEvent::Delete {
                    segment: SegmentId(segment - lifetime),
                    length_bytes: 262144,
                });
            }
        }
    }
    let mut ssd = SsdConfig::with_overprovisioning(40, 16, 16 * 1024, 0.3);
    ssd.streams = 2;
    let params = ReplayParams { ssd, ssds: 1, stripe_unit_bytes: 64 * KIB, samples: 4 };
    let legacy = replay::replay(&params, &events, Mapping::Legacy).unwrap();
    let grouped = replay::replay(&params, &events, Mapping::LifetimeAware).unwrap();
    assert!(legacy.erases > 0, "GC must run");
    assert_eq!(legacy.host_pages, 600 * 16);
    assert!(
        grouped.waf_cumulative <= legacy.waf_cumulative,
        "grouped {} legacy {}",
        grouped.waf_cumulative,
        legacy.waf_cumulative
    );
}

#[test]
fn hot_cold_skew_favours_cost_benefit_and_separation() {
    let run = |victim, mapping| {
        let mut ssd = SsdConfig::with_overprovisioning(512, 32, 4096, 0.1);
        ssd.victim = victim;
        ssd.streams = 2;
        let params = SyntheticParams {
            ssd,
            skew: Skew::HotCold { hot_space_fraction: 0.2, hot_write_fraction: 0.8 },
            device_writes: 6.0,
            samples: 4,
            seed: 3,
        };
        synthetic::run(&params, mapping).unwrap().waf_steady
    };
    let greedy = run(VictimPolicy::Greedy, Mapping::Legacy);
    let cost_benefit = run(VictimPolicy::CostBenefit, Mapping::Legacy);
    let separated = run(VictimPolicy::CostBenefit, Mapping::LifetimeAware);
    assert!(cost_benefit < greedy, "cost-benefit {cost_benefit:.3} vs greedy {greedy:.3}");
    assert!(
        separated < cost_benefit,
        "hot/cold streams {separated:.3} vs one stream {cost_benefit:.3}"
    );
}

#[test]
fn without_trim_dead_data_is_copied_until_the_file_system_reuses_it() {
    // Same workload, file system with and without discard: without it the FTL keeps deleted
    // files' pages valid until their addresses are reused, so legacy copies more.
    use spillway_ftl::volume::LbaAllocation;
    let params = small_bios(4, 8);
    let trimmed = bios::run(&params, Mapping::Legacy).unwrap();
    for allocation in [LbaAllocation::Stack, LbaAllocation::FirstFit, LbaAllocation::NextFit] {
        let fs = FileSystemModel { allocation, trim_on_delete: false };
        let untrimmed = bios::run(&BiosParams { fs, ..params.clone() }, Mapping::Legacy).unwrap();
        eprintln!(
            "{allocation:?}: legacy WAF trim {} no trim {}",
            trimmed.waf_steady, untrimmed.waf_steady
        );
        assert_eq!(untrimmed.host_pages, trimmed.host_pages, "{allocation:?}: same host writes");
        assert!(
            untrimmed.waf_steady > trimmed.waf_steady,
            "{allocation:?}: no-trim {} trim {}",
            untrimmed.waf_steady,
            trimmed.waf_steady
        );
        assert!(untrimmed.label.contains("no_trim"), "{}", untrimmed.label);
    }
}

/// Workload (5): a trace becomes write-log events (file = segment, rank = key) and replays.
#[test]
fn trace_workload_writes_every_traced_byte_and_trims_unlinked_files() {
    use spillway_trace::{Op, Trace, TraceOp};
    let op = |rank, file, op, offset, length| TraceOp {
        time_ns: 0,
        duration_ns: 0,
        offset,
        length,
        rank,
        file,
        op,
    };
    let trace = Trace {
        files: vec!["a".into(), "b".into(), "never-written".into()],
        ops: vec![
            op(0, 0, Op::Open, 0, 0),
            op(0, 0, Op::Write, 0, 1 << 20),
            op(1, 1, Op::Write, 0, 512 * 1024),
            op(1, 1, Op::Read, 0, 4096),
            op(0, 0, Op::Unlink, 0, 0),
            op(1, 2, Op::Unlink, 0, 0),
            op(1, 1, Op::Write, 512 * 1024, 16 * 1024),
        ],
        ..Trace::default()
    };
    let events = replay::events_from_trace(&trace);
    assert_eq!(
        events,
        vec![
            LogEvent::Write {
                stream: StreamKey(0),
                segment: SegmentId(0),
                offset_bytes: 0,
                length_bytes: 1 << 20
            },
            LogEvent::Write {
                stream: StreamKey(1),
                segment: SegmentId(1),
                offset_bytes: 0,
                length_bytes: 512 * 1024
            },
            LogEvent::Delete { segment: SegmentId(0), length_bytes: 1 << 20 },
            LogEvent::Write {
                stream: StreamKey(1),
                segment: SegmentId(1),
                offset_bytes: 512 * 1024,
                length_bytes: 16 * 1024
            },
        ]
    );
    let mut ssd = SsdConfig::with_overprovisioning(64, 16, 16 * 1024, 0.25);
    ssd.streams = 2;
    let params = ReplayParams { ssd, ssds: 2, stripe_unit_bytes: 64 * KIB, samples: 4 };
    let report = replay::replay(&params, &events, Mapping::UserId).unwrap();
    assert_eq!(report.host_pages, 64 + 32 + 1);

    // The Darshan-derived sample trace shipped with the project replays end to end.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/darshan-dxt.spwt");
    let sample = Trace::read_path(std::path::Path::new(path)).unwrap();
    let events = replay::events_from_trace(&sample);
    let written: u64 = sample.ops.iter().filter(|o| o.op == Op::Write).map(|o| o.length).sum();
    let replayed: u64 = events
        .iter()
        .map(|e| match e {
            LogEvent::Write { length_bytes, .. } => *length_bytes,
            LogEvent::Delete { .. } => 0,
        })
        .sum();
    assert!(written > 0);
    assert_eq!(replayed, written);
}
