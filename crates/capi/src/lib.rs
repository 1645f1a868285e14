//! The C ABI of the Spillway client: `libspillway.so` and the generated `include/spillway.h`.
//!
//! HPC applications and I/O libraries are C, C++ and Fortran; this crate exposes the Rust
//! checkpoint client ([`::spillway_client::Client`]) to them through a small, stable surface:
//!
//! * opaque handles (`spillway_client *`, `spillway_file *`) created and destroyed by the library;
//! * every fallible function returns `0` on success or a **negative errno** (the protocol's one
//!   errno table); `spillway_last_error_message()` gives this thread's reason in words;
//! * buffers are owned by the caller, strings are NUL-terminated UTF-8 and only borrowed for
//!   the duration of the call;
//! * no Rust panic crosses the boundary: it is caught and reported as `-EIO` (the workspace
//!   keeps Cargo's default `panic = "unwind"` for this; with `abort` the process would abort);
//! * a handle may be shared by threads: calls on one client are serialised by a mutex.
//!
//! The header is generated from this file by cbindgen and committed; `tests/header.rs` fails when
//! they drift (see docs/design/c-api.md).

#![allow(non_camel_case_types)]

mod error;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use ::spillway_client::{Client, ClientOptions, FileHandle, Placement};
use spillway_proto::{Durability, Endpoint, EpochState, ErrorCode};
use spillway_types::EpochId;

pub use error::CapiError;

/// `spillway_options.placement`: files are cut in stripe units spread over the servers (DataWarp).
pub const SPILLWAY_PLACEMENT_STRIPED: u32 = 0;
/// `spillway_options.placement`: this process writes only to server `rank % servers` (BurstMem).
pub const SPILLWAY_PLACEMENT_LOCAL: u32 = 1;

/// `spillway_options.durability`: whatever each server is configured with.
pub const SPILLWAY_DURABILITY_SERVER_DEFAULT: u32 = 0;
/// `spillway_options.durability`: commit returns once the epoch is fsync'd in every server's SSD
/// log (survives server crashes and power loss).
pub const SPILLWAY_DURABILITY_SSD: u32 = 1;
/// `spillway_options.durability`: commit returns once every server holds the epoch in DRAM
/// (survives a client crash, not a server crash).
pub const SPILLWAY_DURABILITY_MEMORY: u32 = 2;
/// `spillway_options.durability`: commit returns once every piece is in DRAM on `replicas`
/// (at least 2) servers of distinct failure domains (survives the loss of a host).
pub const SPILLWAY_DURABILITY_REPLICATED: u32 = 3;

/// `spillway_epoch_info.state`: still being written.
pub const SPILLWAY_EPOCH_OPEN: u32 = 0;
/// `spillway_epoch_info.state`: committed in DRAM on some server, its SSD log not yet synced.
pub const SPILLWAY_EPOCH_COMMITTED_MEMORY: u32 = 1;
/// `spillway_epoch_info.state`: committed and durable on every server holding it.
pub const SPILLWAY_EPOCH_COMMITTED: u32 = 2;
/// `spillway_epoch_info.state`: drained to the parallel file system.
pub const SPILLWAY_EPOCH_DRAINED: u32 = 3;

/// Bytes of `spillway_server_status.server_name`, including the terminating NUL.
pub const SPILLWAY_SERVER_NAME_BYTES: usize = 64;

/// Client settings. Initialise with `spillway_options_init`, then change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct spillway_options {
    /// `SPILLWAY_PLACEMENT_STRIPED` or `SPILLWAY_PLACEMENT_LOCAL`.
    pub placement: u32,
    /// Striped placement: servers a file is spread over (0: all of them).
    pub stripe_count: u32,
    /// Striped placement: bytes per stripe unit (> 0).
    pub stripe_unit_bytes: u64,
    /// Local placement: this process's rank (it writes to server `rank % servers`).
    pub rank: u32,
    /// One of the `SPILLWAY_DURABILITY_*` values; applies to `spillway_commit_epoch`.
    pub durability: u32,
    /// Pipelined requests per server connection (> 0; capped by the server).
    pub window: u32,
    /// Copies of every piece, on servers of distinct failure domains (hosts): 0 or 1 for one
    /// copy, at most 4. Writes succeed once every copy is acknowledged; reads fall back to
    /// another copy when a server is unreachable.
    pub replicas: u32,
    /// Largest single write or read request in bytes (> 0; capped by the server).
    pub transfer_bytes_max: u64,
}

