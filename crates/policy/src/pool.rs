//! BIOS Algorithm 2: the stream-aware scheduling policy that picks a burst buffer pool for a job.
//!
//! Pools are disjoint groups of SSDs; a job stripes only inside its pool, which bounds how many
//! keys share a device's streams. For a new job of user `u`:
//! 1. an idle pool (no running job) if there is one (lowest id);
//! 2. else a pool where `u` has no running job — so the same user's jobs do not share stream ids —
//!    taking the least used such pool;
//! 3. else the least used pool overall.
//!
//! "Least used" = fewest running jobs, ties to the lowest id.

use spillway_types::StreamKey;

/// Snapshot of one pool for the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolState {
    pub pool: u32,
    /// The user of each job currently running in the pool (one entry per job).
    pub running_job_users: Vec<StreamKey>,
}

/// Which rule of Algorithm 2 chose the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolChoice {
    Idle(u32),
    NotOverlappingUser(u32),
    LeastUsed(u32),
}

impl PoolChoice {
    pub fn pool(self) -> u32 {
        match self {
            PoolChoice::Idle(p) | PoolChoice::NotOverlappingUser(p) | PoolChoice::LeastUsed(p) => p,
        }
    }
}

/// Algorithm 2 for a job of `user`. `None` only when there are no pools.
pub fn select_pool(pools: &[PoolState], user: StreamKey) -> Option<PoolChoice> {
    let least_used = |candidates: &mut dyn Iterator<Item = &PoolState>| {
        candidates.min_by_key(|p| (p.running_job_users.len(), p.pool)).map(|p| p.pool)
    };
    if let Some(idle) =
        pools.iter().filter(|p| p.running_job_users.is_empty()).map(|p| p.pool).min()
    {
        return Some(PoolChoice::Idle(idle));
    }
    let mut not_overlapping = pools.iter().filter(|p| !p.running_job_users.contains(&user));
    if let Some(pool) = least_used(&mut not_overlapping) {
        return Some(PoolChoice::NotOverlappingUser(pool));
    }
    least_used(&mut pools.iter()).map(PoolChoice::LeastUsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(pool: u32, users: &[u64]) -> PoolState {
        PoolState { pool, running_job_users: users.iter().map(|&u| StreamKey(u)).collect() }
    }

    #[test]
    fn idle_pool_first() {
        let pools = [pool(0, &[1]), pool(1, &[]), pool(2, &[])];
        assert_eq!(select_pool(&pools, StreamKey(1)), Some(PoolChoice::Idle(1)));
    }

    #[test]
    fn same_users_jobs_go_to_different_pools() {
        let pools = [pool(0, &[1, 2]), pool(1, &[3]), pool(2, &[1])];
        // User 1 runs in pools 0 and 2: pool 1 is the only one without it.
        assert_eq!(select_pool(&pools, StreamKey(1)), Some(PoolChoice::NotOverlappingUser(1)));
        // User 3: pools 0 and 2 do not have it; 2 is less used.
        assert_eq!(select_pool(&pools, StreamKey(3)), Some(PoolChoice::NotOverlappingUser(2)));
    }

    #[test]
    fn least_used_when_user_is_everywhere() {
        let pools = [pool(0, &[1, 1, 2]), pool(1, &[1, 4]), pool(2, &[1, 5, 6])];
        assert_eq!(select_pool(&pools, StreamKey(1)), Some(PoolChoice::LeastUsed(1)));
        assert_eq!(select_pool(&[], StreamKey(1)), None);
    }

    #[test]
    fn four_users_four_jobs_each_fill_four_pools_evenly() {
        // BIOS 5.6: 8 users × 4 jobs on 4 single-SSD pools; apply decisions one by one.
        let mut pools: Vec<PoolState> = (0..4).map(|p| pool(p, &[])).collect();
        for job in 0..32u64 {
            let user = StreamKey(job % 8);
            let chosen = select_pool(&pools, user).unwrap().pool();
            pools[chosen as usize].running_job_users.push(user);
        }
        for p in &pools {
            assert_eq!(p.running_job_users.len(), 8);
            let mut users = p.running_job_users.clone();
            users.sort();
            users.dedup();
            assert_eq!(users.len(), 8, "no user twice in pool {}", p.pool);
        }
    }
}
