//! slurm_bb_get_status (`scontrol show bbstat`): `spillway status` for whoever asks.
//!
//! The hook runs as root, and root sees every user's reservations, so the hook must not simply
//! ask as itself. Slurm 23.02 and later pass the asking user's uid and gid before the words
//! typed after `bbstat` (Slurm commit "Pass UID and GID to slurm_bb_get_status"); the status is
//! then asked *as* that user (`setgroups`, `setgid`, `setuid` before exec), so the manager shows
//! exactly what it shows that user. Slurm 22.05 passes only the words, so the hook cannot know
//! who asks: it shows capacity only (`spillway status --aggregate`: pools, servers, totals, no
//! reservation). Which Slurm runs the hook is what `scontrol --version` says — not the words,
//! which the user types (`scontrol show bbstat 0 0` must not pass for root under 22.05).

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::commands::{output_of, output_within};
use crate::hooks::Hooks;

/// The first Slurm release that passes the caller's uid and gid to slurm_bb_get_status.
const CALLER_PASSED_SINCE: (u32, u32) = (23, 2);

/// How long `scontrol --version` may take.
const SCONTROL_VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Who asks for the status, as Slurm says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StatusCaller {
    uid: u32,
    gid: u32,
}

impl Hooks {
    /// slurm_bb_get_status (`scontrol show bbstat`): `spillway status` as the asking user when
    /// Slurm says who that is, else capacity only.
    pub(crate) fn status(&self, words: &[String]) -> anyhow::Result<()> {
        let version = slurm_version();
        let (caller, words) = status_caller(version, words)?;
        let mut command = self.spillway()?;
        command.arg("status");
        for word in words {
            if word != "--json" {
                bail!("scontrol show bbstat takes no words but --json; got {word:?}");
            }
            command.arg(word);
        }
        match caller {
            Some(StatusCaller { uid, gid }) => {
                let groups = spillway_sys::user::groups_of(uid, gid)
                    .with_context(|| format!("groups of uid {uid}"))?;
                spillway_sys::process::run_as(&mut command, uid, gid, &groups);
            }
            None => {
                command.arg("--aggregate");
            }
        }
        print!("{}", output_of(&mut command, "spillway status")?);
        Ok(())
    }
}

/// The Slurm release (major, minor) of `scontrol --version` (`slurm 22.05.8`); `None` when it
/// cannot be run or read, which is treated as a release that does not say who asks.
fn slurm_version() -> Option<(u32, u32)> {
    let mut command = Command::new("scontrol");
    command.arg("--version");
    let text = output_within(&mut command, SCONTROL_VERSION_TIMEOUT, "scontrol --version").ok()?;
    parse_slurm_version(&text)
}

/// `slurm 22.05.8` (or `slurm-wlm 23.02.1`) → (22, 5).
fn parse_slurm_version(text: &str) -> Option<(u32, u32)> {
    let number = text.split_whitespace().nth(1)?;
    let mut parts = number.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The caller Slurm passed (from 23.02 on: uid and gid before the user's words) and the
/// user's words.
fn status_caller(
    version: Option<(u32, u32)>,
    words: &[String],
) -> anyhow::Result<(Option<StatusCaller>, &[String])> {
    match version {
        Some(version) if version >= CALLER_PASSED_SINCE => {
            let [uid, gid, rest @ ..] = words else {
                bail!("Slurm {version:?} passes the caller's uid and gid to slurm_bb_get_status; got {words:?}");
            };
            let number = |what: &str, text: &str| {
                text.parse::<u32>().with_context(|| {
                    format!("slurm_bb_get_status: caller {what} {text:?} is not a number")
                })
            };
            Ok((Some(StatusCaller { uid: number("uid", uid)?, gid: number("gid", gid)? }), rest))
        }
        _ => Ok((None, words)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn versions_are_read_from_scontrol() {
        assert_eq!(parse_slurm_version("slurm 22.05.8\n"), Some((22, 5)));
        assert_eq!(parse_slurm_version("slurm-wlm 23.02.1"), Some((23, 2)));
        assert_eq!(parse_slurm_version("nonsense"), None);
    }

    #[test]
    fn the_caller_comes_from_slurm_only_where_slurm_passes_it() {
        // 22.05: the words are the user's, even when they look like a uid and a gid.
        let typed = words(&["0", "0"]);
        assert_eq!(status_caller(Some((22, 5)), &typed).unwrap(), (None, &typed[..]));
        assert_eq!(status_caller(None, &typed).unwrap().0, None, "unknown Slurm: aggregate");
        // 23.02 and later: uid and gid first.
        let passed = words(&["1000", "1000", "--json"]);
        let (caller, rest) = status_caller(Some((23, 2)), &passed).unwrap();
        assert_eq!(caller, Some(StatusCaller { uid: 1000, gid: 1000 }));
        assert_eq!(rest, &passed[2..]);
        assert!(status_caller(Some((24, 11)), &words(&["x", "1"])).is_err());
        assert!(status_caller(Some((23, 11)), &words(&["1"])).is_err());
    }
}
