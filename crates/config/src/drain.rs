//! Knobs of the drain to the parallel file system (PFS). Owned by the drain.
//!
//! The drain is off unless `pfs_directory` is set. Every server of a reservation must be given
//! the same `peers` list (the order clients use) and its own `self_index` in it.

use crate::{knobs, ConfigError};

knobs! {
    /// Draining committed epochs to the PFS.
    section "drain";
    pub struct DrainKnobs {
        /// PFS directory epochs are drained to (`<dir>/epoch-<E>/<file name>`); "" disables the drain. Must exist, and let the epochs' owners create there (a scratch directory, mode 1777): files are written as their owners, never as root.
        pfs_directory: String = String::new(), unit = "path";
        /// The reservation's servers in client order, comma-separated endpoints; "" = this server alone.
        peers: String = String::new(), unit = "endpoints";
        /// This server's position in `peers` (ignored when `peers` is empty).
        self_index: u32 = 0, unit = "index";
        /// PFS stripe size: shuffled domains start on multiples of it (Lustre stripe_size).
        stripe_bytes: u64 = 1 << 20, unit = "bytes";
        /// Largest single PFS write (a multiple of `stripe_bytes`); also the shuffle chunk.
        write_bytes_max: u64 = 8 << 20, unit = "bytes";
        /// How shared files are written: shuffled (coordinated shuffling) or naive.
        mode: String = "shuffled".to_string(), unit = "shuffled|naive";
        /// Queue every epoch for draining as soon as it is committed.
        drain_after_commit: bool = false, unit = "bool";
        /// While clients write to this server, the drain uses at most this share of the PFS bandwidth it measures when idle.
        ingest_bandwidth_share: f64 = 0.25, unit = "fraction (0, 1]";
        /// First pause after a failed drain attempt; doubles per failure.
        retry_backoff_ms_min: u64 = 100, unit = "milliseconds";
        /// Longest pause between drain attempts.
        retry_backoff_ms_max: u64 = 5_000, unit = "milliseconds";
        /// Epochs queued for draining at once; more requests answer Busy.
        queued_epochs_max: u32 = 1024, unit = "epochs";
        /// Failed attempts after which an epoch's drain is quarantined: not retried and not resumed at restart (the data stays in the burst buffer, `spillway drain status` shows the error) until the drain is requested again; 0 = retry forever. A panicking attempt quarantines at once.
        quarantine_after_failures: u32 = 200, unit = "attempts";
        /// Secret that makes staging names on the PFS unpredictable to users; created (32 random bytes, mode 0600) if missing. Every server of a reservation must read the same file.
        staging_key_file: String = "/var/lib/spillway/drain-staging.key".to_string(), unit = "path";
    }
}

impl DrainKnobs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |name: &'static str, value: String, reason: &str| {
            ConfigError::invalid(Self::SECTION, name, value, reason)
        };
        if self.stripe_bytes == 0 {
            return Err(invalid("stripe_bytes", "0".into(), "must be positive"));
        }
        if self.write_bytes_max == 0 || !self.write_bytes_max.is_multiple_of(self.stripe_bytes) {
            return Err(invalid(
                "write_bytes_max",
                self.write_bytes_max.to_string(),
                "must be a positive multiple of stripe_bytes",
            ));
        }
        if self.mode != "shuffled" && self.mode != "naive" {
            return Err(invalid("mode", self.mode.clone(), "expected shuffled or naive"));
        }
        if !(self.ingest_bandwidth_share > 0.0 && self.ingest_bandwidth_share <= 1.0) {
            return Err(invalid(
                "ingest_bandwidth_share",
                self.ingest_bandwidth_share.to_string(),
                "must be in (0, 1]",
            ));
        }
        if self.retry_backoff_ms_min == 0 || self.retry_backoff_ms_min > self.retry_backoff_ms_max {
            return Err(invalid(
                "retry_backoff_ms_min",
                self.retry_backoff_ms_min.to_string(),
                "must be positive and at most retry_backoff_ms_max",
            ));
        }
        if self.queued_epochs_max == 0 {
            return Err(invalid("queued_epochs_max", "0".into(), "must be positive"));
        }
        let peers = self.peers.split(',').filter(|p| !p.trim().is_empty()).count();
        if peers > 0 && self.self_index as usize >= peers {
            return Err(invalid(
                "self_index",
                self.self_index.to_string(),
                "must be a position in peers",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        DrainKnobs::default().validate().unwrap();
        let bad = DrainKnobs { write_bytes_max: 3 << 19, ..DrainKnobs::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("write_bytes_max"));
        let bad = DrainKnobs {
            peers: "127.0.0.1:1,127.0.0.1:2".into(),
            self_index: 2,
            ..DrainKnobs::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("self_index"));
    }
}