/// One epoch as seen over all servers (filled by `spillway_list_epochs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct spillway_epoch_info {
    pub epoch: u64,
    /// The least advanced `SPILLWAY_EPOCH_*` state over the servers holding the epoch.
    pub state: u32,
    /// Servers holding part of the epoch.
    pub servers: u32,
    /// Bytes of the epoch summed over servers.
    pub bytes: u64,
}

/// One server's status (filled by `spillway_status`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct spillway_server_status {
    /// NUL-terminated, truncated to `SPILLWAY_SERVER_NAME_BYTES - 1` bytes.
    pub server_name: [c_char; SPILLWAY_SERVER_NAME_BYTES],
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
}

/// Called by `spillway_list_files` once per file: its name (borrowed for the call only), its
/// size in bytes and the caller's `context`. Return 0 to continue, non-zero to stop.
pub type spillway_file_callback = Option<
    unsafe extern "C" fn(name: *const c_char, size_bytes: u64, context: *mut c_void) -> c_int,
>;

/// A connection to every server of one reservation (opaque).
pub struct spillway_client {
    id: u64,
    client: Mutex<Client>,
}

/// A file of an epoch, opened or created through one client (opaque).
pub struct spillway_file {
    client_id: u64,
    handle: Mutex<FileHandle>,
}

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Runs `body`, turning its error or panic into a negative errno and this thread's last error.
fn guard(operation: &'static str, body: impl FnOnce() -> Result<(), CapiError>) -> c_int {
    error::clear_last_error();
    let error = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return 0,
        Ok(Err(error)) => error,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            CapiError::Panic(message)
        }
    };
    let errno = error.errno();
    assert!(errno > 0, "CapiError::errno is positive by construction");
    error::set_last_error(format!("{operation}: {error}"));
    -errno
}

fn non_null<'a, T>(pointer: *const T, argument: &'static str) -> Result<&'a T, CapiError> {
    // SAFETY: the caller promises non-NULL pointers are valid for the call's duration.
    unsafe { pointer.as_ref() }.ok_or(CapiError::NullArgument(argument))
}

fn string<'a>(pointer: *const c_char, argument: &'static str) -> Result<&'a str, CapiError> {
    if pointer.is_null() {
        return Err(CapiError::NullArgument(argument));
    }
    // SAFETY: the caller promises a NUL-terminated string valid for the call's duration.
    unsafe { CStr::from_ptr(pointer) }.to_str().map_err(|_| CapiError::InvalidUtf8 { argument })
}

fn lock_client(
    client: *const spillway_client,
) -> Result<(u64, MutexGuard<'static, Client>), CapiError> {
    let client: &'static spillway_client = non_null(client, "client")?;
    let guard = client.client.lock().map_err(|_| CapiError::Poisoned("client"))?;
    Ok((client.id, guard))
}

fn lock_file(
    file: *const spillway_file,
    client_id: u64,
) -> Result<MutexGuard<'static, FileHandle>, CapiError> {
    let file: &'static spillway_file = non_null(file, "file")?;
    let handle = file.handle.lock().map_err(|_| CapiError::Poisoned("file"))?;
    if file.client_id != client_id {
        return Err(CapiError::ForeignFile { name: handle.name.clone(), epoch: handle.epoch.0 });
    }
    Ok(handle)
}

