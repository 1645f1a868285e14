//! Typed request and response bodies and their encoding.
//!
//! A body is a fixed sequence of little-endian fields; strings are a u16 length then UTF-8 bytes;
//! lists are a u32 count then the elements. Decoding consumes the whole body: missing bytes,
//! trailing bytes, invalid UTF-8 and out-of-range enum values are all named errors.
//! Bulk data never lives in a body: `Write` data and `ReadData` bytes are the frame payload.

use spillway_types::{EpochId, FileId, GRANT_ALLOWED_IDS_MAX};

use crate::auth::{AuthMethod, CHALLENGE_BYTES};
use crate::errno::ErrorCode;
use crate::frame::{FrameError, Kind};
use crate::identity::{
    Participant, ServerId, CLUSTER_ID_BYTES, COMMIT_PARTICIPANTS_MAX,
    PARTICIPANT_ADDRESS_BYTES_MAX, SERVER_ID_BYTES,
};
use crate::namespace::{NamespaceRequest, NamespaceResponse};
use crate::NAME_BYTES_MAX;

/// How durable a committed epoch must be before `Commit` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Fsync'd in the server's SSD log: survives a server crash and power loss.
    Ssd,
    /// Held in the server's DRAM; the SSD log catches up in the background. Survives a client
    /// crash, not a server crash.
    Memory,
    /// Whatever the server is configured with (`server.commit_durability`). Never in a reply.
    ServerDefault,
    /// A client-side level: the client holds the epoch on k ≥ 2 servers of distinct failure
    /// domains and commits each at `Memory`, so the data survives the loss of a host before
    /// the SSD logs catch up. On the wire it is `Memory` (each server's part is a memory
    /// commit); it is never decoded.
    Replicated,
}

impl Durability {
    fn wire(self) -> u8 {
        match self {
            Durability::Ssd => 0,
            Durability::Memory | Durability::Replicated => 1,
            Durability::ServerDefault => 2,
        }
    }
}

/// One extent of a [`Request::WriteExtents`]: `offset u64, length u32, crc32c u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteExtent {
    pub offset: u64,
    /// Never zero.
    pub length: u32,
    /// CRC32C of the extent's bytes.
    pub crc32c: u32,
}

/// Most extents in one `WriteExtents` (16 bytes each, with the 24-byte head within
/// [`crate::BODY_BYTES_MAX`]).
pub const WRITE_EXTENTS_MAX: usize = 2048;
/// Bytes of one extent in a `WriteExtents` body.
pub const WRITE_EXTENT_BYTES: usize = 16;
const _: () =
    assert!(24 + WRITE_EXTENTS_MAX * WRITE_EXTENT_BYTES <= crate::BODY_BYTES_MAX as usize);

/// Lifecycle state of an epoch as the server reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpochState {
    Open,
    /// Committed at `memory` durability; SSD log not yet synced.
    CommittedMemory,
    Committed,
    Drained,
}

impl EpochState {
    fn wire(self) -> u8 {
        match self {
            EpochState::Open => 0,
            EpochState::CommittedMemory => 1,
            EpochState::Committed => 2,
            EpochState::Drained => 3,
        }
    }
    fn from_wire(kind: Kind, value: u8) -> Result<Self, FrameError> {
        Ok(match value {
            0 => EpochState::Open,
            1 => EpochState::CommittedMemory,
            2 => EpochState::Committed,
            3 => EpochState::Drained,
            other => {
                return Err(FrameError::BadValue {
                    kind,
                    field: "epoch state",
                    value: other as u64,
                })
            }
        })
    }
}

/// One epoch in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochInfo {
    pub epoch: EpochId,
    pub state: EpochState,
    pub files: u64,
    pub bytes: u64,
}

/// What a server saw of one granted epoch since it was granted there: what the manager records
/// as a reservation's achieved rates at teardown (`EpochRevoked`). Kept in memory: a server
/// restart starts the counts again (the manager's next heartbeat grants the epoch anew).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochActivity {
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub write_ops: u64,
    pub read_ops: u64,
    /// File opens and creates, stats, listings, extent queries, and operations on the
    /// namespaces whose data epoch it is.
    pub metadata_ops: u64,
    /// Time during which the epoch had requests: 100 ms ticks with at least one, in ms.
    pub busy_ms: u64,
}

/// One file in a listing, or the answer to `Stat`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub file: FileId,
    pub name: String,
    /// One past the highest byte written on this server.
    pub size_bytes: u64,
    /// Bytes this server holds for the file (less than size when others hold the rest).
    pub stored_bytes: u64,
}

/// A byte range of a file that this server holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
}

/// Server counters for `Status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerStatus {
    pub server_name: String,
    pub connections: u32,
    pub connections_max: u32,
    pub in_flight_bytes: u64,
    pub in_flight_bytes_max: u64,
    pub requests_served: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub dram_bytes_used: u64,
    pub dram_bytes_max: u64,
    pub ssd_bytes_used: u64,
    pub ssd_bytes_max: u64,
    pub epochs: u64,
    /// How the server authenticates TCP peers (`server.auth`).
    pub auth: AuthMethod,
    /// The server's id and incarnation, as in `HelloReply`.
    pub server_id: ServerId,
    pub incarnation: u64,
    /// The server's failure domain (`server.failure_domain`), as in `HelloReply`.
    pub failure_domain: String,
}

/// Where one epoch's drain to the PFS stands on one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainState {
    /// Requested, not started.
    Queued,
    /// Waiting for the epoch to be committed on every server holding it, or for peers to
    /// finish their parts of shared files.
    Waiting,
    Running,
    /// The last attempt failed (see `last_error`); retrying after a bounded backoff. The data
    /// stays in the burst buffer.
    Retrying,
    /// Every file of the epoch is under its final PFS name and fsync'd; the epoch is marked
    /// drained in the store.
    Drained,
    /// Given up after `drain.quarantine_after_failures` failed attempts or a panicking
    /// attempt (see `last_error`): not retried, not resumed at restart, the data kept in the
    /// burst buffer; a new drain request for the epoch releases it.
    Quarantined,
}

impl DrainState {
    pub fn wire(self) -> u8 {
        match self {
            DrainState::Queued => 0,
            DrainState::Waiting => 1,
            DrainState::Running => 2,
            DrainState::Retrying => 3,
            DrainState::Drained => 4,
            DrainState::Quarantined => 5,
        }
    }
    fn from_wire(kind: Kind, value: u8) -> Result<Self, FrameError> {
        Ok(match value {
            0 => DrainState::Queued,
            1 => DrainState::Waiting,
            2 => DrainState::Running,
            3 => DrainState::Retrying,
            4 => DrainState::Drained,
            5 => DrainState::Quarantined,
            other => {
                return Err(FrameError::BadValue {
                    kind,
                    field: "drain state",
                    value: other as u64,
                })
            }
        })
    }
}

impl std::fmt::Display for DrainState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DrainState::Queued => "queued",
            DrainState::Waiting => "waiting",
            DrainState::Running => "running",
            DrainState::Retrying => "retrying",
            DrainState::Drained => "drained",
            DrainState::Quarantined => "quarantined",
        })
    }
}

/// One epoch's drain on one server, for `DrainStatus`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainInfo {
    pub epoch: EpochId,
    pub state: DrainState,
    /// 0 naive, 1 shuffled.
    pub mode: u8,
    pub files_total: u64,
    pub files_done: u64,
    /// Bytes this server wrote to the PFS for the epoch (all attempts).
    pub pfs_bytes_written: u64,
    /// PFS write calls this server made for the epoch (all attempts).
    pub pfs_write_calls: u64,
    /// Time spent gathering bytes from peers (shuffle) and writing + fsyncing (flush).
    pub shuffle_us: u64,
    pub flush_us: u64,
    /// Attempts that failed so far.
    pub failed_attempts: u32,
    /// The last failure, "" if none.
    pub last_error: String,
}

/// Who may use an epoch on a server, how many bytes it may hold there and its SSD stream: the
/// body of `GrantEpoch` (the manager's grant of a reservation's epoch to one of its servers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpochGrant {
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// Other uids allowed to use the epoch (at most [`GRANT_ALLOWED_IDS_MAX`]).
    pub allowed_uids: Vec<u32>,
    /// Groups whose members may use the epoch (at most [`GRANT_ALLOWED_IDS_MAX`]).
    pub allowed_gids: Vec<u32>,
    /// Payload bytes the epoch may take on this server; 0 = no limit.
    pub capacity_bytes: u64,
    /// The reservation's capacity over all its servers (what `statfs` of its namespace
    /// reports); 0 = not known.
    pub reservation_capacity_bytes: u64,
    /// The SSD stream id (BIOS Algorithm 1) the epoch's writes go to, below 2^63; `None`: each
    /// writer's own.
    pub stream: Option<u64>,
}

/// `stream` on the wire when a grant assigns none.
pub const GRANT_NO_STREAM: u64 = u64::MAX;

