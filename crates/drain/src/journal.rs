//! The drain journal: which epochs this server was asked to drain, and which are done, so a
//! drain survives a server crash (docs/design/drain.md, "Journal", has the byte layout).
//!
//! An append-only file of fixed 32-byte records in the server's SSD directory, each fsync'd
//! before the action it announces: `Requested` before any PFS byte of the epoch is written,
//! `Drained` after every file of the epoch is under its final PFS name and the directory is
//! fsync'd, and before the epoch is marked drained in the store. On open, records are replayed;
//! a torn or corrupt tail (a crash mid-append) is cut off, a bad record in the middle is refused.
//! The file is rewritten (staging + rename) to only the pending epochs when it grows beyond
//! `records_max`, so it stays small.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use spillway_types::EpochId;

/// Bytes of one record.
pub const RECORD_BYTES: usize = 32;
/// "SPDJ" little-endian.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SPDJ");
/// Journal file name inside the SSD directory.
pub const JOURNAL_FILE: &str = "drain.journal";

/// How a shared file is written to the PFS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DrainMode {
    /// Every server writes its own extents where they fall.
    Naive,
    /// Coordinated shuffling: stripe-aligned domains, one writer per domain.
    Shuffled,
}

impl DrainMode {
    pub fn code(self) -> u8 {
        match self {
            DrainMode::Naive => 0,
            DrainMode::Shuffled => 1,
        }
    }
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(DrainMode::Naive),
            1 => Some(DrainMode::Shuffled),
            _ => None,
        }
    }
}

impl std::fmt::Display for DrainMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DrainMode::Naive => "naive",
            DrainMode::Shuffled => "shuffled",
        })
    }
}

impl std::str::FromStr for DrainMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "naive" => Ok(DrainMode::Naive),
            "shuffled" => Ok(DrainMode::Shuffled),
            other => Err(format!("drain mode {other:?}: expected naive or shuffled")),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Requested = 1,
    Drained = 2,
    /// Given up after repeated failures or a panic; not resumed at start until requested again.
    Quarantined = 3,
    /// Committed bytes of the epoch are lost (no live server holds them): `detail` files are
    /// not published; the epoch is never marked drained while it reports a loss.
    Lost = 4,
}

/// One epoch's journal state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    pub mode: DrainMode,
    pub drained: bool,
    /// Quarantined after this many failed attempts (0: not quarantined). A later `Requested`
    /// record releases it.
    pub quarantined_after: u32,
    /// Files found with lost bytes by the last `Lost` record (0: none reported).
    pub lost_files: u32,
}

/// Why the journal could not be opened or appended to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    #[error("drain journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("drain journal {path} is corrupt at byte {offset}: {reason} (not a torn tail: later records are valid)")]
    Corrupt { path: PathBuf, offset: u64, reason: String },
    #[error(
        "drain journal {path} refuses appends since {reason}; restart the server to reopen it"
    )]
    Failed { path: PathBuf, reason: String },
}

/// The journal file's appends, behind a seam so tests can inject `EIO`, `ENOSPC`, short
/// writes and failed `fdatasync` ([`FaultyJournalFile`]).
pub trait JournalFile: Send {
    /// One `pwrite`: may write fewer bytes than given.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<usize>;
    fn sync_data(&mut self) -> io::Result<()>;
    fn set_len(&mut self, bytes: u64) -> io::Result<()>;
}

