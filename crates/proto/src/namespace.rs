//! Namespace (metadata service) requests and responses: one frame kind per `Namespace` trait
//! method, plus `NamespaceOpen`, `NamespaceSync` and `NamespaceManifest`.
//!
//! Kept apart from the data-path messages in [`crate::message`] (which wraps them as
//! `Request::Namespace` / `Response::Namespace`) because they carry POSIX types from
//! `spillway-meta` and their own error frame: a namespace failure is an errno chosen by the
//! namespace (`NamespaceError`), not a protocol `ErrorCode`, so the mount can hand it to the
//! kernel unchanged. Every request that acts for someone carries the [`Caller`]; the server
//! trusts it only from root peers. Byte layouts: docs/design/protocol.md, "Namespace frames".

use spillway_namespace::{
    Attr, Caller, Change, Changes, DirEntry, FileKind, FsStat, Ino, ManifestEntry, NamespaceId,
    SetAttr, TimeSet, Timestamp,
};
use spillway_types::EpochId;

use crate::frame::{FrameError, Kind};
use crate::message::{Decoder, Encoder};

/// Largest name or symlink target in a namespace body (PATH_MAX). The namespace itself
/// enforces NAME_MAX and answers ENAMETOOLONG.
pub const NAMESPACE_BYTES_MAX: usize = 4096;
/// Most supplementary groups a caller may carry (Linux NGROUPS_MAX is 65536; FUSE callers have
/// far fewer, and the body must stay under 64 KiB).
pub const CALLER_GROUPS_MAX: usize = 1024;
/// Fixed bytes of one `Attr` on the wire.
pub const ATTR_BYTES: usize = 8 + 1 + 4 * 4 + 8 + 4 + 3 * 12 + 8;

/// A namespace request. `namespace` names the namespace on the server (opened first with
/// `Open`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceRequest {
    /// Opens (with `create`, creates: `data_epoch`, root owner and mode are used only then) a
    /// namespace on this server.
    Open {
        namespace: NamespaceId,
        create: bool,
        data_epoch: EpochId,
        root_uid: u32,
        root_gid: u32,
        root_mode: u32,
    },
    Sync {
        namespace: NamespaceId,
    },
    /// The drain's name map, from entry `from_index` on (a reply holds what fits; ask again
    /// from one past the last until a reply comes back empty).
    Manifest {
        namespace: NamespaceId,
        from_index: u64,
    },
    Lookup {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
    },
    GetAttr {
        namespace: NamespaceId,
        ino: Ino,
    },
    SetAttr {
        namespace: NamespaceId,
        caller: Caller,
        ino: Ino,
        set: SetAttr,
    },
    Create {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        umask: u32,
        rdev: u32,
        exclusive: bool,
    },
    Mkdir {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        mode: u32,
        umask: u32,
    },
    Symlink {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        target: Vec<u8>,
    },
    Readlink {
        namespace: NamespaceId,
        ino: Ino,
    },
    Link {
        namespace: NamespaceId,
        caller: Caller,
        ino: Ino,
        new_parent: Ino,
        new_name: Vec<u8>,
    },
    Unlink {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
    },
    Rmdir {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
    },
    Rename {
        namespace: NamespaceId,
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        new_parent: Ino,
        new_name: Vec<u8>,
        flags: u32,
    },
    Readdir {
        namespace: NamespaceId,
        caller: Caller,
        dir: Ino,
        after_cookie: u64,
        entries_max: u32,
    },
    OpenInode {
        namespace: NamespaceId,
        caller: Caller,
        ino: Ino,
        flags: i32,
    },
    Access {
        namespace: NamespaceId,
        caller: Caller,
        ino: Ino,
        mask: i32,
    },
    Wrote {
        namespace: NamespaceId,
        caller: Caller,
        ino: Ino,
        end_offset: u64,
    },
    Statfs {
        namespace: NamespaceId,
    },
    /// Subscribes to (or keeps polling) the namespace's changes made by others than `session`,
    /// acknowledging every change up to `since`; answered with `Changes` once there are changes
    /// past `since`, or empty after the server's poll bound. Sent on a connection of its own.
    /// The connections that make the session's own changes name it in their `Hello`
    /// ([`session_client_name`]).
    Watch {
        namespace: NamespaceId,
        session: u64,
        since: u64,
    },
}

/// How a connection says in its `Hello` that its namespace changes belong to change session
/// `session` (the one its mount watches with): the client name ends in ` ns-session=<16 hex
/// digits>`. A transparent reconnect repeats the `Hello`, so the binding survives it.
pub fn session_client_name(base: &str, session: u64) -> String {
    format!("{base} ns-session={session:016x}")
}

/// The change session a `Hello`'s client name binds its connection to (0: none).
pub fn session_of_client_name(client_name: &str) -> u64 {
    client_name
        .rsplit_once(" ns-session=")
        .filter(|(_, hex)| hex.len() == 16)
        .and_then(|(_, hex)| u64::from_str_radix(hex, 16).ok())
        .unwrap_or(0)
}

/// Most changes in one `Changes` reply (each at most 11 + 4096 bytes; the body stays far
/// below `BODY_BYTES_MAX` only if names are short, so the server also cuts a batch by bytes).
pub const CHANGES_BATCH_MAX: usize = 1024;

/// A namespace response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceResponse {
    Opened {
        namespace: NamespaceId,
        data_epoch: EpochId,
        created: bool,
    },
    /// lookup, getattr, setattr, create, mkdir, symlink, link, open, wrote.
    Attr(Attr),
    /// unlink, rmdir, rename, access, sync.
    Done,
    /// readlink.
    Target(Vec<u8>),
    Entries(Vec<DirEntry>),
    Stat(FsStat),
    Manifest(Vec<ManifestEntry>),
    /// watch.
    Changes(Changes),
    /// The operation failed with this errno (positive).
    Error {
        errno: i32,
        message: String,
    },
}

