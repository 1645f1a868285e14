//! The frame header: fixed 32 bytes, little-endian, checksummed.
//!
//! ```text
//! offset size field
//!  0      4   magic        b"SPWL"
//!  4      1   kind         message kind (request 0x01.., response 0x81.., error 0xFF)
//!  5      1   flags        0 (reserved; a non-zero value is rejected)
//!  6      2   reserved     0
//!  8      8   request_id   chosen by the client; echoed in the response
//! 16      4   body_bytes   length of the typed body that follows the header
//! 20      4   payload_bytes length of the bulk payload that follows the body
//! 24      4   reserved     0
//! 28      4   header_crc   CRC32C of bytes 0..28
//! ```
//!
//! The header CRC makes garbage and desynchronised streams fail at the first frame instead of
//! being read as a 4 GiB length. Payloads are not checksummed here: TCP and Unix sockets already
//! protect them and the store checksums each record.

use std::io::{self, Read, Write};

use crate::BODY_BYTES_MAX;

/// Size of the fixed frame header.
pub const HEADER_BYTES: usize = 32;
/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"SPWL";

/// Every message kind. The numbering is part of the wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Hello = 0x01,
    OpenFile = 0x02,
    Write = 0x03,
    Read = 0x04,
    Commit = 0x05,
    ListEpochs = 0x06,
    ListFiles = 0x07,
    Stat = 0x08,
    Extents = 0x09,
    DeleteEpoch = 0x0A,
    Status = 0x0B,
    Drain = 0x0C,
    DrainStatus = 0x0D,
    Sync = 0x0E,
    AssignStream = 0x0F,
    /// Site authentication.
    Authenticate = 0x10,
    /// Grants (root only: the manager).
    GrantEpoch = 0x11,
    RevokeEpoch = 0x12,
    /// Cluster membership (root only: the manager).
    JoinCluster = 0x13,
    /// Several extents of one file in one frame (protocol version 5).
    WriteExtents = 0x14,
    /// A run of zeros in one small record (protocol version 6).
    WriteZeros = 0x15,
    // Namespace (metadata service) requests, see `crate::namespace`.
    NamespaceOpen = 0x20,
    NamespaceSync = 0x21,
    NamespaceManifest = 0x22,
    NsLookup = 0x23,
    NsGetAttr = 0x24,
    NsSetAttr = 0x25,
    NsCreate = 0x26,
    NsMkdir = 0x27,
    NsSymlink = 0x28,
    NsReadlink = 0x29,
    NsLink = 0x2A,
    NsUnlink = 0x2B,
    NsRmdir = 0x2C,
    NsRename = 0x2D,
    NsReaddir = 0x2E,
    NsOpen = 0x2F,
    NsAccess = 0x30,
    NsWrote = 0x31,
    NsStatfs = 0x32,
    NsWatch = 0x33,
    HelloReply = 0x81,
    FileOpened = 0x82,
    Written = 0x83,
    ReadData = 0x84,
    Committed = 0x85,
    Epochs = 0x86,
    Files = 0x87,
    FileStat = 0x88,
    ExtentList = 0x89,
    Deleted = 0x8A,
    StatusReply = 0x8B,
    DrainQueued = 0x8C,
    DrainReport = 0x8D,
    Synced = 0x8E,
    StreamAssigned = 0x8F,
    Authenticated = 0x90,
    EpochGranted = 0x91,
    EpochRevoked = 0x92,
    ClusterJoined = 0x93,
    // Namespace responses.
    NamespaceOpened = 0xA0,
    NsAttr = 0xA1,
    NsDone = 0xA2,
    NsTarget = 0xA3,
    NsEntries = 0xA4,
    NsStat = 0xA5,
    NamespaceManifestPage = 0xA6,
    NsError = 0xA7,
    NsChanges = 0xA8,
    Error = 0xFF,
}

