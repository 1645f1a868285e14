//! The secret behind staging names on the PFS.
//!
//! A drain writes a file under a hidden staging name beside its final name, then renames it.
//! Users can write that directory too; if they could predict the staging name they could
//! create it first (the drain refuses a file that is not the owner's, so that only blocks the
//! drain) or watch for it. The name therefore carries a keyed hash of the epoch and the final
//! path, under a key only the servers read. Every server of a reservation writes parts of the
//! same staging file, so they must share the key: one file, like munge's key, the same on
//! every burst buffer node (`drain.staging_key_file`; on one host every server shares it).

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rand::RngCore;
use siphasher::sip128::{Hasher128, SipHasher24};
use spillway_types::EpochId;

/// Bytes of the key.
pub const STAGING_KEY_BYTES: usize = 32;

/// The servers' secret for staging names.
#[derive(Clone)]
pub struct StagingKey([u8; STAGING_KEY_BYTES]);

impl std::fmt::Debug for StagingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StagingKey(…)")
    }
}

impl StagingKey {
    /// A fresh random key, for drainers that all run in one process (benchmarks, tests).
    pub fn random() -> StagingKey {
        let mut key = [0u8; STAGING_KEY_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut key);
        StagingKey(key)
    }

    /// Reads the key at `path`, creating it (random, mode 0600, its directory 0700) if there
    /// is none. A key file others may read, or that is not this process's, is refused. A new
    /// key is written and fsync'd under a temporary name and then linked into place, so a crash
    /// never leaves a short key under `path` (which would keep every server from starting) and
    /// two servers starting at once end with the same key.
    pub fn load_or_create(path: &Path) -> io::Result<StagingKey> {
        if let Some(directory) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(directory)?;
        }
        if std::fs::symlink_metadata(path).is_ok() {
            return read_key(path);
        }
        let fresh = StagingKey::random();
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(format!(".new-{}-{:016x}", std::process::id(), rand::random::<u64>()));
        let temporary = std::path::PathBuf::from(temporary);
        let _ = std::fs::remove_file(&temporary);
        let written =
            write_new_key(&temporary, &fresh).and_then(|()| std::fs::hard_link(&temporary, path));
        let _ = std::fs::remove_file(&temporary);
        match written {
            Ok(()) => {
                if let Some(directory) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::File::open(directory)?.sync_all()?;
                }
                Ok(fresh)
            }
            // Another server linked its key first: use that one.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => read_key(path),
            Err(error) => Err(error),
        }
    }

    /// The staging token of `final_path` in `epoch`.
    pub fn token(&self, epoch: EpochId, final_path: &Path) -> u64 {
        let (k0, k1) = (
            u64::from_le_bytes(self.0[0..8].try_into().expect("8 bytes")),
            u64::from_le_bytes(self.0[8..16].try_into().expect("8 bytes")),
        );
        let mut hasher = SipHasher24::new_with_keys(k0, k1);
        std::hash::Hasher::write(&mut hasher, &self.0[16..]);
        std::hash::Hasher::write(&mut hasher, &epoch.0.to_le_bytes());
        std::hash::Hasher::write(&mut hasher, final_path.as_os_str().as_encoded_bytes());
        hasher.finish128().h1
    }
}

/// Writes `key` to a new file at `path` (mode 0600) and fsyncs it.
fn write_new_key(path: &Path, key: &StagingKey) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(&key.0)?;
    file.sync_all()
}

/// An existing key file: exactly the key's bytes, a plain file of this process's user that
/// nobody else may read.
fn read_key(path: &Path) -> io::Result<StagingKey> {
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let meta = file.metadata()?;
    let refuse = |why: String| {
        Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{}: {why}", path.display())))
    };
    let euid = spillway_sys::user::euid();
    if !meta.file_type().is_file() || meta.uid() != euid {
        return refuse(format!(
            "the drain staging key must be a plain file of uid {euid} (this server's); it is \
             uid {}'s",
            meta.uid()
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return refuse(format!(
            "the drain staging key is readable by others (mode {:o}); chmod 600 it",
            meta.permissions().mode() & 0o7777
        ));
    }
    let mut key = [0u8; STAGING_KEY_BYTES];
    let mut rest = Vec::new();
    (&mut file).take(STAGING_KEY_BYTES as u64 + 1).read_to_end(&mut rest)?;
    if rest.len() != STAGING_KEY_BYTES {
        return refuse(format!(
            "{} bytes, not the {STAGING_KEY_BYTES} of a drain staging key; replace it with the \
             key the other burst buffer nodes use",
            rest.len()
        ));
    }
    key.copy_from_slice(&rest);
    Ok(StagingKey(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_once_then_shared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/drain.key");
        let first = StagingKey::load_or_create(&path).unwrap();
        let again = StagingKey::load_or_create(&path).unwrap();
        let name = Path::new("epoch-3/out.dat");
        assert_eq!(first.token(EpochId(3), name), again.token(EpochId(3), name));
        assert_ne!(first.token(EpochId(3), name), first.token(EpochId(4), name));
        assert_ne!(first.token(EpochId(3), name), StagingKey::random().token(EpochId(3), name));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_readable_or_wrong_sized_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drain.key");
        StagingKey::load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = StagingKey::load_or_create(&path).unwrap_err();
        assert!(error.to_string().contains("readable by others"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"x").unwrap();
        assert!(StagingKey::load_or_create(&path).is_err());
        // A short key (a crash of an older version mid-write) is named, not an EOF.
        std::fs::write(&path, b"short").unwrap();
        let error = StagingKey::load_or_create(&path).unwrap_err();
        assert!(error.to_string().contains("5 bytes, not the 32"), "{error}");
        // A link is not followed.
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(StagingKey::load_or_create(&link).is_err());
    }

    #[test]
    fn servers_starting_at_once_end_with_one_key_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drain.key");
        let keys: Vec<StagingKey> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| StagingKey::load_or_create(&path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let name = Path::new("f");
        assert!(keys.iter().all(|k| k.token(EpochId(1), name) == keys[0].token(EpochId(1), name)));
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "only the key is left: {entries:?}");
    }
}