impl NamespaceRequest {
    /// The namespace this request addresses.
    pub fn namespace(&self) -> NamespaceId {
        use NamespaceRequest::*;
        match self {
            Open { namespace, .. }
            | Sync { namespace }
            | Manifest { namespace, .. }
            | Lookup { namespace, .. }
            | GetAttr { namespace, .. }
            | SetAttr { namespace, .. }
            | Create { namespace, .. }
            | Mkdir { namespace, .. }
            | Symlink { namespace, .. }
            | Readlink { namespace, .. }
            | Link { namespace, .. }
            | Unlink { namespace, .. }
            | Rmdir { namespace, .. }
            | Rename { namespace, .. }
            | Readdir { namespace, .. }
            | OpenInode { namespace, .. }
            | Access { namespace, .. }
            | Wrote { namespace, .. }
            | Watch { namespace, .. }
            | Statfs { namespace } => *namespace,
        }
    }

    /// The caller the request states, if it acts for someone.
    pub fn caller_mut(&mut self) -> Option<&mut Caller> {
        use NamespaceRequest::*;
        match self {
            Lookup { caller, .. }
            | SetAttr { caller, .. }
            | Create { caller, .. }
            | Mkdir { caller, .. }
            | Symlink { caller, .. }
            | Link { caller, .. }
            | Unlink { caller, .. }
            | Rmdir { caller, .. }
            | Rename { caller, .. }
            | Readdir { caller, .. }
            | OpenInode { caller, .. }
            | Access { caller, .. }
            | Wrote { caller, .. } => Some(caller),
            Open { .. }
            | Sync { .. }
            | Manifest { .. }
            | GetAttr { .. }
            | Readlink { .. }
            | Watch { .. }
            | Statfs { .. } => None,
        }
    }

    pub fn kind(&self) -> Kind {
        use NamespaceRequest::*;
        match self {
            Open { .. } => Kind::NamespaceOpen,
            Sync { .. } => Kind::NamespaceSync,
            Manifest { .. } => Kind::NamespaceManifest,
            Lookup { .. } => Kind::NsLookup,
            GetAttr { .. } => Kind::NsGetAttr,
            SetAttr { .. } => Kind::NsSetAttr,
            Create { .. } => Kind::NsCreate,
            Mkdir { .. } => Kind::NsMkdir,
            Symlink { .. } => Kind::NsSymlink,
            Readlink { .. } => Kind::NsReadlink,
            Link { .. } => Kind::NsLink,
            Unlink { .. } => Kind::NsUnlink,
            Rmdir { .. } => Kind::NsRmdir,
            Rename { .. } => Kind::NsRename,
            Readdir { .. } => Kind::NsReaddir,
            OpenInode { .. } => Kind::NsOpen,
            Access { .. } => Kind::NsAccess,
            Wrote { .. } => Kind::NsWrote,
            Statfs { .. } => Kind::NsStatfs,
            Watch { .. } => Kind::NsWatch,
        }
    }

    pub(crate) fn encode(&self, e: &mut Encoder) {
        use NamespaceRequest::*;
        e.u64(self.namespace());
        match self {
            Open { create, data_epoch, root_uid, root_gid, root_mode, .. } => {
                e.u8(*create as u8).u64(data_epoch.0).u32(*root_uid).u32(*root_gid).u32(*root_mode);
            }
            Sync { .. } | Statfs { .. } => {}
            Manifest { from_index, .. } => {
                e.u64(*from_index);
            }
            Lookup { caller, parent, name, .. }
            | Unlink { caller, parent, name, .. }
            | Rmdir { caller, parent, name, .. } => {
                caller_out(e, caller);
                e.u64(*parent).bytes(name);
            }
            GetAttr { ino, .. } | Readlink { ino, .. } => {
                e.u64(*ino);
            }
            SetAttr { caller, ino, set, .. } => {
                caller_out(e, caller);
                e.u64(*ino);
                setattr_out(e, set);
            }
            Create { caller, parent, name, kind, mode, umask, rdev, exclusive, .. } => {
                caller_out(e, caller);
                e.u64(*parent)
                    .bytes(name)
                    .u8(kind.code())
                    .u32(*mode)
                    .u32(*umask)
                    .u32(*rdev)
                    .u8(*exclusive as u8);
            }
            Mkdir { caller, parent, name, mode, umask, .. } => {
                caller_out(e, caller);
                e.u64(*parent).bytes(name).u32(*mode).u32(*umask);
            }
            Symlink { caller, parent, name, target, .. } => {
                caller_out(e, caller);
                e.u64(*parent).bytes(name).bytes(target);
            }
            Link { caller, ino, new_parent, new_name, .. } => {
                caller_out(e, caller);
                e.u64(*ino).u64(*new_parent).bytes(new_name);
            }
            Rename { caller, parent, name, new_parent, new_name, flags, .. } => {
                caller_out(e, caller);
                e.u64(*parent).bytes(name).u64(*new_parent).bytes(new_name).u32(*flags);
            }
            Readdir { caller, dir, after_cookie, entries_max, .. } => {
                caller_out(e, caller);
                e.u64(*dir).u64(*after_cookie).u32(*entries_max);
            }
            OpenInode { caller, ino, flags, .. } => {
                caller_out(e, caller);
                e.u64(*ino).u32(*flags as u32);
            }
            Access { caller, ino, mask, .. } => {
                caller_out(e, caller);
                e.u64(*ino).u32(*mask as u32);
            }
            Wrote { caller, ino, end_offset, .. } => {
                caller_out(e, caller);
                e.u64(*ino).u64(*end_offset);
            }
            Watch { session, since, .. } => {
                e.u64(*session).u64(*since);
            }
        }
    }