impl JournalFile for File {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::write_at(self, data, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn set_len(&mut self, bytes: u64) -> io::Result<()> {
        File::set_len(self, bytes)
    }
}

/// Which journal operations a [`FaultyJournalFile`] fails, switchable at run time.
#[derive(Clone, Copy, Debug, Default)]
pub struct JournalFaults {
    /// Writes take at most this many more bytes (a short write), then fail with `ENOSPC`.
    pub space_left_bytes: Option<u64>,
    /// Every write fails with `EIO`.
    pub write_fails: bool,
    /// Every `fdatasync` fails with `EIO`.
    pub sync_fails: bool,
    /// Every truncation fails with `EIO`.
    pub set_len_fails: bool,
}

/// The real journal file with the failures of its [`JournalFaults`] injected.
pub struct FaultyJournalFile {
    file: File,
    faults: std::sync::Arc<parking_lot::Mutex<JournalFaults>>,
}

impl JournalFile for FaultyJournalFile {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<usize> {
        let mut faults = self.faults.lock();
        if faults.write_fails {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let Some(left) = faults.space_left_bytes.as_mut() else {
            return std::os::unix::fs::FileExt::write_at(&self.file, data, offset);
        };
        if *left == 0 {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let take = data.len().min(*left as usize);
        let written = std::os::unix::fs::FileExt::write_at(&self.file, &data[..take], offset)?;
        *left -= written as u64;
        Ok(written)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        if self.faults.lock().sync_fails {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.sync_data()
    }
    fn set_len(&mut self, bytes: u64) -> io::Result<()> {
        if self.faults.lock().set_len_fails {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.file.set_len(bytes)
    }
}

type SharedJournalFaults = std::sync::Arc<parking_lot::Mutex<JournalFaults>>;

/// The open journal.
pub struct Journal {
    path: PathBuf,
    file: Box<dyn JournalFile>,
    /// Bytes of whole, written records: where the next record goes.
    length: u64,
    /// Set after an append failed in a way that leaves the file's state unknown (a failed
    /// `fdatasync`, or a partial record that could not be cut off): no more appends.
    failed: Option<String>,
    /// Tests: the faults injected into the file (kept for the file reopened by compaction).
    faults: Option<SharedJournalFaults>,
    entries: BTreeMap<EpochId, JournalEntry>,
    records: usize,
    records_max: usize,
}

fn encode(kind: Kind, mode: DrainMode, epoch: EpochId, time_us: u64) -> [u8; RECORD_BYTES] {
    encode_with(kind, mode, epoch, time_us, 0)
}

/// `detail`: bytes 24..28; the failed attempts of a `Quarantined` record, 0 otherwise.
fn encode_with(
    kind: Kind,
    mode: DrainMode,
    epoch: EpochId,
    time_us: u64,
    detail: u32,
) -> [u8; RECORD_BYTES] {
    let mut r = [0u8; RECORD_BYTES];
    r[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    r[4] = kind as u8;
    r[5] = mode.code();
    // 6..8 reserved, zero.
    r[8..16].copy_from_slice(&epoch.0.to_le_bytes());
    r[16..24].copy_from_slice(&time_us.to_le_bytes());
    r[24..28].copy_from_slice(&detail.to_le_bytes());
    let crc = crc32c::crc32c(&r[0..28]);
    r[28..32].copy_from_slice(&crc.to_le_bytes());
    r
}

fn decode(r: &[u8]) -> Result<(Kind, DrainMode, EpochId, u32), String> {
    let magic = u32::from_le_bytes(r[0..4].try_into().unwrap());
    if magic != RECORD_MAGIC {
        return Err(format!("bad magic {magic:#010x}"));
    }
    let crc = u32::from_le_bytes(r[28..32].try_into().unwrap());
    if crc != crc32c::crc32c(&r[0..28]) {
        return Err("CRC mismatch".into());
    }
    let kind = match r[4] {
        1 => Kind::Requested,
        2 => Kind::Drained,
        3 => Kind::Quarantined,
        4 => Kind::Lost,
        k => return Err(format!("unknown record kind {k}")),
    };
    let mode = DrainMode::from_code(r[5]).ok_or_else(|| format!("unknown drain mode {}", r[5]))?;
    let epoch = EpochId(u64::from_le_bytes(r[8..16].try_into().unwrap()));
    Ok((kind, mode, epoch, u32::from_le_bytes(r[24..28].try_into().unwrap())))
}

/// What a journal's bytes say: the state of every epoch, how many whole records hold it, and
/// where the valid records end (a torn tail follows).
struct Replay {
    entries: BTreeMap<EpochId, JournalEntry>,
    records: usize,
    valid: usize,
}

/// Replays journal bytes in order. A record that does not decode is a torn tail when no valid
/// record follows it, and damage (its offset and the reason) when one does.
fn replay(bytes: &[u8]) -> Result<Replay, (u64, String)> {
    let mut entries = BTreeMap::new();
    let mut records = 0usize;
    let whole = bytes.len() / RECORD_BYTES * RECORD_BYTES;
    let mut at = 0;
    while at < whole {
        match decode(&bytes[at..at + RECORD_BYTES]) {
            Ok((kind, mode, epoch, detail)) => {
                let entry = entries.entry(epoch).or_insert(JournalEntry {
                    mode,
                    drained: false,
                    quarantined_after: 0,
                    lost_files: 0,
                });
                match kind {
                    Kind::Requested => {
                        entry.mode = mode;
                        entry.quarantined_after = 0;
                    }
                    Kind::Drained => {
                        entry.drained = true;
                        entry.lost_files = 0;
                    }
                    Kind::Quarantined => entry.quarantined_after = detail.max(1),
                    Kind::Lost => entry.lost_files = detail,
                }
                records += 1;
                at += RECORD_BYTES;
            }
            Err(reason) => {
                let later_valid = (at + RECORD_BYTES..whole)
                    .step_by(RECORD_BYTES)
                    .any(|o| decode(&bytes[o..o + RECORD_BYTES]).is_ok());
                if later_valid {
                    return Err((at as u64, reason));
                }
                break;
            }
        }
    }
    Ok(Replay { entries, records, valid: at })
}

impl Journal {
    /// Opens (creating) the journal in `directory` and replays it.
    /// The directory the journal is in (the server's SSD directory).
    pub fn directory(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    pub fn open(directory: &Path, records_max: usize) -> Result<Journal, JournalError> {
        Journal::open_inner(directory, records_max, None)
    }

    /// [`Journal::open`] with `faults` injected into its appends (tests).
    pub fn open_with_faults(
        directory: &Path,
        records_max: usize,
        faults: SharedJournalFaults,
    ) -> Result<Journal, JournalError> {
        Journal::open_inner(directory, records_max, Some(faults))
    }

    fn wrap(file: File, faults: &Option<SharedJournalFaults>) -> Box<dyn JournalFile> {
        match faults {
            Some(faults) => Box::new(FaultyJournalFile { file, faults: faults.clone() }),
            None => Box::new(file),
        }
    }

    fn open_inner(
        directory: &Path,
        records_max: usize,
        faults: Option<SharedJournalFaults>,
    ) -> Result<Journal, JournalError> {
        let path = directory.join(JOURNAL_FILE);
        let io = |source| JournalError::Io { path: path.clone(), source };
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io)?;
        let Replay { entries, records, valid } = replay(&bytes).map_err(|(offset, reason)| {
            JournalError::Corrupt { path: path.clone(), offset, reason }
        })?;
        if valid < bytes.len() {
            tracing::warn!(path = %path.display(), cut_bytes = bytes.len() - valid, "drain journal: cutting a torn tail");
            file.set_len(valid as u64).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        let mut journal = Journal {
            path,
            file: Journal::wrap(file, &faults),
            length: valid as u64,
            failed: None,
            faults,
            entries,
            records,
            records_max: records_max.max(16),
        };
        if journal.records > journal.records_max {
            journal.compact()?;
        }
        journal.check_against_file();
        Ok(journal)
    }

    fn append(&mut self, record: [u8; RECORD_BYTES]) -> Result<(), JournalError> {
        if let Some(reason) = &self.failed {
            return Err(JournalError::Failed { path: self.path.clone(), reason: reason.clone() });
        }
        let mut written = 0;
        let mut result = Ok(());
        while written < record.len() {
            match self.file.write_at(self.length + written as u64, &record[written..]) {
                Ok(0) => {
                    result = Err(io::Error::new(io::ErrorKind::WriteZero, "wrote nothing"));
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Err(source) = result {
            // A partial record followed by later appends would read as corruption in the
            // middle at the next start (the server would refuse to start): cut it off, or
            // refuse every later append if that fails too.
            if written > 0 {
                if let Err(cut) = self.file.set_len(self.length) {
                    self.failed = Some(format!(
                        "a failed append ({source}) left a partial record that could not be cut \
                         off ({cut})"
                    ));
                }
            }
            return Err(JournalError::Io { path: self.path.clone(), source });
        }
        if let Err(source) = self.file.sync_data() {
            // After a failed fdatasync the kernel may have dropped the dirty pages: what is
            // durable is unknown, and a retried fdatasync could report success for lost data.
            self.failed = Some(format!("an fdatasync failed ({source})"));
            return Err(JournalError::Io { path: self.path.clone(), source });
        }
        self.length += RECORD_BYTES as u64;
        self.records += 1;
        Ok(())
    }

    /// Pair assertion (strict builds): what is on disk replays to exactly the state in memory.
    /// Called after every change has reached the file.
    fn check_against_file(&self) {
        #[cfg(feature = "strict_assertions")]
        {
            let bytes = std::fs::read(&self.path).expect("strict: re-reading the drain journal");
            let replayed = replay(&bytes).expect("strict: the drain journal replays");
            assert_eq!(replayed.valid, bytes.len(), "strict: a torn tail in a live journal");
            assert_eq!(replayed.records, self.records, "strict: journal record count");
            assert_eq!(replayed.entries, self.entries, "strict: journal state differs from disk");
        }
    }

    /// Records (durably) that `epoch` is to be drained in `mode`. Idempotent for a pending epoch
    /// in the same mode; a drained epoch stays drained.
    pub fn request(&mut self, epoch: EpochId, mode: DrainMode) -> Result<(), JournalError> {
        match self.entries.get(&epoch) {
            Some(e) if e.drained || (e.mode == mode && e.quarantined_after == 0) => return Ok(()),
            _ => {}
        }
        self.append(encode(Kind::Requested, mode, epoch, crate::pfs::now_us()))?;
        // A reported loss stays reported across a new request.
        let lost_files = self.entries.get(&epoch).map_or(0, |e| e.lost_files);
        let entry = JournalEntry { mode, drained: false, quarantined_after: 0, lost_files };
        self.entries.insert(epoch, entry);
        self.check_against_file();
        Ok(())
    }

    /// Records (durably) that every file of `epoch` is on the PFS.
    pub fn drained(&mut self, epoch: EpochId) -> Result<(), JournalError> {
        let mode = self.entries.get(&epoch).map(|e| e.mode).unwrap_or(DrainMode::Shuffled);
        if self.entries.get(&epoch).is_some_and(|e| e.drained) {
            return Ok(());
        }
        self.append(encode(Kind::Drained, mode, epoch, crate::pfs::now_us()))?;
        let entry = JournalEntry { mode, drained: true, quarantined_after: 0, lost_files: 0 };
        self.entries.insert(epoch, entry);
        if self.records > self.records_max {
            self.compact()?;
        }
        self.check_against_file();
        Ok(())
    }

    /// Epochs requested and not yet drained, oldest first.
    /// Records that `epoch` is given up after `failed_attempts` (kept in the burst buffer, not
    /// resumed at start; a new request releases it).
    pub fn quarantined(
        &mut self,
        epoch: EpochId,
        failed_attempts: u32,
    ) -> Result<(), JournalError> {
        let Some(entry) = self.entries.get(&epoch).copied() else { return Ok(()) };
        if entry.drained {
            return Ok(());
        }
        let failed_attempts = failed_attempts.max(1);
        self.append(encode_with(
            Kind::Quarantined,
            entry.mode,
            epoch,
            crate::pfs::now_us(),
            failed_attempts,
        ))?;
        self.entries.insert(epoch, JournalEntry { quarantined_after: failed_attempts, ..entry });
        self.check_against_file();
        Ok(())
    }

    /// Records (durably) that `files` files of `epoch` have committed bytes no live server
    /// holds; appended only when the count changes. Nothing for an epoch not requested.
    pub fn lost(&mut self, epoch: EpochId, files: u32) -> Result<(), JournalError> {
        let Some(entry) = self.entries.get(&epoch).copied() else { return Ok(()) };
        if entry.drained || entry.lost_files == files {
            return Ok(());
        }
        self.append(encode_with(Kind::Lost, entry.mode, epoch, crate::pfs::now_us(), files))?;
        self.entries.insert(epoch, JournalEntry { lost_files: files, ..entry });
        self.check_against_file();
        Ok(())
    }

    /// Epochs whose last `Lost` record reports lost files, with the count.
    pub fn lost_epochs(&self) -> Vec<(EpochId, u32)> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.drained && e.lost_files > 0)
            .map(|(&epoch, e)| (epoch, e.lost_files))
            .collect()
    }

    /// Epochs requested and neither drained nor quarantined: resumed at start.
    pub fn pending(&self) -> Vec<(EpochId, DrainMode)> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.drained && e.quarantined_after == 0)
            .map(|(&epoch, e)| (epoch, e.mode))
            .collect()
    }

    /// Quarantined epochs, with their mode and the failed attempts that quarantined them.
    pub fn quarantined_epochs(&self) -> Vec<(EpochId, DrainMode, u32)> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.drained && e.quarantined_after > 0)
            .map(|(&epoch, e)| (epoch, e.mode, e.quarantined_after))
            .collect()
    }

    /// Epochs journaled as drained (kept after compaction: the newest ones).
    pub fn drained_epochs(&self) -> Vec<EpochId> {
        self.entries.iter().filter(|(_, e)| e.drained).map(|(&epoch, _)| epoch).collect()
    }

    pub fn get(&self, epoch: EpochId) -> Option<JournalEntry> {
        self.entries.get(&epoch).copied()
    }

    /// Rewrites the journal with only pending epochs plus the newest `records_max / 2` drained
    /// ones (so `status` still knows recent drains): staging file, fsync, rename, fsync dir.
    fn compact(&mut self) -> Result<(), JournalError> {
        let staging = self.path.with_extension("journal.staging");
        let io = |path: &Path, source| JournalError::Io { path: path.to_path_buf(), source };
        let keep_drained = self.records_max / 2;
        let drained: Vec<EpochId> =
            self.entries.iter().filter(|(_, e)| e.drained).map(|(&k, _)| k).collect();
        let cut = drained.len().saturating_sub(keep_drained);
        for epoch in &drained[..cut] {
            self.entries.remove(epoch);
        }
        let mut bytes = Vec::new();
        for (&epoch, e) in &self.entries {
            bytes.extend_from_slice(&encode(Kind::Requested, e.mode, epoch, 0));
            if e.drained {
                bytes.extend_from_slice(&encode(Kind::Drained, e.mode, epoch, 0));
            } else if e.quarantined_after > 0 {
                bytes.extend_from_slice(&encode_with(
                    Kind::Quarantined,
                    e.mode,
                    epoch,
                    0,
                    e.quarantined_after,
                ));
            }
            if !e.drained && e.lost_files > 0 {
                bytes.extend_from_slice(&encode_with(Kind::Lost, e.mode, epoch, 0, e.lost_files));
            }
        }
        let mut f = File::create(&staging).map_err(|e| io(&staging, e))?;
        f.write_all(&bytes).map_err(|e| io(&staging, e))?;
        f.sync_all().map_err(|e| io(&staging, e))?;
        std::fs::rename(&staging, &self.path).map_err(|e| io(&self.path, e))?;
        if let Some(dir) = self.path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, e))?;
        }
        let file =
            OpenOptions::new().write(true).open(&self.path).map_err(|e| io(&self.path, e))?;
        self.file = Journal::wrap(file, &self.faults);
        self.length = bytes.len() as u64;
        self.records = bytes.len() / RECORD_BYTES;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_requests_and_completions() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), 100).unwrap();
            j.request(EpochId(1), DrainMode::Shuffled).unwrap();
            j.request(EpochId(2), DrainMode::Naive).unwrap();
            j.drained(EpochId(1)).unwrap();
        }
        let j = Journal::open(dir.path(), 100).unwrap();
        assert_eq!(j.pending(), vec![(EpochId(2), DrainMode::Naive)]);
        assert_eq!(
            j.get(EpochId(1)),
            Some(JournalEntry {
                mode: DrainMode::Shuffled,
                drained: true,
                quarantined_after: 0,
                lost_files: 0
            })
        );
    }

    #[test]
    fn torn_tail_is_cut_and_corrupt_middle_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), 100).unwrap();
            j.request(EpochId(1), DrainMode::Shuffled).unwrap();
            j.request(EpochId(2), DrainMode::Shuffled).unwrap();
        }
        let path = dir.path().join(JOURNAL_FILE);
        // A half-written third record.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&encode(Kind::Drained, DrainMode::Shuffled, EpochId(1), 5)[..20]);
        std::fs::write(&path, &bytes).unwrap();
        let j = Journal::open(dir.path(), 100).unwrap();
        assert_eq!(j.pending().len(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64);
        drop(j);
        // Flip a byte of the first record: a valid one follows, so this is corruption.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        match Journal::open(dir.path(), 100) {
            Err(JournalError::Corrupt { offset: 0, .. }) => {}
            other => panic!("expected corruption at 0, got {:?}", other.map(|j| j.pending())),
        }
    }

    #[test]
    fn compaction_keeps_pending_epochs() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), 16).unwrap();
            for e in 1..=40 {
                j.request(EpochId(e), DrainMode::Shuffled).unwrap();
                if e != 7 {
                    j.drained(EpochId(e)).unwrap();
                }
            }
        }
        let j = Journal::open(dir.path(), 16).unwrap();
        assert_eq!(j.pending(), vec![(EpochId(7), DrainMode::Shuffled)]);
        assert!(
            std::fs::metadata(dir.path().join(JOURNAL_FILE)).unwrap().len()
                <= 40 * RECORD_BYTES as u64
        );
        assert!(j.get(EpochId(40)).unwrap().drained);
    }

    #[test]
    fn a_quarantined_epoch_is_not_resumed_until_requested_again_and_survives_compaction() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), 16).unwrap();
            j.request(EpochId(7), DrainMode::Shuffled).unwrap();
            j.request(EpochId(8), DrainMode::Naive).unwrap();
            j.quarantined(EpochId(7), 12).unwrap();
        }
        let mut j = Journal::open(dir.path(), 16).unwrap();
        assert_eq!(j.pending(), vec![(EpochId(8), DrainMode::Naive)]);
        assert_eq!(j.quarantined_epochs(), vec![(EpochId(7), DrainMode::Shuffled, 12)]);
        // Enough drained epochs to force a compaction: the quarantine is kept.
        for e in 100..140 {
            j.request(EpochId(e), DrainMode::Shuffled).unwrap();
            j.drained(EpochId(e)).unwrap();
        }
        drop(j);
        let mut j = Journal::open(dir.path(), 16).unwrap();
        assert_eq!(j.quarantined_epochs(), vec![(EpochId(7), DrainMode::Shuffled, 12)]);
        // An explicit request releases it, also across a restart.
        j.request(EpochId(7), DrainMode::Shuffled).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), 16).unwrap();
        assert!(j.quarantined_epochs().is_empty());
        assert_eq!(
            j.pending(),
            vec![(EpochId(7), DrainMode::Shuffled), (EpochId(8), DrainMode::Naive)]
        );
    }

    #[test]
    fn a_reported_loss_is_journaled_once_per_count_and_survives_requests_restarts_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), 16).unwrap();
            j.request(EpochId(9), DrainMode::Shuffled).unwrap();
            j.lost(EpochId(9), 2).unwrap();
            j.lost(EpochId(9), 2).unwrap();
            // Not requested here: nothing to record.
            j.lost(EpochId(10), 1).unwrap();
        }
        let bytes = std::fs::read(dir.path().join("drain.journal")).unwrap();
        assert_eq!(bytes.len(), 2 * RECORD_BYTES, "a repeated count is not appended again");
        assert_eq!(bytes[RECORD_BYTES + 4], 4, "kind Lost");
        assert_eq!(&bytes[RECORD_BYTES + 24..RECORD_BYTES + 28], &2u32.to_le_bytes(), "files");
        let mut j = Journal::open(dir.path(), 16).unwrap();
        assert_eq!(j.lost_epochs(), vec![(EpochId(9), 2)]);
        assert_eq!(j.pending(), vec![(EpochId(9), DrainMode::Shuffled)], "still retried");
        j.request(EpochId(9), DrainMode::Naive).unwrap();
        for e in 100..140 {
            j.request(EpochId(e), DrainMode::Shuffled).unwrap();
            j.drained(EpochId(e)).unwrap();
        }
        drop(j);
        let j = Journal::open(dir.path(), 16).unwrap();
        assert_eq!(j.lost_epochs(), vec![(EpochId(9), 2)], "kept by a request and compaction");
    }

    fn faults() -> SharedJournalFaults {
        std::sync::Arc::new(parking_lot::Mutex::new(JournalFaults::default()))
    }

    #[test]
    fn a_short_write_then_enospc_is_cut_off_and_later_appends_replay_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let faults = faults();
        let mut j = Journal::open_with_faults(dir.path(), 100, faults.clone()).unwrap();
        j.request(EpochId(1), DrainMode::Shuffled).unwrap();
        // 10 bytes fit, then the disk is full: a short write, then ENOSPC.
        faults.lock().space_left_bytes = Some(10);
        let error = j.request(EpochId(2), DrainMode::Shuffled).unwrap_err();
        assert!(error.to_string().contains("No space left"), "{error}");
        assert_eq!(j.pending(), vec![(EpochId(1), DrainMode::Shuffled)], "not recorded");
        // Space again: the next append follows the last whole record, no garbage between.
        faults.lock().space_left_bytes = None;
        j.request(EpochId(3), DrainMode::Naive).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), 100).unwrap();
        assert_eq!(
            j.pending(),
            vec![(EpochId(1), DrainMode::Shuffled), (EpochId(3), DrainMode::Naive)]
        );
        assert_eq!(std::fs::metadata(dir.path().join(JOURNAL_FILE)).unwrap().len(), 64);
    }

    #[test]
    fn eio_on_write_records_nothing_and_the_journal_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let faults = faults();
        let mut j = Journal::open_with_faults(dir.path(), 100, faults.clone()).unwrap();
        faults.lock().write_fails = true;
        assert!(j.request(EpochId(1), DrainMode::Shuffled).is_err());
        assert!(j.pending().is_empty());
        faults.lock().write_fails = false;
        j.request(EpochId(1), DrainMode::Shuffled).unwrap();
        drop(j);
        assert_eq!(Journal::open(dir.path(), 100).unwrap().pending().len(), 1);
    }

    #[test]
    fn a_failed_fdatasync_or_an_uncut_partial_record_stops_all_appends_until_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let faults = faults();
        let mut j = Journal::open_with_faults(dir.path(), 100, faults.clone()).unwrap();
        j.request(EpochId(1), DrainMode::Shuffled).unwrap();
        faults.lock().sync_fails = true;
        assert!(j.drained(EpochId(1)).is_err());
        faults.lock().sync_fails = false;
        // Durability of what was written is unknown: refuse rather than trust a later fsync.
        let error = j.request(EpochId(2), DrainMode::Shuffled).unwrap_err();
        assert!(matches!(error, JournalError::Failed { .. }), "{error}");
        assert_eq!(j.get(EpochId(1)).map(|e| e.drained), Some(false));
        drop(j);
        // Reopened: whatever reached the disk replays, never as corruption.
        let mut j = Journal::open_with_faults(dir.path(), 100, faults.clone()).unwrap();
        j.request(EpochId(2), DrainMode::Shuffled).unwrap();
        // A partial record that cannot be cut off: refused from then on too.
        faults.lock().space_left_bytes = Some(5);
        faults.lock().set_len_fails = true;
        assert!(j.request(EpochId(3), DrainMode::Shuffled).is_err());
        *faults.lock() = JournalFaults::default();
        assert!(matches!(
            j.request(EpochId(4), DrainMode::Shuffled).unwrap_err(),
            JournalError::Failed { .. }
        ));
        drop(j);
        // The 5 garbage bytes are a torn tail at the next open, cut off.
        let j = Journal::open(dir.path(), 100).unwrap();
        assert!(j.pending().contains(&(EpochId(2), DrainMode::Shuffled)));
        assert!(!j.pending().iter().any(|(e, _)| *e == EpochId(3) || *e == EpochId(4)));
    }
}