/// A request, client → server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First frame of every connection: the versions the client speaks.
    Hello {
        version_min: u16,
        version_max: u16,
        client_name: String,
    },
    /// Opens (and with `create`, creates) the named file in an epoch.
    OpenFile {
        epoch: EpochId,
        name: String,
        create: bool,
    },
    /// Writes the frame payload at `offset`. `payload_crc32c` is the CRC32C the client took of
    /// the payload when the application handed it over; the server refuses a payload that does
    /// not match it, and the store keeps it as the record checksum.
    Write {
        epoch: EpochId,
        file: FileId,
        offset: u64,
        payload_crc32c: u32,
    },
    /// Writes the frame payload as consecutive extents of one file: the first `extents[0].length`
    /// bytes at `extents[0].offset`, and so on, in order (a later extent overwrites an earlier
    /// one it overlaps). What a client's gathered strided writes become (protocol version 5).
    /// The lengths add up to the payload's; each extent carries the CRC32C of its own bytes,
    /// so the server checks each without combining checksums. All or nothing: a checksum or
    /// length that does not match refuses the whole frame.
    WriteExtents {
        epoch: EpochId,
        file: FileId,
        extents: Vec<WriteExtent>,
    },
    /// Makes `[offset, offset + length)` read as zeros, stored as one small record whatever
    /// the length (fallocate's punch hole and zero range; protocol version 6). Answered with
    /// `Written { bytes: 0 }`; ordered with the connection's writes like a write.
    WriteZeros {
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u64,
    },
    /// Reads `length` bytes at `offset`; holes read as zeros.
    Read {
        epoch: EpochId,
        file: FileId,
        offset: u64,
        length: u32,
    },
    /// Seals the epoch. `participants`: every server the committer wrote the epoch to (itself
    /// included if it holds bytes of it); the server records the union of what its committers
    /// name durably before answering, and its drain publishes nothing of the epoch unless each
    /// of them answers with its recorded id and holds the epoch committed.
    Commit {
        epoch: EpochId,
        durability: Durability,
        participants: Vec<Participant>,
    },
    /// Epochs from `from_epoch` upward. A reply holds what fits in one body; ask again from one
    /// past the last epoch until the list comes back empty.
    ListEpochs {
        from_epoch: EpochId,
    },
    /// Files of an epoch with ids from `from_file` upward; paged like `ListEpochs`.
    ListFiles {
        epoch: EpochId,
        from_file: FileId,
    },
    Stat {
        epoch: EpochId,
        file: FileId,
    },
    /// The byte ranges of the file this server holds (for reassembly across servers), starting
    /// with the first range that ends after `from_offset`. A reply holds at most what fits in one
    /// body; the client asks again from the end of the last range until the list comes back empty.
    Extents {
        epoch: EpochId,
        file: FileId,
        from_offset: u64,
    },
    DeleteEpoch {
        epoch: EpochId,
    },
    Status,
    /// Queue a drain of a committed epoch to the PFS (`mode`: 0 naive, 1 shuffled).
    Drain {
        epoch: EpochId,
        mode: u8,
    },
    /// Drain state of every epoch this server knows of.
    DrainStatus,
    /// Make every byte this server acknowledged for the epoch durable in its SSD log without
    /// sealing the epoch (what `fsync` on the mount needs; a commit seals). `participants`
    /// as in `Commit`: recorded before the sync, so an epoch written only through syncs (the
    /// mount's) is protected from publishing with a participant missing too.
    Sync {
        epoch: EpochId,
        participants: Vec<Participant>,
    },
    /// From the manager (root only): the epoch's writes go to SSD stream `stream` (BIOS
    /// Algorithm 1's choice for the reservation's user or job) instead of the writer's uid.
    AssignStream {
        epoch: EpochId,
        stream: u64,
    },
    /// From the manager (root only): the epoch is granted, on this server, as `grant` says.
    /// Replaces any earlier grant or claim; idempotent.
    GrantEpoch {
        epoch: EpochId,
        grant: EpochGrant,
    },
    /// From the manager (root only): the epoch's grant is revoked; only root may use it now.
    RevokeEpoch {
        epoch: EpochId,
    },
    /// From the manager (root only): this server serves the cluster `cluster_id` (the id in
    /// the manager's database). A server that serves no cluster yet records it durably; one
    /// that serves another keeps its own. The reply names the cluster it serves either way.
    JoinCluster {
        cluster_id: [u8; CLUSTER_ID_BYTES],
    },
    /// Right after `Hello` when the reply asked for munge: a credential whose payload is
    /// [`crate::auth::credential_payload`] of the connection's challenge.
    Authenticate {
        credential: String,
    },
    /// A namespace (metadata service) operation; see [`crate::namespace`].
    Namespace(NamespaceRequest),
}

/// A response, server → client. `ReadData` carries the bytes as the frame payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The negotiated version, the limits the client must respect, the identity the server
    /// established for this connection (with `auth` None), or the authentication it requires
    /// next and the connection's challenge (with `auth` Munge; uid/gid are then `nobody`).
    Hello {
        version: u16,
        payload_bytes_max: u32,
        in_flight_requests_max: u32,
        uid: u32,
        gid: u32,
        server_name: String,
        auth: AuthMethod,
        challenge: [u8; CHALLENGE_BYTES],
        /// The server's id (from its identity file; survives restarts).
        server_id: ServerId,
        /// How many times the server with this id has started (1 at the first start; 0: a
        /// server without an identity file, e.g. one embedded in a test, whose id is new at
        /// every start).
        incarnation: u64,
        /// The server's failure domain (`server.failure_domain`; by default its host name):
        /// replicas of one piece go to servers of distinct domains.
        failure_domain: String,
    },
    /// The credential was accepted: requests run as this uid/gid.
    Authenticated {
        uid: u32,
        gid: u32,
    },
    FileOpened {
        file: FileId,
        created: bool,
    },
    Written {
        bytes: u32,
    },
    /// The read's bytes are the frame payload; `payload_crc32c` is their CRC32C, which the
    /// server takes as it checks the records against their write-time checksums, and the
    /// client checks the bytes it received against.
    ReadData {
        payload_crc32c: u32,
    },
    Committed {
        epoch: EpochId,
        durability: Durability,
    },
    Epochs(Vec<EpochInfo>),
    Files(Vec<FileInfo>),
    FileStat(FileInfo),
    Extents(Vec<Extent>),
    Deleted {
        epoch: EpochId,
    },
    Status(ServerStatus),
    DrainQueued {
        epoch: EpochId,
    },
    DrainStatus(Vec<DrainInfo>),
    Synced {
        epoch: EpochId,
    },
    StreamAssigned {
        epoch: EpochId,
        stream: u64,
    },
    EpochGranted {
        epoch: EpochId,
    },
    /// `revoked`: the epoch had a grant, now gone; `activity`: what this server saw of it
    /// since the grant (all zero when it had none).
    EpochRevoked {
        epoch: EpochId,
        revoked: bool,
        activity: EpochActivity,
    },
    /// The cluster this server serves (after `JoinCluster`: the one asked, unless it already
    /// served another).
    ClusterJoined {
        cluster_id: [u8; CLUSTER_ID_BYTES],
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    /// The answer to a namespace request (its failures included).
    Namespace(NamespaceResponse),
}

pub(crate) struct Encoder(pub(crate) Vec<u8>);

