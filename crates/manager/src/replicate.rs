//! Re-replication: after a server of a replicated reservation is lost for good, copy what it
//! held onto a replacement and put the replacement at its index of the server list.
//!
//! Which bytes the lost server held needs no placement arithmetic: every write of a
//! `replicas = k` reservation succeeds only once k servers hold it, so a committed range the
//! lost server held is now on exactly k − 1 survivors, and one it did not hold on k. The ranges
//! of each file that fewer than k survivors hold ([`under_replicated`]) are what it held (bytes
//! no survivor holds are holes, or — with one copy — gone, which the drain reports). Because the
//! replacement leaves the pattern of shared failure domains unchanged
//! (`policy::fragments::choose_replacement`), putting it at the lost index leaves every replica
//! set unchanged: it holds exactly what the lost server held.
//!
//! One reservation at a time, on the manager's repair thread: grant the epoch on the
//! replacement, copy (as root, through the client library, reading from a survivor), seal it
//! there at `ssd` if the survivors sealed it (else make it durable with a sync and leave it
//! open), then swap the server in one transaction. Progress is in memory (bytes copied of the
//! total; `replicas restored` when done) and shown with the reservation; a manager restart
//! redoes an unfinished copy from the start (copying the same bytes again is harmless).

use std::path::Path;

use spillway_client::{Client, ClientOptions};
use spillway_proto::{Durability, Endpoint, EpochState};
use spillway_types::EpochId;

use crate::model::Reservation;
use crate::service::Manager;

/// One range of a file to copy, and a surviving server (index into the survivors) to read it
/// from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeCopy {
    pub offset: u64,
    pub length: u64,
    pub source: usize,
}

/// The ranges that at least one but fewer than `replicas` of the survivors hold, given every
/// `(survivor, offset, length)` extent of one file; adjacent ranges with the same source are
/// merged. Pure.
pub fn under_replicated(extents: &[(usize, u64, u64)], replicas: u32) -> Vec<RangeCopy> {
    // A sweep over the extents' starts and ends, with the servers holding the current stretch
    // (and how many of their extents cover it): O(e log e) for e extents.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(extents.len() * 2);
    for &(server, offset, length) in extents.iter().filter(|e| e.2 > 0) {
        events.push((offset, true, server));
        events.push((offset.saturating_add(length), false, server));
    }
    events.sort_unstable();
    let mut active: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
    let mut out: Vec<RangeCopy> = Vec::new();
    let mut at = 0;
    for (position, starts, server) in events {
        if position > at && !active.is_empty() && active.len() < replicas as usize {
            let source = *active.keys().next().expect("not empty");
            match out.last_mut() {
                Some(last) if last.source == source && last.offset + last.length == at => {
                    last.length += position - at;
                }
                _ => out.push(RangeCopy { offset: at, length: position - at, source }),
            }
        }
        at = position;
        if starts {
            *active.entry(server).or_default() += 1;
        } else if let Some(count) = active.get_mut(&server) {
            *count -= 1;
            if *count == 0 {
                active.remove(&server);
            }
        }
    }
    out
}

/// A degraded reservation the repair thread can restore.
#[derive(Clone, Debug)]
pub struct RepairJob {
    pub reservation: Reservation,
    pub lost_index: usize,
    pub lost_server: u64,
    pub replacement_server: u64,
    pub replacement: String,
}

/// Why one repair attempt failed (it is retried next round).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    #[error("{what}: {source}")]
    Client { what: String, source: spillway_client::ClientError },
    #[error("{0}")]
    Other(String),
}

fn client_error(
    what: impl Into<String>,
) -> impl FnOnce(spillway_client::ClientError) -> RepairError {
    let what = what.into();
    move |source| RepairError::Client { what, source }
}

fn connect(
    addresses: &[String],
    durability: Durability,
    munge_socket: Option<&Path>,
) -> Result<Client, RepairError> {
    let endpoints: Vec<Endpoint> = addresses
        .iter()
        .map(|a| a.parse::<Endpoint>())
        .collect::<Result<_, _>>()
        .map_err(RepairError::Other)?;
    let options = ClientOptions {
        client_name: "spillway-manager re-replication".into(),
        munge_socket: munge_socket.map(Path::to_path_buf),
        durability,
        ..Default::default()
    };
    Client::connect(&endpoints, options)
        .map_err(client_error(format!("connecting to {}", addresses.join(","))))
}

