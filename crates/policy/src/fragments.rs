//! Capacity → fragments → servers: how a reservation's capacity is laid over a pool's servers.
//!
//! DataWarp grants capacity in fragments of a fixed size (its "granularity", 200 GiB on Cori) and
//! the number of fragments sets how many servers a job stripes over: one fragment per server
//! while there are servers, so a bigger request also gets more bandwidth. This module is that
//! decision as a pure function, so the manager and tests agree on it exactly:
//!
//! 1. `fragments = replicas × ceil(capacity / fragment_bytes)` (at least one per copy): every
//!    byte is held `replicas` times, on servers of distinct failure domains (hosts);
//! 2. the candidate servers are the healthy ones with at least one fragment of free space (and,
//!    with more than one replica, a known failure domain), ordered by free bytes (most first),
//!    ties by id (lowest first), then spread over failure domains: in rounds, each round takes
//!    the first remaining server of every domain not yet used in that round, in that order — so
//!    the first servers are on as many distinct hosts as there are;
//! 3. the reservation stripes over `min(fragments, stripe_servers_max, candidates)` of them, the
//!    first in that order; with `replicas = k` they must span at least k failure domains, or the
//!    request fails naming the need;
//! 4. fragments are dealt round robin over the chosen servers; a server whose free space is used
//!    up is skipped; if fragments remain when every chosen server is full, the next candidates
//!    (beyond the stripe width) are **not** used — the request fails with the shortfall named.
//!
//! Deterministic: the same snapshot and request always give the same placement.

use spillway_types::format_bytes;

/// One server as the allocator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpace {
    pub server: u64,
    pub free_bytes: u64,
    pub healthy: bool,
    /// The host it runs on (its `server.failure_domain`); `None` until known.
    pub domain: Option<String>,
}

/// A reservation's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentRequest {
    pub capacity_bytes: u64,
    pub fragment_bytes: u64,
    pub stripe_servers_max: u32,
    /// Copies of every byte, each on another failure domain (1 to [`REPLICAS_MAX`]).
    pub replicas: u32,
}

pub use crate::replicas::REPLICAS_MAX;

/// Where a reservation's fragments go: `(server, fragment count)`, in stripe order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragmentPlan {
    /// Every fragment, copies included.
    pub fragments: u64,
    pub fragment_bytes: u64,
    pub replicas: u32,
    pub per_server: Vec<(u64, u64)>,
}

impl FragmentPlan {
    /// Capacity granted: whole fragments of one copy, so at least the capacity asked for.
    pub fn granted_bytes(&self) -> u64 {
        self.fragments / self.replicas.max(1) as u64 * self.fragment_bytes
    }

    /// Bytes taken on the servers: every copy.
    pub fn raw_bytes(&self) -> u64 {
        self.fragments * self.fragment_bytes
    }

    /// The servers striped over, in stripe order.
    pub fn servers(&self) -> Vec<u64> {
        self.per_server.iter().map(|&(s, _)| s).collect()
    }
}

/// Why a request cannot be placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FragmentError {
    #[error("capacity of 0 bytes requested")]
    ZeroCapacity,
    #[error("fragment size of 0 bytes (knob manager.fragment_bytes)")]
    ZeroFragment,
    #[error("stripe width of 0 servers (knob manager.stripe_servers_max)")]
    ZeroStripe,
    #[error("{} do not fit: no healthy server has a free fragment of {}", format_bytes(*capacity_bytes), format_bytes(*fragment_bytes))]
    NoHealthyServer { capacity_bytes: u64, fragment_bytes: u64 },
    #[error("{fragments} fragments of {} needed, only {placeable} fit on the {servers} servers striped over", format_bytes(*fragment_bytes))]
    InsufficientCapacity { fragments: u64, fragment_bytes: u64, placeable: u64, servers: usize },
    #[error("replicas={replicas} is outside 1..={max}")]
    BadReplicas { replicas: u32, max: u32 },
    #[error("replicas={replicas} needs {replicas} servers on distinct failure domains, the stripe width allows {width} (knob manager.stripe_servers_max)")]
    StripeTooNarrow { replicas: u32, width: u32 },
    #[error("replicas={replicas} needs healthy servers with free space on {replicas} distinct failure domains (hosts), only {domains} available")]
    TooFewDomains { replicas: u32, domains: usize },
}

