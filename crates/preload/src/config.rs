//! What the library intercepts and where it sends it, from the environment (docs/design/
//! preload.md, "Configuration"). `spillway mount --print-preload-env` prints these for a mount.

use std::time::Duration;

use spillway_namespace::NamespaceId;
use spillway_proto::Endpoint;

/// The mount point whose paths are intercepted (absolute). Without it the library does nothing.
pub const ENV_MOUNT: &str = "SPILLWAY_PRELOAD_MOUNT";
/// The reservation's servers, in order, comma-separated (`HOST:PORT` or `unix:/path`).
pub const ENV_SERVERS: &str = "SPILLWAY_PRELOAD_SERVERS";
/// The namespace id the mount uses (default 1, the striped namespace).
pub const ENV_NAMESPACE: &str = "SPILLWAY_PRELOAD_NAMESPACE";
/// The index in the server list of the server holding the namespace (default 0).
pub const ENV_NAMESPACE_SERVER: &str = "SPILLWAY_PRELOAD_NAMESPACE_SERVER";
/// Copies of every piece (the reservation's `replicas`, default 1).
pub const ENV_REPLICAS: &str = "SPILLWAY_PRELOAD_REPLICAS";
/// Data clients (each with its worker thread and connections; default 2).
pub const ENV_SLOTS: &str = "SPILLWAY_PRELOAD_SLOTS";
/// How long a directory lookup is reused, in milliseconds (default 1000; 0: never).
pub const ENV_DIR_CACHE_MS: &str = "SPILLWAY_PRELOAD_DIR_CACHE_MS";

const SLOTS_DEFAULT: usize = 2;
const SLOTS_MAX: usize = 16;
const DIR_CACHE_MS_DEFAULT: u64 = 1000;
const DIR_CACHE_MS_MAX: u64 = 60_000;

#[derive(Clone, Debug)]
pub struct Config {
    /// The mount point, absolute, without a trailing slash.
    pub mountpoint: Vec<u8>,
    pub servers: Vec<Endpoint>,
    pub namespace_id: NamespaceId,
    pub namespace_server: usize,
    pub replicas: u32,
    pub slots: usize,
    pub dir_cache_ttl: Duration,
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => text.trim().parse().map_err(|_| format!("{name}={text:?} is not a number")),
    }
}

impl Config {
    /// `None` when [`ENV_MOUNT`] is not set (the library stays out of the way).
    pub fn from_env() -> Option<Result<Config, String>> {
        let mount = std::env::var_os(ENV_MOUNT)?;
        Some(Self::parse(std::os::unix::ffi::OsStrExt::as_bytes(mount.as_os_str())))
    }

    fn parse(mount: &[u8]) -> Result<Config, String> {
        let text = String::from_utf8_lossy(mount);
        if !mount.starts_with(b"/") {
            return Err(format!("{ENV_MOUNT}={text:?} is not an absolute path"));
        }
        let mountpoint =
            normalize(mount).ok_or_else(|| format!("{ENV_MOUNT}={text:?} leaves /"))?;
        if mountpoint.is_empty() {
            return Err(format!(
                "{ENV_MOUNT}={text:?}: the root directory cannot be a mount point"
            ));
        }
        let servers_text =
            std::env::var(ENV_SERVERS).map_err(|_| format!("{ENV_SERVERS} is not set"))?;
        let servers = servers_text
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse::<Endpoint>().map_err(|e| format!("{ENV_SERVERS}: {s:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Err(format!("{ENV_SERVERS} names no server"));
        }
        let namespace_server = number(ENV_NAMESPACE_SERVER, 0usize)?;
        if namespace_server >= servers.len() {
            return Err(format!(
                "{ENV_NAMESPACE_SERVER}={namespace_server} but {ENV_SERVERS} names {} servers",
                servers.len()
            ));
        }
        let replicas = number(ENV_REPLICAS, 1u32)?;
        let slots = number(ENV_SLOTS, SLOTS_DEFAULT)?;
        let dir_cache_ms = number(ENV_DIR_CACHE_MS, DIR_CACHE_MS_DEFAULT)?;
        if !(1..=4).contains(&replicas) || !(1..=SLOTS_MAX).contains(&slots) {
            return Err(format!(
                "{ENV_REPLICAS} must be 1-4 and {ENV_SLOTS} 1-{SLOTS_MAX} (got {replicas}, {slots})"
            ));
        }
        if dir_cache_ms > DIR_CACHE_MS_MAX {
            return Err(format!("{ENV_DIR_CACHE_MS}={dir_cache_ms}: at most {DIR_CACHE_MS_MAX}"));
        }
        Ok(Config {
            mountpoint,
            servers,
            namespace_id: number(ENV_NAMESPACE, 1u64)?,
            namespace_server,
            replicas,
            slots,
            dir_cache_ttl: Duration::from_millis(dir_cache_ms),
        })
    }

    /// The part of absolute, normalized `path` below the mount point (empty for the mount
    /// point itself), or `None` when it is not under it.
    pub fn inside(&self, path: &[u8]) -> Option<Vec<u8>> {
        let normal = normalize(path)?;
        let rest = normal.strip_prefix(self.mountpoint.as_slice())?;
        if rest.is_empty() {
            return Some(Vec::new());
        }
        rest.strip_prefix(b"/").map(<[u8]>::to_vec)
    }
}

/// `path` (absolute) with empty and `.` components dropped and `..` applied lexically, without
/// a trailing slash (`/` becomes empty); `None` if `..` climbs above `/`. Lexical `..` is what
/// the kernel does too when no symbolic link is on the way; links inside the mount are followed
/// by the walk (`Runtime::resolve`), links outside it are not ours to follow (the call goes to
/// libc).
pub fn normalize(path: &[u8]) -> Option<Vec<u8>> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                parts.pop()?;
            }
            _ => parts.push(part),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for part in parts {
        out.push(b'/');
        out.extend_from_slice(part);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize_lexically() {
        assert_eq!(normalize(b"/a//b/./c/").unwrap(), b"/a/b/c");
        assert_eq!(normalize(b"/a/b/../c").unwrap(), b"/a/c");
        assert_eq!(normalize(b"/").unwrap(), b"");
        assert!(normalize(b"/..").is_none());
    }

    #[test]
    fn only_paths_below_the_mount_point_are_inside() {
        let config = Config {
            mountpoint: b"/mnt/bb".to_vec(),
            servers: vec!["127.0.0.1:1".parse().unwrap()],
            namespace_id: 1,
            namespace_server: 0,
            replicas: 1,
            slots: 1,
            dir_cache_ttl: Duration::ZERO,
        };
        assert_eq!(config.inside(b"/mnt/bb").unwrap(), b"");
        assert_eq!(config.inside(b"/mnt/bb/x/y").unwrap(), b"x/y");
        assert_eq!(config.inside(b"/mnt/bb/x/../y/").unwrap(), b"y");
        assert!(config.inside(b"/mnt/bbb/x").is_none());
        assert!(config.inside(b"/mnt/bb/../other").is_none());
        assert!(config.inside(b"/mnt").is_none());
    }
}
