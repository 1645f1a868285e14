//! The server's identity file, `<ssd_directory>/IDENTITY`: a random 128-bit id made at the
//! first start and an incarnation counted up at every start (docs/design/log-format.md,
//! "Identity file"). A server started empty at a lost server's address therefore has another
//! id, and a drain that recorded the lost one refuses to publish without it.
//!
//! `<ssd_directory>/CLUSTER` ([`ClusterMembership`]) names the cluster the server serves: the
//! id of the manager database that added it first (`JoinCluster`). A manager with another
//! database (a wiped one, or another site's) finds the server serving someone else and does not
//! hand out epoch ids that the server may already hold under other owners.
//!
//! Each file is replaced whole: written to `IDENTITY.tmp`, fsync'd, renamed over `IDENTITY`, the
//! directory fsync'd; a crash leaves the old or the new file, never a torn one. A file that is
//! there but damaged (wrong size, magic, version or CRC) is an error naming it: replacing it
//! would give the server a new id and make the data it holds look lost to every drain.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use spillway_proto::{ServerId, CLUSTER_ID_BYTES, SERVER_ID_BYTES};

/// Name of the identity file in the SSD directory.
pub const IDENTITY_FILE: &str = "IDENTITY";
/// "SPWI" read as a little-endian u32.
pub const IDENTITY_MAGIC: u32 = u32::from_le_bytes(*b"SPWI");
/// Version of the identity file layout.
pub const IDENTITY_VERSION: u32 = 1;
/// Size of the identity file: magic, version, id, incarnation, CRC32C of the bytes before it.
pub const IDENTITY_FILE_BYTES: usize = 4 + 4 + SERVER_ID_BYTES + 8 + 4;

const _: () = assert!(IDENTITY_FILE_BYTES == 36);

/// Name of the cluster file in the SSD directory.
pub const CLUSTER_FILE: &str = "CLUSTER";
/// "SPWC" read as a little-endian u32.
pub const CLUSTER_MAGIC: u32 = u32::from_le_bytes(*b"SPWC");
/// Version of the cluster file layout.
pub const CLUSTER_VERSION: u32 = 1;
/// Size of the cluster file: magic, version, cluster id, CRC32C of the bytes before it.
pub const CLUSTER_FILE_BYTES: usize = 4 + 4 + CLUSTER_ID_BYTES + 4;

const _: () = assert!(CLUSTER_FILE_BYTES == 28);
const _: () = assert!(SERVER_ID_BYTES == 16);

/// Who this server is: its id and how many times it has started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerIdentity {
    pub id: ServerId,
    /// 1 at the first start with an identity file, one more at each start after; 0 for a
    /// server without one ([`ServerIdentity::ephemeral`]).
    pub incarnation: u64,
}

/// Why the identity could not be loaded or recorded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    #[error("server identity file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("server identity file {path} is damaged ({problem}); it is not replaced, because a new id would make the data this server holds look lost: restore it, or remove it together with the store's data")]
    Damaged { path: PathBuf, problem: &'static str },
    #[error("server identity file {path}: the incarnation counter is exhausted")]
    Exhausted { path: PathBuf },
    #[error("cannot draw a server id from getrandom: {0}")]
    Random(getrandom::Error),
}

impl ServerIdentity {
    /// A fresh random identity with incarnation 0, kept nowhere: for servers embedded in tests
    /// and benchmarks, which have no identity file and are another server at every start.
    pub fn ephemeral() -> Result<ServerIdentity, IdentityError> {
        Ok(ServerIdentity { id: random_id()?, incarnation: 0 })
    }

