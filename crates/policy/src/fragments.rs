//! Capacity → fragments → servers: how a reservation's capacity is laid over a pool's servers.
//!
//! DataWarp grants capacity in fragments of a fixed size (its "granularity", 200 GiB on Cori) and
//! the number of fragments sets how many servers a job stripes over: one fragment per server
//! while there are servers, so a bigger request also gets more bandwidth. This module is that
//! decision as a pure function, so the manager and tests agree on it exactly:
//!
//! 1. `fragments = ceil(capacity / fragment_bytes)` (at least one);
//! 2. the candidate servers are the healthy ones with at least one fragment of free space,
//!    ordered by free bytes (most first), ties by id (lowest first);
//! 3. the reservation stripes over `min(fragments, stripe_servers_max, candidates)` of them, the
//!    first in that order;
//! 4. fragments are dealt round robin over the chosen servers; a server whose free space is used
//!    up is skipped; if fragments remain when every chosen server is full, the next candidates
//!    (beyond the stripe width) are **not** used — the request fails with the shortfall named.
//!
//! Deterministic: the same snapshot and request always give the same placement.

/// One server as the allocator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerSpace {
    pub server: u64,
    pub free_bytes: u64,
    pub healthy: bool,
}

/// A reservation's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragmentRequest {
    pub capacity_bytes: u64,
    pub fragment_bytes: u64,
    pub stripe_servers_max: u32,
}

/// Where a reservation's fragments go: `(server, fragment count)`, in stripe order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FragmentPlan {
    pub fragments: u64,
    pub fragment_bytes: u64,
    pub per_server: Vec<(u64, u64)>,
}

impl FragmentPlan {
    /// Capacity granted: whole fragments, so at least the capacity asked for.
    pub fn granted_bytes(&self) -> u64 {
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
    #[error("{capacity_bytes} bytes do not fit: no healthy server has a free {fragment_bytes}-byte fragment")]
    NoHealthyServer { capacity_bytes: u64, fragment_bytes: u64 },
    #[error("{fragments} fragments of {fragment_bytes} bytes needed, only {placeable} fit on the {servers} servers striped over")]
    InsufficientCapacity { fragments: u64, fragment_bytes: u64, placeable: u64, servers: usize },
}

/// Places `request` over `servers` (see the module documentation for the rules).
pub fn allocate(
    servers: &[ServerSpace],
    request: FragmentRequest,
) -> Result<FragmentPlan, FragmentError> {
    if request.capacity_bytes == 0 {
        return Err(FragmentError::ZeroCapacity);
    }
    if request.fragment_bytes == 0 {
        return Err(FragmentError::ZeroFragment);
    }
    if request.stripe_servers_max == 0 {
        return Err(FragmentError::ZeroStripe);
    }
    let fragments = request.capacity_bytes.div_ceil(request.fragment_bytes);
    let mut candidates: Vec<ServerSpace> = servers
        .iter()
        .copied()
        .filter(|s| s.healthy && s.free_bytes >= request.fragment_bytes)
        .collect();
    candidates.sort_by_key(|s| (std::cmp::Reverse(s.free_bytes), s.server));
    if candidates.is_empty() {
        return Err(FragmentError::NoHealthyServer {
            capacity_bytes: request.capacity_bytes,
            fragment_bytes: request.fragment_bytes,
        });
    }
    let width = (fragments.min(request.stripe_servers_max as u64) as usize).min(candidates.len());
    let chosen = &candidates[..width];
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
    Ok(FragmentPlan { fragments, fragment_bytes: request.fragment_bytes, per_server })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn server(server: u64, free_mib: u64) -> ServerSpace {
        ServerSpace { server, free_bytes: free_mib * MIB, healthy: true }
    }

    fn request(capacity_mib: u64, stripe_servers_max: u32) -> FragmentRequest {
        FragmentRequest {
            capacity_bytes: capacity_mib * MIB,
            fragment_bytes: 8 * MIB,
            stripe_servers_max,
        }
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
        let down = [ServerSpace { server: 1, free_bytes: 100 * MIB, healthy: false }];
        assert!(matches!(
            allocate(&down, request(1, 8)),
            Err(FragmentError::NoHealthyServer { .. })
        ));
        assert_eq!(allocate(&servers, request(0, 8)), Err(FragmentError::ZeroCapacity));
    }

    #[test]
    fn deterministic_and_within_free_space() {
        // Every request against every small snapshot: same answer twice, never over free space.
        for frees in [[3u64, 1, 2], [0, 5, 5], [2, 2, 2], [7, 0, 1]] {
            let servers: Vec<ServerSpace> =
                frees.iter().enumerate().map(|(i, &f)| server(i as u64, f * 8)).collect();
            for fragments in 1..12 {
                for width in 1..4 {
                    let a = allocate(&servers, request(fragments * 8, width));
                    assert_eq!(a, allocate(&servers, request(fragments * 8, width)));
                    if let Ok(plan) = a {
                        assert_eq!(plan.per_server.iter().map(|p| p.1).sum::<u64>(), fragments);
                        assert!(plan.per_server.len() <= width as usize);
                        for (s, c) in plan.per_server {
                            assert!(c * 8 <= frees[s as usize] * 8);
                        }
                    }
                }
            }
        }
    }
}
