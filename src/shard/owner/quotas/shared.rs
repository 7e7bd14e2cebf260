//! The quota side of the sync round (seed `run-several-routers.md`, "How it works", steps 1 and
//! 2): hand out the usage this shard's holders admitted since the last round, and subtract the
//! usage other routers published.
//!
//! Usage names its holder by ids every router of a site derives the same way from the keys
//! (`TenantId`, `KeyId`); models stay this process's `ModelId` here, and the sync core turns them
//! into names before anything leaves the router. Usage for a holder this shard has not built is
//! not dropped: the holder is built from the key registry first, so a key used on other routers
//! starts here already charged, not with a fresh budget.

use crate::auth::keys::KeyRegistry;
use crate::ids::{KeyId, TenantId};
use crate::limits::{BucketRef, Day, Millis};
use crate::snapshot::RoutingSnapshot;

use super::Quotas;

/// One bucket's usage as routers exchange it. Request and daily buckets belong to the owner's
/// holder (`tenant`; `key` is a key of that owner that used them, to build the holder where it
/// is unknown); input and output token buckets to the key's own holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketUsage {
    pub tenant: TenantId,
    pub key: KeyId,
    pub bucket: BucketRef,
    pub amount: u64,
}

impl BucketUsage {
    /// Whether the bucket is one of the key's own (B4 token rates) rather than its owner's.
    pub fn is_key_bucket(&self) -> bool {
        matches!(
            self.bucket,
            BucketRef::InputTokens { .. } | BucketRef::OutputTokens { .. }
        )
    }
}

impl Quotas {
    /// Appends every bucket's usage since the last call to `out` (each once: taking resets it).
    /// Walks every holder: once per sync round, never per request.
    pub fn take_usage(&mut self, registry: &KeyRegistry, out: &mut Vec<BucketUsage>) {
        for (tenant, holder) in &mut self.holders {
            let (tenant, key) = (*tenant, holder.built.key);
            holder.limits.take_deltas(|bucket, amount| {
                out.push(BucketUsage {
                    tenant,
                    key,
                    bucket,
                    amount,
                })
            });
        }
        for (key, holder) in &mut self.token_rates {
            // A key removed by a reload: its usage no longer limits anyone.
            let Some(record) = registry.get(*key) else {
                holder.limits.take_deltas(|_, _| {});
                continue;
            };
            let (tenant, key) = (record.tenant_id, *key);
            holder.limits.take_deltas(|bucket, amount| {
                out.push(BucketUsage {
                    tenant,
                    key,
                    bucket,
                    amount,
                })
            });
        }
    }

    /// Subtracts usage other routers admitted `age_ms` ago from this shard's holders (the caller
    /// passes only usage of tenants this shard owns). A holder not built yet is built from the
    /// key first; usage of a key this router does not know, or whose owner differs here (routers
    /// with different key files), is ignored.
    pub fn apply_remote(
        &mut self,
        now: Millis,
        day: Day,
        registry: &KeyRegistry,
        snapshot: &RoutingSnapshot,
        usage: &BucketUsage,
        age_ms: u64,
    ) {
        let Some(record) = registry.get(usage.key) else {
            return;
        };
        if record.tenant_id != usage.tenant || !self.build(now, day, registry, snapshot, record) {
            return;
        }
        let holder = if usage.is_key_bucket() {
            self.token_rates.get_mut(&usage.key)
        } else {
            self.holders.get_mut(&usage.tenant)
        };
        if let Some(holder) = holder {
            holder
                .limits
                .apply_remote(now, usage.bucket, usage.amount, age_ms, self.share);
        }
    }
}

/// Usage other routers published, as the sync core hands it to every shard; each applies the
/// usage of the tenants it owns.
#[derive(Debug, Default)]
pub struct RemoteUsage {
    /// Batches of usage admitted at one time, with how long ago that was.
    pub batches: Vec<RemoteBatch>,
}

#[derive(Debug)]
pub struct RemoteBatch {
    pub age_ms: u64,
    pub usage: Vec<BucketUsage>,
}
