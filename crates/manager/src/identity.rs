//! Who is calling: the kernel-vouched uid/gid of an API connection, its groups, admin or not.
//!
//! The uid and gid come from the transport (`SO_PEERCRED` on the Unix socket, the socket owner
//! in `/proc/net/tcp` on loopback TCP — see `spillway_proto::transport`), never from the request.
//! Supplementary groups are looked up in the user database (`getgrouplist`), which is what decides
//! membership of the configured admin group and of a persistent reservation's allowed groups.

/// The identity an API request runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Primary and supplementary groups.
    pub groups: Vec<u32>,
    /// Root or a member of the admin group: may manage pools, servers and quotas and act for
    /// other users.
    pub admin: bool,
}

impl Caller {
    /// A caller with the groups of `uid` from the user database; admin if root or in `admin_gid`.
    pub fn resolve(uid: u32, gid: u32, admin_gid: Option<u32>) -> Caller {
        let mut groups = groups_of(uid, gid);
        if !groups.contains(&gid) {
            groups.push(gid);
        }
        let admin = uid == 0 || admin_gid.is_some_and(|g| groups.contains(&g));
        Caller { uid, gid, groups, admin }
    }

    /// For tests: a caller with exactly these facts.
    pub fn new(uid: u32, gid: u32, groups: Vec<u32>, admin: bool) -> Caller {
        Caller { uid, gid, groups, admin }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The gid of a group given by name or number; `None` for "".
pub fn resolve_group(text: &str) -> Result<Option<u32>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(gid) = text.parse::<u32>() {
        return Ok(Some(gid));
    }
    match spillway_sys::user::group_id(text) {
        Ok(Some(gid)) => Ok(Some(gid)),
        Ok(None) => Err(format!("group {text:?} does not exist (knob manager.admin_group)")),
        Err(error) => Err(format!("group {text:?}: {error} (knob manager.admin_group)")),
    }
}

/// Every group of `uid` (primary `gid` included) from the user database; just `[gid]` for a uid
/// with no passwd entry or when the database cannot be read.
fn groups_of(uid: u32, gid: u32) -> Vec<u32> {
    spillway_sys::user::groups_of(uid, gid).unwrap_or_else(|_| vec![gid])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_admin_and_groups_include_the_primary() {
        let root = Caller::resolve(0, 0, None);
        assert!(root.admin);
        assert!(root.in_group(0));
        let nobody = Caller::resolve(65534, 65534, Some(4242));
        assert!(!nobody.admin);
        assert!(nobody.in_group(65534));
        let member = Caller::resolve(65534, 4242, Some(4242));
        assert!(member.admin, "primary group is the admin group");
    }

    #[test]
    fn groups_by_name_and_number() {
        assert_eq!(resolve_group(""), Ok(None));
        assert_eq!(resolve_group("123"), Ok(Some(123)));
        assert_eq!(resolve_group("root"), Ok(Some(0)));
        assert!(resolve_group("no-such-group-spillway").unwrap_err().contains("does not exist"));
    }
}