    pub(crate) fn decode(kind: Kind, d: &mut Decoder<'_>) -> Result<NamespaceRequest, FrameError> {
        let namespace = d.u64("namespace")?;
        match kind {
            Kind::NamespaceOpen
            | Kind::NamespaceSync
            | Kind::NamespaceManifest
            | Kind::NsStatfs
            | Kind::NsWatch => NamespaceRequest::decode_whole_namespace(kind, namespace, d),
            Kind::NsGetAttr
            | Kind::NsReadlink
            | Kind::NsSetAttr
            | Kind::NsReaddir
            | Kind::NsOpen
            | Kind::NsAccess
            | Kind::NsWrote => NamespaceRequest::decode_inode_request(kind, namespace, d),
            Kind::NsCreate | Kind::NsMkdir | Kind::NsSymlink => {
                NamespaceRequest::decode_creation_request(kind, namespace, d)
            }
            Kind::NsLookup | Kind::NsUnlink | Kind::NsRmdir | Kind::NsLink | Kind::NsRename => {
                NamespaceRequest::decode_entry_request(kind, namespace, d)
            }
            other => unreachable!("{other:?} is not a namespace request"),
        }
    }

    /// Decodes the rest of a whole-namespace request: open, sync, manifest, statfs, watch.
    fn decode_whole_namespace(
        kind: Kind,
        namespace: NamespaceId,
        decoder: &mut Decoder<'_>,
    ) -> Result<NamespaceRequest, FrameError> {
        use NamespaceRequest::*;
        Ok(match kind {
            Kind::NamespaceOpen => Open {
                namespace,
                create: decoder.boolean("create")?,
                data_epoch: EpochId(decoder.u64("data_epoch")?),
                root_uid: decoder.u32("root_uid")?,
                root_gid: decoder.u32("root_gid")?,
                root_mode: decoder.u32("root_mode")?,
            },
            Kind::NamespaceSync => Sync { namespace },
            Kind::NsStatfs => Statfs { namespace },
            Kind::NamespaceManifest => {
                Manifest { namespace, from_index: decoder.u64("from_index")? }
            }
            Kind::NsWatch => {
                Watch { namespace, session: decoder.u64("session")?, since: decoder.u64("since")? }
            }
            other => unreachable!("{other:?} is not a whole-namespace request"),
        })
    }

    /// Decodes the rest of an inode request: attributes, readlink, readdir, open, access, wrote.
    fn decode_inode_request(
        kind: Kind,
        namespace: NamespaceId,
        decoder: &mut Decoder<'_>,
    ) -> Result<NamespaceRequest, FrameError> {
        use NamespaceRequest::*;
        Ok(match kind {
            Kind::NsGetAttr => GetAttr { namespace, ino: decoder.u64("ino")? },
            Kind::NsReadlink => Readlink { namespace, ino: decoder.u64("ino")? },
            Kind::NsSetAttr => SetAttr {
                namespace,
                caller: caller_in(decoder)?,
                ino: decoder.u64("ino")?,
                set: setattr_in(decoder)?,
            },
            Kind::NsReaddir => Readdir {
                namespace,
                caller: caller_in(decoder)?,
                dir: decoder.u64("dir")?,
                after_cookie: decoder.u64("after_cookie")?,
                entries_max: decoder.u32("entries_max")?,
            },
            Kind::NsOpen => OpenInode {
                namespace,
                caller: caller_in(decoder)?,
                ino: decoder.u64("ino")?,
                flags: decoder.u32("flags")? as i32,
            },
            Kind::NsAccess => Access {
                namespace,
                caller: caller_in(decoder)?,
                ino: decoder.u64("ino")?,
                mask: decoder.u32("mask")? as i32,
            },
            Kind::NsWrote => Wrote {
                namespace,
                caller: caller_in(decoder)?,
                ino: decoder.u64("ino")?,
                end_offset: decoder.u64("end_offset")?,
            },
            other => unreachable!("{other:?} is not an inode request"),
        })
    }

    /// Decodes the rest of a request that makes a new entry and inode: create, mkdir, symlink.
    fn decode_creation_request(
        kind: Kind,
        namespace: NamespaceId,
        decoder: &mut Decoder<'_>,
    ) -> Result<NamespaceRequest, FrameError> {
        use NamespaceRequest::*;
        Ok(match kind {
            Kind::NsCreate => Create {
                namespace,
                caller: caller_in(decoder)?,
                parent: decoder.u64("parent")?,
                name: name_in(decoder, "name")?,
                kind: file_kind_in(decoder)?,
                mode: decoder.u32("mode")?,
                umask: decoder.u32("umask")?,
                rdev: decoder.u32("rdev")?,
                exclusive: decoder.boolean("exclusive")?,
            },
            Kind::NsMkdir => Mkdir {
                namespace,
                caller: caller_in(decoder)?,
                parent: decoder.u64("parent")?,
                name: name_in(decoder, "name")?,
                mode: decoder.u32("mode")?,
                umask: decoder.u32("umask")?,
            },
            Kind::NsSymlink => Symlink {
                namespace,
                caller: caller_in(decoder)?,
                parent: decoder.u64("parent")?,
                name: name_in(decoder, "name")?,
                target: name_in(decoder, "target")?,
            },
            other => unreachable!("{other:?} is not a creation request"),
        })
    }

