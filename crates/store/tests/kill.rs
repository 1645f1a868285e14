//! The real crash test: a child process (this test binary re-executed with
//! `SPILLWAY_STORE_KILL_CHILD` set) writes and commits epochs in a loop on a real directory and
//! is SIGKILLed at random moments, 20 times. After every kill the parent reopens the store and
//! checks every epoch the child reported committed, bit for bit. The child reports through a
//! side file: `commit <epoch> <crc32c>` appended (and fsync'd) after `commit` returned, and
//! `drain <epoch>` appended before it asks to drain an epoch; each line is one write(2), and only
//! newline-terminated lines count (an earlier version wrote fields separately, so a kill could
//! leave `drain 80` without its newline: the next child drained 80, then glued its own line on).

mod common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spillway_store::{Durability, EpochPhase, Store};
use spillway_types::{EpochId, FileId, StreamKey};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

const CHILD_ENV: &str = "SPILLWAY_STORE_KILL_CHILD";
const FILES: u64 = 3;

fn knobs(directory: &Path) -> spillway_config::StoreKnobs {
    spillway_config::StoreKnobs {
        ssd_directory: directory.display().to_string(),
        ..common::small_knobs()
    }
}

/// The content of one file of one epoch (sizes vary so records split and segments roll).
fn file_data(epoch: u64, file: u64) -> Vec<u8> {
    common::payload(
        epoch * 1000 + file,
        10_000 + ((epoch * 7919 + file * 104_729) % 40_000) as usize,
    )
}

fn epoch_checksum(epoch: u64) -> u32 {
    (0..FILES).fold(0, |crc, file| crc32c::crc32c_append(crc, &file_data(epoch, file)))
}

/// Child: continue after the last epoch in the side file, forever, until killed.
fn child(directory: &Path) {
    let side_path = directory.join("side.log");
    let side_text = std::fs::read_to_string(&side_path).unwrap_or_default();
    let last = complete_lines(&side_text)
        .filter_map(|l| l.strip_prefix("commit ")?.split(' ').next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let store = Store::open(&knobs(&directory.join("ssd"))).expect("child: open failed");
    let mut side = std::fs::OpenOptions::new().create(true).append(true).open(&side_path).unwrap();
    if !side_text.is_empty() && !side_text.ends_with('\n') {
        // The predecessor died mid-line: end that line so ours start clean.
        side.write_all(b"\n").unwrap();
    }
    // Epochs above the last reported one may exist uncommitted from the killed predecessor;
    // start past anything the store knows.
    let known = store.epochs().iter().map(|e| e.epoch.0).max().unwrap_or(0);
    // What the killed predecessor left uncommitted will never be committed: delete it, and
    // finish the drains it had announced.
    for info in store.epochs() {
        if info.recovered_uncommitted {
            store.delete_epoch(info.epoch).unwrap();
        }
    }
    for line in complete_lines(&side_text) {
        if let Some(epoch) = line.strip_prefix("drain ").and_then(|e| e.parse::<u64>().ok()) {
            let _ = store.mark_drained(EpochId(epoch));
        }
    }
    let mut epoch = last.max(known) + 1;
    loop {
        for file in 0..FILES {
            store.name_file(EpochId(epoch), FileId(file), &format!("out/{epoch}/{file}")).unwrap();
            let data = file_data(epoch, file);
            // Two halves, second first, to exercise out-of-order offsets.
            let half = data.len() / 2;
            store
                .write(
                    StreamKey(1 + file),
                    EpochId(epoch),
                    FileId(file),
                    half as u64,
                    &data[half..],
                )
                .unwrap();
            store
                .write(StreamKey(1 + file), EpochId(epoch), FileId(file), 0, &data[..half])
                .unwrap();
        }
        store.commit(EpochId(epoch), Durability::Ssd).unwrap();
        // One write(2) per line, so a kill cannot split a line between its fields.
        side.write_all(format!("commit {epoch} {}\n", epoch_checksum(epoch)).as_bytes()).unwrap();
        side.sync_data().unwrap();
        if epoch > 4 {
            side.write_all(format!("drain {}\n", epoch - 4).as_bytes()).unwrap();
            let _ = store.mark_drained(EpochId(epoch - 4));
        }
        epoch += 1;
    }
}

/// Lines ended by a newline (a line cut by a kill is not a report).
fn complete_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive('\n').filter_map(|line| line.strip_suffix('\n'))
}

#[test]
fn kill_child_entry() {
    // Only does something when re-executed by `committed_epochs_survive_sigkill`.
    if let Ok(directory) = std::env::var(CHILD_ENV) {
        child(Path::new(&directory));
    }
}

