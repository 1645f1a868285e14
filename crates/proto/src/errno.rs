//! The one table mapping protocol error codes to errno values.
//!
//! The server answers a failed request with an `Error` frame carrying an [`ErrorCode`]; the client
//! library, the mount and the C ABI turn it into an errno with [`ErrorCode::errno`]. Codes are
//! stable on the wire: a new code is appended, never renumbered.

/// A protocol error code (u16 on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The frame could not be decoded (bad magic, checksum, unknown kind, truncated body…).
    BadFrame,
    /// No protocol version in common with the peer.
    UnsupportedVersion,
    /// A body or payload is larger than the negotiated maximum.
    TooLarge,
    /// A request arrived out of order (e.g. anything before `Hello`, or a second `Hello`).
    OutOfOrder,
    /// The epoch does not exist on this server.
    NoSuchEpoch,
    /// The file does not exist in the epoch.
    NoSuchFile,
    /// The store is full and stayed full for the whole bounded backpressure wait.
    NoSpace,
    /// The epoch is committed, drained or being deleted and takes no more writes.
    EpochReadOnly,
    /// The established identity may not do this.
    PermissionDenied,
    /// The server is shutting down and takes no new work.
    ShuttingDown,
    /// A request argument is invalid (zero-length read, name too long, offset overflow…).
    InvalidArgument,
    /// The store failed an I/O operation; the message names the file and offset.
    Io,
    /// Stored data failed its checksum.
    Corrupt,
    /// A server-side bug; the message says what.
    Internal,
    /// The server is at its connection limit; try again later.
    Busy,
    /// The write would take the epoch past the capacity its grant gives it on this server
    /// (the reservation's share there); nothing of it was written.
    QuotaExceeded,
    /// The write would end past the server's largest file size (`store.file_bytes_max`);
    /// nothing of it was written.
    FileTooLarge,
    /// Data does not match the CRC32C taken when it was written: a write payload that arrived
    /// different from what the client checksummed (nothing of it was written), or held data
    /// that no longer matches its write-time checksum (no bytes are returned).
    ChecksumMismatch,
}

/// Code, wire value, errno, description — the single table.
const TABLE: &[(ErrorCode, u16, i32, &str)] = &[
    (ErrorCode::BadFrame, 1, libc::EPROTO, "malformed frame"),
    (ErrorCode::UnsupportedVersion, 2, libc::EPROTONOSUPPORT, "no common protocol version"),
    (ErrorCode::TooLarge, 3, libc::EMSGSIZE, "frame too large"),
    (ErrorCode::OutOfOrder, 4, libc::EPROTO, "request out of order"),
    (ErrorCode::NoSuchEpoch, 5, libc::ENOENT, "no such epoch"),
    (ErrorCode::NoSuchFile, 6, libc::ENOENT, "no such file"),
    (ErrorCode::NoSpace, 7, libc::ENOSPC, "burst buffer full"),
    (ErrorCode::EpochReadOnly, 8, libc::EROFS, "epoch is read-only"),
    (ErrorCode::PermissionDenied, 9, libc::EACCES, "permission denied"),
    (ErrorCode::ShuttingDown, 10, libc::ESHUTDOWN, "server shutting down"),
    (ErrorCode::InvalidArgument, 11, libc::EINVAL, "invalid argument"),
    (ErrorCode::Io, 12, libc::EIO, "I/O error"),
    (ErrorCode::Corrupt, 13, libc::EBADMSG, "stored data corrupt"),
    (ErrorCode::Internal, 14, libc::ENOTRECOVERABLE, "internal server error"),
    (ErrorCode::Busy, 15, libc::EAGAIN, "server busy"),
    (ErrorCode::QuotaExceeded, 16, libc::EDQUOT, "reservation capacity exceeded"),
    (ErrorCode::FileTooLarge, 17, libc::EFBIG, "file too large"),
    (ErrorCode::ChecksumMismatch, 18, libc::EIO, "data does not match its write-time checksum"),
];

impl ErrorCode {
    /// Every code, in wire order.
    pub fn all() -> impl Iterator<Item = ErrorCode> {
        TABLE.iter().map(|row| row.0)
    }

    fn row(self) -> &'static (ErrorCode, u16, i32, &'static str) {
        TABLE.iter().find(|row| row.0 == self).expect("every ErrorCode has a row in TABLE")
    }

    /// The value on the wire.
    pub fn wire(self) -> u16 {
        self.row().1
    }

    /// The errno an application sees for this code.
    pub fn errno(self) -> i32 {
        self.row().2
    }

    /// A short description.
    pub fn describe(self) -> &'static str {
        self.row().3
    }

    /// Decodes a wire value; `None` for a code this build does not know.
    pub fn from_wire(value: u16) -> Option<ErrorCode> {
        TABLE.iter().find(|row| row.1 == value).map(|row| row.0)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn wire_values_are_unique_and_round_trip() {
        let mut seen = HashSet::new();
        for code in ErrorCode::all() {
            assert!(seen.insert(code.wire()), "duplicate wire value {}", code.wire());
            assert_eq!(ErrorCode::from_wire(code.wire()), Some(code));
            assert!(code.errno() > 0);
        }
        assert_eq!(seen.len(), 18);
        assert_eq!(ErrorCode::from_wire(0), None);
        assert_eq!(ErrorCode::from_wire(999), None);
    }

    #[test]
    fn errno_mapping_is_the_documented_one() {
        assert_eq!(ErrorCode::NoSpace.errno(), libc::ENOSPC);
        assert_eq!(ErrorCode::FileTooLarge.errno(), libc::EFBIG);
        assert_eq!(ErrorCode::NoSuchFile.errno(), libc::ENOENT);
        assert_eq!(ErrorCode::EpochReadOnly.errno(), libc::EROFS);
        assert_eq!(ErrorCode::BadFrame.errno(), libc::EPROTO);
        assert_eq!(ErrorCode::QuotaExceeded.errno(), libc::EDQUOT);
        assert_eq!(ErrorCode::ChecksumMismatch.errno(), libc::EIO);
    }
}
