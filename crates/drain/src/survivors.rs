//! Draining an epoch from the survivors of a lost (or replaced) server, with the epoch
//! manifests (docs/design/drain.md, "Lost servers and replicas").
//!
//! Every committer wrote its manifest (its written ranges per file, and its server list with
//! ids and failure domains) to every server of its list before its commit, so each survivor
//! holds every committed writer's manifest. The servers the manifests name that answer with
//! that id are the live holders; any other server (unreachable, or answering with an id no
//! manifest names: a replacement, or another reservation's server) is never read from. A
//! file's written bytes are the union of the manifests' ranges for it; those no live holder
//! holds are lost (`plan::lost_ranges`), and such a file is never published.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use spillway_client::manifest::{parse_sequenced_name, Manifest};
use spillway_client::{Client, ClientError, ClientOptions};
use spillway_proto::{Endpoint, ErrorCode, ServerId};
use spillway_types::EpochId;

use crate::plan::lost_ranges;

/// The servers an attempt reads from and how its part markers are named.
#[derive(Clone, Debug)]
pub struct View {
    /// The endpoints the attempt's client is connected to, in the reservation's order.
    pub endpoints: Vec<Endpoint>,
    /// This server's index among `endpoints`.
    pub me: usize,
    /// Appended to part markers: empty for the whole server list; else `.of-<positions>`, the
    /// reservation positions of `endpoints` (a marker's index is one of that set), so that
    /// markers of different participant sets never count together.
    pub marker_tag: String,
}

impl View {
    /// Every server of the reservation.
    pub fn whole(peers: &[Endpoint], self_index: usize) -> View {
        View { endpoints: peers.to_vec(), me: self_index, marker_tag: String::new() }
    }
}

/// The written bytes of one file that no live server holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileLoss {
    pub file: String,
    /// Sorted, disjoint byte ranges; empty when no manifest names the file (its written
    /// ranges are unknown, so it is not published either).
    pub ranges: Vec<Range<u64>>,
}

/// What the survivors hold of an epoch.
pub struct Survivors {
    /// Connected to the live servers the manifests name, in the reservation's order.
    pub client: Client,
    pub view: View,
    /// Every file of the manifests (user files only) with its written ranges.
    pub written: BTreeMap<String, Vec<Range<u64>>>,
    /// Files with bytes no live server holds.
    pub losses: Vec<FileLoss>,
    /// The servers of the manifests not among the live ones, each described (position,
    /// address, id, failure domain, why).
    pub lost_servers: Vec<String>,
}

/// Why the survivors cannot be surveyed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SurvivorError {
    #[error("peer: {0}")]
    Peer(#[from] ClientError),
    #[error("manifest {name} of epoch {epoch} cannot be read from any live server: {why}")]
    BadManifest { epoch: EpochId, name: String, why: String },
    #[error("epoch {epoch}: writers announced manifests that no live server holds ({missing}): a writer whose epoch another writer sealed first could not store its manifest (writers of shared files call write_manifest before the barrier), so the survivors cannot tell what it wrote")]
    MissingManifests { epoch: EpochId, missing: String },
    #[error("this server ({id}) is not named by the manifests of epoch {epoch}: it is not one of the servers its writers used, so it does not drain it from the survivors")]
    NotNamed { epoch: EpochId, id: ServerId },
}

