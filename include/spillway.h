/*
 * spillway.h — C ABI of the Spillway burst buffer client (libspillway.so).
 *
 * Conventions: functions returning int return 0 (or a count) on success and a NEGATIVE errno on
 * failure; spillway_last_error_message() then says why, in words. Handles are opaque and freed
 * only by spillway_disconnect / spillway_file_close; buffers belong to the caller; strings are
 * NUL-terminated UTF-8 borrowed for the call. See docs/design/c-api.md.
 *
 * Generated from crates/capi/src by cbindgen — do not edit.
 * Regenerate with: SPILLWAY_BLESS_HEADER=1 cargo test -p spillway-capi --test header
 */

#ifndef SPILLWAY_H
#define SPILLWAY_H

#include <stddef.h>
#include <stdint.h>

// `spillway_options.placement`: files are cut in stripe units spread over the servers (DataWarp).
#define SPILLWAY_PLACEMENT_STRIPED 0

// `spillway_options.placement`: this process writes only to server `rank % servers` (BurstMem).
#define SPILLWAY_PLACEMENT_LOCAL 1

// `spillway_options.durability`: whatever each server is configured with.
#define SPILLWAY_DURABILITY_SERVER_DEFAULT 0

// `spillway_options.durability`: commit returns once the epoch is fsync'd in every server's SSD
// log (survives server crashes and power loss).
#define SPILLWAY_DURABILITY_SSD 1

// `spillway_options.durability`: commit returns once every server holds the epoch in DRAM
// (survives a client crash, not a server crash).
#define SPILLWAY_DURABILITY_MEMORY 2

// `spillway_options.durability`: commit returns once every piece is in DRAM on `replicas`
// (at least 2) servers of distinct failure domains (survives the loss of a host).
#define SPILLWAY_DURABILITY_REPLICATED 3

// `spillway_epoch_info.state`: still being written.
#define SPILLWAY_EPOCH_OPEN 0

// `spillway_epoch_info.state`: committed in DRAM on some server, its SSD log not yet synced.
#define SPILLWAY_EPOCH_COMMITTED_MEMORY 1

// `spillway_epoch_info.state`: committed and durable on every server holding it.
#define SPILLWAY_EPOCH_COMMITTED 2

// `spillway_epoch_info.state`: drained to the parallel file system.
#define SPILLWAY_EPOCH_DRAINED 3

// Bytes of `spillway_server_status.server_name`, including the terminating NUL.
#define SPILLWAY_SERVER_NAME_BYTES 64

// A connection to every server of one reservation (opaque).
typedef struct spillway_client spillway_client;

// A file of an epoch, opened or created through one client (opaque).
typedef struct spillway_file spillway_file;

// Client settings. Initialise with `spillway_options_init`, then change fields.
typedef struct spillway_options {
  // `SPILLWAY_PLACEMENT_STRIPED` or `SPILLWAY_PLACEMENT_LOCAL`.
  uint32_t placement;
  // Striped placement: servers a file is spread over (0: all of them).
  uint32_t stripe_count;
  // Striped placement: bytes per stripe unit (> 0).
  uint64_t stripe_unit_bytes;
  // Local placement: this process's rank (it writes to server `rank % servers`).
  uint32_t rank;
  // One of the `SPILLWAY_DURABILITY_*` values; applies to `spillway_commit_epoch`.
  uint32_t durability;
  // Pipelined requests per server connection (> 0; capped by the server).
  uint32_t window;
  // Copies of every piece, on servers of distinct failure domains (hosts): 0 or 1 for one
  // copy, at most 4. Writes succeed once every copy is acknowledged; reads fall back to
  // another copy when a server is unreachable.
  uint32_t replicas;
  // Largest single write or read request in bytes (> 0; capped by the server).
  uint64_t transfer_bytes_max;
} spillway_options;