impl Encoder {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn string(&mut self, s: &str) -> &mut Self {
        // Names are bounded by NAME_BYTES_MAX when created; anything longer is cut at a char
        // boundary rather than corrupting the frame (only error messages can be that long).
        let mut end = s.len().min(NAME_BYTES_MAX);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.0.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    /// Raw bytes: `length u16` then the bytes (names and symlink targets are not UTF-8).
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        assert!(b.len() <= u16::MAX as usize, "byte string of {} bytes", b.len());
        self.u16(b.len() as u16);
        self.0.extend_from_slice(b);
        self
    }
    /// Fixed-size raw bytes, no length (the challenge).
    pub(crate) fn fixed(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// `count u32`, then per participant `id [u8; 16], address str` (`Commit`, `Sync`).
    pub(crate) fn participants(&mut self, participants: &[Participant]) -> &mut Self {
        assert!(participants.len() <= COMMIT_PARTICIPANTS_MAX, "too many participants");
        self.u32(participants.len() as u32);
        for participant in participants {
            assert!(participant.address.len() <= PARTICIPANT_ADDRESS_BYTES_MAX);
            self.fixed(&participant.id.0).string(&participant.address);
        }
        self
    }
    pub(crate) fn file_info(&mut self, f: &FileInfo) -> &mut Self {
        self.u64(f.file.0).string(&f.name).u64(f.size_bytes).u64(f.stored_bytes)
    }
    /// `owner_uid u32, owner_gid u32, capacity_bytes u64, reservation_capacity_bytes u64,
    /// stream u64, uid count u32, uids, gid count u32, gids`.
    pub(crate) fn grant(&mut self, g: &EpochGrant) -> &mut Self {
        assert!(g.allowed_uids.len() <= GRANT_ALLOWED_IDS_MAX, "grant of too many uids");
        assert!(g.allowed_gids.len() <= GRANT_ALLOWED_IDS_MAX, "grant of too many gids");
        self.u32(g.owner_uid)
            .u32(g.owner_gid)
            .u64(g.capacity_bytes)
            .u64(g.reservation_capacity_bytes)
            .u64(g.stream.unwrap_or(GRANT_NO_STREAM));
        for ids in [&g.allowed_uids, &g.allowed_gids] {
            self.u32(ids.len() as u32);
            for &id in ids {
                self.u32(id);
            }
        }
        self
    }
}

pub(crate) struct Decoder<'a> {
    pub(crate) kind: Kind,
    bytes: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FrameError> {
        if self.bytes.len() < n {
            return Err(FrameError::Truncated {
                kind: self.kind,
                field,
                needed: n,
                available: self.bytes.len(),
            });
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(1, field)?[0])
    }
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.take(2, field)?.try_into().expect("2")))
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.take(4, field)?.try_into().expect("4")))
    }
    /// A u32 followed by a reserved u32 that must be 0.
    pub(crate) fn u32_then_reserved(&mut self, field: &'static str) -> Result<u32, FrameError> {
        let value = self.u32(field)?;
        match self.u32("reserved")? {
            0 => Ok(value),
            reserved => Err(FrameError::BadValue {
                kind: self.kind,
                field: "reserved",
                value: reserved as u64,
            }),
        }
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.take(8, field)?.try_into().expect("8")))
    }
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, FrameError> {
        let len = self.u16(field)? as usize;
        if len > NAME_BYTES_MAX {
            return Err(FrameError::BadValue { kind: self.kind, field, value: len as u64 });
        }
        let raw = self.take(len, field)?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| FrameError::BadString { kind: self.kind, field })
    }
    /// Raw bytes written by `Encoder::bytes`.
    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<Vec<u8>, FrameError> {
        let len = self.u16(field)? as usize;
        Ok(self.take(len, field)?.to_vec())
    }
    /// `N` raw bytes written by `Encoder::fixed`.
    pub(crate) fn fixed<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], FrameError> {
        Ok(self.take(N, field)?.try_into().expect("take returned N bytes"))
    }
    /// A failure domain: a string that [`spillway_types::is_failure_domain`] accepts.
    pub(crate) fn failure_domain(&mut self) -> Result<String, FrameError> {
        let field = "failure_domain";
        let len = self.u16(field)? as usize;
        if len > spillway_types::FAILURE_DOMAIN_BYTES_MAX {
            return Err(FrameError::BadValue { kind: self.kind, field, value: len as u64 });
        }
        let raw = self.take(len, field)?;
        let name = String::from_utf8_lossy(raw).into_owned();
        if !spillway_types::is_failure_domain(&name) {
            return Err(FrameError::BadName { kind: self.kind, field, value: name });
        }
        Ok(name)
    }
    pub(crate) fn auth_method(&mut self) -> Result<AuthMethod, FrameError> {
        let value = self.u8("auth")?;
        AuthMethod::from_wire(value).ok_or(FrameError::BadValue {
            kind: self.kind,
            field: "auth",
            value: value as u64,
        })
    }
    /// Bytes not yet decoded.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }
    pub(crate) fn boolean(&mut self, field: &'static str) -> Result<bool, FrameError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(FrameError::BadValue { kind: self.kind, field, value: other as u64 }),
        }
    }
    pub(crate) fn durability(&mut self) -> Result<Durability, FrameError> {
        match self.u8("durability")? {
            0 => Ok(Durability::Ssd),
            1 => Ok(Durability::Memory),
            2 => Ok(Durability::ServerDefault),
            other => Err(FrameError::BadValue {
                kind: self.kind,
                field: "durability",
                value: other as u64,
            }),
        }
    }
    /// A list count, bounded by what the remaining bytes could possibly hold.
    pub(crate) fn count(
        &mut self,
        element_bytes_min: usize,
        field: &'static str,
    ) -> Result<usize, FrameError> {
        let count = self.u32(field)? as usize;
        if count.saturating_mul(element_bytes_min) > self.bytes.len() {
            return Err(FrameError::Truncated {
                kind: self.kind,
                field,
                needed: count.saturating_mul(element_bytes_min),
                available: self.bytes.len(),
            });
        }
        Ok(count)
    }
    pub(crate) fn file_info(&mut self) -> Result<FileInfo, FrameError> {
        Ok(FileInfo {
            file: FileId(self.u64("file")?),
            name: self.string("name")?,
            size_bytes: self.u64("size_bytes")?,
            stored_bytes: self.u64("stored_bytes")?,
        })
    }
    /// A list of ids written by `Encoder::grant`, bounded by [`GRANT_ALLOWED_IDS_MAX`].
    fn grant_ids(&mut self, field: &'static str) -> Result<Vec<u32>, FrameError> {
        let count = self.count(4, field)?;
        if count > GRANT_ALLOWED_IDS_MAX {
            return Err(FrameError::BadValue { kind: self.kind, field, value: count as u64 });
        }
        (0..count).map(|_| self.u32(field)).collect()
    }
    pub(crate) fn grant(&mut self) -> Result<EpochGrant, FrameError> {
        let owner_uid = self.u32("owner_uid")?;
        let owner_gid = self.u32("owner_gid")?;
        let capacity_bytes = self.u64("capacity_bytes")?;
        let reservation_capacity_bytes = self.u64("reservation_capacity_bytes")?;
        let stream = self.u64("stream")?;
        if stream != GRANT_NO_STREAM && stream >= 1 << 63 {
            return Err(FrameError::BadValue { kind: self.kind, field: "stream", value: stream });
        }
        Ok(EpochGrant {
            owner_uid,
            owner_gid,
            capacity_bytes,
            reservation_capacity_bytes,
            stream: (stream != GRANT_NO_STREAM).then_some(stream),
            allowed_uids: self.grant_ids("allowed_uids")?,
            allowed_gids: self.grant_ids("allowed_gids")?,
        })
    }
    /// The participants of a `Commit`: `count u32`, then per participant `id [u8; 16],
    /// address str`; at most [`COMMIT_PARTICIPANTS_MAX`], addresses at most
    /// [`PARTICIPANT_ADDRESS_BYTES_MAX`] bytes, no id all zeros.
    /// `epoch u64, file u64, count u32, reserved u32`, then `count` extents of `offset u64,
    /// length u32, crc32c u32`: 1 to [`WRITE_EXTENTS_MAX`] extents, none empty, none past
    /// `u64::MAX`.
    pub(crate) fn write_extents(&mut self) -> Result<Request, FrameError> {
        let epoch = EpochId(self.u64("epoch")?);
        let file = FileId(self.u64("file")?);
        let count = self.u32_then_reserved("extent count")? as usize;
        let kind = self.kind;
        let bad = |field, value| FrameError::BadValue { kind, field, value };
        if count == 0 || count > WRITE_EXTENTS_MAX {
            return Err(bad("extent count", count as u64));
        }
        if count * WRITE_EXTENT_BYTES > self.bytes.len() {
            return Err(FrameError::Truncated {
                kind,
                field: "extents",
                needed: count * WRITE_EXTENT_BYTES,
                available: self.bytes.len(),
            });
        }
        let mut extents = Vec::with_capacity(count);
        for _ in 0..count {
            let offset = self.u64("extent offset")?;
            let length = self.u32("extent length")?;
            let crc32c = self.u32("extent crc32c")?;
            if length == 0 {
                return Err(bad("extent length", 0));
            }
            if offset.checked_add(length as u64).is_none() {
                return Err(bad("extent offset", offset));
            }
            extents.push(WriteExtent { offset, length, crc32c });
        }
        Ok(Request::WriteExtents { epoch, file, extents })
    }

    fn write_zeros(&mut self) -> Result<Request, FrameError> {
        Ok(Request::WriteZeros {
            epoch: EpochId(self.u64("epoch")?),
            file: FileId(self.u64("file")?),
            offset: self.u64("offset")?,
            length: self.u64("length")?,
        })
    }
    pub(crate) fn participants(&mut self) -> Result<Vec<Participant>, FrameError> {
        let count = self.count(SERVER_ID_BYTES + 2, "participant count")?;
        if count > COMMIT_PARTICIPANTS_MAX {
            let kind = self.kind;
            return Err(FrameError::BadValue {
                kind,
                field: "participant count",
                value: count as u64,
            });
        }
        let mut participants = Vec::with_capacity(count);
        for _ in 0..count {
            let id = ServerId(self.fixed("participant id")?);
            if id.is_none() {
                return Err(FrameError::BadValue {
                    kind: self.kind,
                    field: "participant id",
                    value: 0,
                });
            }
            let address = self.string("participant address")?;
            // Addresses end up in logs and messages: no control characters (forged lines).
            if address.len() > PARTICIPANT_ADDRESS_BYTES_MAX
                || address.chars().any(char::is_control)
            {
                let (kind, value) = (self.kind, address.len() as u64);
                return Err(FrameError::BadValue { kind, field: "participant address", value });
            }
            participants.push(Participant { id, address });
        }
        Ok(participants)
    }
    pub(crate) fn finish(self) -> Result<(), FrameError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(FrameError::TrailingBytes { kind: self.kind, extra: self.bytes.len() })
        }
    }
}