    /// Decodes the rest of a request on an existing name: lookup, unlink, rmdir, link, rename.
    fn decode_entry_request(
        kind: Kind,
        namespace: NamespaceId,
        decoder: &mut Decoder<'_>,
    ) -> Result<NamespaceRequest, FrameError> {
        use NamespaceRequest::*;
        Ok(match kind {
            Kind::NsLookup | Kind::NsUnlink | Kind::NsRmdir => {
                let caller = caller_in(decoder)?;
                let parent = decoder.u64("parent")?;
                let name = name_in(decoder, "name")?;
                match kind {
                    Kind::NsLookup => Lookup { namespace, caller, parent, name },
                    Kind::NsUnlink => Unlink { namespace, caller, parent, name },
                    _ => Rmdir { namespace, caller, parent, name },
                }
            }
            Kind::NsLink => Link {
                namespace,
                caller: caller_in(decoder)?,
                ino: decoder.u64("ino")?,
                new_parent: decoder.u64("new_parent")?,
                new_name: name_in(decoder, "new_name")?,
            },
            Kind::NsRename => Rename {
                namespace,
                caller: caller_in(decoder)?,
                parent: decoder.u64("parent")?,
                name: name_in(decoder, "name")?,
                new_parent: decoder.u64("new_parent")?,
                new_name: name_in(decoder, "new_name")?,
                flags: decoder.u32("flags")?,
            },
            other => unreachable!("{other:?} is not an entry request"),
        })
    }
}

impl NamespaceResponse {
    pub fn kind(&self) -> Kind {
        match self {
            NamespaceResponse::Opened { .. } => Kind::NamespaceOpened,
            NamespaceResponse::Attr(_) => Kind::NsAttr,
            NamespaceResponse::Done => Kind::NsDone,
            NamespaceResponse::Target(_) => Kind::NsTarget,
            NamespaceResponse::Entries(_) => Kind::NsEntries,
            NamespaceResponse::Stat(_) => Kind::NsStat,
            NamespaceResponse::Manifest(_) => Kind::NamespaceManifestPage,
            NamespaceResponse::Changes(_) => Kind::NsChanges,
            NamespaceResponse::Error { .. } => Kind::NsError,
        }
    }

    pub(crate) fn encode(&self, e: &mut Encoder) {
        match self {
            NamespaceResponse::Opened { namespace, data_epoch, created } => {
                e.u64(*namespace).u64(data_epoch.0).u8(*created as u8);
            }
            NamespaceResponse::Attr(attr) => attr_out(e, attr),
            NamespaceResponse::Done => {}
            NamespaceResponse::Target(target) => {
                e.bytes(target);
            }
            NamespaceResponse::Entries(list) => {
                e.u32(list.len() as u32);
                for entry in list {
                    e.u64(entry.ino).u8(entry.kind.code()).u64(entry.cookie).bytes(&entry.name);
                }
            }
            NamespaceResponse::Stat(s) => {
                e.u32(s.block_bytes)
                    .u64(s.blocks)
                    .u64(s.blocks_free)
                    .u64(s.blocks_avail)
                    .u64(s.files)
                    .u64(s.files_free)
                    .u32(s.name_bytes_max)
                    .u64(s.reservation_bytes)
                    .u64(s.file_bytes);
            }
            NamespaceResponse::Manifest(list) => {
                e.u32(list.len() as u32);
                for m in list {
                    e.string(&m.file_name)
                        .bytes(&m.path)
                        .u64(m.size)
                        .u32(m.mode)
                        .u32(m.uid)
                        .u32(m.gid);
                    timestamp_out(e, m.mtime);
                }
            }
            NamespaceResponse::Changes(batch) => {
                e.u64(batch.version).u8(batch.reset as u8).u32(batch.changes.len() as u32);
                for change in &batch.changes {
                    match change {
                        Change::Inode(ino) => {
                            e.u8(CHANGE_INODE).u64(*ino);
                        }
                        Change::Entry { parent, name } => {
                            e.u8(CHANGE_ENTRY).u64(*parent).bytes(name);
                        }
                    }
                }
            }
            NamespaceResponse::Error { errno, message } => {
                e.u32(*errno as u32).string(message);
            }
        }
    }

