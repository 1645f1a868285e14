//! Which servers hold the replicas of one piece of data.
//!
//! A piece's primary server comes from the client's placement (stripe or rank); its replicas
//! are the servers that follow the primary in ring order (primary+1, primary+2, … mod n),
//! skipping every server whose failure domain (host) is already in the set, so that the k
//! copies of a piece are on k distinct hosts. The set depends only on which servers share a
//! domain, never on the domain names, which gives re-replication its rule
//! ([`replacement_keeps_replica_sets`]): a lost server replaced at its index by one that
//! leaves the pattern of shared domains unchanged leaves every replica set unchanged.
//!
//! Pure: clients (writes, reads), the drain (who holds a range) and the manager
//! (re-replication) compute the same sets from the same server list.

/// Largest replication factor (copies of each piece).
pub const REPLICAS_MAX: u32 = 4;

/// Why no replica set could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    #[error("replication factor {0} is outside 1..={REPLICAS_MAX}")]
    Factor(u32),
    #[error("primary server {primary} is not among the {servers} servers")]
    Primary { primary: usize, servers: usize },
    #[error("{replicas} replicas need servers in {replicas} distinct failure domains (hosts); the {servers} servers are in {domains}")]
    NotEnoughDomains { replicas: u32, servers: usize, domains: usize },
}

/// How many distinct failure domains `domains` (one per server) spans.
pub fn distinct_domains<D: PartialEq>(domains: &[D]) -> usize {
    domains.iter().enumerate().filter(|(i, d)| !domains[..*i].contains(d)).count()
}

/// The `replicas` servers (indices into `domains`, one domain per server) that hold a piece
/// whose primary is `primary`: the primary first, then the following servers in ring order,
/// skipping those whose domain is already in the set.
pub fn replica_set<D: PartialEq>(
    domains: &[D],
    primary: usize,
    replicas: u32,
) -> Result<Vec<usize>, ReplicaError> {
    if replicas == 0 || replicas > REPLICAS_MAX {
        return Err(ReplicaError::Factor(replicas));
    }
    let servers = domains.len();
    if primary >= servers {
        return Err(ReplicaError::Primary { primary, servers });
    }
    let mut set = Vec::with_capacity(replicas as usize);
    for step in 0..servers {
        let candidate = (primary + step) % servers;
        if set.iter().all(|&held: &usize| domains[held] != domains[candidate]) {
            set.push(candidate);
            if set.len() == replicas as usize {
                return Ok(set);
            }
        }
    }
    Err(ReplicaError::NotEnoughDomains { replicas, servers, domains: distinct_domains(domains) })
}

