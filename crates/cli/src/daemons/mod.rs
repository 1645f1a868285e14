//! The long-running processes: a burst buffer server (`serve`) and the control plane
//! (`manager`). Each turns its flags and the knob table into a configuration, starts the
//! crate that does the work and stops it cleanly on SIGTERM or SIGINT.

pub mod manager;
pub mod serve;
