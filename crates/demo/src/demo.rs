//! The demo's steps, in the order of the crate documentation, as methods of one [`Demo`] that
//! carries what a step leaves for the next: the servers and their endpoints, the epochs' plans,
//! CRC32Cs and timings, and the figures the test checks.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use spillway_client::Client;
use spillway_drain::DrainMode;
use spillway_harness::ServerProcess;
use spillway_proto::{Durability, Endpoint, EpochState};
use spillway_types::{format_bytes, EpochId};
use tempfile::TempDir;

use crate::cluster::{
    admin, demo_server, drain_peers, log_tail, server_epochs, ssd_dir, DRAIN_STRIPE_BYTES,
    SERVER_NAMES, STOP_TIMEOUT, VICTIM,
};
use crate::mount::mount_step;
use crate::report::{self, gbps, print_drain, print_epochs, print_status, state_name};
use crate::verify::{check_domain_writes, verify_epoch, verify_pfs_copy};
use crate::watch::{
    final_files, first_freed, settled_use, space_used, wait_for, wait_for_gc, watch_drain,
    DrainWatch, FinalFile,
};
use crate::workload::{
    checkpoint_plans, open_plan, plan_data, write_checkpoint, write_direct, CheckpointTiming,
    EpochPlan,
};
use crate::{Args, DemoSummary};

/// One run of the demo, between its steps.
pub(crate) struct Demo {
    args: Args,
    /// The `spillway` executable, run as the servers and as `spillway mount`.
    bin: PathBuf,
    started: Instant,
    /// The temporary directory's path: SSD logs, server logs, sockets, the PFS stand-in.
    root: PathBuf,
    /// The directory standing in for the PFS the servers drain to.
    pfs: PathBuf,
    /// Epochs 1 and 2 (N-N) and 3 (N-1), checkpointed and committed in step 2.
    plans: [EpochPlan; 3],
    /// Epoch 4, written while epoch 3 drains and left open for the crash of step 5.
    open_plan: EpochPlan,
    /// The CRC32C of every rank's part of each committed epoch.
    crcs: BTreeMap<EpochId, Vec<u32>>,
    timings: BTreeMap<EpochId, CheckpointTiming>,
    /// Epochs drained in steps 3 and 4: read back from their PFS copies in step 5.
    drained: BTreeSet<EpochId>,
    summary: DemoSummary,
    /// In [`SERVER_NAMES`] order. Declared before `temp`, so dropped first: on any way out, every
    /// server is killed before its directories are removed.
    servers: Vec<ServerProcess>,
    endpoints: Vec<Endpoint>,
    temp: TempDir,
}

/// Step 3's drain and what the application wrote meanwhile.
pub(crate) struct DrainOverlap {
    /// Servers the drain was queued on.
    pub(crate) queued: usize,
    pub(crate) watch: DrainWatch,
    /// Epoch 4's writes.
    pub(crate) writes: CheckpointTiming,
}

impl Demo {
    /// Makes the temporary directory and the PFS stand-in in it; starts nothing yet.
    pub(crate) fn new(args: Args) -> anyhow::Result<Demo> {
        let started = Instant::now();
        let bin = match &args.server_bin {
            Some(bin) => bin.clone(),
            None => std::env::current_exe().context("locating the spillway executable")?,
        };
        let temp = tempfile::Builder::new()
            .prefix("spillway-demo-")
            .tempdir_in(&args.dir)
            .with_context(|| format!("creating a temporary directory in {}", args.dir.display()))?;
        let root = temp.path().to_path_buf();
        let pfs = root.join("pfs");
        std::fs::create_dir(&pfs)
            .with_context(|| format!("creating the PFS stand-in {}", pfs.display()))?;
        Ok(Demo {
            plans: checkpoint_plans(args.rank_bytes),
            open_plan: open_plan(args.rank_bytes),
            args,
            bin,
            started,
            root,
            pfs,
            crcs: BTreeMap::new(),
            timings: BTreeMap::new(),
            drained: BTreeSet::new(),
            summary: DemoSummary::default(),
            servers: Vec::new(),
            endpoints: Vec::new(),
            temp,
        })
    }

    /// Bytes of one epoch, all ranks together.
    fn epoch_bytes(&self) -> u64 {
        self.args.ranks as u64 * self.args.rank_bytes
    }

    pub(crate) fn print_intro(&self) {
        report::print_intro(&self.args, &self.root);
    }

