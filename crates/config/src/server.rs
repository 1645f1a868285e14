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
        /// Prometheus `/metrics` over plain HTTP on this TCP address ("" for none). Unauthenticated and read-only (sizes, counters, latencies): bind it to the management network.
        metrics_listen_address: String = String::new(), unit = "host:port";
        /// A name for logs and `status`.
        server_name: String = "spillway".to_string(), unit = "name";
        /// This server's failure domain (the host it shares a fate with), announced to clients and the manager, which place replicas of one piece on servers of distinct domains; "" = the host name (uname). `[A-Za-z0-9][A-Za-z0-9._-]*`, at most 64 bytes.
        failure_domain: String = String::new(), unit = "name";
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
        /// A connection that has not completed Hello (and, with munge, Authenticate) this long after it was accepted is closed.
        handshake_timeout_ms: u64 = 5_000, unit = "milliseconds";
        /// Unauthenticated connections (TCP with `auth = munge`, before their credential) at once, counted apart from `connections_max` so that a flood of silent connects cannot take the places of identified clients; more are refused with `Busy`.
        handshakes_max: u32 = 128, unit = "connections";
        /// A connection with no request in flight and no frame arriving for this long is closed.
        idle_timeout_ms: u64 = 600_000, unit = "milliseconds";
        /// Slowest accepted arrival of a write's payload: measured over windows of `frame_rate_window_ms` (the first is the grace), a slower sender is disconnected and the budget its write held released.
        frame_bytes_per_second_min: u64 = 1024 * 1024, unit = "bytes/second";
        /// Grace and measuring window of `frame_bytes_per_second_min`.
        frame_rate_window_ms: u64 = 2_000, unit = "milliseconds";
        /// Identified connections one uid may hold at once (root exempt); more are refused with `Busy`.
        connections_per_user_max: u32 = 64, unit = "connections";
        /// Write payload bytes in flight (received, not yet in the store) per uid over all its connections (root exempt); a uid at its bound waits, others do not.
        in_flight_bytes_per_user_max: u64 = 128 * 1024 * 1024, unit = "bytes";
        /// How long a namespace change waits for every other mount watching the namespace to drop it from its cache before it is answered; a mount that has not acknowledged by then is marked stale (not waited for again; it drops its whole cache at its next poll).
        namespace_invalidation_wait_ms: u64 = 1_000, unit = "milliseconds";
        /// Namespace change watchers (a caching mount's sessions) one non-root uid may hold per namespace, counting stale ones until they are forgotten (60 s without a poll); more are refused with EUSERS. Root, whose watchers are the mounts, is bounded only by the namespace's 1024 watchers: each silent watcher costs others' next change one wait of `namespace_invalidation_wait_ms`.
        namespace_watchers_per_user_max: u32 = 16, unit = "watchers";
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

    /// `failure_domain` is empty (the host name) or a valid domain name.
    fn check_failure_domain(&self) -> Result<(), ConfigError> {
        if self.failure_domain.is_empty() || spillway_types::is_failure_domain(&self.failure_domain)
        {
            return Ok(());
        }
        Err(ConfigError::invalid(
            Self::SECTION,
            "failure_domain",
            self.failure_domain.clone(),
            "must be [A-Za-z0-9][A-Za-z0-9._-]*, at most 64 bytes",
        ))
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
        crate::check_metrics_address(Self::SECTION, &self.metrics_listen_address)?;
        self.check_failure_domain()?;
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
        for (name, value) in [
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("frame_rate_window_ms", self.frame_rate_window_ms),
            ("handshakes_max", self.handshakes_max as u64),
            ("connections_per_user_max", self.connections_per_user_max as u64),
        ] {
            if value == 0 {
                return Err(invalid(name, "0".into(), "must be at least 1"));
            }
        }
        if self.in_flight_bytes_per_user_max < self.payload_bytes_max as u64 {
            return Err(invalid(
                "in_flight_bytes_per_user_max",
                self.in_flight_bytes_per_user_max.to_string(),
                "must hold at least one payload (payload_bytes_max)",
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
    fn fairness_bounds_are_checked() {
        ServerKnobs::default().validate().unwrap();
        let zero = ServerKnobs { handshake_timeout_ms: 0, ..Default::default() };
        assert!(zero.validate().unwrap_err().to_string().contains("handshake_timeout_ms"));
        let zero = ServerKnobs { connections_per_user_max: 0, ..Default::default() };
        assert!(zero.validate().unwrap_err().to_string().contains("connections_per_user_max"));
        let small = ServerKnobs { in_flight_bytes_per_user_max: 4096, ..Default::default() };
        let refusal = small.validate().unwrap_err().to_string();
        assert!(refusal.contains("in_flight_bytes_per_user_max"), "{refusal}");
    }

    #[test]
    fn failure_domain_is_checked() {
        let knobs = ServerKnobs { failure_domain: "node-1.rack2".into(), ..Default::default() };
        knobs.validate().unwrap();
        for bad in ["-x", "a b", "host/1"] {
            let knobs = ServerKnobs { failure_domain: bad.into(), ..Default::default() };
            let refusal = knobs.validate().unwrap_err().to_string();
            assert!(refusal.contains("failure_domain"), "{refusal}");
        }
    }

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
