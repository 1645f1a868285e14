//! POSIX permission rules as pure functions of the caller and the inodes involved.
//!
//! Kept apart from the state machine so every rule is one small function with its own tests,
//! and the namespace's operations read as "check, then change". The rules follow Linux:
//! one class (owner, else group incl. supplementary groups, else other) decides; root bypasses
//! read/write checks and gets execute when any execute bit is set (or on directories); sticky
//! directories restrict deletion to the owners of the entry or of the directory; only root
//! changes an owner; the owner may change the group to one of its own groups; set-user-ID and
//! set-group-ID (with group execute) bits are dropped on chown and on writes by non-root.

use spillway_namespace::{Attr, Caller, FileKind, MetaError};

/// Read permission bit of the `mask` arguments below.
pub const MAY_READ: u32 = 4;
/// Write permission bit.
pub const MAY_WRITE: u32 = 2;
/// Execute (search, for directories) permission bit.
pub const MAY_EXECUTE: u32 = 1;

pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;
const S_IXGRP: u32 = 0o010;
const ANY_EXECUTE: u32 = 0o111;

/// Whether `c` has every permission in `mask` (a combination of [`MAY_READ`], [`MAY_WRITE`],
/// [`MAY_EXECUTE`]) on an inode with these attributes.
pub fn permits(c: &Caller, attr: &Attr, mask: u32) -> bool {
    debug_assert!(mask <= 7, "mask {mask:#o} has bits beyond rwx");
    if c.is_root() {
        // Root: read and write always; execute only if someone may execute (or a directory).
        return mask & MAY_EXECUTE == 0
            || attr.kind == FileKind::Directory
            || attr.mode & ANY_EXECUTE != 0;
    }
    let granted = if c.uid == attr.uid {
        (attr.mode >> 6) & 7
    } else if c.in_group(attr.gid) {
        (attr.mode >> 3) & 7
    } else {
        attr.mode & 7
    };
    granted & mask == mask
}

/// `permits`, or EACCES naming the inode and the missing permission.
pub fn require(c: &Caller, attr: &Attr, mask: u32, what: &str) -> Result<(), MetaError> {
    if permits(c, attr, mask) {
        return Ok(());
    }
    let wanted: String = [(MAY_READ, 'r'), (MAY_WRITE, 'w'), (MAY_EXECUTE, 'x')]
        .iter()
        .map(|&(bit, ch)| if mask & bit != 0 { ch } else { '-' })
        .collect();
    Err(MetaError::new(
        libc::EACCES,
        format!(
            "{what}: uid {} (gid {}) lacks {wanted} on inode {} (mode {:o}, owner {}:{})",
            c.uid, c.gid, attr.ino, attr.mode, attr.uid, attr.gid
        ),
    ))
}

/// Whether `c` may remove or rename away `victim` from directory `dir`: always unless `dir` is
/// sticky, then only root, the owner of `dir` or the owner of `victim`.
pub fn may_delete_in_sticky(c: &Caller, dir: &Attr, victim: &Attr) -> bool {
    dir.mode & S_ISVTX == 0 || c.is_root() || c.uid == dir.uid || c.uid == victim.uid
}

/// EPERM unless [`may_delete_in_sticky`].
pub fn require_sticky(c: &Caller, dir: &Attr, victim: &Attr, name: &[u8]) -> Result<(), MetaError> {
    if may_delete_in_sticky(c, dir, victim) {
        return Ok(());
    }
    Err(MetaError::new(
        libc::EPERM,
        format!(
            "sticky directory {}: uid {} owns neither it (owner {}) nor {:?} (owner {})",
            dir.ino,
            c.uid,
            dir.uid,
            String::from_utf8_lossy(name),
            victim.uid
        ),
    ))
}

