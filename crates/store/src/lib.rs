//! Log-structured DRAM+SSD store: segments, stacked ordered index, epoch GC, recovery.
