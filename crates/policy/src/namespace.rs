//! Which server holds a namespace, and which namespace a mount uses: pure functions of the
//! reservation's server count, the access mode and the node name.
//!
//! `striped`: one namespace for the whole reservation, on its first server (metadata on one
//! server; spreading directories by hash over servers is left for later). `private`: each
//! compute node gets its own namespace, on server `hash(node) % servers`, so metadata load
//! spreads with the number of nodes. The hash is FNV-1a (64-bit), fixed here so every client
//! and tool agrees on placement whatever it was built with.

/// How a reservation's mount shares its namespace (DataWarp's modes): the one type the
/// directive parser, the manager (its JSON and database) and placement share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NamespaceAccess {
    /// One namespace shared by every node.
    Striped,
    /// One namespace per compute node.
    Private,
}

impl NamespaceAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            NamespaceAccess::Striped => "striped",
            NamespaceAccess::Private => "private",
        }
    }
}

impl std::fmt::Display for NamespaceAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NamespaceAccess {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "striped" => Ok(NamespaceAccess::Striped),
            "private" => Ok(NamespaceAccess::Private),
            other => {
                Err(format!("namespace access {other:?} is neither \"striped\" nor \"private\""))
            }
        }
    }
}

/// Where a mount's namespace lives and what it is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespacePlacement {
    /// Index into the reservation's server list.
    pub server: usize,
    /// The namespace id on that server.
    pub namespace: u64,
}

/// FNV-1a, 64-bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The placement of the namespace a mount on `node` uses, for base namespace id `base`
/// (the reservation's) and `servers` servers. Private namespaces get distinct ids per node
/// (`base` mixed with the node's hash) so two nodes placed on one server do not share a tree.
pub fn namespace_placement(
    access: NamespaceAccess,
    base: u64,
    node: &str,
    servers: usize,
) -> NamespacePlacement {
    assert!(servers > 0, "a reservation has at least one server");
    match access {
        NamespaceAccess::Striped => NamespacePlacement { server: 0, namespace: base },
        NamespaceAccess::Private => {
            let hash = fnv1a64(node.as_bytes());
            // Keep ids below 2^63 so they print and parse as signed numbers in every tool.
            let namespace = (base ^ hash.rotate_left(17)) & (u64::MAX >> 1);
            NamespacePlacement { server: (hash % servers as u64) as usize, namespace }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn striped_is_one_namespace_on_the_first_server() {
        for node in ["n1", "n2", "nid00042"] {
            assert_eq!(
                namespace_placement(NamespaceAccess::Striped, 7, node, 4),
                NamespacePlacement { server: 0, namespace: 7 }
            );
        }
    }

    #[test]
    fn private_spreads_nodes_over_servers_with_distinct_namespaces() {
        let placements: Vec<_> = (0..64)
            .map(|i| namespace_placement(NamespaceAccess::Private, 7, &format!("nid{i:05}"), 4))
            .collect();
        let mut per_server = [0; 4];
        for p in &placements {
            per_server[p.server] += 1;
        }
        assert!(per_server.iter().all(|&n| n >= 8), "64 nodes over 4 servers: {per_server:?}");
        let ids: std::collections::HashSet<_> = placements.iter().map(|p| p.namespace).collect();
        assert_eq!(ids.len(), 64);
        assert_eq!(
            placements[3],
            namespace_placement(NamespaceAccess::Private, 7, "nid00003", 4),
            "deterministic"
        );
        assert_eq!(namespace_placement(NamespaceAccess::Private, 7, "x", 1).server, 0);
    }

    #[test]
    fn access_parses() {
        assert_eq!("private".parse::<NamespaceAccess>(), Ok(NamespaceAccess::Private));
        assert!("shared".parse::<NamespaceAccess>().is_err());
    }
}
