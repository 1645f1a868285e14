//! A small in-memory [`Backend`] with a capacity, used to test the protocol layer on its own:
//! it is the model the server's handlers are checked against, not a stand-in for the store
//! (the end-to-end tests in crates/cli/tests run the real store).

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use spillway_proto::{EpochGrant, EpochInfo, EpochState, ErrorCode, Extent, FileInfo};
use spillway_server::{Backend, BackendError, GrantMode, Usage};
use spillway_types::{EpochId, FileId, StreamKey};

#[derive(Default)]
struct File {
    name: String,
    writes: Vec<(u64, Vec<u8>)>,
}

#[derive(Default)]
struct Epoch {
    committed: bool,
    files: BTreeMap<FileId, File>,
    names: HashMap<String, FileId>,
}

#[derive(Default)]
struct State {
    epochs: BTreeMap<EpochId, Epoch>,
    used: u64,
    next_file: u64,
    commits: u64,
    syncs: u64,
    /// The streams each epoch's writes were given.
    write_streams: BTreeMap<EpochId, std::collections::BTreeSet<StreamKey>>,
    /// Grants in force (kept in memory: the model has no restart).
    grants: BTreeMap<EpochId, EpochGrant>,
    /// Participants recorded per epoch (sorted by id).
    participants: BTreeMap<EpochId, Vec<spillway_proto::Participant>>,
}

pub struct ModelBackend {
    state: Mutex<State>,
    capacity: u64,
}

impl ModelBackend {
    pub fn new(capacity: u64) -> Self {
        ModelBackend { state: Mutex::new(State::default()), capacity }
    }
    pub fn write_streams(&self, epoch: EpochId) -> Vec<StreamKey> {
        self.state
            .lock()
            .write_streams
            .get(&epoch)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }
    pub fn commits(&self) -> u64 {
        self.state.lock().commits
    }
    pub fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }
    pub fn used(&self) -> u64 {
        self.state.lock().used
    }
}

/// The model's record size: a write of more than this is checked as several pieces.
const MODEL_RECORD_PAYLOAD_BYTES: usize = 64 * 1024;

fn no_epoch(epoch: EpochId) -> BackendError {
    BackendError::new(ErrorCode::NoSuchEpoch, format!("epoch {epoch} is not here"))
}

fn no_file(epoch: EpochId, file: FileId) -> BackendError {
    BackendError::new(ErrorCode::NoSuchFile, format!("epoch {epoch} has no file {file}"))
}

impl Backend for ModelBackend {
    fn open_file(
        &self,
        _stream: StreamKey,
        epoch: EpochId,
        name: &str,
        create: bool,
    ) -> Result<(FileId, bool), BackendError> {
        let mut state = self.state.lock();
        let next = FileId(state.next_file + 1);
        if !create && !state.epochs.contains_key(&epoch) {
            return Err(no_epoch(epoch));
        }
        let e = state.epochs.entry(epoch).or_default();
        if let Some(&id) = e.names.get(name) {
            return Ok((id, false));
        }
        if !create {
            return Err(BackendError::new(
                ErrorCode::NoSuchFile,
                format!("no file {name:?} in epoch {epoch}"),
            ));
        }
        if e.committed {
            return Err(BackendError::new(
                ErrorCode::EpochReadOnly,
                format!("epoch {epoch} is committed"),
            ));
        }
        e.names.insert(name.to_string(), next);
        e.files.insert(next, File { name: name.to_string(), writes: Vec::new() });
        state.next_file += 1;
        Ok((next, true))
    }

    fn write(
        &self,
        stream: StreamKey,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        data: &[u8],
        piece_crcs: &[u32],
    ) -> Result<(), BackendError> {
        // The server must hand over the CRC of each record-sized piece it received.
        let received: Vec<u32> =
            data.chunks(MODEL_RECORD_PAYLOAD_BYTES).map(crc32c::crc32c).collect();
        if received != piece_crcs {
            return Err(BackendError::new(
                ErrorCode::Internal,
                format!("piece CRCs {piece_crcs:x?} do not match the data's {received:x?}"),
            ));
        }
        let mut state = self.state.lock();
        state.write_streams.entry(epoch).or_default().insert(stream);
        if state.used + data.len() as u64 > self.capacity {
            return Err(BackendError::new(
                ErrorCode::NoSpace,
                format!("model full: {} of {} bytes used", state.used, self.capacity),
            ));
        }
        let e = state.epochs.get_mut(&epoch).ok_or_else(|| no_epoch(epoch))?;
        if e.committed {
            return Err(BackendError::new(
                ErrorCode::EpochReadOnly,
                format!("epoch {epoch} is committed"),
            ));
        }
        let f = e.files.get_mut(&file).ok_or_else(|| no_file(epoch, file))?;
        f.writes.push((offset, data.to_vec()));
        state.used += data.len() as u64;
        Ok(())
    }

    fn record_payload_bytes(&self) -> usize {
        MODEL_RECORD_PAYLOAD_BYTES
    }

