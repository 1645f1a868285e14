//! End to end: a real `spillway serve` whose SSD directory is a small tmpfs (12 MiB) that fills
//! long before `store.ssd_bytes_max` (1 GiB). Writes get ENOSPC (never EIO), a write past the
//! file-size limit gets EFBIG, deletes work and free space, writes succeed again without a
//! restart, and committed data is intact after one. Needs root (it mounts the tmpfs).

use std::path::{Path, PathBuf};
use std::process::Command;

use spillway_client::{Client, ClientOptions, Placement};
use spillway_harness::{pattern, same_bytes, ServerProcess};
use spillway_proto::{Durability, ErrorCode};
use spillway_types::EpochId;

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const CHUNK: usize = 256 * 1024;

/// A tmpfs mounted for the test, unmounted (lazily) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert!(euid == 0, "disk_full_e2e mounts a tmpfs and must run as root (euid {euid})");
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("running mount");
        assert!(status.success(), "mount -t tmpfs on {} failed: {status}", path.display());
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn client(server: &ServerProcess) -> Client {
    let options = ClientOptions {
        placement: Placement::Local { rank: 0 },
        durability: Durability::Ssd,
        ..ClientOptions::default()
    };
    Client::connect(&[server.endpoint().clone()], options).unwrap()
}

/// Writes `data` to a new file of `epoch` in chunks and flushes; the first error.
fn write_file(
    client: &mut Client,
    epoch: EpochId,
    name: &str,
    data: &[u8],
) -> Result<(), spillway_client::ClientError> {
    client.begin_epoch(epoch);
    let mut file = client.create_file(epoch, name)?;
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        client.write(&mut file, (i * CHUNK) as u64, chunk)?;
        client.flush()?;
    }
    Ok(())
}

fn read_file(client: &mut Client, epoch: EpochId, name: &str, length: usize) -> Vec<u8> {
    let file = client.open_file(epoch, name).unwrap();
    let mut back = vec![0u8; length];
    client.read(&file, 0, &mut back).unwrap();
    back
}

#[test]
fn a_full_ssd_file_system_is_enospc_deletes_free_it_and_writes_resume_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().join("ssd");
    let _tmpfs = Tmpfs::mount(&ssd, "12m");
    let mut server = ServerProcess::builder(BIN, dir.path(), "full")
        .ssd_dir(&ssd)
        .dram_bytes("4M")
        .rust_log("info")
        .env("SPILLWAY_STORE_SSD_BYTES_MAX", (1u64 << 30).to_string())
        .env("SPILLWAY_STORE_SEGMENT_BYTES_MAX", (1u64 << 20).to_string())
        .env("SPILLWAY_STORE_RECORD_PAYLOAD_BYTES_MAX", (256u64 << 10).to_string())
        .env("SPILLWAY_STORE_SSD_RESERVE_BYTES", (1u64 << 20).to_string())
        .env("SPILLWAY_SERVER_BACKPRESSURE_WAIT_MS_MAX", "300")
        .start();
    let mut c = client(&server);

    // Epoch 1: 2 MiB, committed.
    let kept = pattern(1, 2 << 20);
    write_file(&mut c, EpochId(1), "kept.dat", &kept).unwrap();
    c.commit_epoch(EpochId(1)).unwrap();

    // 10 bytes at 2^63: EFBIG, nothing written.
    let mut file = c.create_file(EpochId(1_000), "huge.dat").unwrap();
    let too_big = c.write(&mut file, 1 << 63, b"0123456789").and_then(|()| c.flush());
    let error = too_big.expect_err("a write at 2^63 was accepted");
    assert_eq!(error.code(), Some(ErrorCode::FileTooLarge), "{error}");
    assert_eq!(error.errno(), libc::EFBIG);

    // Epoch 2: fill the file system. The error is ENOSPC, never EIO.
    let filler = pattern(2, 64 << 20);
    let error = write_file(&mut c, EpochId(2), "filler.dat", &filler)
        .expect_err("64 MiB fit on a 12 MiB tmpfs");
    assert_eq!(error.code(), Some(ErrorCode::NoSpace), "{error}");
    assert_eq!(error.errno(), libc::ENOSPC);
    let mut c = client(&server);
    match c.commit_epoch(EpochId(2)) {
        Ok(()) => {}
        Err(error) => assert_eq!(error.code(), Some(ErrorCode::NoSpace), "{error}"),
    }
    // Reads still work, and so does the delete that frees the space.
    assert!(same_bytes(&read_file(&mut c, EpochId(1), "kept.dat", kept.len()), &kept));
    c.delete_epoch(EpochId(2)).unwrap();

    // Space returns: writes succeed again without a restart (each write may wait for the
    // flusher's GC within the server's bounded backpressure wait; retried a bounded number of
    // times because the GC runs in the background).
    let again = pattern(3, 3 << 20);
    let mut result = Err(error);
    for _ in 0..50 {
        let mut fresh = client(&server);
        result = write_file(&mut fresh, EpochId(3), "again.dat", &again)
            .and_then(|()| fresh.commit_epoch(EpochId(3)));
        match &result {
            Err(e) if e.code() == Some(ErrorCode::NoSpace) => {
                let mut cleanup = client(&server);
                let _ = cleanup.delete_epoch(EpochId(3));
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            _ => break,
        }
    }
    result.expect("writes did not resume after the delete freed space");

    // A crash and restart keep everything committed, bit for bit.
    drop(c);
    server.sigkill().unwrap();
    server.restart().unwrap();
    let mut c = client(&server);
    assert!(same_bytes(&read_file(&mut c, EpochId(1), "kept.dat", kept.len()), &kept));
    assert!(same_bytes(&read_file(&mut c, EpochId(3), "again.dat", again.len()), &again));
    let log = std::fs::read_to_string(dir.path().join("full.log")).unwrap();
    assert!(!log.contains("store failed"), "the store failed on a full disk:\n{log}");
}
