//! MUNGE credentials: the site authentication of HPC clusters (the `munged` daemon and its
//! shared key), through `libmunge` loaded at run time.
//!
//! `libmunge.so.2` is opened with `dlopen` the first time a credential is encoded or decoded, so
//! the binary builds and runs on hosts without munge; only a caller that asks for munge
//! authentication needs it, and then gets [`MungeError::Library`] naming what is missing.
//!
//! A [`MungeContext`] is configuration only (the `munged` socket, the credential's time to
//! live): every call creates its own libmunge context and destroys it, because libmunge contexts
//! must not be shared between threads and a decode rewrites the context it is given. The cost is
//! a `malloc` next to a round trip to `munged` over its Unix socket.
//!
//! What `munged` checks on decode, and how it is reported here: the credential was made with the
//! same key ([`MungeError::Invalid`] otherwise: forged, damaged, or from another realm), it is
//! not older than its time to live ([`MungeError::Expired`]) nor from the future
//! ([`MungeError::Rewound`]), and this `munged` has not decoded it before
//! ([`MungeError::Replayed`]). The uid and gid of a credential are those of the process that
//! encoded it, as the encoding `munged` saw them over `SO_PEERCRED`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The shared object opened at run time (Debian's `libmunge2`).
pub const LIBRARY_NAME: &str = "libmunge.so.2";

// Option and error numbers of libmunge's `munge.h` (stable since munge 0.5).
const MUNGE_OPT_TTL: c_int = 4;
const MUNGE_OPT_SOCKET: c_int = 8;
const EMUNGE_SUCCESS: c_int = 0;
const EMUNGE_SOCKET: c_int = 6;
const EMUNGE_BAD_CRED: c_int = 8;
const EMUNGE_BAD_VERSION: c_int = 9;
const EMUNGE_BAD_CIPHER: c_int = 10;
const EMUNGE_BAD_MAC: c_int = 11;
const EMUNGE_BAD_ZIP: c_int = 12;
const EMUNGE_BAD_REALM: c_int = 13;
const EMUNGE_CRED_INVALID: c_int = 14;
const EMUNGE_CRED_EXPIRED: c_int = 15;
const EMUNGE_CRED_REWOUND: c_int = 16;
const EMUNGE_CRED_REPLAYED: c_int = 17;
const EMUNGE_CRED_UNAUTHORIZED: c_int = 18;

/// Longest credential accepted for decoding. A credential is base64 of a small header, the
/// payload and a MAC; Spillway's payloads are under 100 bytes, so real credentials are a few
/// hundred bytes.
pub const CREDENTIAL_BYTES_MAX: usize = 4096;

/// Why a credential could not be encoded or decoded. Each variant carries munge's own message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MungeError {
    /// `libmunge.so.2` cannot be loaded, or lacks a function.
    #[error("libmunge is not available: {message}")]
    Library { message: String },
    /// `munged` is not reachable at the socket (not running, wrong path, no permission).
    #[error("munged not reachable at {socket}: {message}")]
    SocketError { socket: String, message: String },
    /// Not a credential of this realm's key: forged, made with another key, damaged or garbage.
    #[error("invalid credential: {message}")]
    Invalid { message: String },
    /// Older than its time to live.
    #[error("expired credential: {message}")]
    Expired { message: String },
    /// Encoded in the future according to this host's clock.
    #[error("rewound credential (encoded in the future): {message}")]
    Rewound { message: String },
    /// This `munged` has decoded the same credential before.
    #[error("replayed credential: {message}")]
    Replayed { message: String },
    /// Anything else libmunge reports (out of memory, a bad argument, a payload too long).
    #[error("munge error {code}: {message}")]
    Other { code: i32, message: String },
}

/// A decoded credential: who encoded it and what it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub uid: u32,
    pub gid: u32,
    pub payload: Vec<u8>,
}

/// How to reach `munged` and how long credentials live.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MungeContext {
    /// `MUNGE_OPT_SOCKET`; `None`: libmunge's compiled-in default (`/run/munge/munge.socket.2`).
    socket: Option<PathBuf>,
    /// `MUNGE_OPT_TTL` of encoded credentials; `None`: the daemon's default (300 s).
    ttl: Option<Duration>,
}

impl MungeContext {
    /// libmunge's default socket and the daemon's default time to live.
    pub fn new() -> MungeContext {
        MungeContext::default()
    }

    /// Talks to the `munged` listening on `socket` (`None`: libmunge's default).
    pub fn with_socket(mut self, socket: Option<PathBuf>) -> MungeContext {
        self.socket = socket;
        self
    }