impl Request {
    /// The frame kind of this request.
    pub fn kind(&self) -> Kind {
        match self {
            Request::Hello { .. } => Kind::Hello,
            Request::OpenFile { .. } => Kind::OpenFile,
            Request::Write { .. } => Kind::Write,
            Request::WriteExtents { .. } => Kind::WriteExtents,
            Request::WriteZeros { .. } => Kind::WriteZeros,
            Request::Read { .. } => Kind::Read,
            Request::Commit { .. } => Kind::Commit,
            Request::ListEpochs { .. } => Kind::ListEpochs,
            Request::ListFiles { .. } => Kind::ListFiles,
            Request::Stat { .. } => Kind::Stat,
            Request::Extents { .. } => Kind::Extents,
            Request::DeleteEpoch { .. } => Kind::DeleteEpoch,
            Request::Sync { .. } => Kind::Sync,
            Request::AssignStream { .. } => Kind::AssignStream,
            Request::GrantEpoch { .. } => Kind::GrantEpoch,
            Request::RevokeEpoch { .. } => Kind::RevokeEpoch,
            Request::JoinCluster { .. } => Kind::JoinCluster,
            Request::Authenticate { .. } => Kind::Authenticate,
            Request::Status => Kind::Status,
            Request::Drain { .. } => Kind::Drain,
            Request::DrainStatus => Kind::DrainStatus,
            Request::Namespace(r) => r.kind(),
        }
    }

    /// Encodes the body (the payload of a `Write` is sent separately).
    pub fn encode_body(&self) -> Vec<u8> {
        let mut e = Encoder(Vec::with_capacity(32));
        match self {
            Request::Hello { version_min, version_max, client_name } => {
                e.u16(*version_min).u16(*version_max).string(client_name);
            }
            Request::Authenticate { credential } => {
                e.string(credential);
            }
            Request::OpenFile { epoch, name, create } => {
                e.u64(epoch.0).string(name).u8(*create as u8);
            }
            Request::Write { epoch, file, offset, payload_crc32c } => {
                // The u32 after the checksum is reserved (0).
                e.u64(epoch.0).u64(file.0).u64(*offset).u32(*payload_crc32c).u32(0);
            }
            Request::WriteExtents { epoch, file, extents } => {
                assert!(
                    !extents.is_empty() && extents.len() <= WRITE_EXTENTS_MAX,
                    "a WriteExtents carries 1 to {WRITE_EXTENTS_MAX} extents"
                );
                // The u32 after the count is reserved (0).
                e.u64(epoch.0).u64(file.0).u32(extents.len() as u32).u32(0);
                for extent in extents {
                    e.u64(extent.offset).u32(extent.length).u32(extent.crc32c);
                }
            }
            Request::Read { epoch, file, offset, length } => {
                e.u64(epoch.0).u64(file.0).u64(*offset).u32(*length);
            }
            Request::WriteZeros { epoch, file, offset, length } => {
                e.u64(epoch.0).u64(file.0).u64(*offset).u64(*length);
            }
            Request::Commit { epoch, durability, participants } => {
                assert!(participants.len() <= COMMIT_PARTICIPANTS_MAX, "too many participants");
                e.u64(epoch.0).u8(durability.wire()).participants(participants);
            }
            Request::Status | Request::DrainStatus => {}
            Request::Drain { epoch, mode } => {
                e.u64(epoch.0).u8(*mode);
            }
            Request::ListEpochs { from_epoch } => {
                e.u64(from_epoch.0);
            }
            Request::ListFiles { epoch, from_file } => {
                e.u64(epoch.0).u64(from_file.0);
            }
            Request::DeleteEpoch { epoch } | Request::RevokeEpoch { epoch } => {
                e.u64(epoch.0);
            }
            Request::Sync { epoch, participants } => {
                e.u64(epoch.0).participants(participants);
            }
            Request::GrantEpoch { epoch, grant } => {
                e.u64(epoch.0).grant(grant);
            }
            Request::JoinCluster { cluster_id } => {
                e.fixed(cluster_id);
            }
            Request::AssignStream { epoch, stream } => {
                e.u64(epoch.0).u64(*stream);
            }
            Request::Stat { epoch, file } => {
                e.u64(epoch.0).u64(file.0);
            }
            Request::Extents { epoch, file, from_offset } => {
                e.u64(epoch.0).u64(file.0).u64(*from_offset);
            }
            Request::Namespace(r) => r.encode(&mut e),
        }
        e.0
    }

    /// Decodes a request body of the given kind.
    pub fn decode(kind: Kind, body: &[u8]) -> Result<Request, FrameError> {
        if !kind.is_request() {
            return Err(FrameError::WrongDirection { kind, direction: "response" });
        }
        let mut d = Decoder { kind, bytes: body };
        let request = match kind {
            Kind::Hello => Request::Hello {
                version_min: d.u16("version_min")?,
                version_max: d.u16("version_max")?,
                client_name: d.string("client_name")?,
            },
            Kind::OpenFile => Request::OpenFile {
                epoch: EpochId(d.u64("epoch")?),
                name: d.string("name")?,
                create: d.boolean("create")?,
            },
            Kind::Write => Request::Write {
                epoch: EpochId(d.u64("epoch")?),
                file: FileId(d.u64("file")?),
                offset: d.u64("offset")?,
                payload_crc32c: d.u32_then_reserved("payload_crc32c")?,
            },
            Kind::WriteExtents => d.write_extents()?,
            Kind::WriteZeros => d.write_zeros()?,
            Kind::Read => Request::Read {
                epoch: EpochId(d.u64("epoch")?),
                file: FileId(d.u64("file")?),
                offset: d.u64("offset")?,
                length: d.u32("length")?,
            },
            Kind::Commit => Request::Commit {
                epoch: EpochId(d.u64("epoch")?),
                durability: d.durability()?,
                participants: d.participants()?,
            },
            Kind::ListEpochs => Request::ListEpochs { from_epoch: EpochId(d.u64("from_epoch")?) },
            Kind::ListFiles => Request::ListFiles {
                epoch: EpochId(d.u64("epoch")?),
                from_file: FileId(d.u64("from_file")?),
            },
            Kind::Stat => {
                Request::Stat { epoch: EpochId(d.u64("epoch")?), file: FileId(d.u64("file")?) }
            }
            Kind::Extents => Request::Extents {
                epoch: EpochId(d.u64("epoch")?),
                file: FileId(d.u64("file")?),
                from_offset: d.u64("from_offset")?,
            },
            Kind::DeleteEpoch => Request::DeleteEpoch { epoch: EpochId(d.u64("epoch")?) },
            Kind::Sync => {
                Request::Sync { epoch: EpochId(d.u64("epoch")?), participants: d.participants()? }
            }
            Kind::AssignStream => {
                Request::AssignStream { epoch: EpochId(d.u64("epoch")?), stream: d.u64("stream")? }
            }
            Kind::GrantEpoch => {
                Request::GrantEpoch { epoch: EpochId(d.u64("epoch")?), grant: d.grant()? }
            }
            Kind::RevokeEpoch => Request::RevokeEpoch { epoch: EpochId(d.u64("epoch")?) },
            Kind::JoinCluster => Request::JoinCluster { cluster_id: d.fixed("cluster_id")? },
            Kind::Authenticate => Request::Authenticate { credential: d.string("credential")? },
            Kind::Status => Request::Status,
            Kind::Drain => Request::Drain { epoch: EpochId(d.u64("epoch")?), mode: d.u8("mode")? },
            Kind::DrainStatus => Request::DrainStatus,
            k if k.is_namespace() => Request::Namespace(NamespaceRequest::decode(k, &mut d)?),
            _ => unreachable!("is_request checked above"),
        };
        d.finish()?;
        Ok(request)
    }
}

impl Response {
    /// The frame kind of this response.
    pub fn kind(&self) -> Kind {
        match self {
            Response::Hello { .. } => Kind::HelloReply,
            Response::Authenticated { .. } => Kind::Authenticated,
            Response::FileOpened { .. } => Kind::FileOpened,
            Response::Written { .. } => Kind::Written,
            Response::ReadData { .. } => Kind::ReadData,
            Response::Committed { .. } => Kind::Committed,
            Response::Epochs(_) => Kind::Epochs,
            Response::Files(_) => Kind::Files,
            Response::FileStat(_) => Kind::FileStat,
            Response::Extents(_) => Kind::ExtentList,
            Response::Deleted { .. } => Kind::Deleted,
            Response::Synced { .. } => Kind::Synced,
            Response::StreamAssigned { .. } => Kind::StreamAssigned,
            Response::EpochGranted { .. } => Kind::EpochGranted,
            Response::EpochRevoked { .. } => Kind::EpochRevoked,
            Response::ClusterJoined { .. } => Kind::ClusterJoined,
            Response::Status(_) => Kind::StatusReply,
            Response::DrainQueued { .. } => Kind::DrainQueued,
            Response::DrainStatus(_) => Kind::DrainReport,
            Response::Error { .. } => Kind::Error,
            Response::Namespace(r) => r.kind(),
        }
    }

