//! The daily totals of the holders a shard owns: restored from the disk database or the store's
//! read ([`Quotas::restore`]), waiting for the holder they belong to, and reported when they
//! change ([`Quotas::take_changed_daily_totals`]).

use super::persistence::{Persistence, served_model};
use super::*;

impl Quotas {
    /// Turns persistence on with the totals the disk database holds for `restore.day`. Call
    /// before the first admission. Records of the next day, the others' (read near midnight),
    /// start that day on the budgets of the holders built, as the others' usage of it does
    /// (`DailyBudget::apply_remote`); records of any other day are ignored.
    /// From the shared store, the other routers' totals (`others`) replace what is known of
    /// them, so reading them again counts nothing twice; this router's own totals are added once,
    /// at start-up. Either way the key's daily budgets are known from then on.
    pub fn restore(&mut self, snapshot: &RoutingSnapshot, restore: DailyRestore) {
        self.daily_known = true;
        let previous = self.persistence.take();
        let mut restored: HashMap<TenantId, Vec<(Option<ModelKey>, u64, bool)>> = HashMap::new();
        let next_day = Day(restore.day.0 + 1);
        let mut ahead = Vec::new();
        let mut own_ahead: HashMap<TenantId, Vec<(Option<ModelKey>, u64)>> = HashMap::new();
        for record in restore.records {
            if record.day == next_day && record.others && record.tokens > 0 {
                ahead.push(record);
            } else if record.day == next_day && record.tokens > 0 {
                own_ahead
                    .entry(record.tenant)
                    .or_default()
                    .push((record.model, record.tokens));
            } else if record.day == restore.day && (record.tokens > 0 || record.others) {
                restored.entry(record.tenant).or_default().push((
                    record.model,
                    record.tokens,
                    record.others,
                ));
            }
        }
        // This router's own totals are read once; a later read (its first round failed after
        // the read, and the next one read again) carries none. Those still waiting for their
        // holder stay: replaced, a new run forgot what it had charged before its restart (a
        // journal's usage, through the binaries: `tests/shared_limits.rs`).
        let unreported = match previous {
            Some(previous) => {
                let same_day = previous.day == restore.day;
                let (ahead_now_today, ahead_still) = if same_day {
                    (HashMap::new(), previous.ahead)
                } else if Day(previous.day.0 + 1) == restore.day {
                    (previous.ahead, HashMap::new())
                } else {
                    (HashMap::new(), HashMap::new())
                };
                // Own totals still waiting for their holder stay; those of the next day read
                // before midnight are today's own now.
                let waiting_own = previous
                    .restored
                    .into_iter()
                    .filter(|_| same_day)
                    .map(|(tenant, waiting)| {
                        let own = waiting
                            .into_iter()
                            .filter(|(_, _, others)| !others)
                            .map(|(model, tokens, _)| (model, tokens));
                        (tenant, own.collect::<Vec<_>>())
                    })
                    .chain(ahead_now_today);
                for (tenant, waiting) in waiting_own {
                    let entries = restored.entry(tenant).or_default();
                    for (model, tokens) in waiting {
                        let known = entries
                            .iter()
                            .any(|(known, _, of_others)| !of_others && *known == model);
                        if !known {
                            entries.push((model, tokens, false));
                        }
                    }
                }
                for (tenant, waiting) in ahead_still {
                    own_ahead.entry(tenant).or_insert(waiting);
                }
                previous.unreported
            }
            None => Vec::new(),
        };
        self.persistence = Some(Persistence {
            day: restore.day,
            restored,
            unreported,
            ahead: own_ahead,
        });
        // The totals include every daily usage of their day waiting for a holder (the entries up
        // to the read were applied before it; later ones come after this message).
        self.remote_only.forget_daily(restore.day);
        // Holders built before this read take their totals now (a re-read after a gap).
        let persistence = self.persistence.as_mut().expect("set above");
        for (tenant, holder) in &mut self.holders {
            persistence.apply(restore.day, snapshot, *tenant, &mut holder.limits);
        }
        for record in ahead {
            let Some(holder) = self.holders.get_mut(&record.tenant) else {
                continue;
            };
            let Some(model) = served_model(snapshot, record.model.as_ref()) else {
                continue;
            };
            holder
                .limits
                .set_others_daily(model, next_day, record.tokens);
        }
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

    /// What every daily budget counts of the other routers (`tokens`), where it counts any: after
    /// the store lost its data, the sync round writes it back as this router's memory of them
    /// (`sync::daily_fields::daily_records`).
    pub fn daily_memory(&self) -> Vec<DailyTotal> {
        let mut memory = Vec::new();
        for (tenant, holder) in &self.holders {
            let tenant = *tenant;
            holder.limits.daily_others(|model, day, tokens| {
                if tokens > 0 {
                    memory.push(DailyTotal {
                        tenant,
                        model,
                        day,
                        tokens,
                    });
                }
            });
        }
        memory
    }

    /// Hands back totals taken by [`Quotas::take_changed_daily_totals`] that never reached the
    /// control core; the next report carries them (before any newer total of the same budget).
    pub fn requeue_daily_totals(&mut self, mut totals: Vec<DailyTotal>) {
        if let Some(persistence) = self.persistence.as_mut() {
            totals.append(&mut persistence.unreported);
            persistence.unreported = totals;
        }
    }
}
