//! Errors of the C ABI and their errno values, plus the thread-local "last error" message.
//!
//! Every exported function returns `0` or a *negative* errno. The errno comes from the protocol's
//! one table (`spillway_proto::ErrorCode::errno`) through [`CapiError::errno`]; this module adds no
//! second table, only the mapping of ABI-level failures (null pointers, bad UTF-8, panics) onto
//! the same codes. The human-readable reason of the most recent call on a thread is kept in a
//! thread-local C string that `spillway_last_error_message` hands out.

use std::cell::RefCell;
use std::ffi::CString;

use spillway_client::ClientError;
use spillway_proto::ErrorCode;

/// Why a C ABI call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CapiError {
    /// A required pointer argument was NULL.
    #[error("argument `{0}` is NULL")]
    NullArgument(&'static str),
    /// A C string argument was not valid UTF-8.
    #[error("argument `{argument}` is not valid UTF-8")]
    InvalidUtf8 { argument: &'static str },
    /// A server address could not be parsed.
    #[error("server address #{index}: {message}")]
    BadEndpoint { index: usize, message: String },
    /// Some other argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A file handle was passed with a client other than the one that opened it.
    #[error("file {name:?} of epoch {epoch} belongs to another client handle")]
    ForeignFile { name: String, epoch: u64 },
    /// An earlier call panicked while holding this handle; its state is unknown.
    #[error("{0} handle is unusable after an earlier internal error; close it and reconnect")]
    Poisoned(&'static str),
    /// A Rust panic was caught at the boundary (a bug in Spillway).
    #[error("internal error (panic): {0}")]
    Panic(String),
    /// The client library failed.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl CapiError {
    /// The positive errno an application sees (returned negated by the ABI).
    pub fn errno(&self) -> i32 {
        let errno = match self {
            CapiError::NullArgument(_)
            | CapiError::InvalidUtf8 { .. }
            | CapiError::BadEndpoint { .. }
            | CapiError::InvalidArgument(_)
            | CapiError::ForeignFile { .. } => ErrorCode::InvalidArgument.errno(),
            CapiError::Poisoned(_) | CapiError::Panic(_) => ErrorCode::Io.errno(),
            CapiError::Client(e) => e.errno(),
        };
        // An OS error of 0 (or a nonsense value) must not turn a failure into "success".
        if errno > 0 {
            errno
        } else {
            ErrorCode::Io.errno()
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (interior NULs are replaced).
pub(crate) fn set_last_error(message: String) {
    let message = CString::new(message.replace('\0', "\\0")).expect("NULs were replaced");
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

pub(crate) fn clear_last_error() {
    LAST_ERROR.with(|last| *last.borrow_mut() = CString::default());
}

/// A pointer to this thread's last error message; valid until the next call on this thread.
pub(crate) fn last_error_pointer() -> *const std::ffi::c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_proto::Endpoint;
    use spillway_types::EpochId;

    fn endpoint() -> Endpoint {
        "127.0.0.1:1".parse().unwrap()
    }

    /// Every client error path, every ABI error path, every protocol code: a positive errno.
    #[test]
    fn every_error_path_yields_a_positive_errno() {
        let io = |e: std::io::Error| e;
        let mut errors: Vec<CapiError> = vec![
            CapiError::NullArgument("client"),
            CapiError::InvalidUtf8 { argument: "name" },
            CapiError::BadEndpoint { index: 0, message: "x".into() },
            CapiError::InvalidArgument("x".into()),
            CapiError::ForeignFile { name: "f".into(), epoch: 1 },
            CapiError::Poisoned("client"),
            CapiError::Panic("boom".into()),
        ];
        let client_errors = vec![
            ClientError::Connect {
                endpoint: endpoint(),
                source: io(std::io::Error::from_raw_os_error(libc::ECONNREFUSED)),
            },
            ClientError::Connect {
                endpoint: endpoint(),
                source: io(std::io::Error::other("no os code")),
            },
            ClientError::Io {
                endpoint: endpoint(),
                source: io(std::io::Error::from_raw_os_error(0)),
            },
            ClientError::Io {
                endpoint: endpoint(),
                source: io(std::io::Error::from_raw_os_error(libc::EPIPE)),
            },
            ClientError::Handshake { endpoint: endpoint(), message: "x".into() },
            ClientError::Protocol { endpoint: endpoint(), message: "x".into() },
            ClientError::UnexpectedReply {
                endpoint: endpoint(),
                expected: "Committed",
                got: "Files".into(),
            },
            ClientError::NoSuchFile { epoch: EpochId(3), name: "f".into() },
            ClientError::InvalidArgument("x".into()),
        ];
        errors.extend(client_errors.into_iter().map(CapiError::Client));
        for code in ErrorCode::all() {
            errors.push(CapiError::Client(ClientError::Server {
                endpoint: endpoint(),
                code,
                message: "x".into(),
            }));
        }
        for error in &errors {
            assert!(error.errno() > 0, "{error:?} maps to errno {}", error.errno());
        }
    }

    #[test]
    fn errno_values_follow_the_protocol_table() {
        let server = |code| {
            CapiError::Client(ClientError::Server {
                endpoint: endpoint(),
                code,
                message: String::new(),
            })
        };
        assert_eq!(server(ErrorCode::NoSpace).errno(), libc::ENOSPC);
        assert_eq!(server(ErrorCode::EpochReadOnly).errno(), libc::EROFS);
        assert_eq!(server(ErrorCode::QuotaExceeded).errno(), libc::EDQUOT);
        assert_eq!(
            CapiError::Client(ClientError::NoSuchFile { epoch: EpochId(1), name: "f".into() })
                .errno(),
            libc::ENOENT
        );
        assert_eq!(CapiError::NullArgument("x").errno(), libc::EINVAL);
        assert_eq!(CapiError::Panic("x".into()).errno(), libc::EIO);
        let refused = ClientError::Connect {
            endpoint: endpoint(),
            source: std::io::Error::from_raw_os_error(libc::ECONNREFUSED),
        };
        assert_eq!(CapiError::Client(refused).errno(), libc::ECONNREFUSED);
        let zero =
            ClientError::Io { endpoint: endpoint(), source: std::io::Error::from_raw_os_error(0) };
        assert_eq!(CapiError::Client(zero).errno(), libc::EIO);
    }
}