fn client_options(options: &spillway_options) -> Result<ClientOptions, CapiError> {
    let placement = match options.placement {
        SPILLWAY_PLACEMENT_STRIPED => {
            if options.stripe_unit_bytes == 0 {
                return Err(CapiError::InvalidArgument("options.stripe_unit_bytes is 0".into()));
            }
            let stripe_count =
                if options.stripe_count == 0 { u32::MAX } else { options.stripe_count };
            Placement::Striped { stripe_unit_bytes: options.stripe_unit_bytes, stripe_count }
        }
        SPILLWAY_PLACEMENT_LOCAL => Placement::Local { rank: options.rank },
        other => {
            return Err(CapiError::InvalidArgument(format!(
                "options.placement {other} is not a SPILLWAY_PLACEMENT_* value"
            )))
        }
    };
    let durability = match options.durability {
        SPILLWAY_DURABILITY_SERVER_DEFAULT => Durability::ServerDefault,
        SPILLWAY_DURABILITY_SSD => Durability::Ssd,
        SPILLWAY_DURABILITY_MEMORY => Durability::Memory,
        SPILLWAY_DURABILITY_REPLICATED => Durability::Replicated,
        other => {
            return Err(CapiError::InvalidArgument(format!(
                "options.durability {other} is not a SPILLWAY_DURABILITY_* value"
            )))
        }
    };
    if options.window == 0 {
        return Err(CapiError::InvalidArgument("options.window is 0".into()));
    }
    if options.transfer_bytes_max == 0 {
        return Err(CapiError::InvalidArgument("options.transfer_bytes_max is 0".into()));
    }
    // Tiering comes from the job's environment (SPILLWAY_TIERING, set by Slurm's
    // `tiering=`; docs/design/ias.md).
    let tiering =
        spillway_manager::tiering::tiering_from_env().map_err(CapiError::InvalidArgument)?;
    Ok(ClientOptions {
        placement,
        durability,
        tiering,
        replicas: options.replicas.max(1),
        window: options.window,
        transfer_bytes_max: options.transfer_bytes_max,
        ..ClientOptions::default()
    })
}

fn default_options() -> spillway_options {
    let defaults = ClientOptions::default();
    let (stripe_unit_bytes, stripe_count) = match defaults.placement {
        Placement::Striped { stripe_unit_bytes, stripe_count } => {
            (stripe_unit_bytes, if stripe_count == u32::MAX { 0 } else { stripe_count })
        }
        Placement::Local { .. } => (1 << 20, 0),
    };
    spillway_options {
        placement: SPILLWAY_PLACEMENT_STRIPED,
        stripe_count,
        stripe_unit_bytes,
        rank: 0,
        durability: SPILLWAY_DURABILITY_SERVER_DEFAULT,
        window: defaults.window,
        replicas: defaults.replicas,
        transfer_bytes_max: defaults.transfer_bytes_max,
    }
}

fn epoch_state(state: EpochState) -> u32 {
    match state {
        EpochState::Open => SPILLWAY_EPOCH_OPEN,
        EpochState::CommittedMemory => SPILLWAY_EPOCH_COMMITTED_MEMORY,
        EpochState::Committed => SPILLWAY_EPOCH_COMMITTED,
        EpochState::Drained => SPILLWAY_EPOCH_DRAINED,
    }
}

/// The library version ("0.1.0"), a static string.
#[no_mangle]
pub extern "C" fn spillway_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// This thread's reason for the failure of its most recent Spillway call ("" after a success).
/// Owned by the library; valid until the next Spillway call on this thread. Never NULL.
#[no_mangle]
pub extern "C" fn spillway_last_error_message() -> *const c_char {
    error::last_error_pointer()
}

/// A short description of a (positive or negative) errno that Spillway returns, or NULL for a
/// value that is not in Spillway's errno table. Static string.
#[no_mangle]
pub extern "C" fn spillway_strerror(error_number: c_int) -> *const c_char {
    let errno = error_number.checked_abs().unwrap_or(0);
    match ErrorCode::all().find(|code| code.errno() == errno) {
        Some(code) => describe_static(code),
        None => std::ptr::null(),
    }
}

