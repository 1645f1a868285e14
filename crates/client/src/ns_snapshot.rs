//! The namespace snapshot: a striped namespace's name map (its manifest, every live regular
//! file's store name → path, size, owner, mode, mtime) stored as a file of the namespace's data
//! epoch on every server of the reservation when stage-out seals the epoch.
//!
//! The namespace itself lives on one server and is not replicated; the epoch's data is (k
//! copies). Without the snapshot, a drain from the survivors of the namespace's server would
//! publish the mount's files under their store names (`ns/<id>/<ino>.<gen>`). With it, they keep
//! their paths. The live namespace wins whenever a server holds it (a rename after the seal
//! shows); the snapshot is read only when none does. Byte layout (integers little-endian), in
//! docs/design/namespace.md:
//!
//! ```text
//! header (40 bytes): magic "SPWNSSN1", version u16 = 1, reserved u16 = 0, entry_count u32,
//!   namespace u64, data_epoch u64, taken_unix_ns u64
//! per entry: file_name_len u16, file_name bytes (UTF-8), path_len u32, path bytes,
//!   size u64, mode u32, uid u32, gid u32, mtime_seconds i64, mtime_nanos u32
//! crc32c u32 of every byte before it
//! ```

use spillway_namespace::{parse_data_file_name, ManifestEntry, NamespaceId, Timestamp};
use spillway_proto::namespace::NAMESPACE_BYTES_MAX;
use spillway_proto::{ErrorCode, NAME_BYTES_MAX};
use spillway_types::EpochId;

use crate::manifest::{ManifestError, Reader};
use crate::{Client, ClientError};

/// The snapshot's first bytes.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"SPWNSSN1";
/// The layout version this build writes and reads.
pub const SNAPSHOT_VERSION: u16 = 1;
/// Bytes of the fixed header.
pub const SNAPSHOT_HEADER_BYTES: usize = 40;
/// Where snapshots live among an epoch's files (reserved: never listed or published).
pub const SNAPSHOT_DIRECTORY: &str = ".spillway/namespace/";
/// Bytes of an entry besides its names.
const ENTRY_FIXED_BYTES: usize = 2 + 4 + 8 + 4 + 4 + 4 + 8 + 4;

const _: () = assert!(SNAPSHOT_HEADER_BYTES == 8 + 2 + 2 + 4 + 8 + 8 + 8);
const _: () = assert!(ENTRY_FIXED_BYTES == 38);
const _: () = assert!(NAME_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(NAMESPACE_BYTES_MAX <= u32::MAX as usize);

/// The file name of namespace `namespace`'s snapshot taken at `taken_unix_ns`. Each take has
/// its own file (the protocol cannot shorten one): the newest whole one counts.
pub fn snapshot_name(namespace: NamespaceId, taken_unix_ns: u64) -> String {
    format!("{}{taken_unix_ns:016x}", snapshot_prefix(namespace))
}

fn snapshot_prefix(namespace: NamespaceId) -> String {
    format!("{SNAPSHOT_DIRECTORY}{namespace:016x}-")
}

/// A namespace's name map as stage-out stored it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub namespace: NamespaceId,
    /// The namespace's data epoch, which holds the snapshot.
    pub data_epoch: EpochId,
    /// When it was taken (names it; the newest wins).
    pub taken_unix_ns: u64,
    pub entries: Vec<ManifestEntry>,
}