#[test]
fn committed_epochs_survive_sigkill() {
    let seed = common::seed("committed_epochs_survive_sigkill");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let temp =
        tempfile::Builder::new().prefix("spillway-kill-").tempdir_in(scratch_root()).unwrap();
    let directory = temp.path();
    let executable = std::env::current_exe().unwrap();
    let mut verified_total = 0;
    for round in 0..20 {
        run_child_until_killed(&executable, directory, &mut rng, round);
        let side = std::fs::read_to_string(directory.join("side.log")).unwrap_or_default();
        let reports = parse_side_file(&side, round);
        let store = Store::open(&knobs(&directory.join("ssd")))
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: reopen failed: {e}"));
        store.check_invariants();
        let verified = verify_committed_epochs(&store, &side, &reports, seed, round);
        verified_total += verified;
        eprintln!(
            "round {round}: {} committed so far, {verified} verified live, recovery {:?}",
            reports.committed.len(),
            store.stats().recovery
        );
        // Closed cleanly so the next child starts from a tidy state; the kill is the crash.
        store.close().unwrap();
    }
    assert!(verified_total > 0, "the child never committed anything: the test tested nothing");
}

/// Scenario step 1: runs a child on `directory` and SIGKILLs it after a random while.
fn run_child_until_killed(executable: &Path, directory: &Path, rng: &mut ChaCha8Rng, round: u32) {
    let mut child = std::process::Command::new(executable)
        .args(["kill_child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, directory)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(rng.gen_range(30..250)));
    // SIGKILL; the child is not reaped yet, so its pid is still ours.
    child.kill().expect("kill failed");
    let status = child.wait().unwrap();
    assert!(!status.success(), "round {round}: child exited on its own: {status:?}");
}

/// What the children reported in the side file so far.
struct SideReports {
    /// Committed epochs and the CRC of their files' bytes.
    committed: BTreeMap<u64, u32>,
    /// Epochs a child asked to drain.
    drained: BTreeSet<u64>,
}

/// Scenario step 2: parses the complete lines of the side file (a malformed one fails the test).
fn parse_side_file(side: &str, round: u32) -> SideReports {
    let mut committed = BTreeMap::new();
    let mut drained = BTreeSet::new();
    for line in complete_lines(side) {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["commit", epoch, crc] => {
                committed.insert(epoch.parse::<u64>().unwrap(), crc.parse::<u32>().unwrap());
            }
            ["drain", epoch] => {
                drained.insert(epoch.parse::<u64>().unwrap());
            }
            other => panic!("round {round}: malformed side file line {other:?}"),
        }
    }
    SideReports { committed, drained }
}

/// Scenario step 3, on the reopened store: every reported committed epoch not drained is
/// committed and reads back with its reported CRC. Returns how many were verified.
fn verify_committed_epochs(
    store: &Store,
    side: &str,
    reports: &SideReports,
    seed: u64,
    round: u32,
) -> u64 {
    let phases: BTreeMap<u64, EpochPhase> =
        store.epochs().into_iter().map(|e| (e.epoch.0, e.phase)).collect();
    let mut verified = 0;
    for (&epoch, &crc) in &reports.committed {
        if reports.drained.contains(&epoch) {
            continue;
        }
        if phases.get(&epoch) != Some(&EpochPhase::Committed) {
            let context: Vec<&str> =
                side.lines().filter(|l| l.contains(&epoch.to_string())).collect();
            panic!(
                "seed {seed} round {round}: committed epoch {epoch} came back as {:?}; side file lines naming it: {context:?}; epochs: {:?}",
                phases.get(&epoch),
                store.epochs()
            );
        }
        assert_eq!(
            read_back_checksum(store, epoch),
            crc,
            "seed {seed} round {round}: epoch {epoch} reads back different bytes"
        );
        verified += 1;
    }
    verified
}

/// The CRC of the bytes the store reads back for every file of `epoch` (each file must exist
/// with the name the child gave it).
fn read_back_checksum(store: &Store, epoch: u64) -> u32 {
    let mut check = 0;
    for file in 0..FILES {
        let stat = store.stat(EpochId(epoch), FileId(file)).expect("committed file missing");
        assert_eq!(stat.name.as_deref(), Some(format!("out/{epoch}/{file}").as_str()));
        let mut back = vec![0u8; stat.size_bytes as usize];
        store.read(EpochId(epoch), FileId(file), 0, &mut back).unwrap();
        check = crc32c::crc32c_append(check, &back);
    }
    check
}

/// A disk-backed scratch directory (not tmpfs) so fsync means something.
fn scratch_root() -> std::path::PathBuf {
    let root = std::path::PathBuf::from("/var/tmp");
    if root.is_dir() {
        root
    } else {
        std::env::temp_dir()
    }
}