fn describe_static(code: ErrorCode) -> *const c_char {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::sync::OnceLock;
    static TABLE: OnceLock<HashMap<i32, CString>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = HashMap::new();
        for code in ErrorCode::all() {
            // Several codes share an errno; the first in wire order names it.
            table.entry(code.errno()).or_insert_with(|| {
                CString::new(code.describe()).expect("descriptions have no NUL")
            });
        }
        table
    });
    table[&code.errno()].as_ptr()
}

/// Fills `*options` with the defaults: striped over all servers in 1 MiB units, server-default
/// durability, 8 pipelined requests, 4 MiB transfers.
///
/// # Safety
/// `options` is NULL (then `-EINVAL`) or points to writable memory for a `spillway_options`.
#[no_mangle]
pub unsafe extern "C" fn spillway_options_init(options: *mut spillway_options) -> c_int {
    guard("spillway_options_init", || {
        if options.is_null() {
            return Err(CapiError::NullArgument("options"));
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { options.write(default_options()) };
        Ok(())
    })
}

/// Connects to every server of a reservation. `endpoints` holds `endpoint_count` addresses
/// (`tcp://IP:PORT`, `IP:PORT` or `unix:///PATH`), in the reservation's order (placement depends
/// on it). `options` may be NULL for the defaults. On success `*client_out` is a new handle to be
/// released with `spillway_disconnect`; on failure it is set to NULL.
///
/// # Safety
/// `endpoints` points to `endpoint_count` NUL-terminated strings; `options` is NULL or valid;
/// `client_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn spillway_connect(
    endpoints: *const *const c_char,
    endpoint_count: usize,
    options: *const spillway_options,
    client_out: *mut *mut spillway_client,
) -> c_int {
    guard("spillway_connect", || {
        if client_out.is_null() {
            return Err(CapiError::NullArgument("client_out"));
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { client_out.write(std::ptr::null_mut()) };
        if endpoints.is_null() {
            return Err(CapiError::NullArgument("endpoints"));
        }
        if endpoint_count == 0 {
            return Err(CapiError::InvalidArgument("endpoint_count is 0".into()));
        }
        // SAFETY: `endpoints` points to `endpoint_count` pointers per the contract.
        let pointers = unsafe { std::slice::from_raw_parts(endpoints, endpoint_count) };
        let parsed = pointers
            .iter()
            .enumerate()
            .map(|(index, &pointer)| {
                string(pointer, "endpoints[i]")?
                    .parse::<Endpoint>()
                    .map_err(|message| CapiError::BadEndpoint { index, message })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options =
            if options.is_null() { default_options() } else { *non_null(options, "options")? };
        let client = Client::connect(&parsed, client_options(&options)?)?;
        let id = NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed);
        let handle = Box::new(spillway_client { id, client: Mutex::new(client) });
        // SAFETY: checked non-NULL above.
        unsafe { client_out.write(Box::into_raw(handle)) };
        Ok(())
    })
}

/// Closes every connection and frees the handle. Writes not yet flushed or committed are not
/// waited for. NULL is ignored. Close the client's files first or after; both orders are fine.
///
/// # Safety
/// `client` is NULL or a handle from `spillway_connect` not yet disconnected, and no other thread
/// uses it.
#[no_mangle]
pub unsafe extern "C" fn spillway_disconnect(client: *mut spillway_client) {
    if client.is_null() {
        return;
    }
    let _ = guard("spillway_disconnect", || {
        // SAFETY: came from Box::into_raw in spillway_connect, per the contract.
        drop(unsafe { Box::from_raw(client) });
        Ok(())
    });
}

/// The number of servers the client is connected to, or a negative errno.
///
/// # Safety
/// `client` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn spillway_server_count(client: *const spillway_client) -> c_int {
    let mut count = 0;
    let status = guard("spillway_server_count", || {
        let (_, client) = lock_client(client)?;
        count = c_int::try_from(client.server_count())
            .map_err(|_| CapiError::InvalidArgument("too many servers".into()))?;
        Ok(())
    });
    if status < 0 {
        status
    } else {
        count
    }
}

/// Begins epoch `epoch` (BurstMem's checkpoint timestamp) for this client.
///
/// # Safety
/// `client` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn spillway_begin_epoch(client: *mut spillway_client, epoch: u64) -> c_int {
    guard("spillway_begin_epoch", || {
        let (_, mut client) = lock_client(client)?;
        client.begin_epoch(EpochId(epoch));
        Ok(())
    })
}