    fn read(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<u32, BackendError> {
        let state = self.state.lock();
        let e = state.epochs.get(&epoch).ok_or_else(|| no_epoch(epoch))?;
        let f = e.files.get(&file).ok_or_else(|| no_file(epoch, file))?;
        out.fill(0);
        let end = offset + out.len() as u64;
        for (at, data) in &f.writes {
            let start = (*at).max(offset);
            let stop = (at + data.len() as u64).min(end);
            if start < stop {
                out[(start - offset) as usize..(stop - offset) as usize]
                    .copy_from_slice(&data[(start - at) as usize..(stop - at) as usize]);
            }
        }
        Ok(crc32c::crc32c(out))
    }

    fn sync(&self) -> Result<(), BackendError> {
        self.state.lock().syncs += 1;
        Ok(())
    }

    fn sync_epoch(&self, _epoch: EpochId) -> Result<(), BackendError> {
        self.sync()
    }

    fn commit(
        &self,
        epoch: EpochId,
        _durability: spillway_proto::Durability,
    ) -> Result<(), BackendError> {
        let mut state = self.state.lock();
        state.epochs.get_mut(&epoch).ok_or_else(|| no_epoch(epoch))?.committed = true;
        state.commits += 1;
        Ok(())
    }

    fn epochs(&self) -> Result<Vec<EpochInfo>, BackendError> {
        let state = self.state.lock();
        Ok(state
            .epochs
            .iter()
            .map(|(id, e)| EpochInfo {
                epoch: *id,
                state: if e.committed { EpochState::Committed } else { EpochState::Open },
                files: e.files.len() as u64,
                bytes: e
                    .files
                    .values()
                    .flat_map(|f| f.writes.iter())
                    .map(|w| w.1.len() as u64)
                    .sum(),
            })
            .collect())
    }

    fn files(&self, epoch: EpochId) -> Result<Vec<FileInfo>, BackendError> {
        let ids: Vec<FileId> = {
            let state = self.state.lock();
            state.epochs.get(&epoch).ok_or_else(|| no_epoch(epoch))?.files.keys().copied().collect()
        };
        ids.into_iter().map(|f| self.stat(epoch, f)).collect()
    }

    fn stat(&self, epoch: EpochId, file: FileId) -> Result<FileInfo, BackendError> {
        let state = self.state.lock();
        let e = state.epochs.get(&epoch).ok_or_else(|| no_epoch(epoch))?;
        let f = e.files.get(&file).ok_or_else(|| no_file(epoch, file))?;
        let extents = merge(&f.writes);
        Ok(FileInfo {
            file,
            name: f.name.clone(),
            size_bytes: extents.last().map(|e| e.offset + e.length).unwrap_or(0),
            stored_bytes: extents.iter().map(|e| e.length).sum(),
        })
    }

    fn extents(&self, epoch: EpochId, file: FileId) -> Result<Vec<Extent>, BackendError> {
        let state = self.state.lock();
        let e = state.epochs.get(&epoch).ok_or_else(|| no_epoch(epoch))?;
        let f = e.files.get(&file).ok_or_else(|| no_file(epoch, file))?;
        Ok(merge(&f.writes))
    }

    fn delete_epoch(&self, epoch: EpochId) -> Result<(), BackendError> {
        let mut state = self.state.lock();
        let e = state.epochs.remove(&epoch).ok_or_else(|| no_epoch(epoch))?;
        state.grants.remove(&epoch);
        let freed: u64 =
            e.files.values().flat_map(|f| f.writes.iter()).map(|w| w.1.len() as u64).sum();
        state.used -= freed;
        Ok(())
    }

    fn has_epoch(&self, epoch: EpochId) -> bool {
        self.state.lock().epochs.contains_key(&epoch)
    }

    fn grant(&self, epoch: EpochId) -> Option<EpochGrant> {
        self.state.lock().grants.get(&epoch).cloned()
    }

    fn grant_epoch(
        &self,
        epoch: EpochId,
        grant: EpochGrant,
        mode: GrantMode,
    ) -> Result<EpochGrant, BackendError> {
        let mut state = self.state.lock();
        state.epochs.entry(epoch).or_default();
        let in_force = match (state.grants.get(&epoch), mode) {
            (Some(existing), GrantMode::IfAbsent) => existing.clone(),
            _ => grant,
        };
        state.grants.insert(epoch, in_force.clone());
        Ok(in_force)
    }

    fn revoke_grant(&self, epoch: EpochId) -> Result<bool, BackendError> {
        Ok(self.state.lock().grants.remove(&epoch).is_some())
    }

    fn record_participants(
        &self,
        epoch: EpochId,
        participants: &[spillway_proto::Participant],
    ) -> Result<(), BackendError> {
        let mut state = self.state.lock();
        if state.epochs.contains_key(&epoch) {
            let recorded = state.participants.entry(epoch).or_default();
            recorded.extend(participants.iter().cloned());
            recorded.sort_by_key(|p| p.id);
            recorded.dedup_by_key(|p| p.id);
        }
        Ok(())
    }

    fn participants(&self, epoch: EpochId) -> Vec<spillway_proto::Participant> {
        self.state.lock().participants.get(&epoch).cloned().unwrap_or_default()
    }

    fn usage(&self) -> Usage {
        Usage {
            dram_bytes_used: self.used(),
            dram_bytes_max: self.capacity,
            ssd_bytes_used: 0,
            ssd_bytes_max: self.capacity,
        }
    }
}

fn merge(writes: &[(u64, Vec<u8>)]) -> Vec<Extent> {
    let mut ranges: Vec<(u64, u64)> =
        writes.iter().filter(|w| !w.1.is_empty()).map(|(o, d)| (*o, o + d.len() as u64)).collect();
    ranges.sort_unstable();
    let mut out: Vec<Extent> = Vec::new();
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if start <= last.offset + last.length => {
                last.length = last.length.max(end - last.offset);
            }
            _ => out.push(Extent { offset: start, length: end - start }),
        }
    }
    out
}
