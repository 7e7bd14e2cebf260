//! Per-owner quota state on its owner shard: the `limits::KeyLimits` of every quota holder this
//! shard owns, built from the holder's key on first use and rebuilt (keeping usage) when the key's
//! quota or the model table changes.
//!
//! Holder: the key's owner (`TenantId`). The auth reference shares flat buckets — requests per
//! minute and the daily token budget — between every key of one owner, and per-model budgets are
//! "for this owner and model". Keys of one owner with different quotas share the buckets; the
//! limits follow the quota of the key that last used them (a rebuild keeps the usage).
//!
//! Time: the shard passes `now` in; `Millis` count from the shard's start, `Day` is the UTC day.

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::config::Quota;
use crate::auth::keys::{KeyRecord, KeyRegistry, TenantId};
use crate::limits::{
    Admission, BurstSeconds, Day, Delivery, Estimate, FlatQuota, KeyLimits, KeyQuota, Millis,
    ModelContext, ModelQuota, Rejection, Usage,
};
use crate::shard::snapshot::{Capability, RoutingSnapshot};

/// Which key configuration and model table a holder's limits were built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Built {
    registry: usize,
    snapshot_version: u64,
    key: crate::auth::keys::KeyId,
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
        registry: &Arc<KeyRegistry>,
        snapshot: &RoutingSnapshot,
        key: crate::auth::keys::KeyId,
        model: &ModelContext,
        charge: Charge,
    ) -> Result<Admitted, Rejection> {
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
        usage: Usage,
        delivery: Delivery,
    ) {
        if let Some(holder) = self.holders.get_mut(&tenant) {
            let _ = holder.limits.settle(now, day, admission, usage, delivery);
        }
    }

    pub fn cancel(&mut self, tenant: TenantId, admission: Admission) {
        if let Some(holder) = self.holders.get_mut(&tenant) {
            holder.limits.cancel(admission);
        }
    }

    /// Drops holders whose buckets are all full again and whose daily budgets are from a past day
    /// (seed, "Idle-state cleanup"): memory stays bounded however many keys come and go.
    pub fn cleanup(&mut self, now: Millis, day: Day) {
        self.holders.retain(|_, holder| {
            holder.limits.compact(now);
            !holder.limits.is_idle(now, day)
        });
    }

    fn holder(
        &mut self,
        now: Millis,
        day: Day,
        registry: &Arc<KeyRegistry>,
        snapshot: &RoutingSnapshot,
        record: &KeyRecord,
    ) -> Option<&mut Holder> {
        let built = Built {
            registry: Arc::as_ptr(registry) as usize,
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
                Ok(limits) => {
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
        usage: Usage,
        delivery: Delivery,
    },
    Cancel {
        tenant: TenantId,
        admission: Admission,
    },
}