/// Surveys the reservation for `epoch`: `None` when no live server holds a manifest of it
/// (the caller keeps refusing), else the live servers the manifests name and what is lost.
pub fn survey(
    peers: &[Endpoint],
    self_index: usize,
    options: &ClientOptions,
    epoch: EpochId,
) -> Result<Option<Survivors>, SurvivorError> {
    // Who answers, and as whom.
    let mut answering: Vec<(usize, ServerId)> = Vec::new();
    let mut unreachable: BTreeMap<usize, String> = BTreeMap::new();
    for (position, endpoint) in peers.iter().enumerate() {
        match Client::connect(std::slice::from_ref(endpoint), options.clone()) {
            Ok(c) => answering.push((position, c.server_identity(0).0)),
            Err(e) => {
                unreachable.insert(position, e.to_string());
            }
        }
    }
    if answering.is_empty() {
        return Ok(None);
    }
    let endpoints_of = |positions: &[usize]| -> Vec<Endpoint> {
        positions.iter().map(|&p| peers[p].clone()).collect()
    };
    let positions: Vec<usize> = answering.iter().map(|&(p, _)| p).collect();
    let mut client = Client::connect(&endpoints_of(&positions), options.clone())?;
    let manifests = read_manifests(&mut client, epoch)?;
    if manifests.is_empty() {
        return Ok(None);
    }
    check_every_intent_has_its_manifest(&mut client, epoch, &manifests)?;
    // Every server the writers used, with the position and domain the first manifest gives.
    let mut named: BTreeMap<ServerId, (usize, String)> = BTreeMap::new();
    for manifest in &manifests {
        for (position, server) in manifest.servers.iter().enumerate() {
            named.entry(server.id).or_insert((position, server.failure_domain.clone()));
        }
    }
    let live: Vec<(usize, ServerId)> =
        answering.iter().copied().filter(|(_, id)| named.contains_key(id)).collect();
    let Some(me) = live.iter().position(|&(p, _)| p == self_index) else {
        let id = answering.iter().find(|&&(p, _)| p == self_index).map(|&(_, id)| id);
        return match id {
            Some(id) => Err(SurvivorError::NotNamed { epoch, id }),
            None => Ok(None), // this server does not answer itself: nothing to decide here
        };
    };
    let live_positions: Vec<usize> = live.iter().map(|&(p, _)| p).collect();
    if live_positions != positions {
        // A server no manifest names is never read from, whatever it holds.
        client = Client::connect(&endpoints_of(&live_positions), options.clone())?;
    }
    let live_ids: BTreeSet<ServerId> = live.iter().map(|&(_, id)| id).collect();
    let lost_servers = named
        .iter()
        .filter(|(id, _)| !live_ids.contains(id))
        .map(|(id, (position, domain))| {
            describe_lost(peers, &answering, &unreachable, *id, *position, domain)
        })
        .collect();
    let written = written_ranges(&manifests);
    let losses = file_losses(&mut client, epoch, &written)?;
    let marker_tag = if live_positions.len() == peers.len() {
        String::new()
    } else {
        let list: Vec<String> = live_positions.iter().map(usize::to_string).collect();
        format!(".of-{}", list.join("-"))
    };
    let view = View { endpoints: endpoints_of(&live_positions), me, marker_tag };
    Ok(Some(Survivors { client, view, written, losses, lost_servers }))
}

