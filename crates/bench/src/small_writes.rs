//! `spillway bench ingress --small-writes`: 16 KiB writes against 1 MiB writes through the
//! native client, the same bytes in the same run.
//!
//! Two shapes, each with S `spillway serve` processes at `memory` durability and C client threads
//! (each its own [`Client`], as separate processes would have), timed from the first connect to
//! the last commit:
//! - sequential: every thread writes its own file front to back in T-byte writes;
//! - strided: the threads share one file and write its T-byte blocks round robin (thread `i`
//!   writes blocks `i`, `i + C`, `i + 2C`, …), so no thread's consecutive writes are adjacent.
//!
//! Each shape runs with T = 16 KiB and T = 1 MiB back to back in every repeat (fresh servers for
//! each); `ratios.small_vs_large_writes` is the median over repeats of the paired 16 KiB / 1 MiB
//! rates of the sequential shape, `small_vs_large_writes_strided` the same for the strided one.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use spillway_client::{Client, ClientOptions, Placement};
use spillway_proto::{Durability, Endpoint};
use spillway_types::EpochId;

use crate::stats::{gigabytes_per_second, median};

const SMALL: u64 = 16 << 10;
const LARGE: u64 = 1 << 20;

/// How the client threads lay their writes out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    Sequential,
    Strided,
}

/// What one run measures.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub servers: u32,
    pub clients: u32,
    pub bytes_per_client: u64,
    /// The clients' [`ClientOptions::coalesce_bytes_max`].
    pub coalesce_bytes_max: u64,
}

/// One timed run: its rate, and the CPU the subject itself (client threads and servers) spent
/// per GB, which other load on the machine does not change much.
#[derive(Clone, Copy)]
struct Sample {
    gbps: f64,
    cpu_seconds_per_gb: f64,
}

#[derive(Debug, serde::Serialize)]
struct Row {
    layout: &'static str,
    small_gbps: f64,
    large_gbps: f64,
    small_vs_large: f64,
    small_vs_large_per_repeat: Vec<f64>,
    /// Client and server CPU seconds per GB moved (medians).
    small_cpu_seconds_per_gb: f64,
    large_cpu_seconds_per_gb: f64,
    /// 1 MiB writes' CPU per GB over 16 KiB writes' (median of paired ratios): 1 means small
    /// writes cost what large ones do.
    small_vs_large_cpu_efficiency: f64,
}

/// Runs both shapes `repeat` times in `work` and prints a table or (`json`) one JSON object.
pub fn run(shape: Shape, work: &Path, repeat: u32, json: bool) -> anyhow::Result<()> {
    if shape.bytes_per_client < LARGE {
        anyhow::bail!("--small-writes needs --bytes-per-client of at least 1 MiB");
    }
    let mut rows = Vec::new();
    for layout in [Layout::Sequential, Layout::Strided] {
        rows.push(measure_layout(shape, layout, work, repeat)?);
    }
    if json {
        print_json(shape, repeat, &rows)
    } else {
        print_table(shape, repeat, &rows);
        Ok(())
    }
}

/// One layout's row: both sizes `repeat` times, paired.
fn measure_layout(shape: Shape, layout: Layout, work: &Path, repeat: u32) -> anyhow::Result<Row> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    for run in 0..repeat.max(1) {
        // Alternate which size goes first, so neither always inherits warm caches.
        let order = if run % 2 == 0 { [SMALL, LARGE] } else { [LARGE, SMALL] };
        for transfer in order {
            let sample = measure(shape, layout, transfer, work)?;
            if transfer == SMALL {
                small.push(sample);
            } else {
                large.push(sample);
            }
        }
    }
    let per_repeat: Vec<f64> =
        small.iter().zip(&large).map(|(s, l): (&Sample, &Sample)| s.gbps / l.gbps).collect();
    let cpu_ratio =
        median(small.iter().zip(&large).map(|(s, l)| l.cpu_seconds_per_gb / s.cpu_seconds_per_gb));
    Ok(Row {
        layout: match layout {
            Layout::Sequential => "sequential",
            Layout::Strided => "strided",
        },
        small_gbps: median(small.iter().map(|s| s.gbps)),
        large_gbps: median(large.iter().map(|s| s.gbps)),
        small_vs_large: median(per_repeat.iter().copied()),
        small_vs_large_per_repeat: per_repeat,
        small_cpu_seconds_per_gb: median(small.iter().map(|s| s.cpu_seconds_per_gb)),
        large_cpu_seconds_per_gb: median(large.iter().map(|s| s.cpu_seconds_per_gb)),
        small_vs_large_cpu_efficiency: cpu_ratio,
    })
}