    /// Step 1: both servers, each with its drain peers and the PFS directory.
    pub(crate) fn start_servers(&mut self) -> anyhow::Result<()> {
        println!(
            "1. Start two `spillway serve` processes on loopback, draining to a PFS directory"
        );
        println!("   (a directory on the local disk stands in for Lustre: {}; stripe {}; drain peers over Unix sockets)", self.pfs.display(), format_bytes(DRAIN_STRIPE_BYTES));
        let peers = drain_peers(&self.root);
        for (index, name) in SERVER_NAMES.iter().enumerate() {
            let server = demo_server(&self.bin, &self.root, index, &peers, &self.pfs, &self.args)
                .spawn()
                .with_context(|| {
                    format!("starting server {name} ({} serve)", self.bin.display())
                })?;
            println!(
                "   {name}: pid {}, {} (ready in {} ms), SSD log {}",
                server.pid(),
                server.endpoint(),
                server.startup().as_millis(),
                ssd_dir(&self.root, name).display()
            );
            self.servers.push(server);
        }
        self.endpoints = self.servers.iter().map(|s| s.endpoint().clone()).collect();
        println!();
        Ok(())
    }

    /// Step 2: epochs 1 to 3 checkpointed and committed, each against a direct write to disk.
    pub(crate) fn checkpoint(&mut self) -> anyhow::Result<()> {
        println!(
            "2. Checkpoint: each epoch timed as the application sees it (first write to last commit),"
        );
        println!("   against the same bytes written to files on the same disk and fsync'd");
        for plan in self.plans {
            self.checkpoint_epoch(&plan)?;
        }
        println!();
        Ok(())
    }

    fn checkpoint_epoch(&mut self, plan: &EpochPlan) -> anyhow::Result<()> {
        let (ranks, transfer_bytes) = (self.args.ranks, self.args.transfer_bytes);
        let data = plan_data(plan, ranks);
        self.crcs.insert(plan.epoch, data.iter().map(|d| crc32c::crc32c(d)).collect());
        // The direct write first, so that the last epoch's commit is what the drain follows.
        let direct = write_direct(&self.root.join("direct-to-disk"), plan, &data, transfer_bytes)?;
        let timing = write_checkpoint(&self.endpoints, plan, &data, transfer_bytes)?;
        report::print_checkpoint(plan, ranks, self.epoch_bytes(), &timing, direct);
        if plan.durability == Durability::Memory {
            // A memory commit survives a client crash, not a server crash; the servers' flushers
            // make it durable in the background. Wait for that before anyone kills a server.
            let epoch = plan.epoch;
            let caught_up = wait_for(&self.endpoints, "memory commit reaching SSD", |client| {
                Ok(client
                    .list_epochs()?
                    .iter()
                    .any(|e| e.epoch == epoch && e.state == EpochState::Committed))
            })?;
            println!("     background: the SSD logs caught up with epoch {} {:.0} ms after its commit returned", epoch.0, caught_up.as_secs_f64() * 1e3);
        }
        self.timings.insert(plan.epoch, timing);
        Ok(())
    }

    /// Step 3: epoch 3 (N-1) drains by coordinated shuffling while the application writes epoch
    /// 4; the timeline, each server's domain and the PFS copy are shown and checked.
    pub(crate) fn drain_while_writing(&mut self) -> anyhow::Result<()> {
        let plan = self.plans[2];
        let (ranks, epoch_bytes) = (self.args.ranks, self.epoch_bytes());
        println!("3. Epoch {} committed: the application resumes (writes epoch 4) while epoch {} drains to the PFS", plan.epoch.0, plan.epoch.0);
        println!("   (N-1 shared file, coordinated shuffling: stripe-aligned domains, one writer per domain)");
        let files = final_files(&self.endpoints, &self.pfs, &plan, ranks)?;
        let overlap = self.drain_during_next_epoch(&plan, &files)?;
        let committed = self.timings[&plan.epoch].finished;
        report::print_overlap_timeline(&plan, committed, &overlap, ranks, epoch_bytes);
        let idle_write = self.timings[&EpochId(2)].write;
        report::print_overlap_throughput(&overlap, epoch_bytes, idle_write);
        print_drain(&SERVER_NAMES, &overlap.watch);
        check_domain_writes(&overlap.watch.infos, epoch_bytes)?;
        self.summary.pfs_bytes_verified +=
            verify_pfs_copy(&self.pfs, &plan, &self.crcs[&plan.epoch])?;
        self.drained.insert(plan.epoch);
        println!("   PFS copy {} verified: {} bytes, every rank's range matches its CRC32C, no staging file left", files[0].path.display(), epoch_bytes);
        println!("   {}: {} written in {:.0} ms, acknowledged, never committed (the crash comes for it in step 5)", self.open_plan.describe(ranks), format_bytes(epoch_bytes), overlap.writes.write.as_secs_f64() * 1e3);
        println!();
        Ok(())
    }