    /// Encodes the body. Lists longer than fit in [`crate::BODY_BYTES_MAX`] must be split by
    /// the caller (the server caps listings); this asserts they were.
    pub fn encode_body(&self) -> Vec<u8> {
        let mut e = Encoder(Vec::with_capacity(32));
        match self {
            Response::Hello { .. }
            | Response::Authenticated { .. }
            | Response::FileOpened { .. }
            | Response::Written { .. }
            | Response::ReadData { .. }
            | Response::Committed { .. }
            | Response::Synced { .. } => self.encode_data_path(&mut e),
            Response::Epochs(_)
            | Response::Files(_)
            | Response::FileStat(_)
            | Response::Extents(_) => self.encode_listing(&mut e),
            Response::Deleted { .. }
            | Response::StreamAssigned { .. }
            | Response::EpochGranted { .. }
            | Response::EpochRevoked { .. }
            | Response::ClusterJoined { .. }
            | Response::Status(_)
            | Response::DrainQueued { .. }
            | Response::DrainStatus(_) => self.encode_drain_and_administration(&mut e),
            Response::Error { code, message } => {
                e.u16(code.wire()).string(message);
            }
            Response::Namespace(r) => r.encode(&mut e),
        }
        assert!(
            e.0.len() <= crate::BODY_BYTES_MAX as usize,
            "{:?} body of {} bytes",
            self.kind(),
            e.0.len()
        );
        e.0
    }

    /// Encodes the body of a data-path response: handshake, open, write, read, commit, sync.
    fn encode_data_path(&self, encoder: &mut Encoder) {
        match self {
            Response::Hello {
                version,
                payload_bytes_max,
                in_flight_requests_max,
                uid,
                gid,
                server_name,
                auth,
                challenge,
                server_id,
                incarnation,
                failure_domain,
            } => {
                encoder
                    .u16(*version)
                    .u32(*payload_bytes_max)
                    .u32(*in_flight_requests_max)
                    .u32(*uid)
                    .u32(*gid)
                    .string(server_name)
                    .u8(auth.wire())
                    .fixed(challenge)
                    .fixed(&server_id.0)
                    .u64(*incarnation)
                    .string(failure_domain);
            }
            Response::Authenticated { uid, gid } => {
                encoder.u32(*uid).u32(*gid);
            }
            Response::FileOpened { file, created } => {
                encoder.u64(file.0).u8(*created as u8);
            }
            Response::Written { bytes } => {
                encoder.u32(*bytes);
            }
            Response::ReadData { payload_crc32c } => {
                // The u32 after the checksum is reserved (0).
                encoder.u32(*payload_crc32c).u32(0);
            }
            Response::Committed { epoch, durability } => {
                encoder.u64(epoch.0).u8(durability.wire());
            }
            Response::Synced { epoch } => {
                encoder.u64(epoch.0);
            }
            other => unreachable!("{:?} is not a data-path response", other.kind()),
        }
    }

    /// Encodes the body of a listing response: epochs, files, one file's stat, extents.
    fn encode_listing(&self, encoder: &mut Encoder) {
        match self {
            Response::Epochs(list) => {
                encoder.u32(list.len() as u32);
                for x in list {
                    encoder.u64(x.epoch.0).u8(x.state.wire()).u64(x.files).u64(x.bytes);
                }
            }
            Response::Files(list) => {
                encoder.u32(list.len() as u32);
                for f in list {
                    encoder.file_info(f);
                }
            }
            Response::FileStat(f) => {
                encoder.file_info(f);
            }
            Response::Extents(list) => {
                encoder.u32(list.len() as u32);
                for x in list {
                    encoder.u64(x.offset).u64(x.length);
                }
            }
            other => unreachable!("{:?} is not a listing response", other.kind()),
        }
    }

    /// Encodes the body of a drain or administration response (delete, stream, status, drain).
    fn encode_drain_and_administration(&self, encoder: &mut Encoder) {
        match self {
            Response::Deleted { epoch }
            | Response::DrainQueued { epoch }
            | Response::EpochGranted { epoch } => {
                encoder.u64(epoch.0);
            }
            Response::EpochRevoked { epoch, revoked, activity } => {
                encoder.u64(epoch.0).u8(*revoked as u8);
                encoder
                    .u64(activity.bytes_written)
                    .u64(activity.bytes_read)
                    .u64(activity.write_ops)
                    .u64(activity.read_ops)
                    .u64(activity.metadata_ops)
                    .u64(activity.busy_ms);
            }
            Response::ClusterJoined { cluster_id } => {
                encoder.fixed(cluster_id);
            }
            Response::StreamAssigned { epoch, stream } => {
                encoder.u64(epoch.0).u64(*stream);
            }
            Response::Status(s) => {
                encoder
                    .string(&s.server_name)
                    .u32(s.connections)
                    .u32(s.connections_max)
                    .u64(s.in_flight_bytes)
                    .u64(s.in_flight_bytes_max)
                    .u64(s.requests_served)
                    .u64(s.bytes_written)
                    .u64(s.bytes_read)
                    .u64(s.dram_bytes_used)
                    .u64(s.dram_bytes_max)
                    .u64(s.ssd_bytes_used)
                    .u64(s.ssd_bytes_max)
                    .u64(s.epochs)
                    .u8(s.auth.wire())
                    .fixed(&s.server_id.0)
                    .u64(s.incarnation)
                    .string(&s.failure_domain);
            }
            Response::DrainStatus(list) => {
                encoder.u32(list.len() as u32);
                for x in list {
                    encoder
                        .u64(x.epoch.0)
                        .u8(x.state.wire())
                        .u8(x.mode)
                        .u64(x.files_total)
                        .u64(x.files_done)
                        .u64(x.pfs_bytes_written)
                        .u64(x.pfs_write_calls)
                        .u64(x.shuffle_us)
                        .u64(x.flush_us)
                        .u32(x.failed_attempts)
                        .string(&x.last_error);
                }
            }
            other => unreachable!("{:?} is not a drain or administration response", other.kind()),
        }
    }

    /// Decodes a response body of the given kind.
    pub fn decode(kind: Kind, body: &[u8]) -> Result<Response, FrameError> {
        if kind.is_request() {
            return Err(FrameError::WrongDirection { kind, direction: "request" });
        }
        let mut d = Decoder { kind, bytes: body };
        let response = match kind {
            Kind::HelloReply
            | Kind::Authenticated
            | Kind::FileOpened
            | Kind::Written
            | Kind::ReadData
            | Kind::Committed
            | Kind::Synced => Response::decode_data_path(kind, &mut d)?,
            Kind::Epochs | Kind::Files | Kind::FileStat | Kind::ExtentList => {
                Response::decode_listing(kind, &mut d)?
            }
            Kind::Deleted
            | Kind::StreamAssigned
            | Kind::EpochGranted
            | Kind::EpochRevoked
            | Kind::ClusterJoined
            | Kind::DrainQueued
            | Kind::DrainReport
            | Kind::StatusReply => Response::decode_drain_and_administration(kind, &mut d)?,
            Kind::Error => {
                let wire = d.u16("code")?;
                let code = ErrorCode::from_wire(wire).ok_or(FrameError::BadValue {
                    kind,
                    field: "code",
                    value: wire as u64,
                })?;
                Response::Error { code, message: d.string("message")? }
            }
            k if k.is_namespace() => Response::Namespace(NamespaceResponse::decode(k, &mut d)?),
            _ => unreachable!("is_request checked above"),
        };
        d.finish()?;
        Ok(response)
    }

    /// Decodes the body of a data-path response: handshake, open, write, read, commit, sync.
    fn decode_data_path(kind: Kind, decoder: &mut Decoder<'_>) -> Result<Response, FrameError> {
        Ok(match kind {
            Kind::HelloReply => Response::Hello {
                version: decoder.u16("version")?,
                payload_bytes_max: decoder.u32("payload_bytes_max")?,
                in_flight_requests_max: decoder.u32("in_flight_requests_max")?,
                uid: decoder.u32("uid")?,
                gid: decoder.u32("gid")?,
                server_name: decoder.string("server_name")?,
                auth: decoder.auth_method()?,
                challenge: decoder.fixed("challenge")?,
                server_id: ServerId(decoder.fixed("server_id")?),
                incarnation: decoder.u64("incarnation")?,
                failure_domain: decoder.failure_domain()?,
            },
            Kind::Authenticated => {
                Response::Authenticated { uid: decoder.u32("uid")?, gid: decoder.u32("gid")? }
            }
            Kind::FileOpened => Response::FileOpened {
                file: FileId(decoder.u64("file")?),
                created: decoder.boolean("created")?,
            },
            Kind::Written => Response::Written { bytes: decoder.u32("bytes")? },
            Kind::ReadData => {
                Response::ReadData { payload_crc32c: decoder.u32_then_reserved("payload_crc32c")? }
            }
            Kind::Committed => Response::Committed {
                epoch: EpochId(decoder.u64("epoch")?),
                durability: decoder.durability()?,
            },
            Kind::Synced => Response::Synced { epoch: EpochId(decoder.u64("epoch")?) },
            other => unreachable!("{other:?} is not a data-path response"),
        })
    }

