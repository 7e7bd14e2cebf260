//! Per-owner quota state on its owner shard: the `limits::KeyLimits` of every quota holder this
//! shard owns, built from the holder's key on first use and rebuilt (keeping usage) when the key's
//! quota or the model table changes.
//!
//! Holder: the key's owner (`TenantId`). The auth reference shares flat buckets — requests per
//! minute and the daily token budget — between every key of one owner, and per-model budgets are
//! "for this owner and model". Keys of one owner with different quotas share the buckets; the
//! limits follow the quota of the key that last used them (a rebuild keeps the usage).
//!
//! Pure: no I/O, no clock. Time comes in as `Millis` (the process's monotonic origin) and `Day`
//! (the UTC day).
//!
//! Persistence (`HIVENET_ROUTER_QUOTA_BACKEND=badger`, off with `memory`): at start-up
//! [`Quotas::restore`] receives today's totals the disk database holds for the tenants this shard
//! owns. A restored total waits here until its holder is built or rebuilt, is then added to the
//! matching daily budget once and forgotten (a per-model total waits for its model to be served).
//! Totals of a day that is over are dropped. The control core asks every second for the totals
//! that changed ([`Quotas::take_changed_daily_totals`]); a holder dropped as idle hands its
//! unreported change over first, so the disk never keeps a total the router has given back. None
//! of this adds work to admission or settlement: restoring happens where a holder is built anyway.

use std::collections::HashMap;

use crate::auth::config::Quota;
use crate::auth::keys::{KeyRecord, KeyRegistry};
use crate::ids::{Capability, KeyId, ModelId, TenantId};
use crate::limits::{
    Admission, BurstSeconds, Day, Delivery, Estimate, FlatQuota, KeyLimits, KeyQuota,
    LimitExceeded, Millis, ModelContext, ModelQuota, UsedTokens,
};
use crate::snapshot::{ModelKey, RoutingSnapshot};

/// Which key configuration and model table a holder's limits were built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Built {
    registry_version: u64,
    snapshot_version: u64,
    key: KeyId,
}

struct Holder {
    limits: KeyLimits,
    built: Built,
}

/// The limits a key's quota asks for, with model names resolved to this router's model ids.
/// `None`: the key has no finite limit at all (nothing to check or count).
pub fn key_quota(key: &KeyRecord, snapshot: &RoutingSnapshot) -> Option<KeyQuota> {
    match key.settings.quota() {
        Quota::Flat(flat) => {
            let quota = FlatQuota {
                requests_per_minute: flat.requests_per_minute,
                tokens_per_day: flat.tokens_per_day,
                input_tokens_per_minute: flat.input_tokens_per_minute,
                output_tokens_per_minute: flat.output_tokens_per_minute,
            };
            (quota != FlatQuota::default()).then_some(KeyQuota::Flat(quota))
        }
        Quota::PerModel(per_model) => {
            // Models not served right now have no id yet; they cannot be requested either, and the
            // holder is rebuilt when the model table changes.
            let entries: Vec<ModelQuota> = per_model
                .iter()
                .flat_map(|(name, quota)| {
                    Capability::ALL.into_iter().filter_map(move |capability| {
                        snapshot.lookup(name, capability).map(|entry| ModelQuota {
                            model: entry.id,
                            requests_per_minute_per_replica: quota.requests_per_minute_per_replica,
                            tokens_per_day: quota.tokens_per_day,
                        })
                    })
                })
                .collect();
            Some(KeyQuota::PerModel(entries))
        }
    }
}

/// Whether requests with this key need the quota owner at all.
pub fn is_limited(key: &KeyRecord) -> bool {
    match key.settings.quota() {
        Quota::Flat(flat) => {
            flat.requests_per_minute > 0
                || flat.tokens_per_day > 0
                || flat.input_tokens_per_minute > 0
                || flat.output_tokens_per_minute > 0
        }
        Quota::PerModel(_) => true,
    }
}

/// Whether the key's token phase (B4 input/output tokens per minute on a serverless model, the
/// daily budget) has anything to check; without it the request needs no second visit to the
/// quota owner.
pub fn has_token_phase(key: &KeyRecord, serverless: bool) -> bool {
    match key.settings.quota() {
        Quota::Flat(flat) => {
            flat.tokens_per_day > 0
                || (serverless
                    && (flat.input_tokens_per_minute > 0 || flat.output_tokens_per_minute > 0))
        }
        Quota::PerModel(per_model) => per_model.values().any(|quota| quota.tokens_per_day > 0),
    }
}

pub struct Quotas {
    burst: BurstSeconds,
    holders: HashMap<TenantId, Holder>,
    /// `None` with the `memory` quota backend: nothing is restored or reported.
    persistence: Option<Persistence>,
}