fn open_common(
    operation: &'static str,
    client: *mut spillway_client,
    epoch: u64,
    name: *const c_char,
    file_out: *mut *mut spillway_file,
    create: bool,
) -> c_int {
    guard(operation, || {
        if file_out.is_null() {
            return Err(CapiError::NullArgument("file_out"));
        }
        // SAFETY: non-NULL and writable per the contract.
        unsafe { file_out.write(std::ptr::null_mut()) };
        let name = string(name, "name")?;
        let (client_id, mut client) = lock_client(client)?;
        let handle = if create {
            client.create_file(EpochId(epoch), name)?
        } else {
            client.open_file(EpochId(epoch), name)?
        };
        let file = Box::new(spillway_file { client_id, handle: Mutex::new(handle) });
        // SAFETY: checked non-NULL above.
        unsafe { file_out.write(Box::into_raw(file)) };
        Ok(())
    })
}

/// Creates file `name` in `epoch` (or opens it, if another process created it: N-1 files are
/// created by every writer). `*file_out` is a new handle for `spillway_file_close`, NULL on error.
///
/// # Safety
/// `client` is NULL or a live handle; `name` is NULL or a NUL-terminated string; `file_out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn spillway_create_file(
    client: *mut spillway_client,
    epoch: u64,
    name: *const c_char,
    file_out: *mut *mut spillway_file,
) -> c_int {
    open_common("spillway_create_file", client, epoch, name, file_out, true)
}

/// Opens an existing file of `epoch` for reading (restart). `-ENOENT` if no server has it.
///
/// # Safety
/// As for `spillway_create_file`.
#[no_mangle]
pub unsafe extern "C" fn spillway_open_file(
    client: *mut spillway_client,
    epoch: u64,
    name: *const c_char,
    file_out: *mut *mut spillway_file,
) -> c_int {
    open_common("spillway_open_file", client, epoch, name, file_out, false)
}

/// Frees a file handle (the file itself stays in its epoch). NULL is ignored.
///
/// # Safety
/// `file` is NULL or a handle from `spillway_create_file`/`spillway_open_file` not yet closed, and
/// no other thread uses it.
#[no_mangle]
pub unsafe extern "C" fn spillway_file_close(file: *mut spillway_file) {
    if file.is_null() {
        return;
    }
    let _ = guard("spillway_file_close", || {
        // SAFETY: came from Box::into_raw in open_common, per the contract.
        drop(unsafe { Box::from_raw(file) });
        Ok(())
    });
}

/// Writes `length` bytes from `data` at byte `offset` of `file`. Returns once the bytes are sent
/// (the buffer is the caller's again); failures surface here or by the next `spillway_flush` or
/// `spillway_commit_epoch`.
///
/// # Safety
/// `client` and `file` are live handles (`file` from this client); `data` points to `length`
/// readable bytes (may be NULL when `length` is 0).
#[no_mangle]
pub unsafe extern "C" fn spillway_write(
    client: *mut spillway_client,
    file: *mut spillway_file,
    offset: u64,
    data: *const c_void,
    length: usize,
) -> c_int {
    guard("spillway_write", || {
        let (client_id, mut client) = lock_client(client)?;
        let mut file = lock_file(file, client_id)?;
        let bytes: &[u8] = if length == 0 {
            &[]
        } else {
            let data = non_null(data.cast::<u8>(), "data")?;
            // SAFETY: `data` points to `length` readable bytes per the contract.
            unsafe { std::slice::from_raw_parts(data, length) }
        };
        client.write(&mut file, offset, bytes)?;
        Ok(())
    })
}