/// One round: restores the first reservation that needs it (at most one per round).
pub fn repair_round(manager: &Manager) {
    let jobs = match manager.repair_jobs() {
        Ok(jobs) => jobs,
        Err(error) => {
            tracing::error!(%error, "re-replication cannot list degraded reservations");
            return;
        }
    };
    // A reservation whose last attempt failed goes after the others, so one that keeps failing
    // does not hold every other one back.
    let failed =
        |job: &RepairJob| job.reservation.repair.as_ref().is_some_and(|p| p.state == "failed");
    let Some(job) = jobs.iter().find(|j| !failed(j)).or(jobs.first()).cloned() else { return };
    let id = job.reservation.id;
    let lost = job.reservation.servers[job.lost_index].clone();
    tracing::info!(reservation = id, %lost, replacement = %job.replacement, "re-replication starts");
    match repair(manager, &job) {
        Ok(()) => {
            tracing::info!(reservation = id, %lost, replacement = %job.replacement, "replicas restored")
        }
        Err(error) => {
            tracing::warn!(reservation = id, %lost, replacement = %job.replacement, %error, "re-replication failed; retried next round");
            manager.update_repair(id, |p| {
                p.state = "failed".into();
                p.error = Some(error.to_string());
            });
        }
    }
}

/// Copies what the lost server held onto the replacement, then swaps it in.
fn repair(manager: &Manager, job: &RepairJob) -> Result<(), RepairError> {
    let reservation = &job.reservation;
    let epoch = EpochId(reservation.epoch);
    let munge = manager.knobs().munge_socket_path();
    manager.start_repair(reservation.id, &reservation.servers[job.lost_index], &job.replacement);
    // The replacement takes the lost server's place in the grant (its share, the owner, …).
    let mut replaced = reservation.clone();
    replaced.servers[job.lost_index] = job.replacement.clone();
    let mut target =
        connect(std::slice::from_ref(&job.replacement), Durability::Ssd, munge.as_deref())?;
    target
        .grant_epoch(epoch, &crate::reservation_grant(&replaced, job.lost_index))
        .map_err(client_error("granting the epoch on the replacement"))?;
    let survivors: Vec<String> = reservation
        .servers
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != job.lost_index)
        .map(|(_, a)| a.clone())
        .collect();
    let mut source = connect(&survivors, Durability::Ssd, munge.as_deref())?;
    let Some(state) = epoch_state(&mut source, epoch)? else {
        // Nothing of the epoch on any survivor (never written, or drained and freed).
        return finish(manager, job);
    };
    if state == EpochState::Drained || sealed_on(&mut target, epoch)? {
        // Drained: the PFS has it. Sealed on the replacement: an earlier attempt copied and
        // committed everything, then failed to swap.
        return finish(manager, job);
    }
    let plan = copy_plan(&mut source, epoch, reservation.replicas)?;
    let total: u64 = plan.iter().flat_map(|(_, r)| r.iter().map(|c| c.length)).sum();
    manager.update_repair(reservation.id, |p| p.total_bytes = total);
    copy(manager, reservation.id, &mut source, &mut target, epoch, &plan)?;
    if matches!(state, EpochState::Committed | EpochState::CommittedMemory) {
        target.commit_epoch(epoch).map_err(client_error("committing on the replacement"))?;
    } else {
        target.sync_epoch(epoch).map_err(client_error("syncing on the replacement"))?;
    }
    finish(manager, job)
}

fn finish(manager: &Manager, job: &RepairJob) -> Result<(), RepairError> {
    manager
        .replace_server(job.reservation.id, job.lost_index, job.lost_server, job.replacement_server)
        .map_err(|e| RepairError::Other(e.to_string()))?;
    manager.update_repair(job.reservation.id, |p| {
        p.state = "restored".into();
        p.error = None;
    });
    Ok(())
}

/// The epoch's state on the survivors: the least advanced one that has it; `None` if none has.
fn epoch_state(client: &mut Client, epoch: EpochId) -> Result<Option<EpochState>, RepairError> {
    let epochs = client.list_epochs().map_err(client_error("listing epochs on the survivors"))?;
    Ok(epochs.into_iter().find(|e| e.epoch == epoch).map(|e| e.state))
}

/// Whether the single server of `client` holds the epoch committed.
fn sealed_on(client: &mut Client, epoch: EpochId) -> Result<bool, RepairError> {
    let epochs = client.epochs_on(0).map_err(client_error("listing epochs on the replacement"))?;
    Ok(epochs.iter().any(|e| {
        e.epoch == epoch && matches!(e.state, EpochState::Committed | EpochState::CommittedMemory)
    }))
}

/// Per file of the epoch, the ranges fewer than `replicas` survivors hold.
fn copy_plan(
    client: &mut Client,
    epoch: EpochId,
    replicas: u32,
) -> Result<Vec<(String, Vec<RangeCopy>)>, RepairError> {
    let files = client.list_files(epoch).map_err(client_error("listing the epoch's files"))?;
    let mut plan = Vec::new();
    for (name, _) in files {
        let file =
            client.open_file(epoch, &name).map_err(client_error(format!("opening {name}")))?;
        let extents: Vec<(usize, u64, u64)> = client
            .extents(&file)
            .map_err(client_error(format!("extents of {name}")))?
            .into_iter()
            .map(|(server, e)| (server, e.offset, e.length))
            .collect();
        let ranges = under_replicated(&extents, replicas);
        if !ranges.is_empty() {
            plan.push((name, ranges));
        }
    }
    Ok(plan)
}