// One epoch as seen over all servers (filled by `spillway_list_epochs`).
typedef struct spillway_epoch_info {
  uint64_t epoch;
  // The least advanced `SPILLWAY_EPOCH_*` state over the servers holding the epoch.
  uint32_t state;
  // Servers holding part of the epoch.
  uint32_t servers;
  // Bytes of the epoch summed over servers.
  uint64_t bytes;
} spillway_epoch_info;

// Called by `spillway_list_files` once per file: its name (borrowed for the call only), its
// size in bytes and the caller's `context`. Return 0 to continue, non-zero to stop.
typedef int (*spillway_file_callback)(const char *name, uint64_t size_bytes, void *context);

// One server's status (filled by `spillway_status`).
typedef struct spillway_server_status {
  // NUL-terminated, truncated to `SPILLWAY_SERVER_NAME_BYTES - 1` bytes.
  char server_name[SPILLWAY_SERVER_NAME_BYTES];
  uint32_t connections;
  uint32_t connections_max;
  uint64_t in_flight_bytes;
  uint64_t in_flight_bytes_max;
  uint64_t requests_served;
  uint64_t bytes_written;
  uint64_t bytes_read;
  uint64_t dram_bytes_used;
  uint64_t dram_bytes_max;
  uint64_t ssd_bytes_used;
  uint64_t ssd_bytes_max;
  uint64_t epochs;
} spillway_server_status;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The library version ("0.1.0"), a static string.
const char *spillway_version(void);

// This thread's reason for the failure of its most recent Spillway call ("" after a success).
// Owned by the library; valid until the next Spillway call on this thread. Never NULL.
const char *spillway_last_error_message(void);

// A short description of a (positive or negative) errno that Spillway returns, or NULL for a
// value that is not in Spillway's errno table. Static string.
const char *spillway_strerror(int error_number);

// Fills `*options` with the defaults: striped over all servers in 1 MiB units, server-default
// durability, 8 pipelined requests, 4 MiB transfers.
//
// # Safety
// `options` is NULL (then `-EINVAL`) or points to writable memory for a `spillway_options`.
int spillway_options_init(struct spillway_options *options);

// Connects to every server of a reservation. `endpoints` holds `endpoint_count` addresses
// (`tcp://IP:PORT`, `IP:PORT` or `unix:///PATH`), in the reservation's order (placement depends
// on it). `options` may be NULL for the defaults. On success `*client_out` is a new handle to be
// released with `spillway_disconnect`; on failure it is set to NULL.
//
// # Safety
// `endpoints` points to `endpoint_count` NUL-terminated strings; `options` is NULL or valid;
// `client_out` is writable.
int spillway_connect(const char *const *endpoints,
                     size_t endpoint_count,
                     const struct spillway_options *options,
                     struct spillway_client **client_out);

// Closes every connection and frees the handle. Writes not yet flushed or committed are not
// waited for. NULL is ignored. Close the client's files first or after; both orders are fine.
//
// # Safety
// `client` is NULL or a handle from `spillway_connect` not yet disconnected, and no other thread
// uses it.
void spillway_disconnect(struct spillway_client *client);

// The number of servers the client is connected to, or a negative errno.
//
// # Safety
// `client` is NULL or a live handle.
int spillway_server_count(const struct spillway_client *client);

// Begins epoch `epoch` (BurstMem's checkpoint timestamp) for this client.
//
// # Safety
// `client` is NULL or a live handle.
int spillway_begin_epoch(struct spillway_client *client, uint64_t epoch);

// Creates file `name` in `epoch` (or opens it, if another process created it: N-1 files are
// created by every writer). `*file_out` is a new handle for `spillway_file_close`, NULL on error.
//
// # Safety
// `client` is NULL or a live handle; `name` is NULL or a NUL-terminated string; `file_out` is
// writable.
int spillway_create_file(struct spillway_client *client,
                         uint64_t epoch,
                         const char *name,
                         struct spillway_file **file_out);