    /// Requests the drain of `plan`'s epoch, then writes epoch 4 while a thread watches it.
    fn drain_during_next_epoch(
        &self,
        plan: &EpochPlan,
        files: &[FinalFile],
    ) -> anyhow::Result<DrainOverlap> {
        let mut client = admin(&self.endpoints)?;
        let used_at_request = space_used(&mut client)?;
        let queued = client
            .request_drain(plan.epoch, DrainMode::Shuffled.code())
            .with_context(|| format!("requesting the drain of epoch {}", plan.epoch))?;
        let requested = Instant::now();
        if queued != SERVER_NAMES.len() {
            bail!(
                "drain of epoch {} queued on {queued} servers, expected {}",
                plan.epoch,
                SERVER_NAMES.len()
            );
        }
        // The application computes its next state (here: generates epoch 4's bytes), then
        // writes it.
        let data = plan_data(&self.open_plan, self.args.ranks);
        let (watch, writes) = std::thread::scope(|scope| {
            let watcher = scope.spawn(|| {
                watch_drain(&self.endpoints, plan.epoch, requested, &used_at_request, files, None)
            });
            let written =
                write_checkpoint(&self.endpoints, &self.open_plan, &data, self.args.transfer_bytes);
            let watched =
                watcher.join().unwrap_or_else(|_| Err(anyhow!("the drain watcher panicked")));
            (watched, written)
        });
        Ok(DrainOverlap { queued, watch: watch?, writes: writes? })
    }

    /// Step 4: epoch 1 (N-N) drains with the application idle; no server may free its space
    /// before the PFS files it holds parts of are published.
    pub(crate) fn drain_idle(&mut self) -> anyhow::Result<()> {
        let plan = self.plans[0];
        let (ranks, epoch_bytes) = (self.args.ranks, self.epoch_bytes());
        println!("4. Drain epoch {} (N-N, {ranks} files), application idle: GC frees its space only after the PFS copy is fsync'd", plan.epoch.0);
        let mut client = admin(&self.endpoints)?;
        let watch = self.watch_idle_drain(&plan, &mut client)?;
        report::print_idle_timeline(&plan, &watch, ranks);
        let drain_time = watch.drained - watch.requested;
        println!(
            "   drain: {} in {:.0} ms = {:.2} GB/s",
            format_bytes(epoch_bytes),
            drain_time.as_secs_f64() * 1e3,
            gbps(epoch_bytes, drain_time)
        );
        print_drain(&SERVER_NAMES, &watch);
        self.summary.pfs_bytes_verified +=
            verify_pfs_copy(&self.pfs, &plan, &self.crcs[&plan.epoch])?;
        self.drained.insert(plan.epoch);
        println!(
            "   PFS copies of the {ranks} files verified against the CRC32C of what each rank wrote"
        );
        println!(
            "   after the drain and GC (DRAM + SSD in use {} -> {}):",
            format_bytes(watch.used_before),
            format_bytes(watch.used_after)
        );
        print_status(&client.status()?);
        print_epochs(&client.list_epochs()?);
        self.summary.bytes_freed_after_drain = watch.used_before.saturating_sub(watch.used_after);
        println!();
        Ok(())
    }