/// Waits until every write sent so far is acknowledged by its server (held in DRAM).
///
/// # Safety
/// `client` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn spillway_flush(client: *mut spillway_client) -> c_int {
    guard("spillway_flush", || {
        let (_, mut client) = lock_client(client)?;
        client.flush()?;
        Ok(())
    })
}

/// Commits `epoch` on every server this client wrote it to, at the configured durability. In an
/// N-1 checkpoint every writer calls it after the barrier that ends the write phase.
///
/// # Safety
/// `client` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn spillway_commit_epoch(client: *mut spillway_client, epoch: u64) -> c_int {
    guard("spillway_commit_epoch", || {
        let (_, mut client) = lock_client(client)?;
        client.commit_epoch(EpochId(epoch))?;
        Ok(())
    })
}

/// Reads `length` bytes at `offset` of `file` into `buffer` from whichever servers hold them;
/// bytes nobody wrote read as zeros.
///
/// # Safety
/// `client` and `file` are live handles (`file` from this client); `buffer` points to `length`
/// writable bytes (may be NULL when `length` is 0).
#[no_mangle]
pub unsafe extern "C" fn spillway_read(
    client: *mut spillway_client,
    file: *const spillway_file,
    offset: u64,
    buffer: *mut c_void,
    length: usize,
) -> c_int {
    guard("spillway_read", || {
        let (client_id, mut client) = lock_client(client)?;
        let file = lock_file(file, client_id)?;
        let bytes: &mut [u8] = if length == 0 {
            &mut []
        } else {
            if buffer.is_null() {
                return Err(CapiError::NullArgument("buffer"));
            }
            // SAFETY: `buffer` points to `length` writable bytes per the contract.
            unsafe { std::slice::from_raw_parts_mut(buffer.cast::<u8>(), length) }
        };
        client.read(&file, offset, bytes)?;
        Ok(())
    })
}

/// Stores in `*size_bytes_out` the file's size: one past the highest byte any server holds.
///
/// # Safety
/// `client` and `file` are live handles (`file` from this client); `size_bytes_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn spillway_file_size(
    client: *mut spillway_client,
    file: *const spillway_file,
    size_bytes_out: *mut u64,
) -> c_int {
    guard("spillway_file_size", || {
        if size_bytes_out.is_null() {
            return Err(CapiError::NullArgument("size_bytes_out"));
        }
        let (client_id, mut client) = lock_client(client)?;
        let file = lock_file(file, client_id)?;
        let size = client.file_size(&file)?;
        // SAFETY: checked non-NULL above.
        unsafe { size_bytes_out.write(size) };
        Ok(())
    })
}

/// Lists every epoch on any server, in epoch order. Fills at most `capacity` entries of `epochs`
/// and stores the total number in `*count_out` (call with `capacity` 0 to size the array; when the
/// total exceeds `capacity` only the first `capacity` are filled and 0 is still returned).
///
/// # Safety
/// `client` is a live handle; `epochs` points to `capacity` writable entries (may be NULL when
/// `capacity` is 0); `count_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn spillway_list_epochs(
    client: *mut spillway_client,
    epochs: *mut spillway_epoch_info,
    capacity: usize,
    count_out: *mut usize,
) -> c_int {
    guard("spillway_list_epochs", || {
        if count_out.is_null() {
            return Err(CapiError::NullArgument("count_out"));
        }
        if epochs.is_null() && capacity > 0 {
            return Err(CapiError::NullArgument("epochs"));
        }
        let (_, mut client) = lock_client(client)?;
        let list = client.list_epochs()?;
        for (i, summary) in list.iter().take(capacity).enumerate() {
            let info = spillway_epoch_info {
                epoch: summary.epoch.0,
                state: epoch_state(summary.state),
                servers: u32::try_from(summary.servers).unwrap_or(u32::MAX),
                bytes: summary.bytes,
            };
            // SAFETY: i < capacity and `epochs` holds `capacity` entries per the contract.
            unsafe { epochs.add(i).write(info) };
        }
        // SAFETY: checked non-NULL above.
        unsafe { count_out.write(list.len()) };
        Ok(())
    })
}