impl Kind {
    /// Every kind, in byte order within each family.
    pub const ALL: [Kind; 70] = [
        Kind::Hello,
        Kind::OpenFile,
        Kind::Write,
        Kind::Read,
        Kind::Commit,
        Kind::ListEpochs,
        Kind::ListFiles,
        Kind::Stat,
        Kind::Extents,
        Kind::DeleteEpoch,
        Kind::Status,
        Kind::Drain,
        Kind::DrainStatus,
        Kind::Sync,
        Kind::AssignStream,
        Kind::Authenticate,
        Kind::GrantEpoch,
        Kind::RevokeEpoch,
        Kind::JoinCluster,
        Kind::WriteExtents,
        Kind::WriteZeros,
        Kind::HelloReply,
        Kind::FileOpened,
        Kind::Written,
        Kind::ReadData,
        Kind::Committed,
        Kind::Epochs,
        Kind::Files,
        Kind::FileStat,
        Kind::ExtentList,
        Kind::Deleted,
        Kind::StatusReply,
        Kind::DrainQueued,
        Kind::DrainReport,
        Kind::Synced,
        Kind::StreamAssigned,
        Kind::Authenticated,
        Kind::EpochGranted,
        Kind::EpochRevoked,
        Kind::ClusterJoined,
        Kind::Error,
        Kind::NamespaceOpen,
        Kind::NamespaceSync,
        Kind::NamespaceManifest,
        Kind::NsLookup,
        Kind::NsGetAttr,
        Kind::NsSetAttr,
        Kind::NsCreate,
        Kind::NsMkdir,
        Kind::NsSymlink,
        Kind::NsReadlink,
        Kind::NsLink,
        Kind::NsUnlink,
        Kind::NsRmdir,
        Kind::NsRename,
        Kind::NsReaddir,
        Kind::NsOpen,
        Kind::NsAccess,
        Kind::NsWrote,
        Kind::NsStatfs,
        Kind::NsWatch,
        Kind::NamespaceOpened,
        Kind::NsAttr,
        Kind::NsDone,
        Kind::NsTarget,
        Kind::NsEntries,
        Kind::NsStat,
        Kind::NamespaceManifestPage,
        Kind::NsError,
        Kind::NsChanges,
    ];

    /// Decodes a kind byte.
    pub fn from_byte(byte: u8) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| *k as u8 == byte)
    }

    /// Requests travel client → server; everything else server → client.
    pub fn is_request(self) -> bool {
        (self as u8) < 0x80
    }

    /// Namespace (metadata service) kinds: requests 0x20..=0x3F, responses 0xA0..=0xBF.
    pub fn is_namespace(self) -> bool {
        matches!(self as u8, 0x20..=0x3F | 0xA0..=0xBF)
    }

    /// Only these kinds may carry a payload.
    pub fn may_carry_payload(self) -> bool {
        matches!(self, Kind::Write | Kind::WriteExtents | Kind::ReadData)
    }
}

