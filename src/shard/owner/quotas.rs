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
mod tests {
    //! Restoring persisted daily totals into holders, and reporting changed ones.

    use super::*;
    use crate::auth::config::AuthConfig;
    use crate::auth::keys::AuthOutcome;
    use crate::snapshot::ModelEntry;
    use std::sync::Arc;

    const MONDAY: Day = Day(20_000);
    const TUESDAY: Day = Day(20_001);
    const NOW_MS: i64 = 1_785_153_600_000;

    const AUTH: &str = r#"
api:
  mode: api-key
  keys:
    - key_hash: "HASH_FLAT"
      key_preview: "sk-...flat"
      metadata: {name: "flat", owner: "acme"}
      quota: {tokens_per_day: 1000}
    - key_hash: "HASH_PER_MODEL"
      key_preview: "sk-...permodel"
      metadata: {name: "per-model", owner: "globex"}
      quota:
        per_model:
          chat: {requests_per_minute_per_replica: 100, tokens_per_day: 500}
          embed: {requests_per_minute_per_replica: 100, tokens_per_day: 300}
"#;

    fn registry() -> Arc<KeyRegistry> {
        let text = AUTH
            .replace("HASH_FLAT", &crate::auth::keys::hash_key_hex("sk-flat"))
            .replace(
                "HASH_PER_MODEL",
                &crate::auth::keys::hash_key_hex("sk-permodel"),
            );
        Arc::new(KeyRegistry::from_config(
            &AuthConfig::from_yaml(&text).expect("test auth.yaml"),
        ))
    }

