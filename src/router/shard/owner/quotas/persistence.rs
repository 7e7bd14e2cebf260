//! The daily totals a shard's quota holders keep across restarts and share through the store,
//! as records and as what waits for the holder they belong to (`Quotas::restore`, in
//! `quotas::daily_totals`).

use std::collections::HashMap;

use crate::base::ids::{ModelId, TenantId};
use crate::logic::limits::{Day, KeyLimits};
use crate::logic::snapshot::{ModelKey, RoutingSnapshot};

/// One daily total as the disk database keeps it: the tokens this router charged one holder's
/// flat budget (`model: None`) or per-model budget on one UTC day. From the shared store, also
/// what the other routers charged it together (`others`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyRecord {
    pub tenant: TenantId,
    pub model: Option<ModelKey>,
    pub day: Day,
    pub tokens: u64,
    /// The total of the other routers of the site, not this router's own.
    pub others: bool,
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

pub(super) struct Persistence {
    /// The UTC day the restored totals belong to.
    pub(super) day: Day,
    /// Restored totals not yet applied to a holder, by tenant: (model, tokens, others').
    pub(super) restored: HashMap<TenantId, Vec<(Option<ModelKey>, u64, bool)>>,
    /// Changed totals of holders [`Quotas::cleanup`] dropped before they were reported.
    pub(super) unreported: Vec<DailyTotal>,
    /// This router's own totals of the day after `day`, read near midnight by a run whose clock
    /// is still on `day`, not yet applied to a holder: (model, tokens), by tenant.
    pub(super) ahead: HashMap<TenantId, Vec<(Option<ModelKey>, u64)>>,
}

impl Persistence {
    /// Adds the restored totals of `tenant` that match a daily budget of `limits` and forgets
    /// them; the rest wait for a later rebuild (a model not served yet, a quota without that
    /// budget). On a day after the restored one, every restored total is dropped instead.
    pub(super) fn apply(
        &mut self,
        day: Day,
        snapshot: &RoutingSnapshot,
        tenant: TenantId,
        limits: &mut KeyLimits,
    ) {
        if day > self.day && !self.restored.is_empty() {
            self.restored = HashMap::new();
        }
        let next_day = Day(self.day.0 + 1);
        if day > next_day && !self.ahead.is_empty() {
            self.ahead = HashMap::new();
        }
        if day == self.day
            && let Some(waiting) = self.restored.get_mut(&tenant)
        {
            waiting.retain(|(model, tokens, others)| {
                let Some(model) = served_model(snapshot, model.as_ref()) else {
                    return true;
                };
                let applied = if *others {
                    limits.set_others_daily(model, day, *tokens)
                } else {
                    limits.restore_daily(model, day, *tokens)
                };
                !applied
            });
            if waiting.is_empty() {
                self.restored.remove(&tenant);
            }
        }
        // The next day's own totals start that day on the budget, as the others' usage of it
        // does, whether the holder's day is still the restored one or already the next.
        if let Some(waiting) = self.ahead.get_mut(&tenant) {
            waiting.retain(|(model, tokens)| {
                let Some(model) = served_model(snapshot, model.as_ref()) else {
                    return true;
                };
                !limits.restore_daily(model, next_day, *tokens)
            });
            if waiting.is_empty() {
                self.ahead.remove(&tenant);
            }
        }
    }
}

/// A daily total's model as this router's id: `Some(None)` for the key's flat budget,
/// `Some(Some(id))` for a model served here, `None` for a model not served (yet).
pub(super) fn served_model(
    snapshot: &RoutingSnapshot,
    model: Option<&ModelKey>,
) -> Option<Option<ModelId>> {
    match model {
        None => Some(None),
        Some(key) => snapshot
            .lookup(&key.name, key.capability)
            .map(|entry| Some(entry.id)),
    }
}
