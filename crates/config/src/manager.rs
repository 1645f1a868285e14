//! Knobs of the manager (`spillway manager`), the control plane. Owned by the manager.
//!
//! Where its API listens and its database lives, how capacity is cut into fragments and striped,
//! how servers are watched, how streams are assigned (BIOS Algorithm 1), quotas and the bounds
//! of the API server.

use crate::{knobs, Authentication, ConfigError};

/// What a stream id is assigned to (BIOS Algorithm 1's key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKeyKind {
    /// One stream per user, as in BIOS: a user's jobs share it.
    User,
    /// One stream per job (reservation).
    Job,
}

/// How the manager checks that a non-root caller reserving for a Slurm job owns that job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobOwnerCheck {
    /// Ask Slurm (`squeue --jobs=N --format=%U`) who owns the job; refuse when Slurm cannot say.
    Slurm,
    /// Do not check (sites without Slurm); the Slurm setup hook still refuses a `job-N`
    /// reservation that another user holds.
    #[serde(rename = "none")]
    Unchecked,
}

knobs! {
    /// The manager: pools, servers, reservations.
    section "manager";
    pub struct ManagerKnobs {
        /// Unix socket of the HTTP/JSON API; callers are identified by SO_PEERCRED.
        socket_path: String = "/run/spillway/manager.sock".to_string(), unit = "path";
        /// Permission bits of the socket file, octal (world-connectable: authorization is by peer uid).
        socket_mode: String = "0666".to_string(), unit = "octal mode";
        /// Also serve the API on this TCP address ("" for none); loopback only unless `auth = munge`.
        listen_address: String = String::new(), unit = "host:port";
        /// Prometheus `/metrics` over plain HTTP on this TCP address ("" for none). Unauthenticated and read-only (sizes, counters, latencies): bind it to the management network.
        metrics_listen_address: String = String::new(), unit = "host:port";
        /// How API callers over TCP are authenticated: `none` (the loopback socket's owner) or `munge` (an `Authorization: MUNGE` credential on every request). The Unix socket always uses SO_PEERCRED.
        auth: Authentication = Authentication::None, unit = "none|munge";
        /// munged's socket for checking API credentials and for the manager's own connections to servers ("" = libmunge's default).
        munge_socket: String = String::new(), unit = "path";
        /// The SQLite database holding every pool, server, reservation and quota.
        database_path: String = "/var/lib/spillway/manager.db".to_string(), unit = "path";
        /// Group (name or numeric gid) whose members may manage pools, servers and quotas like root ("" for none).
        admin_group: String = String::new(), unit = "group";
        /// Capacity is granted in fragments of this size; each fragment sits on one server.
        fragment_bytes: u64 = 200 << 30, unit = "bytes";
        /// Most servers one reservation stripes over (one fragment per server while possible).
        stripe_servers_max: u32 = 16, unit = "servers";
        /// Capacity one user may hold in active reservations unless a quota row says otherwise (0 = unlimited).
        quota_bytes_default: u64 = 0, unit = "bytes";
        /// Active reservations one user may hold (bounds the tables).
        reservations_per_user_max: u32 = 256, unit = "reservations";
        /// Share of a pool's measured peak (bandwidth, IOPS and metadata rates, each) that one user's active reservations by performance target may hold promised, so that no user takes every promise with a few small reservations; root's own are not bound (1–100).
        targets_user_share_percent_max: u32 = 50, unit = "percent";
        /// How often every server's Status is polled.
        heartbeat_ms: u64 = 2_000, unit = "milliseconds";
        /// Consecutive missed heartbeats after which a server is marked down.
        heartbeat_misses_max: u32 = 3, unit = "heartbeats";
        /// Whether stream ids are assigned per user (BIOS) or per job.
        stream_key: StreamKeyKind = StreamKeyKind::User, unit = "user|job";
        /// Stream ids a device supports (BIOS Algorithm 1's bound).
        streams_max: u16 = 8, unit = "streams";
        /// Stream assignments between two reclaim scans of idle keys.
        stream_reclaim_check_every: u64 = 64, unit = "assignments";
        /// A stream key with no new reservation for this long is reclaimed at the next scan.
        stream_idle_reclaim_s: u64 = 3_600, unit = "seconds";
        /// API connections served at once; more are answered 503 (busy) at once.
        connections_max: u32 = 64, unit = "connections";
        /// Largest API request (headers plus body).
        request_bytes_max: u64 = 64 * 1024, unit = "bytes";
        /// API connections one non-root uid may hold at once; more get 503 (busy), so no user can take them all.
        connections_per_uid_max: u32 = 16, unit = "connections";
        /// How long one API connection may take to send its whole request (slower: 408), and again to take the reply.
        request_timeout_ms: u64 = 10_000, unit = "milliseconds";
        /// How a caller other than root reserving for a Slurm job is checked to own it: "slurm" asks scontrol (needs it on the manager's PATH; without an answer the request is refused), "none" trusts it (sites without Slurm).
        job_owner_check: JobOwnerCheck = JobOwnerCheck::Slurm, unit = "slurm|none";
        /// How long the manager waits for `squeue` to say who owns a job; no answer refuses the request.
        job_owner_timeout_ms: u64 = 5_000, unit = "milliseconds";
        /// How long a rescue reservation (kept because its stage-out failed) stays the owner's alone before root or an admin may reclaim it; never reclaimed automatically.
        rescue_expiry_s: u64 = 1_209_600, unit = "seconds";
        /// A server down (no heartbeat answered) for this long is declared lost for good: its reservations are degraded and re-replicated; 0 = only `spillway server lost` declares it.
        server_lost_after_s: u64 = 86_400, unit = "seconds";
        /// Tiering strategy of jobs that name none (docs/design/ias.md): baseline, high-priority, interference-aware or measured.
        tiering_default: String = "high-priority".to_string(), unit = "strategy";
        /// A job counts as active (IAS's N) for this long after its last phase report.
        tiering_job_active_s: u64 = 600, unit = "seconds";
        /// A phase whose end never arrives (its client died) stops counting after this long.
        tiering_phase_expire_s: u64 = 3_600, unit = "seconds";
        /// Writers the PFS takes at once, jobs' direct PFS phases and drains together: the cross-job drain scheduler's limit.
        pfs_writers_max: u32 = 4, unit = "writers";
        /// A running drain's PFS slot is freed when its holder has not renewed it for this long.
        drain_lease_s: u64 = 60, unit = "seconds";
    }
}

