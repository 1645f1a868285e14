//! The operating-system calls that several Spillway crates make, written once.
//!
//! User and group look-ups, signals, what a child process does between fork and exec,
//! unmounting, local time, acting on files as another user on one thread, resolving paths
//! under a directory without following links, and whether a socket's peer has closed it: each
//! was once copied into the crates that needed it, as raw `libc` with its own
//! `unsafe`. They live here, on top of `nix` and `signal-hook`, so that the other crates stay
//! free of that code (most of them `forbid(unsafe_code)`) and a fix lands in one place.
//!
//! [`munge`] holds the bindings to libmunge (MUNGE credentials, the site authentication of
//! servers and the manager over TCP), opened with `dlopen` only when munge is used.
//!
//! Everything here is a thin, named wrapper: no policy (who may do what is decided by the
//! callers), no caching (the user database may change under a long-running daemon).

pub mod beneath;
pub mod identity;
pub mod mount;
pub mod munge;
pub mod process;
pub mod signal;
pub mod socket;
pub mod time;
pub mod user;