    fn key<'a>(registry: &'a KeyRegistry, raw: &str) -> &'a KeyRecord {
        match registry.authenticate(Some(raw.as_bytes()), NOW_MS) {
            AuthOutcome::Authenticated { key, .. } => key,
            _ => panic!("{raw} does not authenticate"),
        }
    }

    /// A snapshot serving `models` as LLMs, model `i` with id `i`.
    fn snapshot(version: u64, models: &[&str]) -> RoutingSnapshot {
        RoutingSnapshot::new(
            version,
            models.iter().enumerate().map(|(index, name)| {
                (
                    Box::<str>::from(*name),
                    Capability::Llm,
                    ModelEntry {
                        id: ModelId(index as u32),
                        owner_shard: 0,
                        healthy_agents: 1,
                        policy: std::sync::Arc::new(crate::policy::ModelPolicy::built_in(
                            &Default::default(),
                        )),
                        hold_budget: None,
                    },
                )
            }),
            Vec::new(),
        )
    }

    fn llm(name: &str) -> Option<ModelKey> {
        Some(ModelKey {
            name: name.into(),
            capability: Capability::Llm,
        })
    }

    fn context(id: u32) -> ModelContext {
        ModelContext {
            model: ModelId(id),
            healthy_replicas: 1,
            serverless: false,
        }
    }

    fn tokens(input_tokens: u64) -> Charge {
        Charge::RequestsAndTokens(Estimate {
            input_tokens,
            max_output_tokens: None,
        })
    }

    fn admit(
        quotas: &mut Quotas,
        day: Day,
        registry: &KeyRegistry,
        snapshot: &RoutingSnapshot,
        raw: &str,
        model: u32,
        input_tokens: u64,
    ) -> Result<Admitted, LimitExceeded> {
        let key_id = key(registry, raw).key_id;
        quotas.admit(
            Millis(0),
            day,
            registry,
            snapshot,
            key_id,
            &context(model),
            tokens(input_tokens),
        )
    }

    /// A reload that changes a key's quota reaches its holder even when the new registry sits
    /// where the old one was freed: the holder compares registry versions, not addresses.
    #[test]
    fn a_reloaded_quota_applies_whatever_address_the_new_registry_has() {
        let snapshot = snapshot(1, &["chat"]);
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        let first = registry();
        let first_version = first.version();
        assert!(admit(&mut quotas, MONDAY, &first, &snapshot, "sk-flat", 0, 900).is_ok());
        drop(first);
        // The same key with a daily budget of 100 tokens instead of 1000.
        let text = AUTH
            .replace("HASH_FLAT", &crate::auth::keys::hash_key_hex("sk-flat"))
            .replace(
                "HASH_PER_MODEL",
                &crate::auth::keys::hash_key_hex("sk-permodel"),
            )
            .replace("tokens_per_day: 1000", "tokens_per_day: 100");
        let second = KeyRegistry::from_config(&AuthConfig::from_yaml(&text).expect("auth.yaml"));
        assert!(second.version() > first_version);
        // 900 used of 1000 left room for 50 more; the reloaded budget of 100 has none.
        assert!(admit(&mut quotas, MONDAY, &second, &snapshot, "sk-flat", 0, 50).is_err());
    }

    #[test]
    fn flat_total_is_restored_when_the_holder_is_built() {
        let registry = registry();
        let acme = key(&registry, "sk-flat").tenant_id;
        let snapshot = snapshot(1, &["chat"]);
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        quotas.restore(DailyRestore {
            day: MONDAY,
            records: vec![
                DailyRecord {
                    tenant: acme,
                    model: None,
                    day: MONDAY,
                    tokens: 600,
                },
                // Another day's record is not restored.
                DailyRecord {
                    tenant: acme,
                    model: None,
                    day: Day(MONDAY.0 - 1),
                    tokens: 999,
                },
            ],
        });
        assert_eq!(quotas.restored_waiting(), 1);
        assert!(quotas.take_changed_daily_totals().is_empty());
        let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
        assert_eq!(admitted.remaining_tokens, Some(300));
        assert_eq!(quotas.restored_waiting(), 0, "applied once, then forgotten");
        assert_eq!(
            quotas.take_changed_daily_totals(),
            vec![DailyTotal {
                tenant: acme,
                model: None,
                day: MONDAY,
                tokens: 700
            }]
        );
        assert!(quotas.take_changed_daily_totals().is_empty());
        // A rebuild (new snapshot) inherits the usage and does not restore a second time.
        let newer = self::snapshot(2, &["chat"]);
        let admitted = admit(&mut quotas, MONDAY, &registry, &newer, "sk-flat", 0, 100).unwrap();
        assert_eq!(admitted.remaining_tokens, Some(200));
    }

    #[test]
    fn per_model_total_waits_for_its_model_to_be_served() {
        let registry = registry();
        let globex = key(&registry, "sk-permodel").tenant_id;
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        quotas.restore(DailyRestore {
            day: MONDAY,
            records: vec![
                DailyRecord {
                    tenant: globex,
                    model: llm("chat"),
                    day: MONDAY,
                    tokens: 450,
                },
                DailyRecord {
                    tenant: globex,
                    model: llm("embed"),
                    day: MONDAY,
                    tokens: 100,
                },
            ],
        });
        // Only `embed` is served (id 0): its total applies, `chat`'s waits.
        let only_embed = snapshot(1, &["embed"]);
        let admitted = admit(
            &mut quotas,
            MONDAY,
            &registry,
            &only_embed,
            "sk-permodel",
            0,
            10,
        )
        .unwrap();
        assert_eq!(admitted.remaining_tokens, Some(300 - 100 - 10));
        assert_eq!(quotas.restored_waiting(), 1);
        // `chat` appears (id 1): the rebuild applies its total.
        let both = snapshot(2, &["embed", "chat"]);
        let refused =
            admit(&mut quotas, MONDAY, &registry, &both, "sk-permodel", 1, 51).unwrap_err();
        assert_eq!(refused.remaining, 50);
        assert_eq!(quotas.restored_waiting(), 0);
        let mut totals = quotas.take_changed_daily_totals();
        totals.sort_by_key(|total| total.model);
        assert_eq!(
            totals,
            vec![DailyTotal {
                tenant: globex,
                model: Some(ModelId(0)),
                day: MONDAY,
                tokens: 110
            }]
        );
    }

    #[test]
    fn restored_totals_of_a_day_that_is_over_are_dropped() {
        let registry = registry();
        let acme = key(&registry, "sk-flat").tenant_id;
        let snapshot = snapshot(1, &["chat"]);
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        quotas.restore(DailyRestore {
            day: MONDAY,
            records: vec![DailyRecord {
                tenant: acme,
                model: None,
                day: MONDAY,
                tokens: 600,
            }],
        });
        let admitted = admit(
            &mut quotas,
            TUESDAY,
            &registry,
            &snapshot,
            "sk-flat",
            0,
            100,
        )
        .unwrap();
        assert_eq!(admitted.remaining_tokens, Some(900));
        assert_eq!(quotas.restored_waiting(), 0);
        // Cleanup drops them too when no holder of theirs is ever built.
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        quotas.restore(DailyRestore {
            day: MONDAY,
            records: vec![DailyRecord {
                tenant: acme,
                model: None,
                day: MONDAY,
                tokens: 600,
            }],
        });
        quotas.cleanup(Millis(0), MONDAY);
        assert_eq!(quotas.restored_waiting(), 1);
        quotas.cleanup(Millis(0), TUESDAY);
        assert_eq!(quotas.restored_waiting(), 0);
    }

    #[test]
    fn a_dropped_holder_reports_its_last_change_and_requeued_totals_come_first() {
        let registry = registry();
        let acme = key(&registry, "sk-flat").tenant_id;
        let snapshot = snapshot(1, &["chat"]);
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        quotas.restore(DailyRestore {
            day: MONDAY,
            records: Vec::new(),
        });
        let admitted = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
        let total = |tokens| DailyTotal {
            tenant: acme,
            model: None,
            day: MONDAY,
            tokens,
        };
        assert_eq!(quotas.take_changed_daily_totals(), vec![total(100)]);
        quotas.cancel(acme, admitted.admission.expect("a daily charge"));
        // Idle again: dropped, but the disk must learn the 100 were given back.
        quotas.cleanup(Millis(0), MONDAY);
        assert!(quotas.is_empty());
        let taken = quotas.take_changed_daily_totals();
        assert_eq!(taken, vec![total(0)]);
        // A report that never reached the control core goes out again, before newer totals.
        quotas.requeue_daily_totals(taken);
        let _ = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 40).unwrap();
        assert_eq!(
            quotas.take_changed_daily_totals(),
            vec![total(0), total(40)]
        );
    }

    #[test]
    fn memory_backend_reports_nothing() {
        let registry = registry();
        let snapshot = snapshot(1, &["chat"]);
        let mut quotas = Quotas::new(BurstSeconds::FULL_MINUTE);
        let _ = admit(&mut quotas, MONDAY, &registry, &snapshot, "sk-flat", 0, 100).unwrap();
        assert!(quotas.take_changed_daily_totals().is_empty());
        quotas.requeue_daily_totals(vec![DailyTotal {
            tenant: TenantId(1),
            model: None,
            day: MONDAY,
            tokens: 1,
        }]);
        assert!(quotas.take_changed_daily_totals().is_empty());
    }
}