/// The rows and the ratios as one JSON object on stdout.
fn print_json(shape: Shape, repeat: u32, rows: &[Row]) -> anyhow::Result<()> {
    let out = serde_json::json!({
        "benchmark": "ingress-small-writes",
        "servers": shape.servers,
        "clients": shape.clients,
        "bytes_per_client": shape.bytes_per_client,
        "coalesce_bytes_max": shape.coalesce_bytes_max,
        "small_transfer_bytes": SMALL,
        "large_transfer_bytes": LARGE,
        "repeat": repeat.max(1),
        "rows": rows,
        "ratios": {
            "small_vs_large_writes": rows[0].small_vs_large,
            "small_vs_large_writes_strided": rows[1].small_vs_large,
            "small_vs_large_writes_cpu": rows[0].small_vs_large_cpu_efficiency,
            "small_vs_large_writes_strided_cpu": rows[1].small_vs_large_cpu_efficiency,
        },
        "ratio_basis": "16 KiB over 1 MiB writes, native client, memory durability, same bytes; median of paired ratios",
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// The rows as a table.
fn print_table(shape: Shape, repeat: u32, rows: &[Row]) {
    println!(
        "native client ingress GB/s, S={} C={} {} bytes per client, median of {} runs",
        shape.servers,
        shape.clients,
        shape.bytes_per_client,
        repeat.max(1)
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>14} {:>14} {:>10}",
        "layout", "16KiB", "1MiB", "ratio", "16KiB cpu s/GB", "1MiB cpu s/GB", "cpu ratio"
    );
    for row in rows {
        println!(
            "{:<12} {:>10.3} {:>10.3} {:>10.3} {:>14.3} {:>14.3} {:>10.3}",
            row.layout,
            row.small_gbps,
            row.large_gbps,
            row.small_vs_large,
            row.small_cpu_seconds_per_gb,
            row.large_cpu_seconds_per_gb,
            row.small_vs_large_cpu_efficiency
        );
    }
}

/// CPU seconds (user and system) this process and `servers` have used so far.
fn subject_cpu_seconds(servers: &[spillway_harness::ServerProcess]) -> anyhow::Result<f64> {
    let ticks = spillway_sys::time::clock_ticks_per_second() as f64;
    let mut seconds = 0.0;
    let pids = servers.iter().map(|s| s.pid().to_string()).chain(["self".to_string()]);
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        seconds += (field(14) + field(15)) / ticks;
    }
    Ok(seconds)
}

/// One run: fresh servers, C threads writing `bytes_per_client` each in `transfer`-byte
/// writes laid out as `layout`, then committing at memory durability.
fn measure(shape: Shape, layout: Layout, transfer: u64, work: &Path) -> anyhow::Result<Sample> {
    let total = shape.clients as u64 * shape.bytes_per_client;
    let per_server = total.div_ceil(shape.servers as u64);
    let dram = crate::dram_bytes_holding(per_server, 64 << 20);
    let mut servers = Vec::new();
    for s in 0..shape.servers {
        let name = format!("small-{s}");
        let ssd_dir = work.join(format!("ssd-{name}"));
        let args = ["--durability".to_string(), "memory".to_string()];
        servers.push(crate::start_server(work, &name, &ssd_dir, dram, &args)?);
    }
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.endpoint().clone()).collect();
    // Nobody commits (which seals the epoch) before every thread has written.
    let written = std::sync::Barrier::new(shape.clients as usize);
    let cpu_before = subject_cpu_seconds(&servers)?;
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let threads: Vec<_> = (0..shape.clients)
            .map(|rank| {
                let (endpoints, written) = (&endpoints, &written);
                scope
                    .spawn(move || client_thread(endpoints, shape, layout, transfer, rank, written))
            })
            .collect();
        for thread in threads {
            thread.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = subject_cpu_seconds(&servers)? - cpu_before;
    drop(servers);
    for s in 0..shape.servers {
        let _ = std::fs::remove_dir_all(work.join(format!("ssd-small-{s}")));
    }
    Ok(Sample {
        gbps: gigabytes_per_second(total, seconds),
        cpu_seconds_per_gb: cpu / (total as f64 / 1e9),
    })
}

/// One client: connect, write its share, commit.
fn client_thread(
    endpoints: &[Endpoint],
    shape: Shape,
    layout: Layout,
    transfer: u64,
    rank: u32,
    written: &std::sync::Barrier,
) -> anyhow::Result<()> {
    let options = ClientOptions {
        placement: Placement::Striped {
            stripe_unit_bytes: LARGE,
            stripe_count: endpoints.len() as u32,
        },
        durability: Durability::Memory,
        window: 128,
        coalesce_bytes_max: shape.coalesce_bytes_max,
        client_name: format!("small-writes bench {rank}"),
        ..ClientOptions::default()
    };
    let mut client = Client::connect(endpoints, options).context("connecting")?;
    let epoch = EpochId(1);
    client.begin_epoch(epoch);
    let name = match layout {
        Layout::Sequential => format!("rank{rank}"),
        Layout::Strided => "shared".to_string(),
    };
    let mut file = client.create_file(epoch, &name)?;
    let buffer: Vec<u8> =
        (0..transfer).map(|i| (i as u8) ^ (rank as u8).wrapping_mul(31)).collect();
    let blocks = shape.bytes_per_client / transfer;
    for block in 0..blocks {
        let offset = match layout {
            Layout::Sequential => block * transfer,
            Layout::Strided => (block * shape.clients as u64 + rank as u64) * transfer,
        };
        client.write(&mut file, offset, &buffer)?;
    }
    let flushed = client.flush();
    // A failed thread still meets the others, or they would wait for it forever.
    written.wait();
    flushed?;
    client.commit_epoch(epoch)?;
    Ok(())
}