    pub(crate) fn decode(kind: Kind, d: &mut Decoder<'_>) -> Result<NamespaceResponse, FrameError> {
        Ok(match kind {
            Kind::NamespaceOpened => NamespaceResponse::Opened {
                namespace: d.u64("namespace")?,
                data_epoch: EpochId(d.u64("data_epoch")?),
                created: d.boolean("created")?,
            },
            Kind::NsAttr => NamespaceResponse::Attr(attr_in(d)?),
            Kind::NsDone => NamespaceResponse::Done,
            Kind::NsTarget => NamespaceResponse::Target(name_in(d, "target")?),
            Kind::NsEntries => {
                let n = d.count(19, "entry count")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    let ino = d.u64("ino")?;
                    let kind = file_kind_in(d)?;
                    let cookie = d.u64("cookie")?;
                    list.push(DirEntry { ino, kind, cookie, name: name_in(d, "name")? });
                }
                NamespaceResponse::Entries(list)
            }
            Kind::NsStat => NamespaceResponse::Stat(FsStat {
                block_bytes: d.u32("block_bytes")?,
                blocks: d.u64("blocks")?,
                blocks_free: d.u64("blocks_free")?,
                blocks_avail: d.u64("blocks_avail")?,
                files: d.u64("files")?,
                files_free: d.u64("files_free")?,
                name_bytes_max: d.u32("name_bytes_max")?,
                reservation_bytes: d.u64("reservation_bytes")?,
                file_bytes: d.u64("file_bytes")?,
            }),
            Kind::NamespaceManifestPage => {
                let n = d.count(36, "manifest count")?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    list.push(ManifestEntry {
                        file_name: d.string("file_name")?,
                        path: name_in(d, "path")?,
                        size: d.u64("size")?,
                        mode: d.u32("mode")?,
                        uid: d.u32("uid")?,
                        gid: d.u32("gid")?,
                        mtime: timestamp_in(d, "mtime")?,
                    });
                }
                NamespaceResponse::Manifest(list)
            }
            Kind::NsChanges => NamespaceResponse::Changes(changes_in(d)?),
            Kind::NsError => {
                let errno = d.u32("errno")?;
                if errno == 0 || errno > 4095 {
                    return Err(FrameError::BadValue { kind, field: "errno", value: errno as u64 });
                }
                NamespaceResponse::Error { errno: errno as i32, message: d.string("message")? }
            }
            other => unreachable!("{other:?} is not a namespace response"),
        })
    }

    /// Wire bytes of one manifest entry (for the server's paging).
    pub fn manifest_entry_bytes(entry: &ManifestEntry) -> usize {
        2 + entry.file_name.len() + 2 + entry.path.len() + 8 + 12 + 12
    }

    /// Wire bytes of one change (for the server's batching).
    pub fn change_bytes(change: &Change) -> usize {
        match change {
            Change::Inode(_) => 1 + 8,
            Change::Entry { name, .. } => 1 + 8 + 2 + name.len(),
        }
    }

    /// Wire bytes of one directory entry (for the server's paging).
    pub fn dir_entry_bytes(entry: &DirEntry) -> usize {
        8 + 1 + 8 + 2 + entry.name.len()
    }
}

/// Change tags in `NsChanges`.
const CHANGE_INODE: u8 = 1;
const CHANGE_ENTRY: u8 = 2;

fn changes_in(d: &mut Decoder<'_>) -> Result<Changes, FrameError> {
    let version = d.u64("version")?;
    let reset = d.boolean("reset")?;
    let n = d.count(9, "change count")?;
    if n > CHANGES_BATCH_MAX {
        return Err(FrameError::BadValue { kind: d.kind, field: "change count", value: n as u64 });
    }
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        changes.push(match d.u8("change tag")? {
            CHANGE_INODE => Change::Inode(d.u64("ino")?),
            CHANGE_ENTRY => Change::Entry { parent: d.u64("parent")?, name: name_in(d, "name")? },
            other => {
                return Err(FrameError::BadValue {
                    kind: d.kind,
                    field: "change tag",
                    value: other as u64,
                })
            }
        });
    }
    Ok(Changes { version, reset, changes })
}

fn caller_out(e: &mut Encoder, caller: &Caller) {
    let groups = &caller.groups[..caller.groups.len().min(CALLER_GROUPS_MAX)];
    e.u32(caller.uid).u32(caller.gid).u32(caller.pid).u16(groups.len() as u16);
    for gid in groups {
        e.u32(*gid);
    }
}

fn caller_in(d: &mut Decoder<'_>) -> Result<Caller, FrameError> {
    let uid = d.u32("caller uid")?;
    let gid = d.u32("caller gid")?;
    let pid = d.u32("caller pid")?;
    let count = d.u16("caller group count")? as usize;
    if count > CALLER_GROUPS_MAX {
        return Err(FrameError::BadValue {
            kind: d.kind,
            field: "caller group count",
            value: count as u64,
        });
    }
    let mut groups = Vec::with_capacity(count.min(d.remaining() / 4));
    for _ in 0..count {
        groups.push(d.u32("caller group")?);
    }
    Ok(Caller { uid, gid, groups, pid })
}

fn name_in(d: &mut Decoder<'_>, field: &'static str) -> Result<Vec<u8>, FrameError> {
    let bytes = d.bytes(field)?;
    if bytes.len() > NAMESPACE_BYTES_MAX {
        return Err(FrameError::BadValue { kind: d.kind, field, value: bytes.len() as u64 });
    }
    Ok(bytes)
}

fn file_kind_in(d: &mut Decoder<'_>) -> Result<FileKind, FrameError> {
    let code = d.u8("file kind")?;
    FileKind::from_code(code).ok_or(FrameError::BadValue {
        kind: d.kind,
        field: "file kind",
        value: code as u64,
    })
}

fn timestamp_out(e: &mut Encoder, t: Timestamp) {
    e.u64(t.seconds as u64).u32(t.nanos);
}

fn timestamp_in(d: &mut Decoder<'_>, field: &'static str) -> Result<Timestamp, FrameError> {
    let seconds = d.u64(field)? as i64;
    let nanos = d.u32(field)?;
    if nanos >= 1_000_000_000 {
        return Err(FrameError::BadValue { kind: d.kind, field, value: nanos as u64 });
    }
    Ok(Timestamp { seconds, nanos })
}

fn attr_out(e: &mut Encoder, a: &Attr) {
    e.u64(a.ino)
        .u8(a.kind.code())
        .u32(a.mode)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u64(a.size)
        .u32(a.rdev);
    for t in [a.atime, a.mtime, a.ctime] {
        timestamp_out(e, t);
    }
    e.u64(a.generation);
}

fn attr_in(d: &mut Decoder<'_>) -> Result<Attr, FrameError> {
    Ok(Attr {
        ino: d.u64("ino")?,
        kind: file_kind_in(d)?,
        mode: d.u32("mode")?,
        nlink: d.u32("nlink")?,
        uid: d.u32("uid")?,
        gid: d.u32("gid")?,
        size: d.u64("size")?,
        rdev: d.u32("rdev")?,
        atime: timestamp_in(d, "atime")?,
        mtime: timestamp_in(d, "mtime")?,
        ctime: timestamp_in(d, "ctime")?,
        generation: d.u64("generation")?,
    })
}