    /// Drains `plan`'s epoch from settled space and watches it until drained, then (for at most
    /// the GC wait) until space comes back; `used_after` is the settled figure after that.
    fn watch_idle_drain(
        &self,
        plan: &EpochPlan,
        client: &mut Client,
    ) -> anyhow::Result<DrainWatch> {
        let used_before = settled_use(client)?;
        println!("   before the drain:");
        print_status(&client.status()?);
        let files = final_files(&self.endpoints, &self.pfs, plan, self.args.ranks)?;
        client
            .request_drain(plan.epoch, DrainMode::Shuffled.code())
            .with_context(|| format!("requesting the drain of epoch {}", plan.epoch))?;
        let requested = Instant::now();
        // Freed on a server: at least a quarter of its share of the epoch (segments shared with a
        // live epoch stay until compaction).
        let threshold = (self.epoch_bytes() / (4 * SERVER_NAMES.len() as u64)).max(1);
        let mut watch = watch_drain(
            &self.endpoints,
            plan.epoch,
            requested,
            &used_before,
            &files,
            Some(threshold),
        )?;
        if watch.freed.is_none() {
            watch.freed = first_freed(client, watch.drained, &used_before, threshold)?;
        }
        watch.used_after = settled_use(client)?.iter().sum();
        Ok(watch)
    }

    /// Step 5: with epoch 4 open, the victim server is SIGKILLed and restarted on the same SSD
    /// directory and port; its epochs must have survived, and every committed byte reads back.
    pub(crate) fn crash_and_recover(&mut self) -> anyhow::Result<()> {
        let victim_name = SERVER_NAMES[VICTIM];
        println!("5. Crash while epoch 4 is open: SIGKILL {victim_name}, restart it on the same SSD directory and port");
        let before = server_epochs(&self.endpoints[VICTIM])?;
        self.kill_and_restart_victim()?;
        let after = server_epochs(&self.endpoints[VICTIM])?;
        report::print_recovery(victim_name, &before, &after);
        let log_text = self.servers[VICTIM].log_text();
        let torn = log_text.lines().filter(|l| l.contains("torn tail")).count();
        println!("   (epoch 4 was acknowledged in {victim_name}'s DRAM but never committed: what had not spilled to SSD is gone, as documented)");
        println!("   torn record tails cut by recovery (from {victim_name}'s log): {torn}");
        self.check_recovered_states(&before, &after)?;
        self.read_back()
    }

    fn kill_and_restart_victim(&mut self) -> anyhow::Result<()> {
        let victim_name = SERVER_NAMES[VICTIM];
        let server = &mut self.servers[VICTIM];
        let pid = server.pid();
        if !matches!(server.endpoint(), Endpoint::Tcp(_)) {
            bail!("server {victim_name} listens on {}, expected TCP", server.endpoint());
        }
        let status = server.sigkill()?;
        println!("   {victim_name} (pid {pid}) killed: {status}");
        // Same flags, SSD directory and log; the harness pins the TCP port the first run got.
        server.restart().with_context(|| format!("restarting server {victim_name}"))?;
        if server.endpoint() != &self.endpoints[VICTIM] {
            bail!(
                "{victim_name} came back on {} instead of {}",
                server.endpoint(),
                self.endpoints[VICTIM]
            );
        }
        println!(
            "   {victim_name} restarted: pid {}, {} (recovery + ready in {} ms)",
            server.pid(),
            server.endpoint(),
            server.startup().as_millis()
        );
        Ok(())
    }

    /// Every committed epoch the victim held before the kill is still committed after the
    /// restart, or drained if it was drained.
    fn check_recovered_states(
        &self,
        before: &BTreeMap<EpochId, (EpochState, u64)>,
        after: &BTreeMap<EpochId, (EpochState, u64)>,
    ) -> anyhow::Result<()> {
        for plan in &self.plans {
            let (state, _) = after.get(&plan.epoch).copied().unwrap_or((EpochState::Open, 0));
            let expected = if self.drained.contains(&plan.epoch) {
                EpochState::Drained
            } else {
                EpochState::Committed
            };
            if before.contains_key(&plan.epoch) && state != expected {
                bail!(
                    "committed epoch {} is {} on {} after the restart",
                    plan.epoch,
                    state_name(state),
                    SERVER_NAMES[VICTIM]
                );
            }
        }
        Ok(())
    }

