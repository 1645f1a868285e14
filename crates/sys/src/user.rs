//! Who we are, and who a uid is in the user database (`/etc/passwd`, `/etc/group` or NSS).

use std::ffi::CString;
use std::io;

use nix::unistd::{Gid, Group, Uid, User};

/// The real uid of this process.
pub fn uid() -> u32 {
    Uid::current().as_raw()
}

/// The real gid of this process.
pub fn gid() -> u32 {
    Gid::current().as_raw()
}

/// The effective uid of this process (0 when it runs as root, even under sudo).
pub fn euid() -> u32 {
    Uid::effective().as_raw()
}

/// The effective gid of this process.
pub fn egid() -> u32 {
    Gid::effective().as_raw()
}

/// The supplementary groups of this process (`getgroups`).
pub fn process_groups() -> io::Result<Vec<u32>> {
    let groups = nix::unistd::getgroups().map_err(io::Error::from)?;
    Ok(groups.into_iter().map(Gid::as_raw).collect())
}

/// The primary gid of `uid` in the user database; `None` for a uid without an entry.
pub fn primary_gid(uid: u32) -> Option<u32> {
    User::from_uid(Uid::from_raw(uid)).ok().flatten().map(|user| user.gid.as_raw())
}

/// The gid of the group called `name`; `Ok(None)` when there is no such group.
pub fn group_id(name: &str) -> io::Result<Option<u32>> {
    if name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("group name {name:?} contains a NUL byte"),
        ));
    }
    let group = Group::from_name(name).map_err(io::Error::from)?;
    Ok(group.map(|group| group.gid.as_raw()))
}

/// Every group of the user owning `uid`, `gid` included (`getgrouplist`); just `[gid]` for a
/// uid with no entry in the user database.
pub fn groups_of(uid: u32, gid: u32) -> io::Result<Vec<u32>> {
    let Some(user) = User::from_uid(Uid::from_raw(uid)).map_err(io::Error::from)? else {
        return Ok(vec![gid]);
    };
    let name = CString::new(user.name.as_bytes()).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidData, format!("user name of uid {uid} has a NUL"))
    })?;
    let groups = nix::unistd::getgrouplist(&name, Gid::from_raw(gid)).map_err(|errno| {
        io::Error::new(
            io::Error::from(errno).kind(),
            format!("getgrouplist for uid {uid}: {errno}"),
        )
    })?;
    Ok(groups.into_iter().map(Gid::as_raw).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_in_the_database_with_group_root() {
        assert_eq!(primary_gid(0), Some(0));
        assert_eq!(group_id("root").unwrap(), Some(0));
        assert!(groups_of(0, 0).unwrap().contains(&0));
    }

    #[test]
    fn unknown_names_and_uids_are_absent_not_errors() {
        assert_eq!(group_id("no-such-group-spillway").unwrap(), None);
        assert_eq!(primary_gid(4_000_000_000), None);
        assert_eq!(groups_of(4_000_000_000, 77).unwrap(), vec![77]);
        assert!(group_id("bad\0name").is_err());
    }

    #[test]
    fn our_ids_match_the_kernel() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let field = |key: &str| -> Vec<u32> {
            let line = status.lines().find_map(|l| l.strip_prefix(key)).unwrap();
            line.split_whitespace().map(|v| v.parse().unwrap()).collect()
        };
        assert_eq!(field("Uid:")[0..2], [uid(), euid()]);
        assert_eq!(field("Gid:")[0..2], [gid(), egid()]);
        assert_eq!(process_groups().unwrap(), field("Groups:"));
    }
}
