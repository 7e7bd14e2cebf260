//! Per-owner quota state on its owner shard: the `limits::KeyLimits` of every quota holder this
//! shard owns, built from the holder's key on first use and rebuilt (keeping usage) when the key's
//! quota or the model table changes.
//!
//! Two kinds of holder:
//! - The key's owner (`TenantId`) holds the flat buckets the auth reference shares between every
//!   key of one owner — requests per minute and the daily token budget — and the per-model
//!   budgets, which are "for this owner and model". Keys of one owner with different quotas share
//!   these buckets; the limits follow the quota of the key that last used them (a rebuild keeps
//!   the usage).
//! - The key (`KeyId`) holds its B4 input and output token-per-minute buckets, which "are
//!   independent for each key-and-model combination" (seed `admission-control.md`, B4): two keys
//!   of one owner never share them. Only a flat quota with `input_tokens_per_minute` or
//!   `output_tokens_per_minute` has such a holder; it keeps at most
//!   [`crate::logic::limits::TOKEN_RATE_MODELS_MAX`] models and is dropped by [`Quotas::cleanup`] once
//!   every bucket is full again, like an owner's holder.
//!
//! The token phase runs the key's B4 buckets first and the owner's daily budget after (seed,
//! "Gate order"); when the daily budget refuses, the key's input-rate charge is given back.
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

use crate::base::ids::{Capability, KeyId, TenantId};
use crate::logic::auth::config::Quota;
use crate::logic::auth::keys::{KeyRecord, KeyRegistry};
use crate::logic::limits::{
    BucketRef, BurstSeconds, Day, Delivery, Estimate, FlatQuota, KeyLimits, KeyQuota,
    LimitExceeded, Millis, ModelContext, ModelQuota, Share, TokenCharge, UsedTokens,
};
use crate::logic::snapshot::{ModelKey, RoutingSnapshot};
use crate::router::shard::IdMap;

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

/// Shrinks a holder map that cleanup left mostly empty. `retain` keeps a map's slots, so after
/// a burst of keys went idle their ~250-byte slots stayed allocated for the process's life: memory
/// bounded by the busiest moment, not by the keys in use. Shrinks only below a quarter full, so
/// a map that hovers around one size is not rebuilt every cleanup.
fn give_back_slack<K: Eq + std::hash::Hash, V>(holders: &mut IdMap<K, V>) {
    if holders.capacity() > 4 * holders.len().max(16) {
        holders.shrink_to_fit();
    }
}

/// A key's quota split by holder: the owner's part (RPM, daily budgets; its B4 rates zeroed) and
/// the key's B4 token rates (`None` when the quota has none).
fn split_quota(quota: KeyQuota) -> (KeyQuota, Option<KeyQuota>) {
    match quota {
        KeyQuota::Flat(flat) => {
            let rates = (flat.input_tokens_per_minute > 0 || flat.output_tokens_per_minute > 0)
                .then_some(KeyQuota::Flat(FlatQuota {
                    requests_per_minute: 0,
                    tokens_per_day: 0,
                    input_tokens_per_minute: flat.input_tokens_per_minute,
                    output_tokens_per_minute: flat.output_tokens_per_minute,
                }));
            let owner = KeyQuota::Flat(FlatQuota {
                input_tokens_per_minute: 0,
                output_tokens_per_minute: 0,
                ..flat
            });
            (owner, rates)
        }
        per_model @ KeyQuota::PerModel(_) => (per_model, None),
    }
}

/// What the token phase charged: the owner's part (daily budget) and the key's part (B4 input
/// tokens per minute). Hand it back to [`Quotas::settle`] or [`Quotas::cancel`].
#[must_use = "an admission must be settled or cancelled"]
#[derive(Debug, PartialEq, Eq)]
pub struct QuotaAdmission {
    key: KeyId,
    owner: TokenCharge,
    rates: Option<TokenCharge>,
}

