//! The quota side of the sync round (seed `run-several-routers.md`, "How it works", steps 1
//! and 2): what the parent's `Quotas` hands out of its holders' usage, and how it takes the
//! other routers' usage, a start's replay, the site's levels and today's totals read again.

use std::collections::HashMap;

use super::*;

/// The quota side of the sync round (seed `run-several-routers.md`, "How it works", steps 1 and
/// 2): hand out the usage this shard's holders admitted since the last round, and subtract the
/// usage other routers published. Usage for a holder this shard has not built is not dropped: it
/// waits, compact (`remote_only`), until a request here builds the holder, which then starts
/// already charged, not with a fresh budget.
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

    /// Appends every rate bucket low enough to be anchored to the site's level (see
    /// `Bucket::anchor_view`). Walks every holder, once per sync round.
    pub fn anchor_views(&self, now: Millis, out: &mut Vec<BucketView>) {
        for holder in self.holders.values() {
            let key = holder.built.key;
            holder.limits.anchor_views(now, |bucket, view| {
                out.push(BucketView { key, bucket, view })
            });
        }
        for (key, holder) in &self.token_rates {
            let key = *key;
            holder.limits.anchor_views(now, |bucket, view| {
                out.push(BucketView { key, bucket, view })
            });
        }
    }

    /// The holder of `usage`'s bucket was just lowered by a replay of the last minute's usage
    /// (a start): its rate views may be stricter than the site's, and may not lower the site's
    /// levels until anchored (`Bucket::unsettle`).
    pub fn unsettle(&mut self, registry: &KeyRegistry, usage: &BucketUsage) {
        if let Some(holder) = self.built_holder(registry, usage.key, usage.is_key_bucket()) {
            holder.limits.unsettle_rates();
        }
    }

    /// Sets one bucket to the site's level the store returned (the caller passes only keys
    /// whose owner this shard owns). A holder dropped since the round asked is not rebuilt.
    pub fn anchor(&mut self, now: Millis, registry: &KeyRegistry, anchor: &Anchor) {
        let share = self.share;
        if let Some(holder) = self.built_holder(registry, anchor.key, anchor.is_key_bucket()) {
            holder.limits.anchor(
                now,
                anchor.bucket,
                anchor.site_units,
                share,
                anchor.lower_only,
            );
        }
    }

    /// The holder of a bucket of `key`, if built: the key's own for its token rates
    /// (`key_bucket`), its owner's otherwise. Nothing is built here.
    fn built_holder(
        &mut self,
        registry: &KeyRegistry,
        key: KeyId,
        key_bucket: bool,
    ) -> Option<&mut Holder> {
        if key_bucket {
            return self.token_rates.get_mut(&key);
        }
        let tenant = registry.get(key)?.tenant_id;
        self.holders.get_mut(&tenant)
    }

    /// The store lost its data: every holder's daily totals are written again next round.
    pub fn rewrite_daily_totals(&mut self) {
        for holder in self.holders.values_mut() {
            holder.limits.mark_daily_unreported();
        }
    }

    /// Subtracts usage other routers admitted `age_ms` ago from the holders of its key (the
    /// caller passes only keys whose owner this shard owns). Usage of a holder not built yet
    /// waits for it (`remote_only`); a key this router does not know is skipped.
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
        let built = if usage.is_key_bucket() {
            self.token_rates.contains_key(&usage.key)
        } else {
            self.holders.contains_key(&record.tenant_id)
        };
        if !built {
            self.remote_only.record(
                record.tenant_id,
                usage.key,
                usage.bucket,
                usage.amount,
                Millis(now.0.saturating_sub(age_ms)),
            );
            return;
        }
        if !self.build(now, day, registry, snapshot, record) {
            return;
        }
        let share = self.share;
        if let Some(holder) = self.built_holder(registry, usage.key, usage.is_key_bucket()) {
            holder
                .limits
                .apply_remote(now, usage.bucket, usage.amount, age_ms, share);
        }
    }

    /// A start's replay of the last minute's usage (`RemoteUsage::replay`), for the tenants
    /// `owns` says this shard owns: each built rate bucket's usage, every key's of its holder
    /// together, is walked in admission order with the refill between (`Bucket::replay`), not
    /// subtracted batch by batch. Daily usage, and usage of a holder not built, go as in a
    /// round ([`Quotas::apply_remote`]). `unsettle`: see `RemoteUsage::unsettle`.
    #[allow(clippy::too_many_arguments)]
    pub fn replay(
        &mut self,
        now: Millis,
        day: Day,
        registry: &KeyRegistry,
        snapshot: &RoutingSnapshot,
        batches: &[RemoteBatch],
        owns: impl Fn(TenantId) -> bool,
        unsettle: bool,
    ) {
        // By holder and bucket: the key's own for its token rates, the owner's otherwise (any
        // of the owner's keys may name it); with one key that names it.
        type Holder = (Option<KeyId>, TenantId, BucketRef);
        let mut histories: HashMap<Holder, (KeyId, Vec<(Millis, u64)>)> = HashMap::new();
        for batch in batches {
            let admitted = Millis(now.0.saturating_sub(batch.age_ms));
            for usage in &batch.usage {
                let Some(record) = registry.get(usage.key) else {
                    continue;
                };
                if !owns(record.tenant_id) {
                    continue;
                }
                let key_bucket = usage.is_key_bucket();
                let built = if key_bucket {
                    self.token_rates.contains_key(&usage.key)
                } else {
                    self.holders.contains_key(&record.tenant_id)
                };
                if !built || matches!(usage.bucket, BucketRef::Daily { .. }) {
                    self.apply_remote(now, day, registry, snapshot, usage, batch.age_ms);
                    if unsettle {
                        self.unsettle(registry, usage);
                    }
                    continue;
                }
                let holder = (
                    key_bucket.then_some(usage.key),
                    record.tenant_id,
                    usage.bucket,
                );
                histories
                    .entry(holder)
                    .or_insert_with(|| (usage.key, Vec::new()))
                    .1
                    .push((admitted, usage.amount));
            }
        }
        let share = self.share;
        for ((key_bucket, _, bucket), (key, mut history)) in histories {
            let Some(record) = registry.get(key) else {
                continue;
            };
            if !self.build(now, day, registry, snapshot, record) {
                continue;
            }
            history.sort_by_key(|(admitted, _)| *admitted);
            if let Some(holder) = self.built_holder(registry, key, key_bucket.is_some()) {
                holder.limits.replay(now, bucket, &history, share);
                if unsettle {
                    holder.limits.unsettle_rates();
                }
            }
        }
    }
}