    /// Credentials encoded through this context expire `ttl` after encoding (whole seconds,
    /// at least 1; `munged` caps it at its `--max-ttl`).
    pub fn with_ttl(mut self, ttl: Duration) -> MungeContext {
        self.ttl = Some(ttl);
        self
    }

    /// The socket given, if any.
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The socket libmunge will use, for messages: the one given, else libmunge's default.
    pub fn socket_description(&self) -> String {
        match &self.socket {
            Some(path) => path.display().to_string(),
            None => match Library::get().and_then(default_socket) {
                Ok(path) => format!("{path} (libmunge's default)"),
                Err(_) => "libmunge's default socket".to_string(),
            },
        }
    }

    /// A credential carrying `payload`, as munge's NUL-free base64 text.
    pub fn encode(&self, payload: &[u8]) -> Result<String, MungeError> {
        let library = Library::get()?;
        let length = c_int::try_from(payload.len()).map_err(|_| MungeError::Other {
            code: 3,
            message: format!("payload of {} bytes is too long", payload.len()),
        })?;
        let context = Context::create(library, self)?;
        let mut credential: *mut c_char = std::ptr::null_mut();
        // SAFETY: `context` is a live libmunge context; `credential` is a valid out-pointer;
        // `payload` is readable for `length` bytes (libmunge only reads it).
        let code = unsafe {
            (library.encode)(&mut credential, context.raw, payload.as_ptr().cast(), length)
        };
        if code != EMUNGE_SUCCESS {
            return Err(context.error(code, self));
        }
        if credential.is_null() {
            return Err(MungeError::Other {
                code: 1,
                message: "munge_encode succeeded without a credential".into(),
            });
        }
        // SAFETY: on success libmunge returns a NUL-terminated string it allocated with malloc;
        // it stays valid until freed below.
        let text = unsafe { CStr::from_ptr(credential) }.to_string_lossy().into_owned();
        // SAFETY: the caller owns the credential and must free it with free(3); freed once.
        unsafe { libc::free(credential.cast()) };
        Ok(text)
    }

    /// Checks a credential with `munged` and returns who made it and its payload.
    pub fn decode(&self, credential: &str) -> Result<Decoded, MungeError> {
        if credential.is_empty() {
            return Err(MungeError::Invalid { message: "empty credential".into() });
        }
        if credential.len() > CREDENTIAL_BYTES_MAX {
            return Err(MungeError::Invalid {
                message: format!(
                    "credential of {} bytes is longer than {CREDENTIAL_BYTES_MAX}",
                    credential.len()
                ),
            });
        }
        let text = CString::new(credential).map_err(|_| MungeError::Invalid {
            message: "credential contains a NUL byte".into(),
        })?;
        let library = Library::get()?;
        let context = Context::create(library, self)?;
        let mut payload: *mut c_void = std::ptr::null_mut();
        let mut length: c_int = 0;
        let mut uid: libc::uid_t = 0;
        let mut gid: libc::gid_t = 0;
        // SAFETY: `text` is NUL-terminated and outlives the call; `context` is live; every
        // out-pointer points to a local of the type libmunge writes.
        let code = unsafe {
            (library.decode)(
                text.as_ptr(),
                context.raw,
                &mut payload,
                &mut length,
                &mut uid,
                &mut gid,
            )
        };
        let bytes = take_payload(payload, length);
        if code != EMUNGE_SUCCESS {
            return Err(context.error(code, self));
        }
        Ok(Decoded { uid, gid, payload: bytes })
    }
}

/// Copies and frees a payload libmunge allocated (also after some failures: expired, rewound,
/// replayed); empty when there is none.
fn take_payload(payload: *mut c_void, length: c_int) -> Vec<u8> {
    if payload.is_null() {
        return Vec::new();
    }
    let bytes = match usize::try_from(length) {
        // SAFETY: libmunge allocated `length` payload bytes at `payload` (plus a NUL).
        Ok(length) => unsafe { std::slice::from_raw_parts(payload as *const u8, length) }.to_vec(),
        Err(_) => Vec::new(),
    };
    // SAFETY: the caller owns the payload buffer, allocated with malloc; freed once.
    unsafe { libc::free(payload) };
    bytes
}

type EncodeFn = unsafe extern "C" fn(*mut *mut c_char, *mut c_void, *const c_void, c_int) -> c_int;
type DecodeFn = unsafe extern "C" fn(
    *const c_char,
    *mut c_void,
    *mut *mut c_void,
    *mut c_int,
    *mut libc::uid_t,
    *mut libc::gid_t,
) -> c_int;
type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
type ContextCreateFn = unsafe extern "C" fn() -> *mut c_void;
type ContextDestroyFn = unsafe extern "C" fn(*mut c_void);
type ContextStrerrorFn = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type ContextOptionFn = unsafe extern "C" fn(*mut c_void, c_int, ...) -> c_int;

