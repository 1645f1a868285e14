//! Trace-driven two-level burst buffer simulator and workflow characterization.