// Opens an existing file of `epoch` for reading (restart). `-ENOENT` if no server has it.
//
// # Safety
// As for `spillway_create_file`.
int spillway_open_file(struct spillway_client *client,
                       uint64_t epoch,
                       const char *name,
                       struct spillway_file **file_out);

// Frees a file handle (the file itself stays in its epoch). NULL is ignored.
//
// # Safety
// `file` is NULL or a handle from `spillway_create_file`/`spillway_open_file` not yet closed, and
// no other thread uses it.
void spillway_file_close(struct spillway_file *file);

// Writes `length` bytes from `data` at byte `offset` of `file`. Returns once the bytes are sent
// (the buffer is the caller's again); failures surface here or by the next `spillway_flush` or
// `spillway_commit_epoch`.
//
// # Safety
// `client` and `file` are live handles (`file` from this client); `data` points to `length`
// readable bytes (may be NULL when `length` is 0).
int spillway_write(struct spillway_client *client,
                   struct spillway_file *file,
                   uint64_t offset,
                   const void *data,
                   size_t length);

// Waits until every write sent so far is acknowledged by its server (held in DRAM).
//
// # Safety
// `client` is NULL or a live handle.
int spillway_flush(struct spillway_client *client);

// Commits `epoch` on every server this client wrote it to, at the configured durability. In an
// N-1 checkpoint every writer calls it after the barrier that ends the write phase.
//
// # Safety
// `client` is NULL or a live handle.
int spillway_commit_epoch(struct spillway_client *client, uint64_t epoch);

// Reads `length` bytes at `offset` of `file` into `buffer` from whichever servers hold them;
// bytes nobody wrote read as zeros.
//
// # Safety
// `client` and `file` are live handles (`file` from this client); `buffer` points to `length`
// writable bytes (may be NULL when `length` is 0).
int spillway_read(struct spillway_client *client,
                  const struct spillway_file *file,
                  uint64_t offset,
                  void *buffer,
                  size_t length);

// Stores in `*size_bytes_out` the file's size: one past the highest byte any server holds.
//
// # Safety
// `client` and `file` are live handles (`file` from this client); `size_bytes_out` is writable.
int spillway_file_size(struct spillway_client *client,
                       const struct spillway_file *file,
                       uint64_t *size_bytes_out);

// Lists every epoch on any server, in epoch order. Fills at most `capacity` entries of `epochs`
// and stores the total number in `*count_out` (call with `capacity` 0 to size the array; when the
// total exceeds `capacity` only the first `capacity` are filled and 0 is still returned).
//
// # Safety
// `client` is a live handle; `epochs` points to `capacity` writable entries (may be NULL when
// `capacity` is 0); `count_out` is writable.
int spillway_list_epochs(struct spillway_client *client,
                         struct spillway_epoch_info *epochs,
                         size_t capacity,
                         size_t *count_out);

// Calls `callback(name, size_bytes, context)` for every file of `epoch` over all servers, in
// name order, until it returns non-zero. An epoch no server has lists nothing.
//
// # Safety
// `client` is a live handle; `callback` is a valid function. The client is not locked while the
// callback runs, so the callback may call Spillway functions (even on the same client).
int spillway_list_files(struct spillway_client *client,
                        uint64_t epoch,
                        spillway_file_callback callback,
                        void *context);

// Deletes `epoch` on every server that has it (an epoch no server has is not an error).
//
// # Safety
// `client` is NULL or a live handle.
int spillway_delete_epoch(struct spillway_client *client, uint64_t epoch);

// Fills at most `capacity` entries of `statuses` with each server's status, in the order given
// to `spillway_connect`, and stores the number of servers in `*count_out`.
//
// # Safety
// `client` is a live handle; `statuses` points to `capacity` writable entries (may be NULL when
// `capacity` is 0); `count_out` is writable.
int spillway_status(struct spillway_client *client,
                    struct spillway_server_status *statuses,
                    size_t capacity,
                    size_t *count_out);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SPILLWAY_H */