const SET_MODE: u8 = 1;
const SET_UID: u8 = 2;
const SET_GID: u8 = 4;
const SET_SIZE: u8 = 8;
const SET_ATIME: u8 = 16;
const SET_MTIME: u8 = 32;
const SET_VIA_WRITABLE_HANDLE: u8 = 64;

fn time_set_out(e: &mut Encoder, t: TimeSet) {
    match t {
        TimeSet::Now => {
            e.u8(0);
        }
        TimeSet::At(at) => {
            e.u8(1);
            timestamp_out(e, at);
        }
    }
}

fn time_set_in(d: &mut Decoder<'_>, field: &'static str) -> Result<TimeSet, FrameError> {
    match d.u8(field)? {
        0 => Ok(TimeSet::Now),
        1 => {
            // Out-of-range nanoseconds are the namespace's EINVAL, not a frame error.
            let seconds = d.u64(field)? as i64;
            Ok(TimeSet::At(Timestamp { seconds, nanos: d.u32(field)? }))
        }
        other => Err(FrameError::BadValue { kind: d.kind, field, value: other as u64 }),
    }
}

fn setattr_out(e: &mut Encoder, s: &SetAttr) {
    let mut present = 0u8;
    for (is, bit) in [
        (s.mode.is_some(), SET_MODE),
        (s.uid.is_some(), SET_UID),
        (s.gid.is_some(), SET_GID),
        (s.size.is_some(), SET_SIZE),
        (s.atime.is_some(), SET_ATIME),
        (s.mtime.is_some(), SET_MTIME),
        (s.via_writable_handle, SET_VIA_WRITABLE_HANDLE),
    ] {
        if is {
            present |= bit;
        }
    }
    e.u8(present);
    if let Some(mode) = s.mode {
        e.u32(mode);
    }
    if let Some(uid) = s.uid {
        e.u32(uid);
    }
    if let Some(gid) = s.gid {
        e.u32(gid);
    }
    if let Some(size) = s.size {
        e.u64(size);
    }
    if let Some(t) = s.atime {
        time_set_out(e, t);
    }
    if let Some(t) = s.mtime {
        time_set_out(e, t);
    }
}

