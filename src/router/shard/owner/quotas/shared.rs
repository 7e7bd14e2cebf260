//! The quota side of the sync round (seed `run-several-routers.md`, "How it works", steps 1 and
//! 2): hand out the usage this shard's holders admitted since the last round, and subtract the
//! usage other routers published.
//!
//! Usage names its holder by ids every router of a site derives the same way from the keys
//! (`TenantId`, `KeyId`); models stay this process's `ModelId` here, and the sync core turns them
//! into names before anything leaves the router. Usage for a holder this shard has not built is
//! not dropped: the holder is built from the key registry first, so a key used on other routers
//! starts here already charged, not with a fresh budget.

use crate::base::ids::KeyId;
use crate::logic::auth::keys::KeyRegistry;
use crate::logic::limits::{BucketRef, Day, Millis};
use crate::logic::snapshot::RoutingSnapshot;

use super::Quotas;

/// One bucket's usage as routers exchange it. Request and daily buckets belong to the holder of
/// the key's owner (`key` is a key of that owner that used them: every router finds the owner,
/// and builds the holder where it is unknown, from it); input and output token buckets to the
/// key's own holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketUsage {
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
    /// Walks every holder: once per sync round, never per request. A key removed by a reload
    /// still has its usage published; routers that do not know the key skip it.
    pub fn take_usage(&mut self, out: &mut Vec<BucketUsage>) {
        out.append(&mut self.unpublished);
        for holder in self.holders.values_mut() {
            let key = holder.built.key;
            holder.limits.take_deltas(|bucket, amount| {
                out.push(BucketUsage {
                    key,
                    bucket,
                    amount,
                })
            });
        }
        for (key, holder) in &mut self.token_rates {
            let key = *key;
            holder.limits.take_deltas(|bucket, amount| {
                out.push(BucketUsage {
                    key,
                    bucket,
                    amount,
                })
            });
        }
    }

    /// The store lost its data: every holder's daily totals are written again next round.
    pub fn rewrite_daily_totals(&mut self) {
        for holder in self.holders.values_mut() {
            holder.limits.mark_daily_unreported();
        }
    }

    /// Subtracts usage other routers admitted `age_ms` ago from the holders of its key (the
    /// caller passes only keys whose owner this shard owns). A holder not built yet is built from
    /// the key first; a key this router does not know is skipped.
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
        if !self.build(now, day, registry, snapshot, record) {
            return;
        }
        let holder = if usage.is_key_bucket() {
            self.token_rates.get_mut(&usage.key)
        } else {
            self.holders.get_mut(&record.tenant_id)
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