/// Orders servers for striping: by free bytes (most first, ties by id), then spread over failure
/// domains in rounds (each round takes the first remaining server of every domain it has not
/// used yet). A server of unknown domain counts as a domain of its own.
pub fn spread_over_domains(servers: &[ServerSpace]) -> Vec<ServerSpace> {
    let mut remaining: Vec<ServerSpace> = servers.to_vec();
    remaining.sort_by_key(|s| (std::cmp::Reverse(s.free_bytes), s.server));
    let mut ordered = Vec::with_capacity(remaining.len());
    while !remaining.is_empty() {
        let mut round: Vec<Option<&str>> = Vec::new();
        let mut left = Vec::new();
        for server in &remaining {
            let key = server.domain.as_deref();
            if key.is_some() && round.contains(&key) {
                left.push(server.clone());
            } else {
                round.push(key);
                ordered.push(server.clone());
            }
        }
        remaining = left;
    }
    ordered
}

/// The servers a reservation may use now: healthy, with at least one fragment free and, with
/// more than one replica, a known failure domain (step 2 of the module documentation).
pub fn eligible_servers(
    servers: &[ServerSpace],
    fragment_bytes: u64,
    replicas: u32,
) -> Vec<ServerSpace> {
    servers
        .iter()
        .filter(|s| s.healthy && s.free_bytes >= fragment_bytes)
        .filter(|s| replicas == 1 || s.domain.is_some())
        .cloned()
        .collect()
}

/// Distinct known failure domains among `servers`, unknown ones each counting as one.
fn distinct_domains(servers: &[ServerSpace]) -> usize {
    let mut known: Vec<&str> = servers.iter().filter_map(|s| s.domain.as_deref()).collect();
    known.sort_unstable();
    known.dedup();
    known.len() + servers.iter().filter(|s| s.domain.is_none()).count()
}

pub(crate) fn check_request(request: FragmentRequest) -> Result<(), FragmentError> {
    if request.capacity_bytes == 0 {
        return Err(FragmentError::ZeroCapacity);
    }
    if request.fragment_bytes == 0 {
        return Err(FragmentError::ZeroFragment);
    }
    if request.stripe_servers_max == 0 {
        return Err(FragmentError::ZeroStripe);
    }
    if request.replicas == 0 || request.replicas > REPLICAS_MAX {
        return Err(FragmentError::BadReplicas { replicas: request.replicas, max: REPLICAS_MAX });
    }
    if request.stripe_servers_max < request.replicas {
        return Err(FragmentError::StripeTooNarrow {
            replicas: request.replicas,
            width: request.stripe_servers_max,
        });
    }
    Ok(())
}

/// Places `request` over `servers` (see the module documentation for the rules).
pub fn allocate(
    servers: &[ServerSpace],
    request: FragmentRequest,
) -> Result<FragmentPlan, FragmentError> {
    check_request(request)?;
    let replicas = request.replicas;
    let fragments = request.capacity_bytes.div_ceil(request.fragment_bytes) * replicas as u64;
    let eligible = eligible_servers(servers, request.fragment_bytes, replicas);
    if eligible.is_empty() {
        return Err(FragmentError::NoHealthyServer {
            capacity_bytes: request.capacity_bytes,
            fragment_bytes: request.fragment_bytes,
        });
    }
    let candidates = spread_over_domains(&eligible);
    let width = (fragments.min(request.stripe_servers_max as u64) as usize).min(candidates.len());
    let chosen = &candidates[..width];
    let domains = distinct_domains(chosen);
    if domains < replicas as usize {
        return Err(FragmentError::TooFewDomains { replicas, domains });
    }
    let slots: Vec<u64> = chosen.iter().map(|s| s.free_bytes / request.fragment_bytes).collect();
    let placeable: u64 = slots.iter().sum();
    if placeable < fragments {
        return Err(FragmentError::InsufficientCapacity {
            fragments,
            fragment_bytes: request.fragment_bytes,
            placeable,
            servers: width,
        });
    }
    let mut counts = vec![0u64; width];
    let mut left = fragments;
    while left > 0 {
        for (i, count) in counts.iter_mut().enumerate() {
            if left == 0 {
                break;
            }
            if *count < slots[i] {
                *count += 1;
                left -= 1;
            }
        }
    }
    let per_server: Vec<(u64, u64)> =
        chosen.iter().zip(counts).map(|(s, c)| (s.server, c)).collect();
    debug_assert!(per_server.iter().all(|&(_, c)| c > 0), "every chosen server gets a fragment");
    debug_assert_eq!(per_server.iter().map(|&(_, c)| c).sum::<u64>(), fragments);
    Ok(FragmentPlan { fragments, fragment_bytes: request.fragment_bytes, replicas, per_server })
}