/// The functions of libmunge this module calls, resolved once per process.
struct Library {
    encode: EncodeFn,
    decode: DecodeFn,
    strerror: StrerrorFn,
    context_create: ContextCreateFn,
    context_destroy: ContextDestroyFn,
    context_strerror: ContextStrerrorFn,
    context_set: ContextOptionFn,
    context_get: ContextOptionFn,
}

static LIBRARY: OnceLock<Result<Library, MungeError>> = OnceLock::new();

impl Library {
    /// The process's libmunge, opened on first use.
    fn get() -> Result<&'static Library, MungeError> {
        LIBRARY.get_or_init(|| Library::open(LIBRARY_NAME)).as_ref().map_err(Clone::clone)
    }

    /// Opens `name` with `dlopen` and resolves every function. The handle is never closed.
    fn open(name: &str) -> Result<Library, MungeError> {
        let file = CString::new(name)
            .map_err(|_| MungeError::Library { message: format!("{name:?} contains a NUL") })?;
        // SAFETY: `file` is NUL-terminated; dlopen runs libmunge's initialisers, which have no
        // preconditions.
        let handle = unsafe { libc::dlopen(file.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(MungeError::Library {
                message: format!(
                    "cannot load {name}: {} (install the libmunge2 package)",
                    dl_error()
                ),
            });
        }
        let symbol = |symbol: &str| -> Result<*mut c_void, MungeError> {
            let c_symbol = CString::new(symbol).expect("symbol names have no NUL");
            // SAFETY: `handle` is a live dlopen handle (never closed); the name is
            // NUL-terminated.
            let address = unsafe { libc::dlsym(handle, c_symbol.as_ptr()) };
            if address.is_null() {
                return Err(MungeError::Library {
                    message: format!("{name} has no function {symbol}: {}", dl_error()),
                });
            }
            Ok(address)
        };
        // SAFETY: each address is the named libmunge function (every transmute below), whose C
        // prototype in munge.h is exactly the function pointer type it becomes.
        unsafe {
            Ok(Library {
                encode: std::mem::transmute::<*mut c_void, EncodeFn>(symbol("munge_encode")?),
                decode: std::mem::transmute::<*mut c_void, DecodeFn>(symbol("munge_decode")?),
                strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(symbol("munge_strerror")?),
                context_create: std::mem::transmute::<*mut c_void, ContextCreateFn>(symbol(
                    "munge_ctx_create",
                )?),
                context_destroy: std::mem::transmute::<*mut c_void, ContextDestroyFn>(symbol(
                    "munge_ctx_destroy",
                )?),
                context_strerror: std::mem::transmute::<*mut c_void, ContextStrerrorFn>(symbol(
                    "munge_ctx_strerror",
                )?),
                context_set: std::mem::transmute::<*mut c_void, ContextOptionFn>(symbol(
                    "munge_ctx_set",
                )?),
                context_get: std::mem::transmute::<*mut c_void, ContextOptionFn>(symbol(
                    "munge_ctx_get",
                )?),
            })
        }
    }
}

/// The text of the last dlopen/dlsym failure.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "unknown dlopen error".into();
    }
    // SAFETY: non-null, NUL-terminated, see above.
    unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned()
}

/// Copies a libmunge message (never freed by the caller); `None` for NULL.
fn message_text(message: *const c_char) -> Option<String> {
    if message.is_null() {
        return None;
    }
    // SAFETY: libmunge returns NUL-terminated static or context-owned strings; copied at once,
    // while the context is alive.
    Some(unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned())
}

/// The socket libmunge uses when none is set.
fn default_socket(library: &'static Library) -> Result<String, MungeError> {
    let context = Context::create(library, &MungeContext::default())?;
    let mut socket: *const c_char = std::ptr::null();
    // SAFETY: MUNGE_OPT_SOCKET's value is a `char **` out-pointer; `context` is live.
    let code = unsafe { (library.context_get)(context.raw, MUNGE_OPT_SOCKET, &mut socket) };
    match message_text(socket) {
        Some(path) if code == EMUNGE_SUCCESS => Ok(path),
        _ => Err(context.error(code, &MungeContext::default())),
    }
}

/// One libmunge context, configured from a [`MungeContext`] and destroyed when dropped.
struct Context {
    library: &'static Library,
    raw: *mut c_void,
}

