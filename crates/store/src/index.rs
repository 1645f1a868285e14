//! The stacked ordered index: epoch → file → offset → extent (BurstMem's stacked AVL tree,
//! here three levels of `BTreeMap`).
//!
//! An extent names a slice of one data record (by its sequence number; where the record lives,
//! DRAM or which segment, is kept by the store so spilling and compaction update one place).
//! Invariant: within a file the extents never overlap; inserting a newer write trims or splits
//! the older extents it covers, so "newest write wins" is decided once, at insertion, and reads
//! just walk the map in offset order.

use spillway_types::{EpochId, FileId};
use std::collections::BTreeMap;
use std::ops::RangeBounds;

/// A slice of a data record's payload that is the current content of a file range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Sequence number of the data record holding the bytes.
    pub record: u64,
    /// Where in the record's payload the slice starts.
    pub skip: u64,
    pub length: u64,
}

/// file offset → extent, non-overlapping.
pub type FileExtents = BTreeMap<u64, Extent>;

#[derive(Default, Debug)]
pub struct Index {
    epochs: BTreeMap<EpochId, BTreeMap<FileId, FileExtents>>,
}

impl Index {
    /// Records that `[offset, offset + extent.length)` of (`epoch`, `file`) now holds `extent`,
    /// replacing whatever covered that range. Returns the (record, bytes) pairs that lost
    /// coverage, so the caller can keep per-record live counts.
    pub fn insert(
        &mut self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        extent: Extent,
    ) -> Vec<(u64, u64)> {
        assert!(extent.length > 0, "empty extent");
        let end = offset.checked_add(extent.length).expect("extent end overflows u64");
        let extents = self.epochs.entry(epoch).or_default().entry(file).or_default();
        let mut displaced = Vec::new();
        // The extent starting before `offset` may stick into the new range.
        if let Some((&start, &old)) = extents.range(..offset).next_back() {
            let old_end = start + old.length;
            if old_end > offset {
                extents.insert(start, Extent { length: offset - start, ..old });
                if old_end > end {
                    // The new write sits strictly inside the old extent: keep its tail.
                    extents.insert(
                        end,
                        Extent { skip: old.skip + (end - start), length: old_end - end, ..old },
                    );
                    displaced.push((old.record, extent.length));
                } else {
                    displaced.push((old.record, old_end - offset));
                }
            }
        }
        // Extents starting inside the new range are removed or trimmed at the front.
        let inside: Vec<u64> = extents.range(offset..end).map(|(&start, _)| start).collect();
        for start in inside {
            let old = extents.remove(&start).expect("extent vanished");
            let old_end = start + old.length;
            if old_end > end {
                extents.insert(
                    end,
                    Extent { skip: old.skip + (end - start), length: old_end - end, ..old },
                );
                displaced.push((old.record, end - start));
            } else {
                displaced.push((old.record, old.length));
            }
        }
        extents.insert(offset, extent);
        #[cfg(feature = "strict_assertions")]
        Self::check_file(extents);
        displaced
    }

    /// Asserts the no-overlap invariant of one file (strict builds call it after every insert).
    pub fn check_file(extents: &FileExtents) {
        let mut previous_end = 0u64;
        for (&start, extent) in extents {
            assert!(extent.length > 0, "empty extent at {start}");
            assert!(start >= previous_end, "extents overlap at offset {start}");
            previous_end = start + extent.length;
        }
    }

    /// Removes an epoch and returns its files (for the caller's accounting).
    pub fn remove_epoch(&mut self, epoch: EpochId) -> BTreeMap<FileId, FileExtents> {
        self.epochs.remove(&epoch).unwrap_or_default()
    }

    /// All files of an epoch, in file order.
    pub fn epoch(&self, epoch: EpochId) -> Option<&BTreeMap<FileId, FileExtents>> {
        self.epochs.get(&epoch)
    }

    /// Epochs in a range, in order, each with its files.
    pub fn epochs_in(
        &self,
        range: impl RangeBounds<EpochId>,
    ) -> impl Iterator<Item = (EpochId, &BTreeMap<FileId, FileExtents>)> {
        self.epochs.range(range).map(|(&e, files)| (e, files))
    }

    /// One file of one epoch.
    pub fn file(&self, epoch: EpochId, file: FileId) -> Option<&FileExtents> {
        self.epochs.get(&epoch)?.get(&file)
    }

    /// The extents overlapping `[offset, offset + length)` of a file, in offset order, each as
    /// (file offset, extent) clipped to the range.
    pub fn range(
        &self,
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    ) -> Vec<(u64, Extent)> {
        let Some(extents) = self.file(epoch, file) else { return Vec::new() };
        let end = offset.saturating_add(length);
        let mut out = Vec::new();
        let first = extents.range(..=offset).next_back().map(|(&s, _)| s).unwrap_or(offset);
        for (&start, &extent) in extents.range(first..end) {
            let extent_end = start + extent.length;
            if extent_end <= offset {
                continue;
            }
            let clip_start = start.max(offset);
            let clip_end = extent_end.min(end);
            out.push((
                clip_start,
                Extent {
                    record: extent.record,
                    skip: extent.skip + (clip_start - start),
                    length: clip_end - clip_start,
                },
            ));
        }
        out
    }

    /// File size as the end of its last extent (0 if unknown).
    pub fn file_size(extents: &FileExtents) -> u64 {
        extents.iter().next_back().map_or(0, |(&s, e)| s + e.length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(record: u64, length: u64) -> Extent {
        Extent { record, skip: 0, length }
    }

    #[test]
    fn newer_writes_split_and_trim_older_ones() {
        let mut index = Index::default();
        let (e, f) = (EpochId(1), FileId(1));
        assert!(index.insert(e, f, 0, extent(1, 100)).is_empty());
        // Inside: splits record 1 into [0,10) and [20,100).
        assert_eq!(index.insert(e, f, 10, extent(2, 10)), vec![(1, 10)]);
        // Covers the tail of 1 and beyond.
        assert_eq!(index.insert(e, f, 90, extent(3, 20)), vec![(1, 10)]);
        let file = index.file(e, f).unwrap();
        Index::check_file(file);
        let layout: Vec<(u64, u64, u64, u64)> =
            file.iter().map(|(&s, x)| (s, x.record, x.skip, x.length)).collect();
        assert_eq!(layout, vec![(0, 1, 0, 10), (10, 2, 0, 10), (20, 1, 20, 70), (90, 3, 0, 20)]);
        // Covers everything.
        let displaced = index.insert(e, f, 0, extent(4, 200));
        assert_eq!(displaced.iter().map(|d| d.1).sum::<u64>(), 110);
        assert_eq!(index.file(e, f).unwrap().len(), 1);
    }

    #[test]
    fn range_query_clips() {
        let mut index = Index::default();
        let (e, f) = (EpochId(2), FileId(5));
        index.insert(e, f, 0, extent(1, 10));
        index.insert(e, f, 20, extent(2, 10));
        let got = index.range(e, f, 5, 20);
        assert_eq!(
            got,
            vec![
                (5, Extent { record: 1, skip: 5, length: 5 }),
                (20, Extent { record: 2, skip: 0, length: 5 })
            ]
        );
        assert_eq!(Index::file_size(index.file(e, f).unwrap()), 30);
        assert!(index.range(e, FileId(9), 0, 10).is_empty());
    }
}
