//! Knobs of the burst buffer server (network side). Owned by the server.
//!
//! Every queue and in-flight count of the server has its bound here.

use crate::{knobs, Authentication, ConfigError};

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
        /// TCP address to listen on ("" for none). Non-loopback addresses need `auth = munge` or `insecure_tcp`.
        listen_address: String = "127.0.0.1:7070".to_string(), unit = "host:port";
        /// Unix-domain socket to listen on as well ("" for none); identity comes from SO_PEERCRED.
        unix_socket_path: String = String::new(), unit = "path";
        /// How TCP peers are authenticated: `none` (loopback: the socket's owner; remote: nobody) or `munge` (a credential right after Hello). Unix sockets always use SO_PEERCRED.
        auth: Authentication = Authentication::None, unit = "none|munge";
        /// munged's socket for checking credentials and for this server's own drain connections ("" = libmunge's default, /run/munge/munge.socket.2).
        munge_socket: String = String::new(), unit = "path";
        /// With `auth = none`, allow a non-loopback TCP listener anyway: its peers are unauthenticated and run as nobody (logs a warning).
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
    /// Whether a non-loopback TCP listener may be bound: its peers are authenticated (munge),
    /// or the operator accepted unauthenticated ones (`insecure_tcp`).
    pub fn remote_tcp_allowed(&self) -> bool {
        self.auth == Authentication::Munge || self.insecure_tcp
    }

    /// `munge_socket` as a path; `None`: libmunge's default socket.
    pub fn munge_socket_path(&self) -> Option<std::path::PathBuf> {
        crate::munge_socket_path(&self.munge_socket)
    }

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
            let refusal = "remote peers would not be authenticated: set auth = munge, or insecure_tcp (--insecure-tcp) to accept them unauthenticated";
            crate::check_listen_address(
                Self::SECTION,
                "listen_address",
                &self.listen_address,
                self.remote_tcp_allowed(),
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
        let refusal = knobs.validate().unwrap_err().to_string();
        assert!(refusal.contains("insecure_tcp") && refusal.contains("auth = munge"), "{refusal}");
        knobs.insecure_tcp = true;
        knobs.validate().unwrap();
    }

    #[test]
    fn munge_authentication_allows_any_address() {
        let knobs = ServerKnobs {
            listen_address: "0.0.0.0:7070".into(),
            auth: Authentication::Munge,
            ..Default::default()
        };
        knobs.validate().unwrap();
        let parsed: ServerKnobs = toml::from_str("auth = \"munge\"").unwrap();
        assert_eq!(parsed.auth, Authentication::Munge);
        assert!(toml::from_str::<ServerKnobs>("auth = \"kerberos\"").is_err());
    }

    #[test]
    fn durability_parses_lowercase() {
        let knobs: ServerKnobs = toml::from_str("commit_durability = \"memory\"").unwrap();
        assert_eq!(knobs.commit_durability, CommitDurability::Memory);
        assert!(toml::from_str::<ServerKnobs>("commit_durability = \"disk\"").is_err());
    }
}