/// Why a reservation cannot grow in place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrowError {
    #[error("{asked} fragments asked, it holds {current} already: a reservation only grows (its data may already live anywhere in it)")]
    Shrink { current: u64, asked: u64 },
    #[error("server {server} of the reservation is down, lost or being removed: it cannot grow until that changes")]
    Unavailable { server: u64 },
    #[error("{extra} more fragments of {} needed, only {placeable} fit on the reservation's {servers} servers", format_bytes(*fragment_bytes))]
    InsufficientCapacity { extra: u64, fragment_bytes: u64, placeable: u64, servers: usize },
}

/// Grows a reservation in place to `fragments` (copies included): on the same servers in the same
/// stripe order, because where its data lives depends on that list, each keeping what it holds.
/// `current` is each server with its free space and the fragments it holds now. The extra
/// fragments are dealt round robin over them within their free space, as [`allocate`] deals.
pub fn grow(
    current: &[(ServerSpace, u64)],
    fragments: u64,
    fragment_bytes: u64,
) -> Result<Vec<(u64, u64)>, GrowError> {
    let held: u64 = current.iter().map(|&(_, count)| count).sum();
    if fragments < held {
        return Err(GrowError::Shrink { current: held, asked: fragments });
    }
    if let Some((down, _)) = current.iter().find(|(s, _)| !s.healthy) {
        return Err(GrowError::Unavailable { server: down.server });
    }
    let slots: Vec<u64> = current.iter().map(|(s, _)| s.free_bytes / fragment_bytes).collect();
    let placeable: u64 = slots.iter().sum();
    let extra = fragments - held;
    if placeable < extra {
        return Err(GrowError::InsufficientCapacity {
            extra,
            fragment_bytes,
            placeable,
            servers: current.len(),
        });
    }
    let mut added = vec![0u64; current.len()];
    let mut left = extra;
    while left > 0 {
        for (i, count) in added.iter_mut().enumerate() {
            if left > 0 && *count < slots[i] {
                *count += 1;
                left -= 1;
            }
        }
    }
    Ok(current.iter().zip(added).map(|((s, held), added)| (s.server, held + added)).collect())
}