    /// Loads the identity from `directory` (creating it with a random id at the first start),
    /// counts this start, and records it durably before returning. Call it while holding the
    /// store's lock on `directory`, so that two servers never count the same start.
    pub fn start(directory: &Path) -> Result<ServerIdentity, IdentityError> {
        let path = directory.join(IDENTITY_FILE);
        let previous = match std::fs::read(&path) {
            Ok(bytes) => Some(
                decode(&bytes)
                    .map_err(|problem| IdentityError::Damaged { path: path.clone(), problem })?,
            ),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(IdentityError::Io { path, source }),
        };
        let identity = match previous {
            Some(previous) => ServerIdentity {
                id: previous.id,
                incarnation: previous
                    .incarnation
                    .checked_add(1)
                    .ok_or_else(|| IdentityError::Exhausted { path: path.clone() })?,
            },
            None => ServerIdentity { id: random_id()?, incarnation: 1 },
        };
        write_durably(directory, &path, &encode(&identity))?;
        Ok(identity)
    }
}

/// The cluster a server serves (see the module documentation). Without a directory (servers
/// embedded in tests) it is kept in memory only.
pub struct ClusterMembership {
    directory: Option<PathBuf>,
    serves: std::sync::Mutex<Option<[u8; CLUSTER_ID_BYTES]>>,
}

impl ClusterMembership {
    /// Kept in memory only: the server serves no cluster until joined, and forgets at exit.
    pub fn ephemeral() -> ClusterMembership {
        ClusterMembership { directory: None, serves: std::sync::Mutex::new(None) }
    }

    /// Reads `<directory>/CLUSTER` (absent: no cluster yet); a damaged file is an error.
    pub fn load(directory: &Path) -> Result<ClusterMembership, IdentityError> {
        let path = directory.join(CLUSTER_FILE);
        let serves = match std::fs::read(&path) {
            Ok(bytes) => Some(
                decode_cluster(&bytes)
                    .map_err(|problem| IdentityError::Damaged { path: path.clone(), problem })?,
            ),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(IdentityError::Io { path, source }),
        };
        Ok(ClusterMembership {
            directory: Some(directory.to_path_buf()),
            serves: std::sync::Mutex::new(serves),
        })
    }

    /// Joins `cluster_id` unless the server serves a cluster already (recorded durably first);
    /// the cluster it serves afterwards, which differs from `cluster_id` for another's server.
    pub fn join(
        &self,
        cluster_id: [u8; CLUSTER_ID_BYTES],
    ) -> Result<[u8; CLUSTER_ID_BYTES], IdentityError> {
        let mut serves = self.serves.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(current) = *serves {
            return Ok(current);
        }
        if let Some(directory) = &self.directory {
            write_durably(directory, &directory.join(CLUSTER_FILE), &encode_cluster(&cluster_id))?;
        }
        *serves = Some(cluster_id);
        Ok(cluster_id)
    }
}