/// Runs a repair round every `heartbeat_ms` until `stop` is set.
pub fn run(manager: std::sync::Arc<Manager>, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering;
    let period = std::time::Duration::from_millis(manager.knobs().heartbeat_ms);
    while !stop.load(Ordering::Relaxed) {
        let started = std::time::Instant::now();
        repair_round(&manager);
        while started.elapsed() < period && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(20).min(period));
        }
    }
}

/// Bytes read per request while copying.
const COPY_CHUNK_BYTES: u64 = 1 << 20;

fn copy(
    manager: &Manager,
    reservation: u64,
    source: &mut Client,
    target: &mut Client,
    epoch: EpochId,
    plan: &[(String, Vec<RangeCopy>)],
) -> Result<(), RepairError> {
    let mut buffer = vec![0u8; COPY_CHUNK_BYTES as usize];
    for (name, ranges) in plan {
        let from =
            source.open_file(epoch, name).map_err(client_error(format!("opening {name}")))?;
        let mut to = target
            .create_file(epoch, name)
            .map_err(client_error(format!("creating {name} on the replacement")))?;
        for range in ranges {
            let mut at = range.offset;
            let end = range.offset + range.length;
            while at < end {
                let length = (end - at).min(COPY_CHUNK_BYTES);
                let chunk = &mut buffer[..length as usize];
                source
                    .read_ranges(&from, at, chunk, vec![(range.source, at, length)])
                    .map_err(client_error(format!("reading {name} at {at}")))?;
                target
                    .write(&mut to, at, chunk)
                    .map_err(client_error(format!("writing {name} at {at}")))?;
                at += length;
                manager.update_repair(reservation, |p| p.copied_bytes += length);
            }
        }
        target.flush().map_err(client_error(format!("writing {name} on the replacement")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_held_by_fewer_than_k_survivors_are_copied() {
        // Two copies; survivors 0 and 1. 0..100 held by both (the lost server did not hold it);
        // 100..150 only by 0, 150..200 only by 1 (the lost server held those); 300..400 by
        // nobody (a hole).
        let extents = [(0, 0, 150), (1, 0, 100), (1, 150, 50)];
        assert_eq!(
            under_replicated(&extents, 2),
            vec![
                RangeCopy { offset: 100, length: 50, source: 0 },
                RangeCopy { offset: 150, length: 50, source: 1 },
            ]
        );
        // Three copies: everything held by fewer than three; adjacent ranges of one source merge.
        assert_eq!(
            under_replicated(&extents, 3),
            vec![
                RangeCopy { offset: 0, length: 150, source: 0 },
                RangeCopy { offset: 150, length: 50, source: 1 },
            ]
        );
        assert!(under_replicated(&extents, 1).is_empty());
        assert!(under_replicated(&[], 2).is_empty());
        assert!(under_replicated(&[(0, 5, 0)], 2).is_empty(), "empty extents hold nothing");
    }

    #[test]
    fn overlapping_extents_of_one_server_count_once() {
        let extents = [(0, 0, 100), (0, 50, 100), (1, 0, 150)];
        assert!(under_replicated(&extents, 2).is_empty());
        assert_eq!(
            under_replicated(&[(0, 0, 100), (0, 50, 100)], 2),
            vec![RangeCopy { offset: 0, length: 150, source: 0 }]
        );
    }

    #[test]
    fn matches_a_byte_by_byte_count() {
        // Pseudo-random small layouts (three servers, offsets below 64): every byte is in the
        // output exactly when 1..k servers hold it, copied from the lowest such server.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |bound: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % bound
        };
        for _ in 0..500 {
            let extents: Vec<(usize, u64, u64)> =
                (0..next(6)).map(|_| (next(3) as usize, next(64), next(20))).collect();
            for replicas in 1..=3u32 {
                let mut expected = vec![None; 100];
                for (byte, slot) in expected.iter_mut().enumerate() {
                    let byte = byte as u64;
                    let mut held: Vec<usize> = extents
                        .iter()
                        .filter(|&&(_, o, l)| o <= byte && byte < o + l)
                        .map(|e| e.0)
                        .collect();
                    held.sort_unstable();
                    held.dedup();
                    if !held.is_empty() && held.len() < replicas as usize {
                        *slot = Some(held[0]);
                    }
                }
                let mut got = vec![None; 100];
                for copy in under_replicated(&extents, replicas) {
                    for byte in copy.offset..copy.offset + copy.length {
                        assert!(got[byte as usize].is_none(), "byte {byte} twice");
                        got[byte as usize] = Some(copy.source);
                    }
                }
                assert_eq!(got, expected, "{extents:?} k={replicas}");
            }
        }
    }
}