    /// Every committed epoch read back through the client and checked against its CRC32Cs; the
    /// drained and freed ones come from their PFS copies.
    fn read_back(&mut self) -> anyhow::Result<()> {
        println!("   reading every committed byte back through the client and checking CRC32C; the client falls");
        println!(
            "   back to the PFS copy for epochs that were drained and freed (restart read path):"
        );
        let read_started = Instant::now();
        let mut verified_total = 0;
        for plan in &self.plans {
            let expected = &self.crcs[&plan.epoch];
            let drained = self.drained.contains(&plan.epoch);
            let (verified, from_pfs) = verify_epoch(
                &self.endpoints,
                plan,
                expected,
                self.args.transfer_bytes,
                &self.pfs,
                drained,
            )?;
            verified_total += verified;
            self.summary.parts_read_from_pfs += from_pfs;
            let listing: Vec<String> = expected.iter().map(|c| format!("{c:08x}")).collect();
            let source = if from_pfs > 0 { "from the PFS copy" } else { "from the burst buffer" };
            println!(
                "     epoch {}: {} in {} part(s) verified {source}, CRC32C {}",
                plan.epoch.0,
                format_bytes(verified),
                expected.len(),
                listing.join(" ")
            );
        }
        let read_time = read_started.elapsed();
        println!(
            "   all {} committed bytes verified ({}) in {:.0} ms = {:.2} GB/s",
            verified_total,
            format_bytes(verified_total),
            read_time.as_secs_f64() * 1e3,
            gbps(verified_total, read_time)
        );
        println!();
        Ok(())
    }

    /// Step 6: the epochs and the servers' space, then the oldest epoch still held in the burst
    /// buffer is deleted and GC is watched giving its space back.
    pub(crate) fn delete_and_gc(&self) -> anyhow::Result<()> {
        println!(
            "6. Epochs and space, then delete the oldest epoch still held in the burst buffer"
        );
        let mut client = admin(&self.endpoints)?;
        print_epochs(&client.list_epochs()?);
        let statuses = client.status()?;
        print_status(&statuses);
        let ssd_before: u64 = statuses.iter().map(|s| s.ssd_bytes_used).sum();
        let oldest = client
            .list_epochs()?
            .iter()
            .find(|e| e.state != EpochState::Drained)
            .map(|e| e.epoch)
            .ok_or_else(|| anyhow!("no undrained epoch listed"))?;
        client.delete_epoch(oldest).with_context(|| format!("deleting epoch {oldest}"))?;
        // Segments with no live bytes are removed by each server's background GC; a segment that
        // also holds a live epoch stays until compaction, which runs when free space gets low.
        let (statuses, first_freed) = wait_for_gc(&mut client, ssd_before)?;
        let ssd_after: u64 = statuses.iter().map(|s| s.ssd_bytes_used).sum();
        println!(
            "   deleted epoch {}; SSD use {} -> {}: {} freed by GC (first segments gone after {:.0} ms)",
            oldest.0,
            format_bytes(ssd_before),
            format_bytes(ssd_after),
            format_bytes(ssd_before.saturating_sub(ssd_after)),
            first_freed.as_secs_f64() * 1e3
        );
        if ssd_after >= ssd_before {
            println!("   (no segment held only epoch {} data: its bytes are dead and go when compaction runs at low free space)", oldest.0);
        }
        print_epochs(&client.list_epochs()?);
        print_status(&statuses);
        if client.list_epochs()?.iter().any(|e| e.epoch == oldest) {
            bail!("epoch {oldest} still listed after its deletion");
        }
        println!();
        Ok(())
    }

    /// Step 7: unmodified programs through the POSIX mount.
    pub(crate) fn mount(&self) -> anyhow::Result<()> {
        mount_step(&self.bin, &self.endpoints, &self.root)
    }

    /// Step 8: SIGTERM to both servers, which must exit 0; then the temporary directory goes.
    pub(crate) fn shut_down(mut self) -> anyhow::Result<DemoSummary> {
        println!("8. Clean shutdown: SIGTERM to both servers");
        let mut failures = Vec::new();
        for server in &mut self.servers {
            let started = Instant::now();
            let status = server.sigterm_and_wait(STOP_TIMEOUT)?;
            let name = server.name();
            println!("   {name}: exited with {status} after {} ms", started.elapsed().as_millis());
            if !status.success() {
                failures
                    .push(format!("{name} exited with {status}{}", log_tail(server.log_path())));
            }
        }
        if !failures.is_empty() {
            bail!("unclean shutdown: {}", failures.join("; "));
        }
        let _ = std::io::stdout().flush();
        drop(self.temp);
        println!("   removed {}", self.root.display());
        println!();
        println!(
            "Demo done in {:.1} s: epochs drained in the background and verified on the PFS; every committed byte verified after SIGKILL and restart.",
            self.started.elapsed().as_secs_f64()
        );
        Ok(self.summary)
    }
}
