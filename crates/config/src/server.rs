//! Knobs of the burst buffer server (network side). Owned by the server.
//!
//! Every queue and in-flight count of the server has its bound here.

use crate::{knobs, ConfigError};

/// Commit durability when a request does not say (and for `spillway serve`'s default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitDurability {
    /// `commit` returns when the epoch is fsync'd in the SSD log.
    Ssd,
    /// `commit` returns when the server holds the epoch in DRAM; the SSD log catches up.
    Memory,
}

knobs! {
    /// The burst buffer server process.
    section "server";
    pub struct ServerKnobs {
        /// TCP address to listen on ("" for none). Non-loopback addresses need `insecure_tcp`.
        listen_address: String = "127.0.0.1:7070".to_string(), unit = "host:port";
        /// Unix-domain socket to listen on as well ("" for none); identity comes from SO_PEERCRED.
        unix_socket_path: String = String::new(), unit = "path";
        /// Allow a non-loopback TCP listener although peers cannot be authenticated yet (logs a warning).
        insecure_tcp: bool = false, unit = "bool";
        /// A name for logs and `status`.
        server_name: String = "spillway".to_string(), unit = "name";
        /// Connections served at once; more are refused with an error frame.
        connections_max: u32 = 256, unit = "connections";
        /// Largest payload of one frame (a write or a read reply), announced in the handshake.
        payload_bytes_max: u32 = 16 * 1024 * 1024, unit = "bytes";
        /// Requests a client may have outstanding on one connection (the per-connection queue).
        in_flight_requests_max: u32 = 128, unit = "requests";
        /// Write payload bytes received but not yet in the store, over all connections.
        in_flight_bytes_max: u64 = 512 * 1024 * 1024, unit = "bytes";
        /// How long a write waits for space when the store is full before failing with ENOSPC.
        backpressure_wait_ms_max: u64 = 10_000, unit = "milliseconds";
        /// Durability of `commit` when the client asks for the server default.
        commit_durability: CommitDurability = CommitDurability::Ssd, unit = "ssd|memory";
        /// A client silent this long mid-frame is disconnected and its partial write dropped (it holds DRAM).
        frame_stall_ms_max: u64 = 30_000, unit = "milliseconds";
        /// On SIGTERM, how long to wait for in-flight requests before closing connections.
        shutdown_grace_ms_max: u64 = 10_000, unit = "milliseconds";
        /// Accept data only for epochs the manager granted (GrantEpoch); false: the first uid to create an epoch claims it.
        managed: bool = false, unit = "bool";
    }
}

impl ServerKnobs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |name: &'static str, value: String, reason: &str| {
            ConfigError::invalid(Self::SECTION, name, value, reason)
        };
        if self.listen_address.is_empty() && self.unix_socket_path.is_empty() {
            return Err(invalid(
                "listen_address",
                "\"\"".into(),
                "needs a TCP address or a unix_socket_path",
            ));
        }
        if !self.listen_address.is_empty() {
            let refusal =
                "peers cannot be authenticated yet, set insecure_tcp (--insecure-tcp) to allow it";
            crate::check_listen_address(
                Self::SECTION,
                "listen_address",
                &self.listen_address,
                self.insecure_tcp,
                refusal,
            )?;
        }
        if self.connections_max == 0 {
            return Err(invalid("connections_max", "0".into(), "must be at least 1"));
        }
        if self.payload_bytes_max < 4096 || self.payload_bytes_max > 256 * 1024 * 1024 {
            return Err(invalid(
                "payload_bytes_max",
                self.payload_bytes_max.to_string(),
                "must be within 4 KiB..=256 MiB",
            ));
        }
        if self.in_flight_requests_max == 0 || self.in_flight_requests_max > 4096 {
            return Err(invalid(
                "in_flight_requests_max",
                self.in_flight_requests_max.to_string(),
                "must be within 1..=4096",
            ));
        }
        if self.in_flight_bytes_max < self.payload_bytes_max as u64 {
            return Err(invalid(
                "in_flight_bytes_max",
                self.in_flight_bytes_max.to_string(),
                "must hold at least one payload (payload_bytes_max)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_needs_insecure_tcp() {
        let mut knobs = ServerKnobs { listen_address: "0.0.0.0:7070".into(), ..Default::default() };
        assert!(knobs.validate().unwrap_err().to_string().contains("insecure_tcp"));
        knobs.insecure_tcp = true;
        knobs.validate().unwrap();
    }

    #[test]
    fn durability_parses_lowercase() {
        let knobs: ServerKnobs = toml::from_str("commit_durability = \"memory\"").unwrap();
        assert_eq!(knobs.commit_durability, CommitDurability::Memory);
        assert!(toml::from_str::<ServerKnobs>("commit_durability = \"disk\"").is_err());
    }
}