/// Calls `callback(name, size_bytes, context)` for every file of `epoch` over all servers, in
/// name order, until it returns non-zero. An epoch no server has lists nothing.
///
/// # Safety
/// `client` is a live handle; `callback` is a valid function. The client is not locked while the
/// callback runs, so the callback may call Spillway functions (even on the same client).
#[no_mangle]
pub unsafe extern "C" fn spillway_list_files(
    client: *mut spillway_client,
    epoch: u64,
    callback: spillway_file_callback,
    context: *mut c_void,
) -> c_int {
    guard("spillway_list_files", || {
        let callback = callback.ok_or(CapiError::NullArgument("callback"))?;
        let files = {
            let (_, mut client) = lock_client(client)?;
            client.list_files(EpochId(epoch))?
        };
        for (name, size) in files {
            let name =
                std::ffi::CString::new(name.replace('\0', "\\0")).expect("NULs were replaced");
            // SAFETY: valid callback per the contract; `name` lives across the call.
            if unsafe { callback(name.as_ptr(), size, context) } != 0 {
                break;
            }
        }
        Ok(())
    })
}

/// Deletes `epoch` on every server that has it (an epoch no server has is not an error).
///
/// # Safety
/// `client` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn spillway_delete_epoch(client: *mut spillway_client, epoch: u64) -> c_int {
    guard("spillway_delete_epoch", || {
        let (_, mut client) = lock_client(client)?;
        client.delete_epoch(EpochId(epoch))?;
        Ok(())
    })
}