    /// Decodes the body of a listing response: epochs, files, one file's stat, extents.
    fn decode_listing(kind: Kind, decoder: &mut Decoder<'_>) -> Result<Response, FrameError> {
        Ok(match kind {
            Kind::Epochs => {
                let n = decoder.count(25, "epoch count")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    let epoch = EpochId(decoder.u64("epoch")?);
                    let state = EpochState::from_wire(kind, decoder.u8("state")?)?;
                    list.push(EpochInfo {
                        epoch,
                        state,
                        files: decoder.u64("files")?,
                        bytes: decoder.u64("bytes")?,
                    });
                }
                Response::Epochs(list)
            }
            Kind::Files => {
                let n = decoder.count(26, "file count")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    list.push(decoder.file_info()?);
                }
                Response::Files(list)
            }
            Kind::FileStat => Response::FileStat(decoder.file_info()?),
            Kind::ExtentList => {
                let n = decoder.count(16, "extent count")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    list.push(Extent {
                        offset: decoder.u64("offset")?,
                        length: decoder.u64("length")?,
                    });
                }
                Response::Extents(list)
            }
            other => unreachable!("{other:?} is not a listing response"),
        })
    }

    /// Decodes the body of a drain or administration response (delete, stream, drain, status).
    fn decode_drain_and_administration(
        kind: Kind,
        decoder: &mut Decoder<'_>,
    ) -> Result<Response, FrameError> {
        Ok(match kind {
            Kind::Deleted => Response::Deleted { epoch: EpochId(decoder.u64("epoch")?) },
            Kind::StreamAssigned => Response::StreamAssigned {
                epoch: EpochId(decoder.u64("epoch")?),
                stream: decoder.u64("stream")?,
            },
            Kind::DrainQueued => Response::DrainQueued { epoch: EpochId(decoder.u64("epoch")?) },
            Kind::EpochGranted => Response::EpochGranted { epoch: EpochId(decoder.u64("epoch")?) },
            Kind::EpochRevoked => Response::EpochRevoked {
                epoch: EpochId(decoder.u64("epoch")?),
                revoked: decoder.boolean("revoked")?,
                activity: EpochActivity {
                    bytes_written: decoder.u64("bytes_written")?,
                    bytes_read: decoder.u64("bytes_read")?,
                    write_ops: decoder.u64("write_ops")?,
                    read_ops: decoder.u64("read_ops")?,
                    metadata_ops: decoder.u64("metadata_ops")?,
                    busy_ms: decoder.u64("busy_ms")?,
                },
            },
            Kind::ClusterJoined => {
                Response::ClusterJoined { cluster_id: decoder.fixed("cluster_id")? }
            }
            Kind::DrainReport => {
                let n = decoder.count(64, "drain count")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    let epoch = EpochId(decoder.u64("epoch")?);
                    let state = DrainState::from_wire(kind, decoder.u8("state")?)?;
                    list.push(DrainInfo {
                        epoch,
                        state,
                        mode: decoder.u8("mode")?,
                        files_total: decoder.u64("files_total")?,
                        files_done: decoder.u64("files_done")?,
                        pfs_bytes_written: decoder.u64("pfs_bytes_written")?,
                        pfs_write_calls: decoder.u64("pfs_write_calls")?,
                        shuffle_us: decoder.u64("shuffle_us")?,
                        flush_us: decoder.u64("flush_us")?,
                        failed_attempts: decoder.u32("failed_attempts")?,
                        last_error: decoder.string("last_error")?,
                    });
                }
                Response::DrainStatus(list)
            }
            Kind::StatusReply => Response::Status(ServerStatus {
                server_name: decoder.string("server_name")?,
                connections: decoder.u32("connections")?,
                connections_max: decoder.u32("connections_max")?,
                in_flight_bytes: decoder.u64("in_flight_bytes")?,
                in_flight_bytes_max: decoder.u64("in_flight_bytes_max")?,
                requests_served: decoder.u64("requests_served")?,
                bytes_written: decoder.u64("bytes_written")?,
                bytes_read: decoder.u64("bytes_read")?,
                dram_bytes_used: decoder.u64("dram_bytes_used")?,
                dram_bytes_max: decoder.u64("dram_bytes_max")?,
                ssd_bytes_used: decoder.u64("ssd_bytes_used")?,
                ssd_bytes_max: decoder.u64("ssd_bytes_max")?,
                epochs: decoder.u64("epochs")?,
                auth: decoder.auth_method()?,
                server_id: ServerId(decoder.fixed("server_id")?),
                incarnation: decoder.u64("incarnation")?,
                failure_domain: decoder.failure_domain()?,
            }),
            other => unreachable!("{other:?} is not a drain or administration response"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-zA-Z0-9_./é-]{0,40}").unwrap()
    }

    fn durability() -> impl Strategy<Value = Durability> {
        prop_oneof![
            Just(Durability::Ssd),
            Just(Durability::Memory),
            Just(Durability::ServerDefault)
        ]
    }

    /// Up to 4 participants with non-zero ids.
    fn participants() -> impl Strategy<Value = Vec<Participant>> {
        proptest::collection::vec((any::<[u8; SERVER_ID_BYTES]>(), name()), 0..4).prop_map(|v| {
            v.into_iter()
                .map(|(mut id, address)| {
                    id[0] |= 1;
                    Participant { id: ServerId(id), address }
                })
                .collect()
        })
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (any::<u16>(), any::<u16>(), name()).prop_map(|(a, b, n)| Request::Hello {
                version_min: a,
                version_max: b,
                client_name: n
            }),
            (any::<u64>(), name(), any::<bool>()).prop_map(|(e, n, c)| Request::OpenFile {
                epoch: EpochId(e),
                name: n,
                create: c
            }),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(e, f, o, c)| {
                Request::Write { epoch: EpochId(e), file: FileId(f), offset: o, payload_crc32c: c }
            }),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(e, f, o, l)| {
                Request::WriteZeros { epoch: EpochId(e), file: FileId(f), offset: o, length: l }
            }),
            (
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec(
                    (0..u64::MAX / 2, 1..u32::MAX, any::<u32>())
                        .prop_map(|(o, l, c)| { WriteExtent { offset: o, length: l, crc32c: c } }),
                    1..40
                )
            )
                .prop_map(|(e, f, x)| Request::WriteExtents {
                    epoch: EpochId(e),
                    file: FileId(f),
                    extents: x
                }),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(e, f, o, l)| {
                Request::Read { epoch: EpochId(e), file: FileId(f), offset: o, length: l }
            }),
            (any::<u64>(), durability(), participants()).prop_map(|(e, d, p)| Request::Commit {
                epoch: EpochId(e),
                durability: d,
                participants: p
            }),
            any::<u64>().prop_map(|e| Request::ListEpochs { from_epoch: EpochId(e) }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(e, f)| Request::ListFiles { epoch: EpochId(e), from_file: FileId(f) }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(e, f)| Request::Stat { epoch: EpochId(e), file: FileId(f) }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(e, f, o)| Request::Extents {
                epoch: EpochId(e),
                file: FileId(f),
                from_offset: o
            }),
            any::<u64>().prop_map(|e| Request::DeleteEpoch { epoch: EpochId(e) }),
            (any::<u64>(), participants())
                .prop_map(|(e, p)| Request::Sync { epoch: EpochId(e), participants: p }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(e, s)| Request::AssignStream { epoch: EpochId(e), stream: s }),
            (any::<u64>(), grant())
                .prop_map(|(e, grant)| Request::GrantEpoch { epoch: EpochId(e), grant }),
            any::<u64>().prop_map(|e| Request::RevokeEpoch { epoch: EpochId(e) }),
            any::<[u8; CLUSTER_ID_BYTES]>().prop_map(|id| Request::JoinCluster { cluster_id: id }),
            name().prop_map(|credential| Request::Authenticate { credential }),
            Just(Request::Status),
            (any::<u64>(), any::<u8>())
                .prop_map(|(e, m)| Request::Drain { epoch: EpochId(e), mode: m }),
            Just(Request::DrainStatus),
        ]
    }

    fn grant() -> impl Strategy<Value = EpochGrant> {
        let ids = || proptest::collection::vec(any::<u32>(), 0..8);
        let stream = prop_oneof![Just(None), (0u64..1 << 63).prop_map(Some)];
        (any::<u32>(), any::<u32>(), ids(), ids(), any::<u64>(), any::<u64>(), stream).prop_map(
            |(u, g, allowed_uids, allowed_gids, c, r, stream)| EpochGrant {
                owner_uid: u,
                owner_gid: g,
                allowed_uids,
                allowed_gids,
                capacity_bytes: c,
                reservation_capacity_bytes: r,
                stream,
            },
        )
    }

    fn file_info() -> impl Strategy<Value = FileInfo> {
        (any::<u64>(), name(), any::<u64>(), any::<u64>()).prop_map(|(f, n, s, t)| FileInfo {
            file: FileId(f),
            name: n,
            size_bytes: s,
            stored_bytes: t,
        })
    }

    fn state() -> impl Strategy<Value = EpochState> {
        prop_oneof![
            Just(EpochState::Open),
            Just(EpochState::CommittedMemory),
            Just(EpochState::Committed),
            Just(EpochState::Drained)
        ]
    }

    /// An `Epochs` listing of up to 20 epochs.
    fn epochs_response() -> impl Strategy<Value = Response> {
        proptest::collection::vec((any::<u64>(), state(), any::<u64>(), any::<u64>()), 0..20)
            .prop_map(|v| {
                Response::Epochs(
                    v.into_iter()
                        .map(|(e, s, f, b)| EpochInfo {
                            epoch: EpochId(e),
                            state: s,
                            files: f,
                            bytes: b,
                        })
                        .collect(),
                )
            })
    }

    /// A `Status` reply with counters derived from a few random values.
    fn status_response() -> impl Strategy<Value = Response> {
        (name(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(n, c, b, e)| {
            Response::Status(ServerStatus {
                server_name: n,
                connections: c,
                connections_max: c / 2,
                in_flight_bytes: b,
                in_flight_bytes_max: b / 3,
                requests_served: e,
                bytes_written: b ^ e,
                bytes_read: 7,
                dram_bytes_used: 1,
                dram_bytes_max: 2,
                ssd_bytes_used: 3,
                ssd_bytes_max: 4,
                epochs: e,
                auth: if c % 2 == 0 { AuthMethod::None } else { AuthMethod::Munge },
                server_id: ServerId((b as u128 ^ (e as u128) << 64).to_le_bytes()),
                incarnation: e / 5,
                failure_domain: format!("rack{}.node{c}", e % 3),
            })
        })
    }

    /// A `DrainStatus` report of up to 8 epochs' drains.
    fn drain_status_response() -> impl Strategy<Value = Response> {
        proptest::collection::vec((any::<u64>(), 0u8..6, any::<u64>(), any::<u32>(), name()), 0..8)
            .prop_map(|v| {
                Response::DrainStatus(
                    v.into_iter()
                        .map(|(e, s, n, a, m)| DrainInfo {
                            epoch: EpochId(e),
                            state: DrainState::from_wire(Kind::DrainReport, s).unwrap(),
                            mode: s % 2,
                            files_total: n,
                            files_done: n / 2,
                            pfs_bytes_written: n ^ e,
                            pfs_write_calls: e / 3,
                            shuffle_us: 5,
                            flush_us: n / 7,
                            failed_attempts: a,
                            last_error: m,
                        })
                        .collect(),
                )
            })
    }

    fn response() -> impl Strategy<Value = Response> {
        prop_oneof![
            (any::<u16>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), name())
                .prop_flat_map(|hello| (
                    Just(hello),
                    any::<bool>(),
                    any::<[u8; CHALLENGE_BYTES]>(),
                    any::<[u8; SERVER_ID_BYTES]>(),
                    any::<u64>()
                ))
                .prop_map(|((v, p, i, u, g, n), munge, challenge, id, incarnation)| {
                    Response::Hello {
                        version: v,
                        payload_bytes_max: p,
                        in_flight_requests_max: i,
                        uid: u,
                        gid: g,
                        server_name: n,
                        auth: if munge { AuthMethod::Munge } else { AuthMethod::None },
                        challenge,
                        server_id: ServerId(id),
                        incarnation,
                        failure_domain: format!("host-{}", incarnation % 7),
                    }
                }),
            (any::<u32>(), any::<u32>())
                .prop_map(|(uid, gid)| Response::Authenticated { uid, gid }),
            (any::<u64>(), any::<bool>())
                .prop_map(|(f, c)| Response::FileOpened { file: FileId(f), created: c }),
            any::<u32>().prop_map(|b| Response::Written { bytes: b }),
            any::<u32>().prop_map(|c| Response::ReadData { payload_crc32c: c }),
            (any::<u64>(), durability())
                .prop_map(|(e, d)| Response::Committed { epoch: EpochId(e), durability: d }),
            epochs_response(),
            proptest::collection::vec(file_info(), 0..10).prop_map(Response::Files),
            file_info().prop_map(Response::FileStat),
            proptest::collection::vec((any::<u64>(), any::<u64>()), 0..20).prop_map(|v| {
                Response::Extents(
                    v.into_iter().map(|(o, l)| Extent { offset: o, length: l }).collect(),
                )
            }),
            any::<u64>().prop_map(|e| Response::Deleted { epoch: EpochId(e) }),
            any::<u64>().prop_map(|e| Response::Synced { epoch: EpochId(e) }),
            (any::<u64>(), any::<u64>())
                .prop_map(|(e, s)| Response::StreamAssigned { epoch: EpochId(e), stream: s }),
            any::<u64>().prop_map(|e| Response::EpochGranted { epoch: EpochId(e) }),
            (any::<u64>(), any::<bool>(), any::<[u64; 6]>()).prop_map(|(e, r, a)| {
                let activity = EpochActivity {
                    bytes_written: a[0],
                    bytes_read: a[1],
                    write_ops: a[2],
                    read_ops: a[3],
                    metadata_ops: a[4],
                    busy_ms: a[5],
                };
                Response::EpochRevoked { epoch: EpochId(e), revoked: r, activity }
            }),
            any::<[u8; CLUSTER_ID_BYTES]>()
                .prop_map(|id| Response::ClusterJoined { cluster_id: id }),
            status_response(),
            any::<u64>().prop_map(|e| Response::DrainQueued { epoch: EpochId(e) }),
            drain_status_response(),
            (0usize..16, name()).prop_map(|(i, m)| Response::Error {
                code: ErrorCode::all().nth(i).unwrap(),
                message: m
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn requests_round_trip(r in request()) {
            let body = r.encode_body();
            prop_assert_eq!(Request::decode(r.kind(), &body).unwrap(), r);
        }

        #[test]
        fn responses_round_trip(r in response()) {
            let body = r.encode_body();
            prop_assert_eq!(Response::decode(r.kind(), &body).unwrap(), r);
        }

        /// Every strict prefix of a non-empty body is rejected as truncated; one extra byte is
        /// rejected as trailing.
        #[test]
        fn truncated_and_padded_requests_are_rejected(r in request(), cut in any::<prop::sample::Index>()) {
            let body = r.encode_body();
            if !body.is_empty() {
                let at = cut.index(body.len());
                let truncated = matches!(Request::decode(r.kind(), &body[..at]), Err(FrameError::Truncated { .. }));
                prop_assert!(truncated);
            }
            let mut padded = body.clone();
            padded.push(0);
            let trailing = matches!(Request::decode(r.kind(), &padded), Err(FrameError::TrailingBytes { extra: 1, .. }));
            prop_assert!(trailing);
        }

        #[test]
        fn truncated_responses_are_rejected(r in response(), cut in any::<prop::sample::Index>()) {
            let body = r.encode_body();
            if !body.is_empty() {
                let at = cut.index(body.len());
                prop_assert!(Response::decode(r.kind(), &body[..at]).is_err());
            }
        }

        /// Random bytes never panic the decoder, whatever the kind.
        #[test]
        fn garbage_bodies_never_panic(kind in 0u8..=255, body in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Some(kind) = Kind::from_byte(kind) {
                let _ = Request::decode(kind, &body);
                let _ = Response::decode(kind, &body);
            }
        }
    }

    #[test]
    fn bad_enum_values_are_named() {
        let mut body = Request::Commit {
            epoch: EpochId(1),
            durability: Durability::Ssd,
            participants: Vec::new(),
        }
        .encode_body();
        body[8] = 9; // the durability byte, after the epoch

        assert_eq!(
            Request::decode(Kind::Commit, &body),
            Err(FrameError::BadValue { kind: Kind::Commit, field: "durability", value: 9 })
        );
        let mut body =
            Request::OpenFile { epoch: EpochId(1), name: "a".into(), create: true }.encode_body();
        body[10] = 0xFF; // the name byte
        assert_eq!(
            Request::decode(Kind::OpenFile, &body),
            Err(FrameError::BadString { kind: Kind::OpenFile, field: "name" })
        );
        let mut body =
            Response::Error { code: ErrorCode::Io, message: String::new() }.encode_body();
        body[0] = 200;
        assert!(matches!(
            Response::decode(Kind::Error, &body),
            Err(FrameError::BadValue { field: "code", .. })
        ));
    }

    #[test]
    fn an_unknown_auth_method_is_named() {
        let hello = Response::Hello {
            version: 2,
            payload_bytes_max: 1,
            in_flight_requests_max: 1,
            uid: 0,
            gid: 0,
            server_name: "s".into(),
            auth: AuthMethod::Munge,
            challenge: [9; CHALLENGE_BYTES],
            server_id: ServerId([3; SERVER_ID_BYTES]),
            incarnation: 2,
            failure_domain: "n1".into(),
        };
        let mut body = hello.encode_body();
        assert_eq!(
            body.len(),
            2 + 4 + 4 + 4 + 4 + 3 + 1 + CHALLENGE_BYTES + SERVER_ID_BYTES + 8 + 2 + 2
        );
        body[21] = 7; // the auth byte, after the one-byte server name
        assert_eq!(
            Response::decode(Kind::HelloReply, &body),
            Err(FrameError::BadValue { kind: Kind::HelloReply, field: "auth", value: 7 })
        );
    }

    #[test]
    fn an_invalid_failure_domain_is_named() {
        let status = |domain: &str| {
            Response::Status(ServerStatus { failure_domain: domain.into(), ..Default::default() })
                .encode_body()
        };
        let good = status("node-1");
        assert!(Response::decode(Kind::StatusReply, &good).is_ok());
        for bad in ["", "a b", "../x", &"y".repeat(65)] {
            let error = Response::decode(Kind::StatusReply, &status(bad)).unwrap_err();
            assert!(error.to_string().contains("failure_domain"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn commit_participants_out_of_range_are_named() {
        let participant = Participant { id: ServerId([1; SERVER_ID_BYTES]), address: "a".into() };
        let commit = |participants: Vec<Participant>| {
            Request::Commit { epoch: EpochId(1), durability: Durability::Ssd, participants }
                .encode_body()
        };
        let mut body = commit(vec![participant.clone()]);
        body[13..13 + SERVER_ID_BYTES].fill(0);
        assert_eq!(
            Request::decode(Kind::Commit, &body),
            Err(FrameError::BadValue { kind: Kind::Commit, field: "participant id", value: 0 })
        );
        let mut body = commit(Vec::new());
        body[9..13].copy_from_slice(&(COMMIT_PARTICIPANTS_MAX as u32 + 1).to_le_bytes());
        body.extend(std::iter::repeat_n(0u8, (COMMIT_PARTICIPANTS_MAX + 1) * 18));
        assert!(matches!(
            Request::decode(Kind::Commit, &body),
            Err(FrameError::BadValue { field: "participant count", .. })
        ));
        let long = Participant {
            address: "x".repeat(PARTICIPANT_ADDRESS_BYTES_MAX + 1),
            ..participant.clone()
        };
        let mut body = commit(vec![participant.clone()]);
        body.truncate(13 + SERVER_ID_BYTES);
        body.extend_from_slice(&(long.address.len() as u16).to_le_bytes());
        body.extend_from_slice(long.address.as_bytes());
        assert!(matches!(
            Request::decode(Kind::Commit, &body),
            Err(FrameError::BadValue { field: "participant address", .. })
        ));
        let forged = Participant { address: "a\nERROR forged".into(), ..participant };
        let body = commit(vec![forged]);
        assert!(matches!(
            Request::decode(Kind::Commit, &body),
            Err(FrameError::BadValue { field: "participant address", .. })
        ));
    }

    #[test]
    fn write_body_layout_is_the_documented_one() {
        let write = Request::Write {
            epoch: EpochId(0x0102),
            file: FileId(0x0304),
            offset: 0x0506,
            payload_crc32c: 0xA1B2_C3D4,
        };
        let mut expected = Vec::new();
        expected.extend_from_slice(&0x0102u64.to_le_bytes());
        expected.extend_from_slice(&0x0304u64.to_le_bytes());
        expected.extend_from_slice(&0x0506u64.to_le_bytes());
        expected.extend_from_slice(&0xA1B2_C3D4u32.to_le_bytes());
        expected.extend_from_slice(&[0; 4]);
        assert_eq!(write.encode_body(), expected);
        assert_eq!(Request::decode(Kind::Write, &expected).unwrap(), write);
        let mut reserved_set = expected.clone();
        reserved_set[28] = 1;
        assert!(matches!(
            Request::decode(Kind::Write, &reserved_set),
            Err(FrameError::BadValue { kind: Kind::Write, field: "reserved", value: 1 })
        ));
        // A version 3 body without the checksum (24 bytes) is cut short, not read as CRC 0.
        assert!(matches!(
            Request::decode(Kind::Write, &expected[..24]),
            Err(FrameError::Truncated { .. })
        ));
    }

    #[test]
    fn write_extents_body_layout_is_the_documented_one() {
        let extents = vec![
            WriteExtent { offset: 0x10, length: 0x20, crc32c: 0x30 },
            WriteExtent { offset: 0x40, length: 0x50, crc32c: 0x60 },
        ];
        let write = Request::WriteExtents { epoch: EpochId(7), file: FileId(9), extents };
        let mut expected = Vec::new();
        expected.extend_from_slice(&7u64.to_le_bytes());
        expected.extend_from_slice(&9u64.to_le_bytes());
        expected.extend_from_slice(&2u32.to_le_bytes());
        expected.extend_from_slice(&[0; 4]);
        for (offset, length, crc) in [(0x10u64, 0x20u32, 0x30u32), (0x40, 0x50, 0x60)] {
            expected.extend_from_slice(&offset.to_le_bytes());
            expected.extend_from_slice(&length.to_le_bytes());
            expected.extend_from_slice(&crc.to_le_bytes());
        }
        assert_eq!(write.encode_body(), expected);
        assert_eq!(Request::decode(Kind::WriteExtents, &expected).unwrap(), write);
        let decode_with = |at: usize, bytes: &[u8]| {
            let mut body = expected.clone();
            body[at..at + bytes.len()].copy_from_slice(bytes);
            Request::decode(Kind::WriteExtents, &body)
        };
        assert!(matches!(
            decode_with(20, &[1]),
            Err(FrameError::BadValue { field: "reserved", value: 1, .. })
        ));
        assert!(matches!(
            decode_with(16, &0u32.to_le_bytes()),
            Err(FrameError::BadValue { field: "extent count", value: 0, .. })
        ));
        assert!(matches!(
            decode_with(16, &3u32.to_le_bytes()),
            Err(FrameError::Truncated { field: "extents", .. })
        ));
        assert!(matches!(
            decode_with(16, &(WRITE_EXTENTS_MAX as u32 + 1).to_le_bytes()),
            Err(FrameError::BadValue { field: "extent count", .. })
        ));
        assert!(matches!(
            decode_with(24 + 8, &0u32.to_le_bytes()),
            Err(FrameError::BadValue { field: "extent length", value: 0, .. })
        ));
        assert!(matches!(
            decode_with(24, &(u64::MAX - 4).to_le_bytes()),
            Err(FrameError::BadValue { field: "extent offset", .. })
        ));
    }

    #[test]
    fn read_data_body_layout_is_the_documented_one() {
        let reply = Response::ReadData { payload_crc32c: 0x0102_0304 };
        let expected = [4, 3, 2, 1, 0, 0, 0, 0];
        assert_eq!(reply.encode_body(), expected);
        assert_eq!(Response::decode(Kind::ReadData, &expected).unwrap(), reply);
        assert!(matches!(
            Response::decode(Kind::ReadData, &[4, 3, 2, 1, 0, 0, 0, 9]),
            Err(FrameError::BadValue {
                kind: Kind::ReadData,
                field: "reserved",
                value: 0x0900_0000
            })
        ));
        assert!(matches!(Response::decode(Kind::ReadData, &[]), Err(FrameError::Truncated { .. })));
    }

    #[test]
    fn direction_is_checked() {
        assert!(matches!(
            Request::decode(Kind::Written, &[0; 4]),
            Err(FrameError::WrongDirection { .. })
        ));
        assert!(matches!(
            Response::decode(Kind::Write, &[0; 24]),
            Err(FrameError::WrongDirection { .. })
        ));
    }

    #[test]
    fn grant_lists_and_streams_out_of_range_are_named() {
        let grant = EpochGrant {
            allowed_uids: (0..=GRANT_ALLOWED_IDS_MAX as u32).collect(),
            ..EpochGrant::default()
        };
        let mut e = Encoder(Vec::new());
        e.u64(1).u32(0).u32(0).u64(0).u64(0).u64(GRANT_NO_STREAM);
        e.u32(grant.allowed_uids.len() as u32);
        for &uid in &grant.allowed_uids {
            e.u32(uid);
        }
        e.u32(0);
        assert!(matches!(
            Request::decode(Kind::GrantEpoch, &e.0),
            Err(FrameError::BadValue { field: "allowed_uids", .. })
        ));
        let mut e = Encoder(Vec::new());
        e.u64(1).u32(0).u32(0).u64(0).u64(0).u64(1 << 63).u32(0).u32(0);
        assert!(matches!(
            Request::decode(Kind::GrantEpoch, &e.0),
            Err(FrameError::BadValue { field: "stream", .. })
        ));
    }

    #[test]
    fn huge_list_count_does_not_allocate() {
        let mut body = Vec::new();
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Response::decode(Kind::Epochs, &body), Err(FrameError::Truncated { .. })));
    }
}