impl ManagerKnobs {
    /// `munge_socket` as a path; `None`: libmunge's default socket.
    pub fn munge_socket_path(&self) -> Option<std::path::PathBuf> {
        crate::munge_socket_path(&self.munge_socket)
    }

    /// `socket_mode` as permission bits (`"0666"`, `"666"` or `"0o666"`).
    pub fn socket_mode_bits(&self) -> Result<u32, ConfigError> {
        let digits = self.socket_mode.trim().trim_start_matches("0o");
        match u32::from_str_radix(digits, 8) {
            Ok(mode) if mode <= 0o777 => Ok(mode),
            _ => Err(ConfigError::invalid(
                Self::SECTION,
                "socket_mode",
                &self.socket_mode,
                "not an octal permission mode (0000 to 0777)",
            )),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |name: &'static str, value: String, reason: &str| {
            ConfigError::invalid(Self::SECTION, name, value, reason)
        };
        crate::check_metrics_address(Self::SECTION, &self.metrics_listen_address)?;
        if self.socket_path.is_empty() && self.listen_address.is_empty() {
            return Err(invalid(
                "socket_path",
                "\"\"".into(),
                "needs a socket_path or a listen_address",
            ));
        }
        if !self.listen_address.is_empty() {
            let refusal = "remote callers are only authenticated with auth = munge";
            crate::check_listen_address(
                Self::SECTION,
                "listen_address",
                &self.listen_address,
                self.auth == Authentication::Munge,
                refusal,
            )?;
        }
        self.socket_mode_bits()?;
        if self.fragment_bytes < 4096 {
            return Err(invalid(
                "fragment_bytes",
                self.fragment_bytes.to_string(),
                "must be at least 4096",
            ));
        }
        const STRATEGIES: [&str; 4] =
            ["baseline", "high-priority", "interference-aware", "measured"];
        if !STRATEGIES.contains(&self.tiering_default.as_str()) {
            return Err(invalid(
                "tiering_default",
                self.tiering_default.clone(),
                "not one of baseline, high-priority, interference-aware, measured",
            ));
        }
        let positive = [
            ("stripe_servers_max", self.stripe_servers_max as u64),
            ("reservations_per_user_max", self.reservations_per_user_max as u64),
            ("targets_user_share_percent_max", self.targets_user_share_percent_max as u64),
            ("heartbeat_ms", self.heartbeat_ms),
            ("heartbeat_misses_max", self.heartbeat_misses_max as u64),
            ("streams_max", self.streams_max as u64),
            ("connections_max", self.connections_max as u64),
            ("connections_per_uid_max", self.connections_per_uid_max as u64),
            ("request_timeout_ms", self.request_timeout_ms),
            ("job_owner_timeout_ms", self.job_owner_timeout_ms),
            ("pfs_writers_max", self.pfs_writers_max as u64),
            ("drain_lease_s", self.drain_lease_s),
            ("tiering_job_active_s", self.tiering_job_active_s),
            ("tiering_phase_expire_s", self.tiering_phase_expire_s),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(invalid(name, "0".into(), "must be at least 1"));
            }
        }
        self.check_bounds()
    }

    /// The knobs with a bound other than "at least 1".
    fn check_bounds(&self) -> Result<(), ConfigError> {
        let out_of_range = [
            (
                self.targets_user_share_percent_max > 100,
                "targets_user_share_percent_max",
                self.targets_user_share_percent_max as u64,
                "a share of the pool's peak: at most 100",
            ),
            (
                self.request_bytes_max < 1024,
                "request_bytes_max",
                self.request_bytes_max,
                "must be at least 1024",
            ),
        ];
        match out_of_range.into_iter().find(|(out, ..)| *out) {
            Some((_, name, value, why)) => {
                Err(ConfigError::invalid(Self::SECTION, name, value.to_string(), why))
            }
            None => Ok(()),
        }
    }
}