/// Why bytes are not a valid frame. Names the field and the values at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error(
        "bad magic {found:02x?} (expected \"SPWL\"): not a spillway peer or stream out of sync"
    )]
    BadMagic { found: [u8; 4] },
    #[error("header checksum mismatch: computed {computed:#010x}, frame says {found:#010x}")]
    HeaderChecksum { computed: u32, found: u32 },
    #[error("unknown message kind {kind:#04x}")]
    UnknownKind { kind: u8 },
    #[error("reserved header field {field} is {value}, must be 0")]
    ReservedNotZero { field: &'static str, value: u64 },
    #[error("body of {bytes} bytes exceeds the maximum of {max}")]
    BodyTooLarge { bytes: u32, max: u32 },
    #[error("payload of {bytes} bytes exceeds the maximum of {max}")]
    PayloadTooLarge { bytes: u32, max: u32 },
    #[error("{kind:?} frames carry no payload, this one says {bytes} bytes")]
    UnexpectedPayload { kind: Kind, bytes: u32 },
    #[error("{kind:?} body truncated reading {field}: needs {needed} bytes, {available} left")]
    Truncated { kind: Kind, field: &'static str, needed: usize, available: usize },
    #[error("{kind:?} body has {extra} trailing bytes")]
    TrailingBytes { kind: Kind, extra: usize },
    #[error("{kind:?} field {field} is not valid UTF-8")]
    BadString { kind: Kind, field: &'static str },
    #[error("{kind:?} field {field} is not a valid name: {value:?}")]
    BadName { kind: Kind, field: &'static str, value: String },
    #[error("{kind:?} field {field} has invalid value {value}")]
    BadValue { kind: Kind, field: &'static str, value: u64 },
    #[error("{kind:?} is a {direction} kind and is not expected here")]
    WrongDirection { kind: Kind, direction: &'static str },
}

/// Why a frame could not be received from a connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed by peer")]
    Closed,
    /// The peer closed the connection in the middle of a frame.
    #[error(
        "connection closed in the middle of a frame ({got} of {expected} bytes of the {part})"
    )]
    TruncatedFrame { part: &'static str, got: usize, expected: usize },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub request_id: u64,
    pub body_bytes: u32,
    pub payload_bytes: u32,
}

impl Header {
    /// Encodes the header, computing its checksum.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        assert!(self.body_bytes <= BODY_BYTES_MAX, "body of {} bytes", self.body_bytes);
        assert!(self.payload_bytes == 0 || self.kind.may_carry_payload());
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = self.kind as u8;
        out[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.body_bytes.to_le_bytes());
        out[20..24].copy_from_slice(&self.payload_bytes.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and validates a header. `payload_bytes_max` is the negotiated payload limit.
    pub fn decode(
        bytes: &[u8; HEADER_BYTES],
        payload_bytes_max: u32,
    ) -> Result<Header, FrameError> {
        let found: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
        if found != MAGIC {
            return Err(FrameError::BadMagic { found });
        }
        let computed = crc32c::crc32c(&bytes[0..28]);
        let stored = u32::from_le_bytes(bytes[28..32].try_into().expect("4 bytes"));
        if computed != stored {
            return Err(FrameError::HeaderChecksum { computed, found: stored });
        }
        let kind = Kind::from_byte(bytes[4]).ok_or(FrameError::UnknownKind { kind: bytes[4] })?;
        if bytes[5] != 0 {
            return Err(FrameError::ReservedNotZero { field: "flags", value: bytes[5] as u64 });
        }
        let reserved_6 = u16::from_le_bytes(bytes[6..8].try_into().expect("2 bytes"));
        if reserved_6 != 0 {
            return Err(FrameError::ReservedNotZero {
                field: "bytes 6..8",
                value: reserved_6 as u64,
            });
        }
        let reserved_24 = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
        if reserved_24 != 0 {
            return Err(FrameError::ReservedNotZero {
                field: "bytes 24..28",
                value: reserved_24 as u64,
            });
        }
        let request_id = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let body_bytes = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
        let payload_bytes = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
        if body_bytes > BODY_BYTES_MAX {
            return Err(FrameError::BodyTooLarge { bytes: body_bytes, max: BODY_BYTES_MAX });
        }
        if payload_bytes > 0 && !kind.may_carry_payload() {
            return Err(FrameError::UnexpectedPayload { kind, bytes: payload_bytes });
        }
        let max = payload_bytes_max.min(crate::PAYLOAD_BYTES_LIMIT);
        if payload_bytes > max {
            return Err(FrameError::PayloadTooLarge { bytes: payload_bytes, max });
        }
        Ok(Header { kind, request_id, body_bytes, payload_bytes })
    }
}

/// Reads exactly `buffer.len()` bytes; distinguishes a clean close before the first byte.
fn read_part<R: Read + ?Sized>(
    reader: &mut R,
    buffer: &mut [u8],
    part: &'static str,
    clean_close_ok: bool,
) -> Result<(), ReceiveError> {
    let mut got = 0;
    while got < buffer.len() {
        match reader.read(&mut buffer[got..]) {
            Ok(0) if got == 0 && clean_close_ok => return Err(ReceiveError::Closed),
            Ok(0) => {
                return Err(ReceiveError::TruncatedFrame { part, got, expected: buffer.len() })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReceiveError::Io(e)),
        }
    }
    Ok(())
}

/// Reads one header and its body; the payload (if any) is left on the stream for the caller to
/// read straight into its own buffer with [`read_payload`].
pub fn read_header_and_body<R: Read + ?Sized>(
    reader: &mut R,
    body: &mut Vec<u8>,
    payload_bytes_max: u32,
) -> Result<Header, ReceiveError> {
    let mut raw = [0u8; HEADER_BYTES];
    read_part(reader, &mut raw, "header", true)?;
    let header = Header::decode(&raw, payload_bytes_max)?;
    body.clear();
    body.resize(header.body_bytes as usize, 0);
    read_part(reader, body, "body", false)?;
    Ok(header)
}

/// Reads a frame's payload into `buffer` (whose length is the header's `payload_bytes`).
pub fn read_payload<R: Read + ?Sized>(
    reader: &mut R,
    buffer: &mut [u8],
) -> Result<(), ReceiveError> {
    read_part(reader, buffer, "payload", false)
}

/// Writes header + body + payload, using vectored writes so the payload is not copied.
pub fn write_frame<W: Write + ?Sized>(
    writer: &mut W,
    kind: Kind,
    request_id: u64,
    body: &[u8],
    payload: &[u8],
) -> io::Result<()> {
    let body_bytes = u32::try_from(body.len()).expect("body fits u32");
    let payload_bytes = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "payload larger than 4 GiB"))?;
    let header = Header { kind, request_id, body_bytes, payload_bytes }.encode();
    let parts: [&[u8]; 3] = [&header, body, payload];
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut written = 0usize;
    while written < total {
        // Build the remaining slices after `written` bytes.
        let mut skip = written;
        let mut slices: Vec<io::IoSlice<'_>> = Vec::with_capacity(3);
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            slices.push(io::IoSlice::new(&part[skip..]));
            skip = 0;
        }
        match writer.write_vectored(&slices) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped reading")),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header { kind: Kind::Write, request_id: 77, body_bytes: 24, payload_bytes: 4096 }
    }

    #[test]
    fn header_round_trips() {
        let h = header();
        assert_eq!(Header::decode(&h.encode(), 1 << 20).unwrap(), h);
    }

    #[test]
    fn every_kind_byte_round_trips() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_byte(kind as u8), Some(kind));
        }
        assert_eq!(Kind::from_byte(0x00), None);
        assert_eq!(Kind::from_byte(0x7F), None);
    }

    #[test]
    fn garbage_is_named() {
        let mut bytes = header().encode();
        bytes[0] = b'X';
        assert!(matches!(Header::decode(&bytes, 1 << 20), Err(FrameError::BadMagic { .. })));
        let mut bytes = header().encode();
        bytes[12] ^= 1;
        assert!(matches!(Header::decode(&bytes, 1 << 20), Err(FrameError::HeaderChecksum { .. })));
    }

    fn reseal(mut bytes: [u8; HEADER_BYTES]) -> [u8; HEADER_BYTES] {
        let crc = crc32c::crc32c(&bytes[0..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn bad_fields_behind_a_valid_checksum_are_rejected() {
        let mut b = header().encode();
        b[4] = 0x42;
        assert_eq!(
            Header::decode(&reseal(b), 1 << 20),
            Err(FrameError::UnknownKind { kind: 0x42 })
        );
        let mut b = header().encode();
        b[5] = 1;
        assert!(matches!(
            Header::decode(&reseal(b), 1 << 20),
            Err(FrameError::ReservedNotZero { field: "flags", .. })
        ));
        let mut b = header().encode();
        b[25] = 1;
        assert!(matches!(
            Header::decode(&reseal(b), 1 << 20),
            Err(FrameError::ReservedNotZero { .. })
        ));
        let mut b = header().encode();
        b[16..20].copy_from_slice(&(BODY_BYTES_MAX + 1).to_le_bytes());
        assert!(matches!(
            Header::decode(&reseal(b), 1 << 20),
            Err(FrameError::BodyTooLarge { .. })
        ));
        assert_eq!(
            Header::decode(&header().encode(), 4095),
            Err(FrameError::PayloadTooLarge { bytes: 4096, max: 4095 })
        );
        let mut b = header().encode();
        b[4] = Kind::Commit as u8;
        assert!(matches!(
            Header::decode(&reseal(b), 1 << 20),
            Err(FrameError::UnexpectedPayload { .. })
        ));
    }

    #[test]
    fn truncated_streams_say_where() {
        let h = header().encode();
        let mut cursor = std::io::Cursor::new(h[..10].to_vec());
        let mut body = Vec::new();
        match read_header_and_body(&mut cursor, &mut body, 1 << 20) {
            Err(ReceiveError::TruncatedFrame { part: "header", got: 10, expected: 32 }) => {}
            other => panic!("{other:?}"),
        }
        let mut cursor = std::io::Cursor::new(Vec::new());
        assert!(matches!(
            read_header_and_body(&mut cursor, &mut body, 1 << 20),
            Err(ReceiveError::Closed)
        ));
        let mut stream = h.to_vec();
        stream.extend_from_slice(&[0; 5]);
        let mut cursor = std::io::Cursor::new(stream);
        assert!(matches!(
            read_header_and_body(&mut cursor, &mut body, 1 << 20),
            Err(ReceiveError::TruncatedFrame { part: "body", got: 5, expected: 24 })
        ));
    }

    #[test]
    fn write_frame_lays_out_header_body_payload() {
        let mut out = Vec::new();
        write_frame(&mut out, Kind::Write, 9, &[1, 2, 3], &[7; 10]).unwrap();
        assert_eq!(out.len(), HEADER_BYTES + 13);
        let mut cursor = std::io::Cursor::new(out);
        let mut body = Vec::new();
        let h = read_header_and_body(&mut cursor, &mut body, 100).unwrap();
        assert_eq!((h.kind, h.request_id, h.payload_bytes), (Kind::Write, 9, 10));
        assert_eq!(body, vec![1, 2, 3]);
        let mut payload = vec![0; 10];
        read_payload(&mut cursor, &mut payload).unwrap();
        assert_eq!(payload, vec![7; 10]);
    }
}
