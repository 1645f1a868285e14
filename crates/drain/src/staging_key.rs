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
    /// is none. A key file others may read, or that is not this process's, is refused.
    pub fn load_or_create(path: &Path) -> io::Result<StagingKey> {
        if let Some(directory) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(directory)?;
        }
        let fresh = StagingKey::random();
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path);
        match created {
            Ok(mut file) => {
                file.write_all(&fresh.0)?;
                file.sync_all()?;
                Ok(fresh)
            }
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

/// An existing key file: exactly the key's bytes, a plain file of this process's user that
/// nobody else may read.
fn read_key(path: &Path) -> io::Result<StagingKey> {
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let meta = file.metadata()?;
    let refuse = |why: String| {
        Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{}: {why}", path.display())))
    };
    if !meta.file_type().is_file() || meta.uid() != spillway_sys::user::euid() {
        return refuse(format!("the drain staging key must be a plain file of uid {}", meta.uid()));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return refuse(format!(
            "the drain staging key is readable by others (mode {:o}); chmod 600 it",
            meta.permissions().mode() & 0o7777
        ));
    }
    let mut key = [0u8; STAGING_KEY_BYTES];
    let mut rest = Vec::new();
    file.read_exact(&mut key)?;
    file.read_to_end(&mut rest)?;
    if !rest.is_empty() {
        return refuse(format!("longer than the {STAGING_KEY_BYTES} bytes of a key"));
    }
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
    }
}