/// Per file of the manifests, the written bytes no server of `client` holds.
fn file_losses(
    client: &mut Client,
    epoch: EpochId,
    written: &BTreeMap<String, Vec<Range<u64>>>,
) -> Result<Vec<FileLoss>, SurvivorError> {
    let mut losses = Vec::new();
    for (file, ranges) in written {
        let extents = match client.open_file(epoch, file) {
            Ok(handle) => {
                client.extents(&handle)?.into_iter().map(|(s, e)| (s, e.offset, e.length)).collect()
            }
            Err(e) if is_absent(&e) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let lost = lost_ranges(ranges, &extents, |_| true);
        if !lost.is_empty() {
            losses.push(FileLoss { file: file.clone(), ranges: lost });
        }
    }
    Ok(losses)
}

/// A lost server for messages: where it was in the list and what it was.
fn describe_lost(
    peers: &[Endpoint],
    answering: &[(usize, ServerId)],
    unreachable: &BTreeMap<usize, String>,
    id: ServerId,
    position: usize,
    domain: &str,
) -> String {
    let Some(endpoint) = peers.get(position) else {
        return format!("server {id} in failure domain {domain:?} (position {position}, beyond this drain's server list)");
    };
    if let Some(error) = unreachable.get(&position) {
        return format!("cannot reach server {position} at {endpoint}, last seen as {id} in failure domain {domain:?} ({error})");
    }
    match answering.iter().find(|&&(p, _)| p == position) {
        Some((_, now)) if *now != id => format!(
            "server {position} at {endpoint} was {id} in failure domain {domain:?} and now answers as {now}"
        ),
        _ => format!("server {id} in failure domain {domain:?} (last at position {position}, {endpoint}) does not answer at its place"),
    }
}

/// Every intent (written before a client's first write since its previous manifest) must have
/// its manifest: otherwise that writer's ranges are unknown and nothing can be proven lost or
/// not.
fn check_every_intent_has_its_manifest(
    client: &mut Client,
    epoch: EpochId,
    manifests: &[Manifest],
) -> Result<(), SurvivorError> {
    let present: BTreeSet<(u64, u64)> =
        manifests.iter().map(|m| (m.client_id, m.commit_seq)).collect();
    let missing: Vec<String> = client
        .list_intents(epoch)?
        .into_iter()
        .filter(|name| parse_sequenced_name(name).is_none_or(|key| !present.contains(&key)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(SurvivorError::MissingManifests { epoch, missing: missing.join(", ") })
}

fn is_absent(error: &ClientError) -> bool {
    matches!(error, ClientError::NoSuchFile { .. } | ClientError::NoSuchEpoch { .. })
        || matches!(error.code(), Some(ErrorCode::NoSuchFile | ErrorCode::NoSuchEpoch))
}

/// Every manifest of `epoch` on the live servers, each decoded from the first holder whose
/// copy decodes (and names this epoch).
fn read_manifests(client: &mut Client, epoch: EpochId) -> Result<Vec<Manifest>, SurvivorError> {
    let mut manifests = Vec::new();
    for (name, size) in client.list_manifests(epoch)? {
        // Its writer sets its size: refused before anything that large is allocated.
        if size > spillway_client::OWN_FILE_BYTES_MAX {
            let max = spillway_client::OWN_FILE_BYTES_MAX;
            let why = format!("{size} bytes, more than a manifest may have ({max})");
            return Err(SurvivorError::BadManifest { epoch, name, why });
        }
        let handle = client.open_file(epoch, &name)?;
        let mut why = String::from("no holder");
        let mut decoded = None;
        for server in handle.servers() {
            let Ok(length) = usize::try_from(size) else { break };
            let mut bytes = vec![0u8; length];
            let wanted = spillway_client::whole_file_reads(server, size);
            if let Err(e) = client.read_ranges(&handle, 0, &mut bytes, wanted) {
                why = e.to_string();
                continue;
            }
            match Manifest::decode(&bytes) {
                Ok(m) if m.epoch == epoch => {
                    decoded = Some(m);
                    break;
                }
                Ok(m) => why = format!("it names epoch {}", m.epoch),
                Err(e) => why = e.to_string(),
            }
        }
        match decoded {
            Some(m) => manifests.push(m),
            None => return Err(SurvivorError::BadManifest { epoch, name, why }),
        }
    }
    Ok(manifests)
}

/// The union of the manifests' ranges per user file.
pub fn written_ranges(manifests: &[Manifest]) -> BTreeMap<String, Vec<Range<u64>>> {
    let mut written: BTreeMap<String, Vec<Range<u64>>> = BTreeMap::new();
    for manifest in manifests {
        for file in &manifest.files {
            if file.name.starts_with(spillway_client::RESERVED_PREFIX) {
                continue;
            }
            let ranges = written.entry(file.name.clone()).or_default();
            for &(offset, length) in &file.ranges {
                ranges.push(offset..offset.saturating_add(length));
            }
        }
    }
    written
}

/// A loss for messages and status: `"name" [a..b, c..d]`, each file on its own.
pub fn describe_losses(losses: &[FileLoss]) -> String {
    losses
        .iter()
        .map(|loss| {
            if loss.ranges.is_empty() {
                return format!(
                    "{:?} (no manifest names it: its written ranges are unknown)",
                    loss.file
                );
            }
            let ranges: Vec<String> =
                loss.ranges.iter().map(|r| format!("{}..{}", r.start, r.end)).collect();
            format!("{:?} bytes [{}]", loss.file, ranges.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}
