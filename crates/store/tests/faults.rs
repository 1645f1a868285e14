//! The store under faults: the file-size limit (EFBIG), a full file system (ENOSPC that is never
//! sticky), genuine I/O errors (sticky `Failed`), failed fsyncs, all injected behind the
//! storage seam (`SimStorage` faults and capacity).

mod common;

use spillway_store::{Durability, SimStorage, Storage, Store, WriteError};
use spillway_types::{EpochId, FileId, StreamKey};
use std::sync::Arc;

fn open_sim_with(knobs: &spillway_config::StoreKnobs) -> (Arc<SimStorage>, Store) {
    let storage = SimStorage::new();
    let store = Store::open_with(knobs, storage.clone() as Arc<dyn Storage>).unwrap();
    (storage, store)
}

#[test]
fn writes_ending_past_the_file_size_limit_are_refused_whole() {
    let knobs = spillway_config::StoreKnobs { file_bytes_max: 1 << 20, ..common::small_knobs() };
    let (_storage, store) = open_sim_with(&knobs);
    let (stream, epoch, file) = (StreamKey(1), EpochId(1), FileId(1));
    // Ending exactly at the limit is fine; one byte past it is refused.
    store.write(stream, epoch, file, (1 << 20) - 10, &[7u8; 10]).unwrap();
    let refused = store.write(stream, epoch, file, (1 << 20) - 9, &[7u8; 10]);
    assert!(
        matches!(refused, Err(WriteError::FileTooLarge { offset, length: 10, file_bytes_max, .. })
            if offset == (1 << 20) - 9 && file_bytes_max == 1 << 20),
        "{refused:?}"
    );
    // The report case: 10 bytes at 2^63, and an end that overflows u64.
    assert!(matches!(
        store.write(stream, epoch, file, 1 << 63, &[1u8; 10]),
        Err(WriteError::FileTooLarge { .. })
    ));
    assert!(matches!(
        store.write(stream, epoch, file, u64::MAX - 4, &[1u8; 10]),
        Err(WriteError::OffsetOverflow { .. })
    ));
    assert!(matches!(
        store.try_reserve_write(stream, epoch, file, 1 << 63, 10),
        Err(WriteError::FileTooLarge { .. })
    ));
    // Nothing of the refused writes exists: the file still ends at the limit.
    let info = store.stat(epoch, file).unwrap();
    assert_eq!(info.size_bytes, 1 << 20);
    store.commit(epoch, Durability::Ssd).unwrap();
    store.check_invariants();
}

#[test]
fn the_default_file_size_limit_is_2_to_the_44() {
    assert_eq!(spillway_config::StoreKnobs::default().file_bytes_max, 1 << 44);
    let too_big =
        spillway_config::StoreKnobs { file_bytes_max: (1 << 62) + 1, ..common::small_knobs() };
    let error = too_big.validate().unwrap_err().to_string();
    assert!(error.contains("file_bytes_max"), "{error}");
}
