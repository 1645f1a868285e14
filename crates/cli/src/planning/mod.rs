//! The planning tools a center runs before it buys or sizes a burst buffer: SSD wear under
//! stream placements (`ftl`), a trace-driven buffer simulation (`sim`) and a workflow's
//! characterization with allocation advice (`characterize`). Each parses its flags, calls
//! `spillway-ftl` or `spillway-sim`, and formats the result.

pub mod characterize;
pub mod ftl;
pub mod sim;
pub mod sim_ias;