impl Context {
    fn create(library: &'static Library, settings: &MungeContext) -> Result<Context, MungeError> {
        // SAFETY: no preconditions; returns NULL when out of memory.
        let raw = unsafe { (library.context_create)() };
        if raw.is_null() {
            return Err(MungeError::Other {
                code: 5,
                message: "munge_ctx_create failed (out of memory)".into(),
            });
        }
        let context = Context { library, raw };
        if let Some(socket) = &settings.socket {
            use std::os::unix::ffi::OsStrExt;
            let path =
                CString::new(socket.as_os_str().as_bytes()).map_err(|_| MungeError::Other {
                    code: 2,
                    message: format!("socket path {} contains a NUL", socket.display()),
                })?;
            // SAFETY: MUNGE_OPT_SOCKET takes a `const char *`, which libmunge copies; `raw` is
            // live.
            let code = unsafe { (library.context_set)(raw, MUNGE_OPT_SOCKET, path.as_ptr()) };
            if code != EMUNGE_SUCCESS {
                return Err(context.error(code, settings));
            }
        }
        if let Some(ttl) = settings.ttl {
            let seconds = c_int::try_from(ttl.as_secs().max(1)).unwrap_or(c_int::MAX);
            // SAFETY: MUNGE_OPT_TTL takes an `int`; `raw` is live.
            let code = unsafe { (library.context_set)(raw, MUNGE_OPT_TTL, seconds) };
            if code != EMUNGE_SUCCESS {
                return Err(context.error(code, settings));
            }
        }
        Ok(context)
    }

    /// The error for `code`, with the context's detailed message (else munge's generic one).
    fn error(&self, code: c_int, settings: &MungeContext) -> MungeError {
        // SAFETY: `raw` is live; the message belongs to the context and is copied at once.
        let detailed = message_text(unsafe { (self.library.context_strerror)(self.raw) });
        // SAFETY: munge_strerror accepts any number and returns a static string.
        let generic = message_text(unsafe { (self.library.strerror)(code) });
        let message = detailed.or(generic).unwrap_or_else(|| format!("munge error {code}"));
        match code {
            EMUNGE_SOCKET => {
                MungeError::SocketError { socket: settings.socket_description(), message }
            }
            EMUNGE_BAD_CRED
            | EMUNGE_BAD_VERSION
            | EMUNGE_BAD_CIPHER
            | EMUNGE_BAD_MAC
            | EMUNGE_BAD_ZIP
            | EMUNGE_BAD_REALM
            | EMUNGE_CRED_INVALID
            | EMUNGE_CRED_UNAUTHORIZED => MungeError::Invalid { message },
            EMUNGE_CRED_EXPIRED => MungeError::Expired { message },
            EMUNGE_CRED_REWOUND => MungeError::Rewound { message },
            EMUNGE_CRED_REPLAYED => MungeError::Replayed { message },
            code => MungeError::Other { code, message },
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `raw` came from munge_ctx_create and is destroyed exactly once.
        unsafe { (self.library.context_destroy)(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_library_error_naming_it() {
        let Err(error) = Library::open("libmunge-that-does-not-exist.so.9") else {
            panic!("a library that does not exist was opened");
        };
        let MungeError::Library { message } = &error else { panic!("{error:?}") };
        assert!(message.contains("libmunge-that-does-not-exist.so.9"), "{message}");
        assert!(error.to_string().starts_with("libmunge is not available"), "{error}");
    }

    #[test]
    fn an_unreachable_daemon_is_a_socket_error_naming_the_socket() {
        let socket = std::env::temp_dir().join("spillway-no-munged-here.socket");
        let context = MungeContext::new().with_socket(Some(socket.clone()));
        let error = context.encode(b"x").unwrap_err();
        let MungeError::SocketError { socket: named, .. } = &error else { panic!("{error:?}") };
        assert_eq!(named, &socket.display().to_string());
        // Decoding needs the daemon too; a garbage credential must not be judged locally.
        assert!(matches!(
            context.decode("MUNGE:garbage:"),
            Err(MungeError::SocketError { .. } | MungeError::Invalid { .. })
        ));
    }

    #[test]
    fn malformed_credentials_are_invalid_before_any_daemon_is_asked() {
        let context = MungeContext::new()
            .with_socket(Some(std::env::temp_dir().join("spillway-no-munged-here.socket")));
        assert!(matches!(context.decode("a\0b"), Err(MungeError::Invalid { .. })));
        let long = "M".repeat(CREDENTIAL_BYTES_MAX + 1);
        assert!(matches!(context.decode(&long), Err(MungeError::Invalid { .. })));
    }

    #[test]
    fn the_default_socket_is_named() {
        let description = MungeContext::new().socket_description();
        assert!(description.contains("munge"), "{description}");
    }
}