fn setattr_in(d: &mut Decoder<'_>) -> Result<SetAttr, FrameError> {
    let present = d.u8("setattr fields")?;
    if present & 0x80 != 0 {
        return Err(FrameError::BadValue {
            kind: d.kind,
            field: "setattr fields",
            value: present as u64,
        });
    }
    let mut s = SetAttr {
        via_writable_handle: present & SET_VIA_WRITABLE_HANDLE != 0,
        ..SetAttr::default()
    };
    if present & SET_MODE != 0 {
        s.mode = Some(d.u32("mode")?);
    }
    if present & SET_UID != 0 {
        s.uid = Some(d.u32("uid")?);
    }
    if present & SET_GID != 0 {
        s.gid = Some(d.u32("gid")?);
    }
    if present & SET_SIZE != 0 {
        s.size = Some(d.u64("size")?);
    }
    if present & SET_ATIME != 0 {
        s.atime = Some(time_set_in(d, "atime")?);
    }
    if present & SET_MTIME != 0 {
        s.mtime = Some(time_set_in(d, "mtime")?);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Request, Response};
    use proptest::prelude::*;

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..40)
    }

    fn caller() -> impl Strategy<Value = Caller> {
        (any::<u32>(), any::<u32>(), proptest::collection::vec(any::<u32>(), 0..5), any::<u32>())
            .prop_map(|(uid, gid, groups, pid)| Caller { uid, gid, groups, pid })
    }

    fn kind() -> impl Strategy<Value = FileKind> {
        (0usize..7).prop_map(|i| FileKind::ALL[i])
    }

    fn timestamp() -> impl Strategy<Value = Timestamp> {
        (any::<i64>(), 0u32..1_000_000_000)
            .prop_map(|(seconds, nanos)| Timestamp { seconds, nanos })
    }

    fn time_set() -> impl Strategy<Value = Option<TimeSet>> {
        prop_oneof![
            Just(None),
            Just(Some(TimeSet::Now)),
            timestamp().prop_map(|t| Some(TimeSet::At(t)))
        ]
    }

    fn setattr() -> impl Strategy<Value = SetAttr> {
        (
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u64>()),
            time_set(),
            time_set(),
            any::<bool>(),
        )
            .prop_map(|(mode, uid, gid, size, atime, mtime, via_writable_handle)| {
                SetAttr { mode, uid, gid, size, atime, mtime, via_writable_handle }
            })
    }

    fn attr() -> impl Strategy<Value = Attr> {
        (
            any::<u64>(),
            kind(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            timestamp(),
            timestamp(),
            any::<u64>(),
        )
            .prop_map(|(ino, kind, mode, nlink, size, atime, mtime, generation)| Attr {
                ino,
                kind,
                mode,
                nlink,
                uid: mode ^ 7,
                gid: nlink ^ 9,
                size,
                rdev: mode.rotate_left(3),
                atime,
                mtime,
                ctime: atime,
                generation,
            })
    }

    /// An `Open` of a random namespace, created or not, with a random root owner and mode.
    fn open_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (any::<u64>(), any::<bool>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(namespace, create, e, u, g, m)| Open {
                namespace,
                create,
                data_epoch: EpochId(e),
                root_uid: u,
                root_gid: g,
                root_mode: m,
            })
    }

    /// A `Create` whose umask is derived from its mode.
    fn create_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (
            any::<u64>(),
            caller(),
            any::<u64>(),
            bytes(),
            kind(),
            any::<u32>(),
            any::<u32>(),
            any::<bool>(),
        )
            .prop_map(|(namespace, caller, parent, name, kind, mode, rdev, exclusive)| {
                Create {
                    namespace,
                    caller,
                    parent,
                    name,
                    kind,
                    mode,
                    umask: mode >> 3,
                    rdev,
                    exclusive,
                }
            })
    }

    /// A `Mkdir` with the usual umask 022.
    fn mkdir_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (any::<u64>(), caller(), any::<u64>(), bytes(), any::<u32>()).prop_map(
            |(namespace, caller, parent, name, mode)| Mkdir {
                namespace,
                caller,
                parent,
                name,
                mode,
                umask: 0o22,
            },
        )
    }

    /// A `Symlink` with a random name and target.
    fn symlink_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (any::<u64>(), caller(), any::<u64>(), bytes(), bytes()).prop_map(
            |(namespace, caller, parent, name, target)| Symlink {
                namespace,
                caller,
                parent,
                name,
                target,
            },
        )
    }

    /// A `Link` of a random inode under a random new name.
    fn link_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (any::<u64>(), caller(), any::<u64>(), any::<u64>(), bytes()).prop_map(
            |(namespace, caller, ino, new_parent, new_name)| Link {
                namespace,
                caller,
                ino,
                new_parent,
                new_name,
            },
        )
    }

    /// A `Rename` with random names and flags.
    fn rename_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (any::<u64>(), caller(), any::<u64>(), bytes(), any::<u64>(), bytes(), any::<u32>())
            .prop_map(|(namespace, caller, parent, name, new_parent, new_name, flags)| Rename {
                namespace,
                caller,
                parent,
                name,
                new_parent,
                new_name,
                flags,
            })
    }

    /// A `Readdir` from a random cookie.
    fn readdir_request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        (any::<u64>(), caller(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
            |(namespace, caller, dir, after_cookie, entries_max)| Readdir {
                namespace,
                caller,
                dir,
                after_cookie,
                entries_max,
            },
        )
    }

    fn request() -> impl Strategy<Value = NamespaceRequest> {
        use NamespaceRequest::*;
        let n = any::<u64>();
        prop_oneof![
            open_request(),
            n.prop_map(|namespace| Sync { namespace }),
            n.prop_map(|namespace| Statfs { namespace }),
            (n, any::<u64>())
                .prop_map(|(namespace, from_index)| Manifest { namespace, from_index }),
            (n, caller(), any::<u64>(), bytes()).prop_map(|(namespace, caller, parent, name)| {
                Lookup { namespace, caller, parent, name }
            }),
            (n, caller(), any::<u64>(), bytes()).prop_map(|(namespace, caller, parent, name)| {
                Unlink { namespace, caller, parent, name }
            }),
            (n, caller(), any::<u64>(), bytes()).prop_map(|(namespace, caller, parent, name)| {
                Rmdir { namespace, caller, parent, name }
            }),
            (n, any::<u64>()).prop_map(|(namespace, ino)| GetAttr { namespace, ino }),
            (n, any::<u64>()).prop_map(|(namespace, ino)| Readlink { namespace, ino }),
            (n, caller(), any::<u64>(), setattr())
                .prop_map(|(namespace, caller, ino, set)| SetAttr { namespace, caller, ino, set }),
            create_request(),
            mkdir_request(),
            symlink_request(),
            link_request(),
            rename_request(),
            readdir_request(),
            (n, caller(), any::<u64>(), any::<i32>()).prop_map(
                |(namespace, caller, ino, flags)| OpenInode { namespace, caller, ino, flags }
            ),
            (n, caller(), any::<u64>(), any::<i32>())
                .prop_map(|(namespace, caller, ino, mask)| Access { namespace, caller, ino, mask }),
            (n, caller(), any::<u64>(), any::<u64>()).prop_map(
                |(namespace, caller, ino, end_offset)| Wrote { namespace, caller, ino, end_offset }
            ),
            (n, any::<u64>(), any::<u64>()).prop_map(|(namespace, session, since)| Watch {
                namespace,
                session,
                since
            }),
        ]
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            any::<u64>().prop_map(Change::Inode),
            (any::<u64>(), bytes()).prop_map(|(parent, name)| Change::Entry { parent, name }),
        ]
    }

    fn response() -> impl Strategy<Value = NamespaceResponse> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(namespace, e, created)| {
                NamespaceResponse::Opened { namespace, data_epoch: EpochId(e), created }
            }),
            attr().prop_map(NamespaceResponse::Attr),
            Just(NamespaceResponse::Done),
            bytes().prop_map(NamespaceResponse::Target),
            proptest::collection::vec((bytes(), any::<u64>(), kind(), any::<u64>()), 0..10)
                .prop_map(|v| NamespaceResponse::Entries(
                    v.into_iter()
                        .map(|(name, ino, kind, cookie)| DirEntry { name, ino, kind, cookie })
                        .collect()
                )),
            (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(b, n, f)| {
                NamespaceResponse::Stat(FsStat {
                    block_bytes: b,
                    blocks: n,
                    blocks_free: n / 2,
                    blocks_avail: n / 3,
                    files: f,
                    files_free: f / 2,
                    name_bytes_max: 255,
                    reservation_bytes: n / 5,
                    file_bytes: f / 7,
                })
            }),
            proptest::collection::vec((bytes(), any::<u64>(), any::<u32>(), timestamp()), 0..6)
                .prop_map(|v| NamespaceResponse::Manifest(
                    v.into_iter()
                        .map(|(path, size, mode, mtime)| ManifestEntry {
                            file_name: format!("ns/1/{size}.0"),
                            path,
                            size,
                            mode,
                            uid: mode / 2,
                            gid: 3,
                            mtime
                        })
                        .collect()
                )),
            (any::<u64>(), any::<bool>(), proptest::collection::vec(change(), 0..8)).prop_map(
                |(version, reset, changes)| NamespaceResponse::Changes(Changes {
                    version,
                    reset,
                    changes
                })
            ),
            (1i32..4096, "[a-z ]{0,30}")
                .prop_map(|(errno, message)| NamespaceResponse::Error { errno, message }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn namespace_requests_round_trip(r in request()) {
            let request = Request::Namespace(r);
            let body = request.encode_body();
            prop_assert_eq!(Request::decode(request.kind(), &body).unwrap(), request);
        }

        #[test]
        fn namespace_responses_round_trip(r in response()) {
            let response = Response::Namespace(r);
            let body = response.encode_body();
            prop_assert_eq!(Response::decode(response.kind(), &body).unwrap(), response);
        }

        #[test]
        fn truncated_namespace_bodies_are_rejected(r in request(), cut in any::<prop::sample::Index>()) {
            let request = Request::Namespace(r);
            let body = request.encode_body();
            let at = cut.index(body.len());
            prop_assert!(Request::decode(request.kind(), &body[..at]).is_err());
            let mut padded = body.clone();
            padded.push(0);
            prop_assert!(Request::decode(request.kind(), &padded).is_err());
        }
    }

    #[test]
    fn bad_values_are_named() {
        let request = Request::Namespace(NamespaceRequest::Create {
            namespace: 1,
            caller: Caller::root(),
            parent: 1,
            name: b"f".to_vec(),
            kind: FileKind::Regular,
            mode: 0o644,
            umask: 0,
            rdev: 0,
            exclusive: true,
        });
        let mut body = request.encode_body();
        // namespace 8, caller 14, parent 8, name 2+1 → kind at 33.
        body[33] = 99;
        assert!(matches!(
            Request::decode(Kind::NsCreate, &body),
            Err(FrameError::BadValue { field: "file kind", value: 99, .. })
        ));
        let mut groups = Vec::new();
        groups.extend_from_slice(&1u64.to_le_bytes());
        groups.extend_from_slice(&[0; 12]);
        groups.extend_from_slice(&(CALLER_GROUPS_MAX as u16 + 1).to_le_bytes());
        assert!(matches!(
            Request::decode(Kind::NsLookup, &groups),
            Err(FrameError::BadValue { field: "caller group count", .. })
        ));
        let error = Response::Namespace(NamespaceResponse::Error { errno: 2, message: "x".into() });
        let mut body = error.encode_body();
        body[0..4].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            Response::decode(Kind::NsError, &body),
            Err(FrameError::BadValue { field: "errno", .. })
        ));
    }

    #[test]
    fn changes_have_their_documented_layout_and_bad_tags_are_named() {
        let batch = Changes {
            version: 7,
            reset: false,
            changes: vec![Change::Inode(5), Change::Entry { parent: 1, name: b"ab".to_vec() }],
        };
        let response = Response::Namespace(NamespaceResponse::Changes(batch.clone()));
        let mut body = response.encode_body();
        // version 8, reset 1, count 4; inode: tag 1 + ino 8; entry: tag 1 + parent 8 + 2 + 2.
        assert_eq!(body.len(), 8 + 1 + 4 + 9 + 13);
        assert_eq!(&body[0..8], &7u64.to_le_bytes());
        assert_eq!(body[13], 1);
        assert_eq!(body[22], 2);
        for change in &batch.changes {
            assert!(NamespaceResponse::change_bytes(change) > 0);
        }
        assert_eq!(
            NamespaceResponse::change_bytes(&batch.changes[1])
                + NamespaceResponse::change_bytes(&batch.changes[0]),
            9 + 13
        );
        body[22] = 9;
        assert!(matches!(
            Response::decode(Kind::NsChanges, &body),
            Err(FrameError::BadValue { field: "change tag", value: 9, .. })
        ));
        let mut huge = Vec::new();
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.push(0);
        huge.extend_from_slice(&(CHANGES_BATCH_MAX as u32 + 1).to_le_bytes());
        huge.resize(huge.len() + 9 * (CHANGES_BATCH_MAX + 1), 0);
        assert!(matches!(
            Response::decode(Kind::NsChanges, &huge),
            Err(FrameError::BadValue { field: "change count", .. })
        ));
    }

    #[test]
    fn a_session_survives_the_client_name() {
        let name = session_client_name("spillway-meta", 0xabc);
        assert_eq!(name, "spillway-meta ns-session=0000000000000abc");
        assert_eq!(session_of_client_name(&name), 0xabc);
        assert_eq!(session_of_client_name("spillway-meta"), 0);
        assert_eq!(session_of_client_name("x ns-session=12"), 0);
        assert_eq!(session_of_client_name("x ns-session=zzzzzzzzzzzzzzzz"), 0);
    }

    #[test]
    fn an_attr_has_its_documented_size() {
        let mut e = Encoder(Vec::new());
        attr_out(
            &mut e,
            &Attr {
                ino: 1,
                kind: FileKind::Regular,
                mode: 0,
                nlink: 1,
                uid: 0,
                gid: 0,
                size: 0,
                rdev: 0,
                atime: Timestamp::default(),
                mtime: Timestamp::default(),
                ctime: Timestamp::default(),
                generation: 0,
            },
        );
        assert_eq!(e.0.len(), ATTR_BYTES);
        assert_eq!(ATTR_BYTES, 81);
    }
}