/// The cluster file's bytes (docs/design/log-format.md, "Cluster file").
pub fn encode_cluster(cluster_id: &[u8; CLUSTER_ID_BYTES]) -> [u8; CLUSTER_FILE_BYTES] {
    let mut out = [0u8; CLUSTER_FILE_BYTES];
    out[0..4].copy_from_slice(&CLUSTER_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&CLUSTER_VERSION.to_le_bytes());
    out[8..24].copy_from_slice(cluster_id);
    let crc = crc32c::crc32c(&out[..24]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes and checks the cluster file's bytes; the problem named if they are not one.
pub fn decode_cluster(bytes: &[u8]) -> Result<[u8; CLUSTER_ID_BYTES], &'static str> {
    if bytes.len() != CLUSTER_FILE_BYTES {
        return Err("wrong size");
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if u32_at(0) != CLUSTER_MAGIC {
        return Err("wrong magic");
    }
    if u32_at(24) != crc32c::crc32c(&bytes[..24]) {
        return Err("CRC mismatch");
    }
    if u32_at(4) != CLUSTER_VERSION {
        return Err("unknown version");
    }
    Ok(bytes[8..24].try_into().expect("16 bytes"))
}

fn random_id() -> Result<ServerId, IdentityError> {
    let mut id = [0u8; SERVER_ID_BYTES];
    while id == [0u8; SERVER_ID_BYTES] {
        getrandom::getrandom(&mut id).map_err(IdentityError::Random)?;
    }
    Ok(ServerId(id))
}

/// The file's bytes (docs/design/log-format.md, "Identity file").
pub fn encode(identity: &ServerIdentity) -> [u8; IDENTITY_FILE_BYTES] {
    let mut out = [0u8; IDENTITY_FILE_BYTES];
    out[0..4].copy_from_slice(&IDENTITY_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&IDENTITY_VERSION.to_le_bytes());
    out[8..24].copy_from_slice(&identity.id.0);
    out[24..32].copy_from_slice(&identity.incarnation.to_le_bytes());
    let crc = crc32c::crc32c(&out[..32]);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes and checks the file's bytes; the problem named if they are not an identity.
pub fn decode(bytes: &[u8]) -> Result<ServerIdentity, &'static str> {
    if bytes.len() != IDENTITY_FILE_BYTES {
        return Err("wrong size");
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if u32_at(0) != IDENTITY_MAGIC {
        return Err("wrong magic");
    }
    if u32_at(32) != crc32c::crc32c(&bytes[..32]) {
        return Err("CRC mismatch");
    }
    if u32_at(4) != IDENTITY_VERSION {
        return Err("unknown version");
    }
    let id = ServerId(bytes[8..24].try_into().expect("16 bytes"));
    if id.is_none() {
        return Err("all-zero id");
    }
    let incarnation = u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes"));
    Ok(ServerIdentity { id, incarnation })
}

/// Temp file, fsync, rename over `path`, fsync of the directory.
fn write_durably(directory: &Path, path: &Path, bytes: &[u8]) -> Result<(), IdentityError> {
    let temporary = path.with_extension("tmp");
    let io = |source| IdentityError::Io { path: temporary.clone(), source };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temporary)
        .map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(io)?;
    File::open(directory)
        .and_then(|d| d.sync_all())
        .map_err(|source| IdentityError::Io { path: directory.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_survives_restarts_and_the_incarnation_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let first = ServerIdentity::start(dir.path()).unwrap();
        assert_eq!(first.incarnation, 1);
        assert!(!first.id.is_none());
        let second = ServerIdentity::start(dir.path()).unwrap();
        assert_eq!((second.id, second.incarnation), (first.id, 2));
        let other = ServerIdentity::start(tempfile::tempdir().unwrap().path()).unwrap();
        assert_ne!(other.id, first.id, "another directory is another server");
        assert!(!dir.path().join("IDENTITY.tmp").exists());
    }

    #[test]
    fn a_server_joins_one_cluster_and_keeps_it_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let first = ClusterMembership::load(dir.path()).unwrap();
        assert_eq!(first.join([1; 16]).unwrap(), [1; 16]);
        assert_eq!(first.join([2; 16]).unwrap(), [1; 16], "another cluster does not take it over");
        let again = ClusterMembership::load(dir.path()).unwrap();
        assert_eq!(again.join([2; 16]).unwrap(), [1; 16], "recorded durably");
        assert!(!dir.path().join("CLUSTER.tmp").exists());
        let path = dir.path().join(CLUSTER_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = ClusterMembership::load(dir.path()).err().expect("a damaged file").to_string();
        assert!(error.contains("CRC mismatch") && error.contains("CLUSTER"), "{error}");
        let memory = ClusterMembership::ephemeral();
        assert_eq!(memory.join([3; 16]).unwrap(), [3; 16]);
        assert_eq!(memory.join([4; 16]).unwrap(), [3; 16]);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it_and_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        ServerIdentity::start(dir.path()).unwrap();
        let path = dir.path().join(IDENTITY_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[10] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = ServerIdentity::start(dir.path()).unwrap_err();
        let message = error.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("CRC mismatch"), "{message}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "a damaged file must not be replaced");
        std::fs::write(&path, &bytes[..20]).unwrap();
        assert!(ServerIdentity::start(dir.path()).unwrap_err().to_string().contains("wrong size"));
    }
}