/// The server that takes a lost server's place at `lost_index` of a reservation's server list
/// (`list`, server ids in stripe order): a healthy server of the pool (`pool`) not already in
/// the list, with `needed_bytes` free, of known failure domain, that leaves every replica set
/// of the list unchanged ([`crate::replicas::replacement_keeps_replica_sets`]: the lost
/// server's domain, or — when the lost server shared its domain with no other server of the
/// list — a domain no other server of the list has), the most free first, ties by id. `None`
/// when no server qualifies.
pub fn choose_replacement(
    pool: &[ServerSpace],
    list: &[u64],
    lost_index: usize,
    lost_domain: Option<&str>,
    needed_bytes: u64,
) -> Option<u64> {
    // The list's domains; a member of unknown domain (not yet heard) gets a name of its own.
    let domains: Vec<String> = list
        .iter()
        .enumerate()
        .map(|(i, id)| match pool.iter().find(|s| s.server == *id).and_then(|s| s.domain.clone()) {
            Some(domain) if i != lost_index => domain,
            _ if i == lost_index => {
                lost_domain.map(str::to_string).unwrap_or_else(|| format!("\0lost-{id}"))
            }
            _ => format!("\0unknown-{id}"),
        })
        .collect();
    pool.iter()
        .filter(|s| s.healthy && s.free_bytes >= needed_bytes && !list.contains(&s.server))
        .filter(|s| {
            s.domain.as_ref().is_some_and(|domain| {
                crate::replicas::replacement_keeps_replica_sets(&domains, lost_index, domain)
            })
        })
        .min_by_key(|s| (std::cmp::Reverse(s.free_bytes), s.server))
        .map(|s| s.server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_keeps_the_servers_and_deals_the_rest_round_robin() {
        let space = |server, free_fragments: u64, healthy| ServerSpace {
            server,
            free_bytes: free_fragments * 10,
            healthy,
            domain: None,
        };
        let current = [(space(3, 1, true), 2), (space(1, 5, true), 1), (space(2, 0, true), 1)];
        // 4 held, 8 asked: 4 extra over servers 3 and 1 (2 is full), server 3 full after one.
        assert_eq!(grow(&current, 8, 10), Ok(vec![(3, 3), (1, 4), (2, 1)]));
        assert_eq!(grow(&current, 4, 10), Ok(vec![(3, 2), (1, 1), (2, 1)]), "same size: as is");
        assert_eq!(grow(&current, 3, 10), Err(GrowError::Shrink { current: 4, asked: 3 }));
        assert_eq!(
            grow(&current, 11, 10),
            Err(GrowError::InsufficientCapacity {
                extra: 7,
                fragment_bytes: 10,
                placeable: 6,
                servers: 3
            })
        );
        let down = [(space(3, 9, true), 1), (space(1, 9, false), 1)];
        assert_eq!(grow(&down, 4, 10), Err(GrowError::Unavailable { server: 1 }));
    }

    const MIB: u64 = 1 << 20;

    fn server(server: u64, free_mib: u64) -> ServerSpace {
        // Each server on its own host unless a test says otherwise.
        ServerSpace {
            server,
            free_bytes: free_mib * MIB,
            healthy: true,
            domain: Some(format!("host{server}")),
        }
    }

    fn on(domain: &str, server: ServerSpace) -> ServerSpace {
        ServerSpace { domain: Some(domain.to_string()), ..server }
    }

    fn request(capacity_mib: u64, stripe_servers_max: u32) -> FragmentRequest {
        FragmentRequest {
            capacity_bytes: capacity_mib * MIB,
            fragment_bytes: 8 * MIB,
            stripe_servers_max,
            replicas: 1,
        }
    }

    fn replicated(capacity_mib: u64, stripe_servers_max: u32, replicas: u32) -> FragmentRequest {
        FragmentRequest { replicas, ..request(capacity_mib, stripe_servers_max) }
    }

    #[test]
    fn capacity_rounds_up_to_whole_fragments_one_per_server() {
        let servers = [server(1, 100), server(2, 100), server(3, 100)];
        let plan = allocate(&servers, request(17, 8)).unwrap();
        assert_eq!(plan.fragments, 3);
        assert_eq!(plan.granted_bytes(), 24 * MIB);
        assert_eq!(plan.per_server, vec![(1, 1), (2, 1), (3, 1)]);
        // One fragment: one server, the one with the most free space.
        let servers = [server(1, 50), server(2, 90)];
        assert_eq!(allocate(&servers, request(1, 8)).unwrap().per_server, vec![(2, 1)]);
    }

    #[test]
    fn stripe_width_is_capped_and_fragments_dealt_round_robin() {
        let servers = [server(1, 100), server(2, 100), server(3, 100)];
        let plan = allocate(&servers, request(5 * 8, 2)).unwrap();
        assert_eq!(plan.fragments, 5);
        assert_eq!(plan.per_server, vec![(1, 3), (2, 2)]);
    }

    #[test]
    fn unhealthy_and_full_servers_are_skipped() {
        let mut servers = vec![server(1, 100), server(2, 4), server(3, 100)];
        servers[0].healthy = false;
        let plan = allocate(&servers, request(16, 8)).unwrap();
        assert_eq!(plan.per_server, vec![(3, 2)], "1 is down, 2 has less than a fragment free");
    }

    #[test]
    fn a_small_server_fills_and_the_rest_goes_elsewhere() {
        let servers = [server(1, 16), server(2, 100)];
        let plan = allocate(&servers, request(6 * 8, 8)).unwrap();
        assert_eq!(plan.per_server, vec![(2, 4), (1, 2)]);
    }

    #[test]
    fn shortfall_is_named() {
        let servers = [server(1, 16), server(2, 16)];
        let error = allocate(&servers, request(5 * 8, 8)).unwrap_err();
        assert_eq!(
            error,
            FragmentError::InsufficientCapacity {
                fragments: 5,
                fragment_bytes: 8 * MIB,
                placeable: 4,
                servers: 2
            }
        );
        assert!(error.to_string().contains("only 4 fit"), "{error}");
        let down = [ServerSpace { healthy: false, ..server(1, 100) }];
        assert!(matches!(
            allocate(&down, request(1, 8)),
            Err(FragmentError::NoHealthyServer { .. })
        ));
        assert_eq!(allocate(&servers, request(0, 8)), Err(FragmentError::ZeroCapacity));
    }

    #[test]
    fn deterministic_and_within_free_space() {
        // Every request against every small snapshot: same answer twice, never over free space,
        // and k copies on at least k hosts (servers 0 and 1 share a host).
        for frees in [[3u64, 1, 2], [0, 5, 5], [2, 2, 2], [7, 0, 1]] {
            let servers: Vec<ServerSpace> = frees
                .iter()
                .enumerate()
                .map(|(i, &f)| on(if i < 2 { "a" } else { "b" }, server(i as u64, f * 8)))
                .collect();
            for (fragments, width, replicas) in (1..12)
                .flat_map(|f| (1..4).flat_map(move |w| (1..=w.min(2)).map(move |k| (f, w, k))))
            {
                let asked = replicated(fragments * 8, width, replicas);
                let a = allocate(&servers, asked);
                assert_eq!(a, allocate(&servers, asked));
                if let Ok(plan) = a {
                    let total = fragments * replicas as u64;
                    assert_eq!(plan.per_server.iter().map(|p| p.1).sum::<u64>(), total);
                    assert!(plan.per_server.len() <= width as usize);
                    let chosen: Vec<ServerSpace> =
                        plan.servers().iter().map(|&s| servers[s as usize].clone()).collect();
                    assert!(distinct_domains(&chosen) >= replicas as usize);
                    for (s, c) in plan.per_server {
                        assert!(c * 8 <= frees[s as usize] * 8);
                    }
                }
            }
        }
    }

    #[test]
    fn stripes_spread_over_hosts_before_doubling_up() {
        // Two servers on host a (the two emptiest), one each on b and c.
        let servers = [
            on("a", server(1, 100)),
            on("a", server(2, 90)),
            on("b", server(3, 50)),
            on("c", server(4, 40)),
        ];
        let plan = allocate(&servers, request(3 * 8, 8)).unwrap();
        assert_eq!(plan.servers(), vec![1, 3, 4], "one per host first, most free first");
        let plan = allocate(&servers, request(4 * 8, 8)).unwrap();
        assert_eq!(plan.servers(), vec![1, 3, 4, 2], "then the second round");
        let order: Vec<u64> = spread_over_domains(&servers).iter().map(|s| s.server).collect();
        assert_eq!(order, vec![1, 3, 4, 2]);
    }

    #[test]
    fn replicas_take_k_copies_on_k_hosts() {
        let servers = [on("a", server(1, 100)), on("b", server(2, 100)), on("c", server(3, 100))];
        let plan = allocate(&servers, replicated(16, 8, 2)).unwrap();
        assert_eq!(plan.fragments, 4, "2 fragments, twice");
        assert_eq!(plan.granted_bytes(), 16 * MIB);
        assert_eq!(plan.raw_bytes(), 32 * MIB);
        assert_eq!(plan.per_server, vec![(1, 2), (2, 1), (3, 1)]);
        // A single fragment, two copies: two servers on two hosts.
        let plan = allocate(&servers, replicated(1, 8, 2)).unwrap();
        assert_eq!(plan.per_server, vec![(1, 1), (2, 1)]);
    }

    #[test]
    fn replicas_refused_without_enough_hosts() {
        let one_host = [on("a", server(1, 100)), on("a", server(2, 100))];
        let error = allocate(&one_host, replicated(8, 8, 2)).unwrap_err();
        assert_eq!(error, FragmentError::TooFewDomains { replicas: 2, domains: 1 });
        assert!(error.to_string().contains("2 distinct failure domains"), "{error}");
        // Unknown domains do not count for replicas (they might be one host).
        let unknown = [
            ServerSpace { domain: None, ..server(1, 100) },
            ServerSpace { domain: None, ..server(2, 100) },
        ];
        assert!(matches!(
            allocate(&unknown, replicated(8, 8, 2)),
            Err(FragmentError::NoHealthyServer { .. })
        ));
        assert!(allocate(&unknown, request(16, 8)).is_ok(), "replicas=1 does not need domains");
        let servers = [server(1, 100), server(2, 100)];
        assert_eq!(
            allocate(&servers, replicated(8, 1, 2)),
            Err(FragmentError::StripeTooNarrow { replicas: 2, width: 1 })
        );
        for replicas in [0, REPLICAS_MAX + 1] {
            assert!(matches!(
                allocate(&servers, replicated(8, 8, replicas)),
                Err(FragmentError::BadReplicas { .. })
            ));
        }
        // Three copies on two hosts: refused even with room.
        assert!(matches!(
            allocate(&servers, replicated(8, 8, 3)),
            Err(FragmentError::TooFewDomains { replicas: 3, domains: 2 })
        ));
    }

    #[test]
    fn a_replacement_keeps_every_domain_distinct() {
        // The list is [1 (a), 2 (b), 3 (c)]; 2 is lost.
        let pool = [
            on("a", server(1, 10)),
            on("b", server(2, 10)),
            on("c", server(3, 10)),
            on("a", server(4, 500)), // most free, but host a already holds 1
            on("b", server(5, 50)),  // the lost server's host
            on("d", server(6, 40)),  // a host the list does not use
            on("d", server(7, 400)), // same, but down
            ServerSpace { domain: None, ..server(8, 900) },
        ];
        let mut pool = pool.to_vec();
        pool[6].healthy = false;
        assert_eq!(choose_replacement(&pool, &[1, 2, 3], 1, Some("b"), 8 * MIB), Some(5));
        assert_eq!(
            choose_replacement(&pool, &[1, 2, 3], 1, Some("b"), 60 * MIB),
            None,
            "5 and 6 lack room"
        );
        assert_eq!(
            choose_replacement(&pool, &[1, 2, 3], 1, None, 8 * MIB),
            Some(5),
            "b is then unused"
        );
        // With 9 on host b in the list too, only host b keeps the replica sets: not 6 (d).
        pool.push(on("b", server(9, 5))); // too small to replace anything
        assert_eq!(choose_replacement(&pool, &[1, 2, 3, 9], 1, Some("b"), 8 * MIB), Some(5));
        pool[4].healthy = false;
        assert_eq!(choose_replacement(&pool, &[1, 2, 3, 9], 1, Some("b"), 8 * MIB), None);
        assert_eq!(choose_replacement(&pool, &[1, 2, 3], 1, Some("b"), 8 * MIB), Some(6));
        pool[5].healthy = false;
        assert_eq!(choose_replacement(&pool, &[1, 2, 3], 1, Some("b"), 8 * MIB), None);
    }
}
