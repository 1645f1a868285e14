//! Page-mapped FTL simulator with multi-stream placement (SSD write amplification).
