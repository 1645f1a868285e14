//! The pools answer for Slurm (`slurm_bb_pools`): Slurm's JSON computed from the manager's
//! pools and reservations, and the cache file the Lua reads from inside slurmctld (so no manager
//! call ever runs there).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context};

use crate::hooks::Hooks;

/// How long `pools` waits for the manager when refreshing the cache.
const POOLS_TIMEOUT: Duration = Duration::from_secs(5);

/// The cached answer, as the last refresh wrote it.
pub(crate) fn read_cache(cache: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(cache)
        .with_context(|| format!("reading pools cache {}", cache.display()))
}

/// Each pool's name and whole capacity, from the cached answer.
pub(crate) fn pool_sizes(cache: &Path) -> anyhow::Result<Vec<crate::directive::PoolSize>> {
    let json: serde_json::Value = serde_json::from_str(&read_cache(cache)?)
        .with_context(|| format!("parsing pools cache {}", cache.display()))?;
    let pools = json["pools"]
        .as_array()
        .ok_or_else(|| anyhow!("pools cache {}: no \"pools\" array", cache.display()))?;
    pools
        .iter()
        .map(|pool| {
            let name = pool["id"].as_str();
            let (quantity, granularity) = (pool["quantity"].as_u64(), pool["granularity"].as_u64());
            match (name, quantity, granularity) {
                (Some(name), Some(quantity), Some(granularity)) => Ok(crate::directive::PoolSize {
                    name: name.to_string(),
                    capacity_bytes: quantity.saturating_mul(granularity),
                }),
                _ => Err(anyhow!("pools cache {}: bad pool {pool}", cache.display())),
            }
        })
        .collect()
}

/// Replace the cached answer (a temporary file renamed over it).
pub(crate) fn write_cache(cache: &Path, json: &str) -> anyhow::Result<()> {
    let tmp = cache.with_extension("tmp");
    std::fs::write(&tmp, json).with_context(|| format!("writing {}", tmp.display()))?;
    // Readable by slurmctld whoever refreshed it.
    std::fs::rename(&tmp, cache)
        .with_context(|| format!("renaming {} to {}", tmp.display(), cache.display()))?;
    Ok(())
}

impl Hooks {
    /// Slurm's pool JSON from the manager's pools and reservations.
    pub(crate) fn slurm_pools_json(&self) -> anyhow::Result<String> {
        let pools: serde_json::Value =
            serde_json::from_str(&self.manager_timed(&["pool", "list", "--json"], POOLS_TIMEOUT)?)
                .context("parsing `pool list --json`")?;
        let reservations: serde_json::Value = serde_json::from_str(
            &self.manager_timed(&["reservation", "list", "--all", "--json"], POOLS_TIMEOUT)?,
        )
        .context("parsing `reservation list --all --json`")?;
        Ok(slurm_pools(&pools, &reservations)?.to_string())
    }
}

/// Slurm's `{"pools":[{"id","quantity","granularity","free"}]}` (sizes in granularity units)
/// from `pool list --json` and `reservation list --all --json` (the manager's model types).
///
/// quantity = the pool's capacity / granularity. Slurm subtracts its own jobs' usage itself and
/// treats quantity − free as space used outside Slurm, so free = quantity minus what the
/// reservations Slurm does not account for hold: persistent ones and any not tied to a job.
fn slurm_pools(
    pools: &serde_json::Value,
    reservations: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let pools =
        pools.as_array().ok_or_else(|| anyhow!("pool list: expected a JSON array, got {pools}"))?;
    let reservations = reservations
        .as_array()
        .ok_or_else(|| anyhow!("reservation list: expected a JSON array, got {reservations}"))?;
    let text = |item: &serde_json::Value, key: &str| {
        item.get(key).and_then(|v| v.as_str()).map(str::to_string)
    };
    let number = |item: &serde_json::Value, key: &str| item.get(key).and_then(|v| v.as_u64());
    let mut out = Vec::new();
    for pool in pools {
        let name = text(pool, "name").ok_or_else(|| anyhow!("pool without a name: {pool}"))?;
        let granularity = number(pool, "granularity_bytes")
            .filter(|g| *g > 0)
            .ok_or_else(|| anyhow!("pool {name} without a granularity_bytes: {pool}"))?;
        let capacity = number(pool, "capacity_bytes")
            .ok_or_else(|| anyhow!("pool {name} without capacity_bytes: {pool}"))?;
        let external: u64 = reservations
            .iter()
            .filter(|r| text(r, "pool").as_deref() == Some(name.as_str()))
            .filter(|r| text(r, "state").as_deref() != Some("destroyed"))
            .filter(|r| {
                let slurm_job = r.get("job").is_some_and(|j| !j.is_null())
                    && !r.get("persistent").and_then(|p| p.as_bool()).unwrap_or(false);
                !slurm_job
            })
            .filter_map(|r| number(r, "capacity_bytes"))
            .sum();
        let quantity = capacity / granularity;
        let free = quantity.saturating_sub(external.div_ceil(granularity));
        out.push(serde_json::json!({"id": name, "quantity": quantity, "granularity": granularity, "free": free}));
    }
    Ok(serde_json::json!({ "pools": out }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_json_subtracts_only_reservations_slurm_does_not_account() {
        let mib = 1u64 << 20;
        let pools = serde_json::json!([
            {"name": "fast", "granularity_bytes": mib, "capacity_bytes": 128 * mib},
            {"name": "slow", "granularity_bytes": 4 * mib, "capacity_bytes": 40 * mib},
        ]);
        let reservations = serde_json::json!([
            {"name": "job-5", "job": "5", "persistent": false, "pool": "fast", "capacity_bytes": 10 * mib, "state": "active"},
            {"name": "shared", "job": null, "persistent": true, "pool": "fast", "capacity_bytes": 3 * mib + 1, "state": "active"},
            {"name": "gone", "job": null, "persistent": true, "pool": "fast", "capacity_bytes": 50 * mib, "state": "destroyed"},
            {"name": "res-9", "job": null, "persistent": false, "pool": "slow", "capacity_bytes": 8 * mib, "state": "active"},
        ]);
        let json = slurm_pools(&pools, &reservations).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"pools": [
                {"id": "fast", "quantity": 128, "granularity": mib, "free": 124},
                {"id": "slow", "quantity": 10, "granularity": 4 * mib, "free": 8},
            ]})
        );
        // What submission checks read back from the cache.
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("pools.json");
        write_cache(&cache, &json.to_string()).unwrap();
        let sizes = pool_sizes(&cache).unwrap();
        assert_eq!(
            sizes[0],
            crate::directive::PoolSize { name: "fast".into(), capacity_bytes: 128 * mib }
        );
        assert_eq!(sizes[1].capacity_bytes, 40 * mib);
        let no_granularity = serde_json::json!([{"name": "x", "capacity_bytes": 1}]);
        assert!(slurm_pools(&no_granularity, &reservations)
            .unwrap_err()
            .to_string()
            .contains("pool x"));
    }
}