/// chown rules: root may set anything; otherwise the caller must own the file, may not change
/// the owner, and may only set a group it belongs to. Unchanged values are always allowed to
/// the owner.
pub fn check_chown(
    c: &Caller,
    attr: &Attr,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<(), MetaError> {
    if c.is_root() {
        return Ok(());
    }
    if let Some(uid) = uid {
        if uid != attr.uid {
            return Err(MetaError::new(
                libc::EPERM,
                format!(
                    "chown of inode {} to uid {uid}: only root changes an owner (caller uid {})",
                    attr.ino, c.uid
                ),
            ));
        }
    }
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    if c.uid != attr.uid {
        return Err(MetaError::new(
            libc::EPERM,
            format!(
                "chown of inode {}: caller uid {} is not the owner {}",
                attr.ino, c.uid, attr.uid
            ),
        ));
    }
    if let Some(gid) = gid {
        if gid != attr.gid && !c.in_group(gid) {
            return Err(MetaError::new(
                libc::EPERM,
                format!(
                    "chgrp of inode {} to gid {gid}: uid {} is not a member of that group",
                    attr.ino, c.uid
                ),
            ));
        }
    }
    Ok(())
}

/// The mode bits after a chown of a non-directory: set-user-ID always dropped, set-group-ID
/// dropped when group execute is set (without it the bit means mandatory locking and stays).
/// Linux does this for every caller, root included.
pub fn mode_after_chown(attr: &Attr) -> u32 {
    if attr.kind == FileKind::Directory {
        return attr.mode;
    }
    drop_privilege_bits(attr.mode)
}

/// The mode bits after a data write or truncation by `c`: non-root callers drop set-user-ID,
/// and set-group-ID when group execute is set; root keeps them.
pub fn mode_after_write(c: &Caller, attr: &Attr) -> u32 {
    if c.is_root() || attr.kind != FileKind::Regular {
        return attr.mode;
    }
    drop_privilege_bits(attr.mode)
}

fn drop_privilege_bits(mode: u32) -> u32 {
    let mut mode = mode & !S_ISUID;
    if mode & S_IXGRP != 0 {
        mode &= !S_ISGID;
    }
    mode
}

/// chmod: only the owner or root, else EPERM. Returns the mode to store: a non-root caller who
/// is not a member of the file's group cannot set set-group-ID (the bit is silently cleared).
pub fn chmod_mode(c: &Caller, attr: &Attr, requested: u32) -> Result<u32, MetaError> {
    if !c.is_root() && c.uid != attr.uid {
        return Err(MetaError::new(
            libc::EPERM,
            format!(
                "chmod of inode {}: caller uid {} is not the owner {}",
                attr.ino, c.uid, attr.uid
            ),
        ));
    }
    let mut mode = requested & 0o7777;
    if !c.is_root() && !c.in_group(attr.gid) {
        mode &= !S_ISGID;
    }
    Ok(mode)
}

/// utimens: setting explicit times needs ownership (EPERM); setting "now" needs ownership or
/// write permission (EACCES).
pub fn check_set_times(c: &Caller, attr: &Attr, explicit: bool) -> Result<(), MetaError> {
    if c.is_root() || c.uid == attr.uid {
        return Ok(());
    }
    if explicit {
        return Err(MetaError::new(
            libc::EPERM,
            format!(
                "setting explicit times on inode {}: caller uid {} is not the owner {}",
                attr.ino, c.uid, attr.uid
            ),
        ));
    }
    require(c, attr, MAY_WRITE, "setting times to now")
}

/// Owner, group and mode of a new inode created by `c` in directory `parent` with requested
/// permission bits `mode` (umask already applied): the group is the parent's if the parent is
/// set-group-ID (and a new directory inherits the bit), else the caller's; a caller outside the
/// resulting group cannot create a set-group-ID non-directory.
pub fn new_inode_owner(c: &Caller, parent: &Attr, kind: FileKind, mode: u32) -> (u32, u32, u32) {
    let mut mode = mode & 0o7777;
    let gid = if parent.mode & S_ISGID != 0 {
        if kind == FileKind::Directory {
            mode |= S_ISGID;
        }
        parent.gid
    } else {
        c.gid
    };
    if kind != FileKind::Directory && mode & S_ISGID != 0 && !c.is_root() && !c.in_group(gid) {
        mode &= !S_ISGID;
    }
    (c.uid, gid, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_namespace::Timestamp;

    fn attr(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: 9,
            kind,
            mode,
            nlink: 1,
            uid,
            gid,
            size: 0,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            generation: 0,
        }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller { uid, gid, groups: groups.to_vec(), pid: 1 }
    }

    #[test]
    fn the_first_matching_class_decides() {
        let file = attr(FileKind::Regular, 0o070, 10, 20); // owner nothing, group rwx
        assert!(
            !permits(&user(10, 20, &[]), &file, MAY_READ),
            "owner class decides even when group would allow"
        );
        assert!(permits(&user(11, 20, &[]), &file, MAY_READ | MAY_WRITE | MAY_EXECUTE));
        assert!(permits(&user(11, 5, &[7, 20]), &file, MAY_WRITE), "supplementary groups count");
        assert!(!permits(&user(11, 5, &[7]), &file, MAY_READ), "other class: nothing");
        let other = attr(FileKind::Regular, 0o604, 10, 20);
        assert!(permits(&user(12, 21, &[]), &other, MAY_READ));
        assert!(!permits(&user(12, 21, &[]), &other, MAY_WRITE));
        assert!(!permits(&user(12, 20, &[]), &other, MAY_READ), "group class with no bits denies");
    }

    #[test]
    fn root_bypasses_all_but_execute() {
        let root = Caller::root();
        let file = attr(FileKind::Regular, 0o000, 10, 20);
        assert!(permits(&root, &file, MAY_READ | MAY_WRITE));
        assert!(!permits(&root, &file, MAY_EXECUTE));
        assert!(permits(&root, &attr(FileKind::Regular, 0o001, 10, 20), MAY_EXECUTE));
        assert!(permits(&root, &attr(FileKind::Directory, 0o000, 10, 20), MAY_EXECUTE));
    }

    #[test]
    fn require_names_the_missing_bits() {
        let error = require(
            &user(1, 1, &[]),
            &attr(FileKind::Regular, 0o600, 2, 2),
            MAY_READ | MAY_EXECUTE,
            "open",
        )
        .unwrap_err();
        assert_eq!(error.errno, libc::EACCES);
        assert!(
            error.message.contains("r-x") && error.message.contains("inode 9"),
            "{}",
            error.message
        );
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let dir = attr(FileKind::Directory, 0o1777, 1, 1);
        let victim = attr(FileKind::Regular, 0o644, 2, 2);
        assert!(!may_delete_in_sticky(&user(3, 3, &[]), &dir, &victim));
        assert!(may_delete_in_sticky(&user(2, 3, &[]), &dir, &victim), "entry owner");
        assert!(may_delete_in_sticky(&user(1, 3, &[]), &dir, &victim), "directory owner");
        assert!(may_delete_in_sticky(&Caller::root(), &dir, &victim));
        let plain = attr(FileKind::Directory, 0o777, 1, 1);
        assert!(may_delete_in_sticky(&user(3, 3, &[]), &plain, &victim));
        assert_eq!(
            require_sticky(&user(3, 3, &[]), &dir, &victim, b"f").unwrap_err().errno,
            libc::EPERM
        );
    }

    #[test]
    fn chown_rules() {
        let file = attr(FileKind::Regular, 0o644, 10, 20);
        assert!(check_chown(&Caller::root(), &file, Some(99), Some(99)).is_ok());
        assert_eq!(
            check_chown(&user(10, 20, &[]), &file, Some(11), None).unwrap_err().errno,
            libc::EPERM
        );
        assert!(
            check_chown(&user(10, 20, &[]), &file, Some(10), None).is_ok(),
            "unchanged owner is allowed"
        );
        assert!(
            check_chown(&user(10, 20, &[30]), &file, None, Some(30)).is_ok(),
            "owner to one of its groups"
        );
        assert_eq!(
            check_chown(&user(10, 20, &[30]), &file, None, Some(31)).unwrap_err().errno,
            libc::EPERM
        );
        assert_eq!(
            check_chown(&user(11, 20, &[30]), &file, None, Some(30)).unwrap_err().errno,
            libc::EPERM,
            "non-owner"
        );
        assert!(check_chown(&user(11, 20, &[]), &file, None, None).is_ok());
    }

    #[test]
    fn chown_drops_setuid_and_executable_setgid_on_files_only() {
        assert_eq!(mode_after_chown(&attr(FileKind::Regular, 0o6755, 1, 1)), 0o755);
        assert_eq!(
            mode_after_chown(&attr(FileKind::Regular, 0o6745, 1, 1)),
            0o2745,
            "sgid without gx stays"
        );
        assert_eq!(mode_after_chown(&attr(FileKind::Directory, 0o6755, 1, 1)), 0o6755);
    }

    #[test]
    fn writes_by_non_root_drop_privilege_bits() {
        let file = attr(FileKind::Regular, 0o6775, 1, 1);
        assert_eq!(mode_after_write(&user(1, 1, &[]), &file), 0o775);
        assert_eq!(mode_after_write(&Caller::root(), &file), 0o6775);
    }

    #[test]
    fn chmod_rules() {
        let file = attr(FileKind::Regular, 0o644, 10, 20);
        assert_eq!(chmod_mode(&user(11, 20, &[]), &file, 0o777).unwrap_err().errno, libc::EPERM);
        assert_eq!(chmod_mode(&user(10, 20, &[]), &file, 0o2755).unwrap(), 0o2755);
        assert_eq!(
            chmod_mode(&user(10, 21, &[]), &file, 0o2755).unwrap(),
            0o755,
            "sgid needs group membership"
        );
        assert_eq!(chmod_mode(&Caller::root(), &file, 0o2755).unwrap(), 0o2755);
        assert_eq!(
            chmod_mode(&user(10, 20, &[]), &file, 0o170644).unwrap(),
            0o644,
            "type bits ignored"
        );
    }

    #[test]
    fn time_setting_rules() {
        let file = attr(FileKind::Regular, 0o646, 10, 20);
        assert!(check_set_times(&user(10, 1, &[]), &file, true).is_ok());
        assert_eq!(check_set_times(&user(11, 1, &[]), &file, true).unwrap_err().errno, libc::EPERM);
        assert!(
            check_set_times(&user(11, 1, &[]), &file, false).is_ok(),
            "write permission suffices for now"
        );
        let readonly = attr(FileKind::Regular, 0o644, 10, 20);
        assert_eq!(
            check_set_times(&user(11, 1, &[]), &readonly, false).unwrap_err().errno,
            libc::EACCES
        );
    }

    #[test]
    fn new_inodes_take_group_and_sgid_from_sgid_parents() {
        let plain = attr(FileKind::Directory, 0o755, 0, 50);
        assert_eq!(
            new_inode_owner(&user(10, 20, &[]), &plain, FileKind::Regular, 0o644),
            (10, 20, 0o644)
        );
        let sgid = attr(FileKind::Directory, 0o2775, 0, 50);
        assert_eq!(
            new_inode_owner(&user(10, 20, &[]), &sgid, FileKind::Regular, 0o644),
            (10, 50, 0o644)
        );
        assert_eq!(
            new_inode_owner(&user(10, 20, &[]), &sgid, FileKind::Directory, 0o755),
            (10, 50, 0o2755)
        );
        assert_eq!(
            new_inode_owner(&user(10, 20, &[]), &sgid, FileKind::Regular, 0o2755),
            (10, 50, 0o755),
            "non-member"
        );
        assert_eq!(
            new_inode_owner(&user(10, 20, &[50]), &sgid, FileKind::Regular, 0o2755),
            (10, 50, 0o2755)
        );
    }
}