/// Whether putting a server of domain `replacement` at index `lost` (in place of the server
/// there) leaves every replica set of `domains` unchanged: the replacement is in the lost
/// server's domain, or the lost server shared its domain with no other server and the
/// replacement's domain is held by no other server either.
pub fn replacement_keeps_replica_sets<D: PartialEq>(
    domains: &[D],
    lost: usize,
    replacement: &D,
) -> bool {
    if *replacement == domains[lost] {
        return true;
    }
    let others = || domains.iter().enumerate().filter(move |&(i, _)| i != lost).map(|(_, d)| d);
    !others().any(|d| *d == domains[lost]) && !others().any(|d| d == replacement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_comes_first_then_the_ring_order() {
        let hosts = ["a", "b", "c", "d"];
        assert_eq!(replica_set(&hosts, 0, 1).unwrap(), [0]);
        assert_eq!(replica_set(&hosts, 0, 2).unwrap(), [0, 1]);
        assert_eq!(replica_set(&hosts, 2, 3).unwrap(), [2, 3, 0]);
        assert_eq!(replica_set(&hosts, 3, 4).unwrap(), [3, 0, 1, 2]);
    }

    #[test]
    fn servers_of_a_domain_already_in_the_set_are_skipped() {
        // Two servers on host a, two on host b, in that order.
        let hosts = ["a", "a", "b", "b"];
        assert_eq!(replica_set(&hosts, 0, 2).unwrap(), [0, 2]);
        assert_eq!(replica_set(&hosts, 1, 2).unwrap(), [1, 2]);
        assert_eq!(replica_set(&hosts, 3, 2).unwrap(), [3, 0]);
        let hosts = ["x", "y", "x", "z"];
        assert_eq!(replica_set(&hosts, 2, 3).unwrap(), [2, 3, 1]);
    }

    #[test]
    fn too_few_domains_bad_factors_and_primaries_are_named() {
        let error = replica_set(&["h", "h", "h"], 1, 2).unwrap_err();
        assert_eq!(error, ReplicaError::NotEnoughDomains { replicas: 2, servers: 3, domains: 1 });
        let message = error.to_string();
        assert!(message.contains("2 distinct failure domains") && message.contains("in 1"));
        assert_eq!(
            replica_set(&["a", "b", "a"], 0, 3),
            Err(ReplicaError::NotEnoughDomains { replicas: 3, servers: 3, domains: 2 })
        );
        assert_eq!(replica_set(&["a"], 0, 0), Err(ReplicaError::Factor(0)));
        assert_eq!(replica_set(&["a"; 8], 0, 5), Err(ReplicaError::Factor(5)));
        assert_eq!(
            replica_set(&["a", "b"], 2, 1),
            Err(ReplicaError::Primary { primary: 2, servers: 2 })
        );
        assert_eq!(
            replica_set::<&str>(&[], 0, 1),
            Err(ReplicaError::Primary { primary: 0, servers: 0 })
        );
    }

    /// Every list of up to 6 servers over 4 domains: each set holds k distinct domains, primary
    /// first, and is what a brute-force reading of the rule gives.
    #[test]
    fn every_set_spans_distinct_domains_with_the_primary_first() {
        for domains in all_lists(6, 4) {
            for primary in 0..domains.len() {
                for replicas in 1..=REPLICAS_MAX {
                    match replica_set(&domains, primary, replicas) {
                        Ok(set) => {
                            assert_eq!(set.len(), replicas as usize);
                            assert_eq!(set[0], primary);
                            let chosen: Vec<u8> = set.iter().map(|&i| domains[i]).collect();
                            assert_eq!(distinct_domains(&chosen), set.len(), "{domains:?}");
                        }
                        Err(ReplicaError::NotEnoughDomains { domains: n, .. }) => {
                            assert!(n < replicas as usize);
                            assert_eq!(n, distinct_domains(&domains));
                        }
                        Err(other) => panic!("{domains:?} {primary} {replicas}: {other}"),
                    }
                }
            }
        }
    }

    /// Rule 2 of the design, checked over every list of up to 6 servers over 4 domains and every
    /// replacement by one of 5 domains (the fifth new to the list): whenever
    /// `replacement_keeps_replica_sets` allows a replacement, every replica set, for every
    /// primary and factor, is unchanged; and a replacement by a domain new to the list is
    /// always allowed when the lost server's domain was its own.
    #[test]
    fn an_allowed_replacement_leaves_every_replica_set_unchanged() {
        let mut allowed = 0u64;
        for domains in all_lists(6, 4) {
            for lost in 0..domains.len() {
                for replacement in 0..5u8 {
                    let keeps = replacement_keeps_replica_sets(&domains, lost, &replacement);
                    let lost_domain_alone =
                        distinct_domains(&domains) > distinct_domains(&without(&domains, lost));
                    if replacement == 4 && lost_domain_alone {
                        assert!(keeps, "{domains:?} {lost}");
                    }
                    if !keeps {
                        continue;
                    }
                    allowed += 1;
                    let mut replaced = domains.clone();
                    replaced[lost] = replacement;
                    for primary in 0..domains.len() {
                        for replicas in 1..=REPLICAS_MAX {
                            assert_eq!(
                                replica_set(&domains, primary, replicas),
                                replica_set(&replaced, primary, replicas),
                                "{domains:?} → {replaced:?}, primary {primary}, k {replicas}"
                            );
                        }
                    }
                }
            }
        }
        assert!(allowed > 10_000, "the property was checked on {allowed} replacements only");
    }

    #[test]
    fn a_fresh_domain_in_place_of_one_of_two_servers_of_a_host_would_move_replicas() {
        // Servers 0 and 1 share host a: the piece of primary 0 has its copy on 2 (host b).
        let hosts = ["a", "a", "b"];
        assert_eq!(replica_set(&hosts, 0, 2).unwrap(), [0, 2]);
        assert!(!replacement_keeps_replica_sets(&hosts, 1, &"c"));
        assert_eq!(replica_set(&["a", "c", "b"], 0, 2).unwrap(), [0, 1]);
        assert!(replacement_keeps_replica_sets(&hosts, 1, &"a"));
        assert!(!replacement_keeps_replica_sets(&["a", "b", "c"], 1, &"c"));
        assert!(replacement_keeps_replica_sets(&["a", "b", "c"], 1, &"d"));
    }

    fn without(domains: &[u8], index: usize) -> Vec<u8> {
        let mut rest = domains.to_vec();
        rest.remove(index);
        rest
    }

    /// Every list of 1..=`length_max` elements over `0..alphabet`.
    fn all_lists(length_max: usize, alphabet: u8) -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        let mut layer = vec![Vec::new()];
        for _ in 0..length_max {
            layer = layer
                .iter()
                .flat_map(|list: &Vec<u8>| {
                    (0..alphabet).map(move |d| {
                        let mut longer = list.clone();
                        longer.push(d);
                        longer
                    })
                })
                .collect();
            all.extend(layer.iter().cloned());
        }
        all
    }
}