/// One daily total as the disk database keeps it: the tokens this router charged one holder's
/// flat budget (`model: None`) or per-model budget on one UTC day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyRecord {
    pub tenant: TenantId,
    pub model: Option<ModelKey>,
    pub day: Day,
    pub tokens: u64,
}

/// A daily total that changed, as a shard reports it. Model ids are this process's; the control
/// core turns them into [`ModelKey`]s before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailyTotal {
    pub tenant: TenantId,
    pub model: Option<ModelId>,
    pub day: Day,
    pub tokens: u64,
}

/// What a shard restores at start-up: the disk's totals for `day` of the tenants it owns.
#[derive(Debug, Clone, Default)]
pub struct DailyRestore {
    pub day: Day,
    pub records: Vec<DailyRecord>,
}

struct Persistence {
    /// The UTC day the restored totals belong to.
    day: Day,
    /// Restored totals not yet applied to a holder, by tenant.
    restored: HashMap<TenantId, Vec<(Option<ModelKey>, u64)>>,
    /// Changed totals of holders [`Quotas::cleanup`] dropped before they were reported.
    unreported: Vec<DailyTotal>,
}

impl Persistence {
    /// Adds the restored totals of `tenant` that match a daily budget of `limits` and forgets
    /// them; the rest wait for a later rebuild (a model not served yet, a quota without that
    /// budget). On a day after the restored one, every restored total is dropped instead.
    fn apply(
        &mut self,
        day: Day,
        snapshot: &RoutingSnapshot,
        tenant: TenantId,
        limits: &mut KeyLimits,
    ) {
        if day > self.day && !self.restored.is_empty() {
            self.restored = HashMap::new();
        }
        if day != self.day {
            return;
        }
        let Some(waiting) = self.restored.get_mut(&tenant) else {
            return;
        };
        waiting.retain(|(model, tokens)| {
            let model = match model {
                None => None,
                Some(key) => match snapshot.lookup(&key.name, key.capability) {
                    Some(entry) => Some(entry.id),
                    None => return true,
                },
            };
            !limits.restore_daily(model, day, *tokens)
        });
        if waiting.is_empty() {
            self.restored.remove(&tenant);
        }
    }
}

/// What the quota owner admitted: the charge to settle later (`None` when nothing is counted) and
/// what the key has left, for `X-RateLimit-*` on the response.
#[derive(Debug, Default)]
pub struct Admitted {
    pub admission: Option<Admission>,
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
}

/// What an admission asks for: the RPM check only (`count_tokens`, embeddings, rerank), or the
/// token checks too (chat and messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    RequestsOnly,
    RequestsAndTokens(Estimate),
    /// The token phase alone, for a request that passed the RPM phase and the gates between.
    TokensOnly(Estimate),
}

impl Quotas {
    pub fn new(burst: BurstSeconds) -> Quotas {
        Quotas {
            burst,
            holders: HashMap::new(),
            persistence: None,
        }
    }

    /// Turns persistence on with the totals the disk database holds for `restore.day` (records of
    /// another day are ignored). Call before the first admission.
    pub fn restore(&mut self, restore: DailyRestore) {
        let mut restored: HashMap<TenantId, Vec<(Option<ModelKey>, u64)>> = HashMap::new();
        for record in restore.records {
            if record.day == restore.day && record.tokens > 0 {
                restored
                    .entry(record.tenant)
                    .or_default()
                    .push((record.model, record.tokens));
            }
        }
        self.persistence = Some(Persistence {
            day: restore.day,
            restored,
            unreported: Vec::new(),
        });
    }

    /// Restored totals still waiting for their holder (for tests and logs).
    pub fn restored_waiting(&self) -> usize {
        self.persistence.as_ref().map_or(0, |persistence| {
            persistence.restored.values().map(Vec::len).sum()
        })
    }

    /// Every daily total that changed since the last call (empty without persistence). Walks
    /// every holder: run it about once a second, never per request.
    pub fn take_changed_daily_totals(&mut self) -> Vec<DailyTotal> {
        let Some(persistence) = self.persistence.as_mut() else {
            return Vec::new();
        };
        let mut totals = std::mem::take(&mut persistence.unreported);
        for (tenant, holder) in &mut self.holders {
            let tenant = *tenant;
            holder
                .limits
                .take_changed_daily_totals(|model, day, tokens| {
                    totals.push(DailyTotal {
                        tenant,
                        model,
                        day,
                        tokens,
                    })
                });
        }
        totals
    }

    /// Hands back totals taken by [`Quotas::take_changed_daily_totals`] that never reached the
    /// control core; the next report carries them (before any newer total of the same budget).
    pub fn requeue_daily_totals(&mut self, mut totals: Vec<DailyTotal>) {
        if let Some(persistence) = self.persistence.as_mut() {
            totals.append(&mut persistence.unreported);
            persistence.unreported = totals;
        }
    }