impl Snapshot {
    /// The snapshot's bytes. Entries come from the namespace, whose store names and paths are
    /// within the bounds (asserted).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + 96 * self.entries.len());
        out.extend_from_slice(&SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.namespace.to_le_bytes());
        out.extend_from_slice(&self.data_epoch.0.to_le_bytes());
        out.extend_from_slice(&self.taken_unix_ns.to_le_bytes());
        debug_assert_eq!(out.len(), SNAPSHOT_HEADER_BYTES);
        for entry in &self.entries {
            assert!(entry.file_name.len() <= NAME_BYTES_MAX);
            assert!(entry.path.len() <= NAMESPACE_BYTES_MAX);
            out.extend_from_slice(&(entry.file_name.len() as u16).to_le_bytes());
            out.extend_from_slice(entry.file_name.as_bytes());
            out.extend_from_slice(&(entry.path.len() as u32).to_le_bytes());
            out.extend_from_slice(&entry.path);
            out.extend_from_slice(&entry.size.to_le_bytes());
            out.extend_from_slice(&entry.mode.to_le_bytes());
            out.extend_from_slice(&entry.uid.to_le_bytes());
            out.extend_from_slice(&entry.gid.to_le_bytes());
            out.extend_from_slice(&entry.mtime.seconds.to_le_bytes());
            out.extend_from_slice(&entry.mtime.nanos.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks a snapshot: every entry must be a store file of this namespace.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, ManifestError> {
        if bytes.len() < SNAPSHOT_HEADER_BYTES + 4 {
            return Err(ManifestError::Truncated { field: "header" });
        }
        let mut r = Reader::checked(bytes, SNAPSHOT_MAGIC, SNAPSHOT_VERSION)?;
        let count = r.u32("entry_count")? as usize;
        let namespace = r.u64("namespace")?;
        let data_epoch = EpochId(r.u64("data_epoch")?);
        let taken_unix_ns = r.u64("taken_unix_ns")?;
        if count.saturating_mul(ENTRY_FIXED_BYTES) > r.0.len() {
            return Err(ManifestError::BadValue { field: "entry_count", value: count as u64 });
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push(entry(&mut r, namespace)?);
        }
        if !r.0.is_empty() {
            return Err(ManifestError::Trailing(r.0.len()));
        }
        Ok(Snapshot { namespace, data_epoch, taken_unix_ns, entries })
    }
}

fn entry(r: &mut Reader<'_>, namespace: NamespaceId) -> Result<ManifestEntry, ManifestError> {
    let len = r.u16("file_name_len")? as usize;
    let file_name = std::str::from_utf8(r.take(len, "file_name")?)
        .map_err(|_| ManifestError::BadValue { field: "file_name", value: len as u64 })?
        .to_string();
    if parse_data_file_name(&file_name).is_none_or(|(ns, _, _)| ns != namespace) {
        return Err(ManifestError::BadValue { field: "file_name", value: len as u64 });
    }
    let len = r.u32("path_len")? as usize;
    if len == 0 || len > NAMESPACE_BYTES_MAX {
        return Err(ManifestError::BadValue { field: "path_len", value: len as u64 });
    }
    let path = r.take(len, "path")?.to_vec();
    // A snapshot is a file of the epoch its writers could forge: a path that could leave the
    // directory it is published or staged under is refused, whoever reads it.
    if !is_plain_relative(&path) {
        return Err(ManifestError::BadValue { field: "path", value: len as u64 });
    }
    let size = r.u64("size")?;
    let mode = r.u32("mode")?;
    let uid = r.u32("uid")?;
    let gid = r.u32("gid")?;
    let seconds = r.u64("mtime_seconds")? as i64;
    let nanos = r.u32("mtime_nanos")?;
    if nanos >= 1_000_000_000 {
        return Err(ManifestError::BadValue { field: "mtime_nanos", value: nanos as u64 });
    }
    let mtime = Timestamp { seconds, nanos };
    Ok(ManifestEntry { file_name, path, size, mode, uid, gid, mtime })
}

/// `a/b/c`: no leading or doubled `/`, no `.` or `..` component, no NUL.
fn is_plain_relative(path: &[u8]) -> bool {
    path.split(|&b| b == b'/').all(|part| !part.is_empty() && part != b"." && part != b"..")
        && !path.contains(&0)
}

impl Client {
    /// Stores `snapshot` in its data epoch on every server of this client's list, so that any
    /// survivor holds it. An epoch already sealed (EpochReadOnly) keeps what it has: the error.
    pub fn store_namespace_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), ClientError> {
        let name = snapshot_name(snapshot.namespace, snapshot.taken_unix_ns);
        let bytes = snapshot.encode();
        for server in 0..self.servers.len() {
            self.write_whole_file(snapshot.data_epoch, server, &name, &bytes)?;
        }
        Ok(())
    }

    /// The newest snapshot of `namespace` in `epoch` that some server holds whole and that
    /// names them. A copy that cannot be read (a connection, a server) is an error, to be
    /// retried; copies that all read but none decodes (a stage-out that ran out of space
    /// midway) are [`SnapshotLoad::Damaged`].
    pub fn load_namespace_snapshot(
        &mut self,
        epoch: EpochId,
        namespace: NamespaceId,
    ) -> Result<SnapshotLoad, ClientError> {
        let prefix = snapshot_prefix(namespace);
        let mut takes = match self.list_files_where(epoch, true) {
            Ok(files) => files,
            Err(e) if e.code() == Some(ErrorCode::NoSuchEpoch) => Vec::new(),
            Err(e) => return Err(e),
        };
        takes.retain(|(name, _)| name.starts_with(&prefix));
        if takes.is_empty() {
            return Ok(SnapshotLoad::Absent);
        }
        // Fixed-width hex times: the newest sorts last.
        takes.sort();
        let mut damage = Vec::new();
        for (name, size) in takes.iter().rev() {
            match self.load_snapshot_file(epoch, namespace, name, *size, &mut damage)? {
                Some(snapshot) => return Ok(SnapshotLoad::Found(snapshot)),
                None => continue,
            }
        }
        Ok(SnapshotLoad::Damaged(format!("epoch {epoch}: {}", damage.join("; "))))
    }

    /// One snapshot file from the first server whose copy decodes; `None` (with why in
    /// `damage`) when none does.
    fn load_snapshot_file(
        &mut self,
        epoch: EpochId,
        namespace: NamespaceId,
        name: &str,
        size: u64,
        damage: &mut Vec<String>,
    ) -> Result<Option<Snapshot>, ClientError> {
        let length = match usize::try_from(size) {
            Ok(length) if size <= crate::OWN_FILE_BYTES_MAX => length,
            _ => {
                let max = crate::OWN_FILE_BYTES_MAX;
                damage.push(format!("{name}: {size} bytes, more than a snapshot may have ({max})"));
                return Ok(None);
            }
        };
        let handle = self.open_file(epoch, name)?;
        for server in handle.servers() {
            let mut bytes = vec![0u8; length];
            let wanted = crate::whole_file_reads(server, size);
            match self.read_ranges(&handle, 0, &mut bytes, wanted) {
                Err(e) if e.code().is_none() => return Err(e),
                Err(e) => damage.push(format!("{name} on server {server}: {e}")),
                Ok(()) => match Snapshot::decode(&bytes) {
                    Ok(s) if s.namespace == namespace && s.data_epoch == epoch => {
                        return Ok(Some(s))
                    }
                    Ok(s) => damage.push(format!(
                        "{name} on server {server}: of namespace {} epoch {}",
                        s.namespace, s.data_epoch
                    )),
                    Err(e) => damage.push(format!("{name} on server {server}: {e}")),
                },
            }
        }
        Ok(None)
    }
}

/// What [`Client::load_namespace_snapshot`] found.
#[derive(Debug)]
pub enum SnapshotLoad {
    /// No server holds a snapshot of the namespace in the epoch.
    Absent,
    Found(Snapshot),
    /// Copies exist and none is whole (why, per server).
    Damaged(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        let entry = |ino: u64, path: &str| ManifestEntry {
            file_name: spillway_namespace::data_file_name(9, ino, 1),
            path: path.as_bytes().to_vec(),
            size: ino * 1000,
            mode: 0o100640,
            uid: 1000,
            gid: 100,
            mtime: Timestamp { seconds: 1_700_000_000, nanos: 5 },
        };
        Snapshot {
            namespace: 9,
            data_epoch: EpochId(12),
            taken_unix_ns: 0x1234,
            entries: vec![entry(2, "ckpt/a.dat"), entry(3, "ckpt/sub/b.dat")],
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_its_header_is_fixed() {
        let snapshot = sample();
        let bytes = snapshot.encode();
        assert_eq!(&bytes[..8], b"SPWNSSN1");
        assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 2, "entry_count");
        assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 9, "namespace");
        assert_eq!(Snapshot::decode(&bytes).unwrap(), snapshot);
        assert_eq!(u64::from_le_bytes(bytes[32..40].try_into().unwrap()), 0x1234, "taken");
        assert_eq!(
            snapshot_name(9, 0x1234),
            ".spillway/namespace/0000000000000009-0000000000001234"
        );
    }

    #[test]
    fn damaged_cut_or_foreign_snapshots_are_refused_without_panicking() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            assert!(Snapshot::decode(&flipped).is_err(), "flip at {at}");
        }
        // Paths that could leave the directory they are published under are refused.
        for bad in ["../etc/passwd", "/abs", "a//b", "a/./b", "a/..", "a/", "a\0b"] {
            let mut forged = sample();
            forged.entries[0].path = bad.as_bytes().to_vec();
            let error = Snapshot::decode(&forged.encode()).unwrap_err();
            assert!(
                matches!(error, ManifestError::BadValue { field: "path", .. }),
                "{bad:?}: {error}"
            );
        }
        // An entry of another namespace, with a valid checksum, is refused.
        let mut foreign = sample();
        foreign.entries[1].file_name = spillway_namespace::data_file_name(8, 3, 1);
        let error = Snapshot::decode(&foreign.encode()).unwrap_err();
        assert!(matches!(error, ManifestError::BadValue { field: "file_name", .. }), "{error}");
    }
}
