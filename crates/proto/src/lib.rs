//! Versioned wire protocol between clients and burst buffer servers; errno table.
//!
//! Every message is a frame: a fixed 32-byte [`frame::Header`] (magic, kind, request id, body and
//! payload lengths, header CRC32C), a small typed body (at most [`BODY_BYTES_MAX`]) and an
//! optional bulk payload. Only `Write` requests and `ReadData` responses carry a payload, and the
//! payload is the last thing in the frame so a server can read it straight into the buffer it
//! hands to the store, and a client can send it from the caller's slice without copying.
//! The byte-level layout is documented in `docs/design/protocol.md`.
//!
//! The transport (TCP, Unix-domain sockets; RDMA later) sits behind the traits in [`transport`];
//! the codec ([`frame`], [`message`]) is pure and does no I/O beyond `Read`/`Write`.

pub mod auth;
pub mod errno;
pub mod frame;
pub mod identity;
pub mod message;
pub mod namespace;
pub mod transport;

pub use auth::{AuthMethod, CHALLENGE_BYTES};
pub use errno::ErrorCode;
pub use frame::{FrameError, Header, Kind, ReceiveError, HEADER_BYTES};
pub use identity::{
    cluster_id_hex, parse_cluster_id, Participant, ServerId, CLUSTER_ID_BYTES,
    COMMIT_PARTICIPANTS_MAX, PARTICIPANT_ADDRESS_BYTES_MAX, SERVER_ID_BYTES,
};
pub use message::{
    DrainInfo, DrainState, Durability, EpochActivity, EpochGrant, EpochInfo, EpochState, Extent,
    FileInfo, Request, Response, ServerStatus, WriteExtent, WRITE_EXTENTS_MAX, WRITE_EXTENT_BYTES,
};
pub use namespace::{
    session_client_name, session_of_client_name, NamespaceRequest, NamespaceResponse,
    CHANGES_BATCH_MAX,
};
pub use transport::{Connection, Endpoint, Identity, Listener, Transport};

/// The protocol version this build speaks. The handshake picks the highest version both sides
/// support; the frame header layout is the same in every version. Version 2 added site
/// authentication (`auth` and `challenge` in `HelloReply`, `Authenticate`/`Authenticated`,
/// `auth` in `StatusReply`). Version 3 added server identity (`server_id` and `incarnation` in
/// `HelloReply` and `StatusReply`), the participants of a `Commit` and the `payload_crc32c` of a
/// `Write`. Version 4 added the server's failure domain (`failure_domain` in `HelloReply` and
/// `StatusReply`), which replica placement needs. Version 5 added `WriteExtents` (a client's
/// gathered strided writes); a client sends it only to a server that chose version 5 or later.
/// Version 6 added `WriteZeros` (a run of zeros stored as one small record).
pub const PROTOCOL_VERSION: u16 = 6;
/// The first version with `WriteExtents`.
pub const WRITE_EXTENTS_VERSION: u16 = 5;
/// The first version with `WriteZeros`; a client sends zeros as bytes to an older server.
pub const WRITE_ZEROS_VERSION: u16 = 6;
/// The oldest protocol version this build still speaks. Servers and clients of this repository
/// move together, so versions 1 to 3 are no longer spoken: a version 2 client's commit would
/// name no participants, and a version 3 server no failure domain for replica placement.
pub const PROTOCOL_VERSION_MIN: u16 = 4;
/// Largest typed body of any frame. Bodies are metadata only (names, lists), never bulk data.
pub const BODY_BYTES_MAX: u32 = 64 * 1024;
/// Hard upper bound on any payload, whatever a server advertises: 256 MiB.
pub const PAYLOAD_BYTES_LIMIT: u32 = 256 * 1024 * 1024;
/// Largest file name in a body.
pub const NAME_BYTES_MAX: usize = 4096;