impl QuotaAdmission {
    /// Whether a daily budget was charged: a non-streamed answer must then be checked against
    /// it before delivery.
    pub fn has_daily(&self) -> bool {
        self.owner.has_daily()
    }
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

/// Whether the key's quota has B4 token rates, kept in a holder of its own.
fn has_token_rates(key: &KeyRecord) -> bool {
    match key.settings.quota() {
        Quota::Flat(flat) => flat.input_tokens_per_minute > 0 || flat.output_tokens_per_minute > 0,
        Quota::PerModel(_) => false,
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
    /// Per owner: RPM, daily and per-model budgets.
    holders: IdMap<TenantId, Holder>,
    /// Per key: B4 token-per-minute buckets (flat quotas with ITPM or OTPM only).
    token_rates: IdMap<KeyId, Holder>,
    /// `None` with the `memory` quota backend and no sync store: nothing is restored or
    /// reported.
    persistence: Option<persistence::Persistence>,
    /// This router's part of every limit (`limits::share`), set by the sync core each round.
    share: Share,
    /// False while the routers share limits and today's totals have not been read from the store
    /// yet: a key with a daily budget is refused (`429 token_limit_exceeded`) rather than handed a
    /// fresh budget (seed `run-several-routers.md`, "When the store is unreachable").
    daily_known: bool,
    /// The limits are shared through a store: usage is taken every round.
    shared: bool,
    /// Usage taken from holders [`Quotas::cleanup`] dropped, for the next round to publish: at
    /// most one entry per bucket of the holders one cleanup walked, emptied every round.
    unpublished: Vec<shared::BucketUsage>,
    /// Other routers' usage of holders not built here, applied when a request builds them.
    remote_only: remote_only::RemoteOnly,
}

/// What the quota owner admitted: the charge to settle later (`None` when nothing is counted) and
/// what the key has left, for `X-RateLimit-*` on the response.
#[derive(Debug, Default)]
pub struct Admitted {
    pub admission: Option<QuotaAdmission>,
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
    /// The RPM phase, and the token phase ahead of the gates that come between them in the gate
    /// order (`api::plan`, "tokens ahead"). A token phase the key does not pass charges nothing
    /// and refuses nothing: the answer admits the request unit alone (`admission: None`), and
    /// the requester runs the token phase again in its place, after the gates.
    Ahead(Estimate),
}

impl Quotas {
    pub fn new(burst: BurstSeconds) -> Quotas {
        Quotas {
            burst,
            holders: IdMap::default(),
            token_rates: IdMap::default(),
            persistence: None,
            share: Share::Whole,
            daily_known: true,
            shared: false,
            unpublished: Vec::new(),
            remote_only: remote_only::RemoteOnly::default(),
        }
    }

    /// Tenants with other routers' usage waiting for a holder here (`remote_only`).
    pub fn remote_only_tenants(&self) -> usize {
        self.remote_only.len()
    }

    /// This router's part of every limit from now on (the sync core, each round).
    pub fn set_share(&mut self, share: Share) {
        self.share = share;
    }

    pub fn share(&self) -> Share {
        self.share
    }

    /// The routers share limits through a store: report daily totals, and refuse keys with a
    /// daily budget until today's totals are read ([`Quotas::restore`]).
    pub fn share_through_store(&mut self, day: Day) {
        self.daily_known = false;
        self.shared = true;
        if self.persistence.is_none() {
            self.persistence = Some(persistence::Persistence {
                day,
                restored: HashMap::new(),
                unreported: Vec::new(),
                ahead: HashMap::new(),
            });
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
        mut charge: Charge,
    ) -> Result<Admitted, LimitExceeded> {
        let Some(record) = registry.get(key) else {
            // The key vanished in a reload between authentication and here: nothing to count.
            return Ok(Admitted::default());
        };
        if !self.build(now, day, registry, snapshot, record) {
            return Ok(Admitted::default());
        }
        let share = self.share;
        let owner = self
            .holders
            .get_mut(&record.tenant_id)
            .expect("built above");
        if !self.daily_known
            && !matches!(charge, Charge::RequestsOnly)
            && owner.limits.has_daily(model.model)
        {
            if !matches!(charge, Charge::Ahead(_)) {
                // Today's total cannot be read yet: refused at once, never a fresh budget.
                return Err(LimitExceeded::daily_spent(model.model));
            }
            // Refused after the gates, in its place.
            charge = Charge::RequestsOnly;
        }
        let rates = self.token_rates.get_mut(&key);
        match charge {
            Charge::RequestsOnly => owner
                .limits
                .admit_request(now, model, share)
                .map(|request| Admitted {
                    admission: None,
                    remaining_requests: request.remaining_requests,
                    remaining_tokens: None,
                }),
            Charge::TokensOnly(estimate) => admit_tokens(
                now, day, key, owner, rates, model, estimate, share,
            )
            .map(|(admission, remaining_tokens)| Admitted {
                remaining_requests: None,
                remaining_tokens,
                admission: Some(admission),
            }),
            Charge::RequestsAndTokens(estimate) | Charge::Ahead(estimate) => {
                // Both phases with nothing in between; a refused token phase keeps the RPM unit
                // (`limits::KeyLimits::admit`).
                let request = owner.limits.admit_request(now, model, share)?;
                match admit_tokens(now, day, key, owner, rates, model, estimate, share) {
                    Ok((admission, remaining_tokens)) => Ok(Admitted {
                        remaining_requests: request.remaining_requests,
                        remaining_tokens,
                        admission: Some(admission),
                    }),
                    // Nothing of the token phase stays charged; it runs again after the gates.
                    Err(_) if matches!(charge, Charge::Ahead(_)) => Ok(Admitted {
                        remaining_requests: request.remaining_requests,
                        remaining_tokens: None,
                        admission: None,
                    }),
                    Err(mut rejection) => {
                        rejection.remaining_requests = request.remaining_requests;
                        Err(rejection)
                    }
                }
            }
        }
    }

    pub fn settle(
        &mut self,
        now: Millis,
        day: Day,
        tenant: TenantId,
        admission: QuotaAdmission,
        usage: UsedTokens,
        delivery: Delivery,
    ) -> Option<crate::logic::limits::Settlement> {
        if let Some(rates) = admission.rates {
            // A holder dropped meanwhile was full; a new one is built on the key's next request.
            if let Some(holder) = self.token_rates.get_mut(&admission.key) {
                let _ = holder.limits.settle(now, day, rates, usage, delivery);
            }
        }
        self.holders.get_mut(&tenant).map(|holder| {
            holder
                .limits
                .settle(now, day, admission.owner, usage, delivery)
        })
    }

    pub fn cancel(&mut self, tenant: TenantId, admission: QuotaAdmission) {
        if let Some(rates) = admission.rates
            && let Some(holder) = self.token_rates.get_mut(&admission.key)
        {
            holder.limits.cancel(rates);
        }
        if let Some(holder) = self.holders.get_mut(&tenant) {
            holder.limits.cancel(admission.owner);
        }
    }

    /// Keys holding B4 token-rate buckets right now (for tests and logs).
    /// Slots allocated for owners' holders, used or not (what their map costs).
    #[cfg(test)]
    fn holder_slots(&self) -> usize {
        self.holders.capacity()
    }

    /// Tokens the flat daily budget of `tenant` counts as used on `day` by every router, if
    /// its holder is built (for the site's simulation, `router::sync::simulation`).
    #[cfg(test)]
    pub fn daily_used(&mut self, tenant: TenantId, day: Day) -> Option<u64> {
        self.holders
            .get_mut(&tenant)
            .and_then(|holder| holder.limits.daily_used(None, day))
    }

    /// The day the flat daily budget of `tenant` counts, if its holder is built (for the
    /// site's simulation).
    #[cfg(test)]
    pub fn daily_day(&mut self, tenant: TenantId) -> Option<Day> {
        self.holders
            .get_mut(&tenant)
            .and_then(|holder| holder.limits.daily_day(None))
    }

    /// Requests left in the flat RPM bucket of `tenant`, if its holder is built (for the
    /// site's simulation).
    #[cfg(test)]
    pub fn requests_left(&self, tenant: TenantId, now: Millis) -> Option<i64> {
        self.holders
            .get(&tenant)
            .and_then(|holder| holder.limits.requests_left(now))
    }

    pub fn token_rate_holders(&self) -> usize {
        self.token_rates.len()
    }

    /// Drops holders whose buckets are all full again and whose daily budgets are from a past day
    /// (seed, "Idle-state cleanup"): memory stays bounded however many keys come and go.
    pub fn cleanup(&mut self, now: Millis, day: Day) {
        if self.shared {
            // What the buckets admitted since the last round goes out with the next one, whatever
            // is dropped below (a holder refilled to full, a full token-rate entry).
            let mut unpublished = std::mem::take(&mut self.unpublished);
            self.take_usage(&mut unpublished);
            self.unpublished = unpublished;
        }
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
        // A key's holder has no daily budget: nothing to report before dropping it.
        self.token_rates.retain(|_, holder| {
            holder.limits.compact(now);
            !holder.limits.is_idle(now, day)
        });
        give_back_slack(&mut self.holders);
        give_back_slack(&mut self.token_rates);
        self.remote_only.prune(now, day);
        if let Some(persistence) = persistence
            && day > persistence.day
            && !persistence.restored.is_empty()
        {
            persistence.restored = HashMap::new();
        }
    }

    /// Builds or rebuilds (keeping usage) the owner's holder and the key's token-rate holder
    /// for `record`'s current quota. False when the key has nothing to count here.
    fn build(
        &mut self,
        now: Millis,
        day: Day,
        registry: &KeyRegistry,
        snapshot: &RoutingSnapshot,
        record: &KeyRecord,
    ) -> bool {
        let built = Built {
            registry_version: registry.version(),
            snapshot_version: snapshot.version,
            key: record.key_id,
        };
        let owner_current = self
            .holders
            .get(&record.tenant_id)
            .map(|holder| holder.built);
        let rates_current = self
            .token_rates
            .get(&record.key_id)
            .map(|holder| holder.built);
        // A key's holder may have been dropped as idle while its owner's stayed: rebuilt then.
        let rates_wanted = has_token_rates(record);
        if owner_current == Some(built) && (!rates_wanted || rates_current == Some(built)) {
            return true;
        }
        let Some(quota) = key_quota(record, snapshot) else {
            return false;
        };
        let (owner_quota, rates_quota) = split_quota(quota);
        let burst = self.burst;
        let created = owner_current.is_none() || (rates_quota.is_some() && rates_current.is_none());
        if owner_current != Some(built) {
            let rebuilt = match self.holders.get(&record.tenant_id) {
                Some(previous) => previous.limits.reconfigured(now, day, &owner_quota, burst),
                None => KeyLimits::new(now, day, &owner_quota, burst),
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
                    return false;
                }
            }
        }
        match rates_quota {
            None => {
                self.token_rates.remove(&record.key_id);
            }
            Some(rates_quota) if rates_current != Some(built) => {
                let rebuilt = match self.token_rates.get(&record.key_id) {
                    Some(previous) => previous.limits.reconfigured(now, day, &rates_quota, burst),
                    None => KeyLimits::new(now, day, &rates_quota, burst),
                };
                match rebuilt {
                    Ok(limits) => {
                        self.token_rates
                            .insert(record.key_id, Holder { limits, built });
                    }
                    Err(error) => {
                        tracing::error!(%error, preview = %record.preview, "quota cannot be enforced");
                        self.holders.remove(&record.tenant_id);
                        return false;
                    }
                }
            }
            Some(_) => {}
        }
        if created && !self.remote_only.is_empty() {
            self.apply_waiting(now, record);
        }
        true
    }

    /// Applies to `record`'s holders, just built, what other routers used of them meanwhile.
    fn apply_waiting(&mut self, now: Millis, record: &KeyRecord) {
        for pending in self.remote_only.take(record.tenant_id, record.key_id) {
            let holder = if matches!(
                pending.bucket,
                BucketRef::InputTokens { .. } | BucketRef::OutputTokens { .. }
            ) {
                self.token_rates.get_mut(&pending.key)
            } else {
                self.holders.get_mut(&record.tenant_id)
            };
            if let Some(holder) = holder {
                holder.limits.apply_remote(
                    now,
                    pending.bucket,
                    pending.amount,
                    pending.at.until(now),
                    self.share,
                );
                holder.limits.unsettle_rates();
            }
        }
    }
}

/// The token phase across both holders, in the seed's order: the key's B4 output-rate state and
/// input tokens per minute, then the owner's daily budget. A refusal leaves both as they were.
/// With the admission, what is left of the owner's daily budget (`X-RateLimit-Remaining-Tokens`).
#[allow(clippy::too_many_arguments)]
fn admit_tokens(
    now: Millis,
    day: Day,
    key: KeyId,
    owner: &mut Holder,
    rates: Option<&mut Holder>,
    model: &ModelContext,
    estimate: Estimate,
    share: Share,
) -> Result<(QuotaAdmission, Option<u64>), LimitExceeded> {
    let (rates, rates_charge) = match rates {
        Some(holder) => {
            let admission = holder
                .limits
                .admit_tokens(now, day, model, estimate, share)?;
            (Some(holder), Some(admission.charge))
        }
        None => (None, None),
    };
    match owner.limits.admit_tokens(now, day, model, estimate, share) {
        Ok(owner) => Ok((
            QuotaAdmission {
                key,
                owner: owner.charge,
                rates: rates_charge,
            },
            owner.remaining_tokens,
        )),
        Err(rejection) => {
            if let (Some(holder), Some(charge)) = (rates, rates_charge) {
                holder.limits.cancel(charge);
            }
            Err(rejection)
        }
    }
}

/// A settle or cancel that must reach the holder's owner.
#[derive(Debug)]
pub enum Release {
    Settle {
        tenant: TenantId,
        admission: QuotaAdmission,
        usage: UsedTokens,
        delivery: Delivery,
    },
    Cancel {
        tenant: TenantId,
        admission: QuotaAdmission,
    },
}

mod daily_totals;
mod persistence;
mod remote_only;
mod shared;
mod sync_round;
pub use persistence::{DailyRecord, DailyRestore, DailyTotal};
pub use shared::{Anchor, BucketUsage, BucketView, RemoteBatch, RemoteUsage};

#[cfg(test)]
mod tests;
