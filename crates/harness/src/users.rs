//! Unprivileged local users for the security tests: created with `useradd` (idempotent, so a
//! re-run or a parallel test finds the same account), and commands run as them with `setpriv`.
//!
//! Only root can create users or switch to them; [`TestUser::create`] fails with a message
//! that says so instead of letting a test pass without its attacker.

use std::process::Command;

/// A local account created for a test: its name, uid and primary gid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Why a test user could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UserError {
    #[error("creating test users needs root (running as uid {0}); run the security tests as root")]
    NotRoot(u32),
    #[error("{command}: {detail}")]
    Command { command: String, detail: String },
    #[error("user {0:?} exists but its uid/gid could not be read")]
    Lookup(String),
}

impl TestUser {
    /// The account `name` (at most 32 characters, `[a-z_][a-z0-9_-]*`), created without a home
    /// directory or login shell if it does not exist yet.
    pub fn create(name: &str) -> Result<Self, UserError> {
        let uid = spillway_sys::user::euid();
        if uid != 0 {
            return Err(UserError::NotRoot(uid));
        }
        if lookup(name).is_none() {
            let output = Command::new("useradd")
                .args(["--system", "--no-create-home", "--user-group"])
                .args(["--shell", "/usr/sbin/nologin", name])
                .output()
                .map_err(|e| UserError::Command {
                    command: "useradd".into(),
                    detail: e.to_string(),
                })?;
            // Exit 9: created meanwhile by a parallel test, which is as good.
            if !output.status.success() && output.status.code() != Some(9) {
                return Err(UserError::Command {
                    command: format!("useradd {name}"),
                    detail: String::from_utf8_lossy(&output.stderr).trim().to_string(),
                });
            }
        }
        let (uid, gid) = lookup(name).ok_or_else(|| UserError::Lookup(name.to_string()))?;
        Ok(Self { name: name.to_string(), uid, gid })
    }

    /// `program` run as this user: real and effective uid/gid, its primary group only, and no
    /// capabilities left (setpriv drops them with the uid change).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--init-groups")
            .arg("--")
            .arg(program);
        command
    }
}

/// The uid and gid of `name` from `id`, or None if there is no such user.
fn lookup(name: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let output = Command::new("id").args([flag, name]).output().ok()?;
        if !output.status.success() {
            return None;
        }
        String::from_utf8_lossy(&output.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_user_runs_commands_as_itself() {
        let user = match TestUser::create("spw-test-user") {
            Ok(user) => user,
            Err(UserError::NotRoot(_)) => panic!("this test must run as root"),
            Err(e) => panic!("{e}"),
        };
        assert_ne!(user.uid, 0);
        let again = TestUser::create("spw-test-user").unwrap();
        assert_eq!(again, user, "creating twice finds the same account");
        let output = user.command("id").arg("-u").output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), user.uid.to_string());
    }
}