/// Fills at most `capacity` entries of `statuses` with each server's status, in the order given
/// to `spillway_connect`, and stores the number of servers in `*count_out`.
///
/// # Safety
/// `client` is a live handle; `statuses` points to `capacity` writable entries (may be NULL when
/// `capacity` is 0); `count_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn spillway_status(
    client: *mut spillway_client,
    statuses: *mut spillway_server_status,
    capacity: usize,
    count_out: *mut usize,
) -> c_int {
    guard("spillway_status", || {
        if count_out.is_null() {
            return Err(CapiError::NullArgument("count_out"));
        }
        if statuses.is_null() && capacity > 0 {
            return Err(CapiError::NullArgument("statuses"));
        }
        let (_, mut client) = lock_client(client)?;
        let list = client.status()?;
        for (i, s) in list.iter().take(capacity).enumerate() {
            let mut server_name = [0 as c_char; SPILLWAY_SERVER_NAME_BYTES];
            for (target, &source) in server_name
                .iter_mut()
                .zip(s.server_name.as_bytes().iter().take(SPILLWAY_SERVER_NAME_BYTES - 1))
            {
                *target = source as c_char;
            }
            let status = spillway_server_status {
                server_name,
                connections: s.connections,
                connections_max: s.connections_max,
                in_flight_bytes: s.in_flight_bytes,
                in_flight_bytes_max: s.in_flight_bytes_max,
                requests_served: s.requests_served,
                bytes_written: s.bytes_written,
                bytes_read: s.bytes_read,
                dram_bytes_used: s.dram_bytes_used,
                dram_bytes_max: s.dram_bytes_max,
                ssd_bytes_used: s.ssd_bytes_used,
                ssd_bytes_max: s.ssd_bytes_max,
                epochs: s.epochs,
            };
            // SAFETY: i < capacity and `statuses` holds `capacity` entries per the contract.
            unsafe { statuses.add(i).write(status) };
        }
        // SAFETY: checked non-NULL above.
        unsafe { count_out.write(list.len()) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::ptr;

    fn last_error() -> String {
        // SAFETY: the library returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(spillway_last_error_message()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_is_caught_and_reported_as_eio() {
        let status = guard("test_operation", || panic!("deliberate test panic"));
        assert_eq!(status, -libc::EIO);
        let message = last_error();
        assert!(
            message.contains("test_operation") && message.contains("deliberate test panic"),
            "{message}"
        );
        assert_eq!(guard("ok", || Ok(())), 0);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn replicas_and_replicated_durability_reach_the_client_options() {
        let mut options = default_options();
        assert_eq!(client_options(&options).unwrap().replicas, 1, "0 is one copy");
        options.replicas = 2;
        options.durability = SPILLWAY_DURABILITY_REPLICATED;
        let converted = client_options(&options).unwrap();
        assert_eq!((converted.replicas, converted.durability), (2, Durability::Replicated));
        options.durability = 9;
        assert!(client_options(&options).is_err());
    }

    #[test]
    fn null_arguments_are_einval_with_the_argument_named() {
        // SAFETY: the entry points are documented to check every pointer for null first.
        unsafe {
            assert_eq!(spillway_begin_epoch(ptr::null_mut(), 1), -libc::EINVAL);
            assert!(last_error().contains("`client`"), "{}", last_error());
            assert_eq!(spillway_options_init(ptr::null_mut()), -libc::EINVAL);
            let mut client = ptr::NonNull::<spillway_client>::dangling().as_ptr();
            assert_eq!(spillway_connect(ptr::null(), 1, ptr::null(), &mut client), -libc::EINVAL);
            assert!(client.is_null(), "client_out is cleared on failure");
            assert_eq!(
                spillway_connect(ptr::null(), 1, ptr::null(), ptr::null_mut()),
                -libc::EINVAL
            );
            spillway_disconnect(ptr::null_mut());
            spillway_file_close(ptr::null_mut());
        }
    }

    #[test]
    fn bad_endpoints_and_options_are_einval_before_any_connection() {
        let good = CString::new("127.0.0.1:1").unwrap();
        let bad = CString::new("not an address").unwrap();
        let endpoints = [good.as_ptr(), bad.as_ptr()];
        let mut client = ptr::null_mut();
        // SAFETY: `endpoints` holds two valid C strings that outlive the calls; null options
        // mean the defaults.
        unsafe {
            assert_eq!(
                spillway_connect(endpoints.as_ptr(), 2, ptr::null(), &mut client),
                -libc::EINVAL
            );
            assert!(last_error().contains("address #1"), "{}", last_error());
            let mut options = std::mem::zeroed::<spillway_options>();
            assert_eq!(spillway_options_init(&mut options), 0);
            assert_eq!(options.window, 64);
            options.placement = 7;
            assert_eq!(
                spillway_connect(endpoints.as_ptr(), 1, &options, &mut client),
                -libc::EINVAL
            );
            assert!(last_error().contains("options.placement 7"), "{}", last_error());
            let not_utf8 = [0xffu8 as c_char, 0];
            let endpoints = [not_utf8.as_ptr()];
            assert_eq!(
                spillway_connect(endpoints.as_ptr(), 1, ptr::null(), &mut client),
                -libc::EINVAL
            );
            assert!(last_error().contains("UTF-8"), "{}", last_error());
        }
        assert!(client.is_null());
    }

    #[test]
    fn connection_refused_is_the_os_errno() {
        // Bind then drop a listener: its port is (almost certainly) closed now.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = CString::new(format!("127.0.0.1:{port}")).unwrap();
        let endpoints = [address.as_ptr()];
        let mut client = ptr::null_mut();
        // SAFETY: one valid C string in `endpoints`; `client` is a valid out-pointer.
        let status = unsafe { spillway_connect(endpoints.as_ptr(), 1, ptr::null(), &mut client) };
        assert_eq!(status, -libc::ECONNREFUSED, "{}", last_error());
        assert!(
            last_error().contains(&port.to_string()),
            "the message names the server: {}",
            last_error()
        );
    }

    #[test]
    fn strerror_covers_the_table() {
        for code in ErrorCode::all() {
            let text = spillway_strerror(-code.errno());
            assert!(!text.is_null(), "{code:?}");
        }
        assert!(spillway_strerror(0).is_null());
        assert!(spillway_strerror(c_int::MIN).is_null());
        // SAFETY: the version is a static NUL-terminated string.
        let version = unsafe { CStr::from_ptr(spillway_version()) };
        assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