    pub fn len(&self) -> usize {
        self.holders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    #[allow(clippy::too_many_arguments)]
    pub fn admit(
        &mut self,
        now: Millis,
        day: Day,
        registry: &KeyRegistry,
        snapshot: &RoutingSnapshot,
        key: KeyId,
        model: &ModelContext,
        charge: Charge,
    ) -> Result<Admitted, LimitExceeded> {
        let Some(record) = registry.get(key) else {
            // The key vanished in a reload between authentication and here: nothing to count.
            return Ok(Admitted::default());
        };
        let Some(holder) = self.holder(now, day, registry, snapshot, record) else {
            return Ok(Admitted::default());
        };
        match charge {
            Charge::RequestsOnly => {
                holder
                    .limits
                    .admit_request(now, model)
                    .map(|request| Admitted {
                        admission: None,
                        remaining_requests: request.remaining_requests,
                        remaining_tokens: None,
                    })
            }
            Charge::TokensOnly(estimate) => holder
                .limits
                .admit_tokens(now, day, model, estimate)
                .map(|admission| Admitted {
                    remaining_requests: None,
                    remaining_tokens: admission.remaining_tokens,
                    admission: Some(admission),
                }),
            Charge::RequestsAndTokens(estimate) => holder
                .limits
                .admit(now, day, model, estimate)
                .map(|admission| Admitted {
                    remaining_requests: admission.remaining_requests,
                    remaining_tokens: admission.remaining_tokens,
                    admission: Some(admission),
                }),
        }
    }

    pub fn settle(
        &mut self,
        now: Millis,
        day: Day,
        tenant: TenantId,
        admission: Admission,
        usage: UsedTokens,
        delivery: Delivery,
    ) -> Option<crate::limits::Settlement> {
        self.holders
            .get_mut(&tenant)
            .map(|holder| holder.limits.settle(now, day, admission, usage, delivery))
    }

    pub fn cancel(&mut self, tenant: TenantId, admission: Admission) {
        if let Some(holder) = self.holders.get_mut(&tenant) {
            holder.limits.cancel(admission);
        }
    }

    /// Drops holders whose buckets are all full again and whose daily budgets are from a past day
    /// (seed, "Idle-state cleanup"): memory stays bounded however many keys come and go.
    pub fn cleanup(&mut self, now: Millis, day: Day) {
        let mut persistence = self.persistence.as_mut();
        self.holders.retain(|tenant, holder| {
            holder.limits.compact(now);
            let idle = holder.limits.is_idle(now, day);
            if idle && let Some(persistence) = persistence.as_mut() {
                let tenant = *tenant;
                holder
                    .limits
                    .take_changed_daily_totals(|model, day, tokens| {
                        persistence.unreported.push(DailyTotal {
                            tenant,
                            model,
                            day,
                            tokens,
                        })
                    });
            }
            !idle
        });
        if let Some(persistence) = persistence
            && day > persistence.day
            && !persistence.restored.is_empty()
        {
            persistence.restored = HashMap::new();
        }
    }

    fn holder(
        &mut self,
        now: Millis,
        day: Day,
        registry: &KeyRegistry,
        snapshot: &RoutingSnapshot,
        record: &KeyRecord,
    ) -> Option<&mut Holder> {
        let built = Built {
            registry_version: registry.version(),
            snapshot_version: snapshot.version,
            key: record.key_id,
        };
        let burst = self.burst;
        let current = self
            .holders
            .get(&record.tenant_id)
            .map(|holder| holder.built);
        if current != Some(built) {
            let quota = key_quota(record, snapshot)?;
            let rebuilt = match self.holders.get(&record.tenant_id) {
                Some(previous) => previous.limits.reconfigured(now, day, &quota, burst),
                None => KeyLimits::new(now, day, &quota, burst),
            };
            match rebuilt {
                Ok(mut limits) => {
                    if let Some(persistence) = self.persistence.as_mut() {
                        persistence.apply(day, snapshot, record.tenant_id, &mut limits);
                    }
                    self.holders
                        .insert(record.tenant_id, Holder { limits, built });
                }
                Err(error) => {
                    // Validated at load; a failure here means limits beyond the supported range.
                    tracing::error!(%error, preview = %record.preview, "quota cannot be enforced");
                    return None;
                }
            }
        }
        self.holders.get_mut(&record.tenant_id)
    }
}

/// A settle or cancel that must reach the holder's owner.
#[derive(Debug)]
pub enum Release {
    Settle {
        tenant: TenantId,
        admission: Admission,
        usage: UsedTokens,
        delivery: Delivery,
    },
    Cancel {
        tenant: TenantId,
        admission: Admission,
    },
}

#[cfg(test)]
mod tests;
