//! The sync core's side of occupancy credits (seed `run-several-routers.md`, "Occupancy
//! credits"): the pools of the budgets this router has credits for, its view of each
//! (`credits::view`), and the refills the owner shards ask for.
//!
//! - A refill is served as soon as it arrives, between rounds: one `GRANT` script, held to the
//!   view's ceiling, then (with Sentinel) a `WAIT` for a replica.
//! - Each round rewrites what the router holds of every budget it reported and reads every pool
//!   it knows, all in one call after the round's transaction (`ROUND`), so the views follow the
//!   others.
//! - A new epoch (the store lost its data) makes every view guard what it last saw, and every
//!   shard forfeit its credits; requests in flight are written back as held.
//!
//! The rules themselves are pure (`credits::view`, `credits::wallet`, `shard::owner::wallets`);
//! this module maps them onto the store's keys and the shards' messages.

use std::collections::HashMap;
use std::sync::Arc;

use crate::base::ids::ModelId;
use crate::logic::credits::BudgetKind;
use crate::logic::credits::view::PoolView;
use crate::logic::snapshot::ModelKey;
use crate::router::shard::owner::wallets::CreditHolding;

use super::pool_store::StoredHolding;
use super::store::{PoolRead, PoolRewrite, PoolWrite};

/// Refills waiting for the sync core at most; beyond it an ask is dropped (the wallet asks
/// again after the next round).
pub const REFILL_QUEUE: usize = 1024;

/// The `WAIT` for a replica's acknowledgement of a grant, with Sentinel.
pub const ACKNOWLEDGE_WAIT_MS: u64 = 50;

/// One budget's pool as this router knows it.
#[derive(Debug)]
struct Budget {
    /// The pool's name under `pool:`: `{capability}|{model}|{kind}` (`share-{key}` for a key's
    /// share).
    pool: String,
    /// The whole budget, as the owner shard last reported it.
    budget: u64,
    view: PoolView,
    /// This round's report from the owner shard.
    holding: Option<CreditHolding>,
    /// Another router ran short at the last read.
    others_short: bool,
}

/// What a round's reads mean for the shards.
#[derive(Debug, Default)]
pub struct AfterRound {
    /// Every shard forfeits its credits (the store lost its data, or the others gave this
    /// router up in some pool).
    pub forfeit: bool,
    /// The budgets other routers ran short of.
    pub others_short: Arc<Vec<(ModelId, BudgetKind)>>,
    /// Routers given up in some pool since the last round (for the log).
    pub given_up: bool,
}

/// The pools of the budgets this router has credits for. Bound: one entry per model and budget
/// kind this router has reported credits for (two per model the registry knows), and one per
/// key's B4 share while this router's wallet for it reports (it goes at the first round that
/// does not); each round writes and reads one pool per entry, each pool holding one field per
/// router of the site.
#[derive(Debug)]
pub struct SiteCredits {
    router: String,
    run: u64,
    settle_ms: u64,
    budgets: HashMap<(ModelId, BudgetKind), Budget>,
    /// Whether a round has read the store yet.
    knows_the_store: bool,
    /// The settle window of the latest loss (or of a young store's first read) ends then.
    settles_at: u64,
    /// The pools written this round, in order (for [`SiteCredits::after_round`]).
    written: Vec<(ModelId, BudgetKind)>,
    /// A failover was noticed: no grant until a round has rewritten what this router holdings.
    awaiting_rewrite: bool,
}

/// The pool name of a model's budget.
pub fn pool_name(model: &ModelKey, kind: BudgetKind) -> String {
    format!(
        "{}|{}|{}",
        model.capability.as_str(),
        model.name,
        kind.name()
    )
}

/// When the epoch `epoch` began (unix ms), from its `{unix ms}-…` prefix; 0 when it has none
/// (an epoch set by an older version: treated as settled).
pub fn epoch_since(epoch: &str) -> u64 {
    epoch
        .split('-')
        .next()
        .and_then(|prefix| prefix.parse().ok())
        .unwrap_or(0)
}

impl SiteCredits {
    pub fn new(router: &str, run: u64, settle_ms: u64) -> SiteCredits {
        SiteCredits {
            router: router.to_owned(),
            run,
            settle_ms,
            budgets: HashMap::new(),
            knows_the_store: false,
            settles_at: 0,
            written: Vec::new(),
            awaiting_rewrite: false,
        }
    }

    /// While a settle window holds new credits back: when it ends (unix ms), and the pools of
    /// the budgets it holds back (`{capability}|{model}|{kind}`), sorted; `None` once it ended,
    /// or before this router first read the store.
    pub fn settling(&self, now_ms: u64) -> Option<(u64, Vec<&str>)> {
        if !self.knows_the_store || now_ms >= self.settles_at {
            return None;
        }
        let mut pools: Vec<&str> = self
            .budgets
            .values()
            .map(|budget| budget.pool.as_str())
            .collect();
        pools.sort_unstable();
        Some((self.settles_at, pools))
    }

    /// The store failed over, or restarted (a new replication ID): its latest writes may be
    /// lost though its epoch is the same. Every view guards what the new pool lost
    /// (`PoolView::failed_over`), and no grant is asked for until a round has rewritten what
    /// this router holdings.
    pub fn failed_over(&mut self, now_ms: u64) {
        if !self.knows_the_store {
            return;
        }
        for budget in self.budgets.values_mut() {
            budget
                .view
                .failed_over(now_ms, self.settle_ms, &self.router);
        }
        self.awaiting_rewrite = true;
    }

    /// This round's reports from the owner shards; `name` names a model (a model the registry
    /// no longer knows is skipped: its wallet gives its credits back when idle).
    pub fn take_holdings(
        &mut self,
        now_ms: u64,
        holdings: Vec<CreditHolding>,
        name: impl Fn(ModelId) -> Option<ModelKey>,
    ) {
        for holding in holdings {
            let budget = self.budget(now_ms, holding.model, holding.kind, holding.budget, &name);
            if let Some(budget) = budget {
                budget.holding = Some(holding);
            }
        }
    }

    fn budget(
        &mut self,
        now_ms: u64,
        model: ModelId,
        kind: BudgetKind,
        size: u64,
        name: impl Fn(ModelId) -> Option<ModelKey>,
    ) -> Option<&mut Budget> {
        if !self.budgets.contains_key(&(model, kind)) {
            let pool = pool_name(&name(model)?, kind);
            let view = if self.knows_the_store {
                PoolView::for_new_budget(now_ms, self.settles_at)
            } else {
                PoolView::new()
            };
            self.budgets.insert(
                (model, kind),
                Budget {
                    pool,
                    budget: size,
                    view,
                    holding: None,
                    others_short: false,
                },
            );
        }
        let budget = self.budgets.get_mut(&(model, kind))?;
        budget.budget = size;
        Some(budget)
    }

    /// The round's pool commands: every budget's rewrite (when its owner reported one and this
    /// router knows the store's epoch) and read. `leaving`: a clean shutdown writes nothing (the
    /// holdings are released after the round).
    pub fn pool_writes<'a>(
        &'a mut self,
        epoch: Option<&'a str>,
        leaving: bool,
    ) -> Vec<PoolWrite<'a>> {
        self.written.clear();
        let mut writes = Vec::with_capacity(self.budgets.len());
        for (key, budget) in &self.budgets {
            let rewrite = match (budget.holding, epoch) {
                (Some(hold), Some(epoch)) if !leaving => Some(PoolRewrite {
                    epoch,
                    run: self.run,
                    holding: hold.holding,
                    in_use: hold.in_use,
                    short: hold.ran_short,
                }),
                _ => None,
            };
            self.written.push(*key);
            writes.push(PoolWrite {
                pool: &budget.pool,
                rewrite,
            });
        }
        writes
    }

    /// The round's reads. `epoch_changed`: the store's epoch is not the one this router knew
    /// (it lost its data); `epoch_began`: when the store's current epoch began.
    pub fn after_round(
        &mut self,
        now_ms: u64,
        epoch_changed: bool,
        epoch_began: u64,
        reads: &[PoolRead],
    ) -> AfterRound {
        let mut after = AfterRound::default();
        self.awaiting_rewrite = false;
        let first = !self.knows_the_store;
        if first {
            self.knows_the_store = true;
            self.settles_at = epoch_began.saturating_add(self.settle_ms);
        }
        if epoch_changed {
            self.settles_at = epoch_began.saturating_add(self.settle_ms);
            after.forfeit = true;
        }
        let mut others_short = Vec::new();
        let mut unreported = Vec::new();
        for (key, read) in self.written.iter().zip(reads) {
            let Some(budget) = self.budgets.get_mut(key) else {
                continue;
            };
            if budget.holding.take().is_none() && matches!(key.1, BudgetKind::Share(_)) {
                unreported.push(*key);
            }
            let holdings: Vec<(String, StoredHolding)> = read
                .holdings
                .iter()
                .filter_map(|(router, text)| Some((router.clone(), StoredHolding::parse(text)?)))
                .collect();
            budget.others_short = holdings
                .iter()
                .any(|(router, holding)| *router != self.router && holding.short);
            if budget.others_short {
                others_short.push(*key);
            }
            let held = holdings
                .iter()
                .map(|(router, holding)| (router.clone(), holding.held));
            if epoch_changed {
                budget.view.lost(
                    now_ms,
                    epoch_began,
                    self.settle_ms,
                    &self.router,
                    budget.budget,
                );
            } else if first {
                budget
                    .view
                    .first_read(now_ms, epoch_began, self.settle_ms, held, budget.budget);
            } else {
                budget.view.read(held, budget.budget);
            }
            if read.rewritten == Some(1) {
                // The others gave this router up in this pool: what it believed it held is not
                // its any more.
                after.forfeit = true;
                after.given_up = true;
            }
        }
        // A key's share this router holds nothing of (its wallet went, or never got any):
        // its pool is read no more. A later refill reads it again, as a budget first seen.
        for key in unreported {
            self.budgets.remove(&key);
        }
        after.others_short = Arc::new(others_short);
        after
    }

    /// What the routers of `model`'s `kind` pool may hold together at most, as this router can
    /// vouch for now (the grant script takes it for the budget), with the pool's name.
    /// `unknown_routers`: agents report routers the store does not list.
    pub fn ceiling(
        &mut self,
        now_ms: u64,
        model: ModelId,
        kind: BudgetKind,
        size: u64,
        unknown_routers: bool,
        name: impl Fn(ModelId) -> Option<ModelKey>,
    ) -> Option<(String, u64)> {
        if !self.knows_the_store || self.awaiting_rewrite {
            return None;
        }
        let budget = self.budget(now_ms, model, kind, size, name)?;
        Some((
            budget.pool.clone(),
            budget.view.ceiling(now_ms, budget.budget, unknown_routers),
        ))
    }

    /// A failover was noticed and no round has rewritten this router's holdings since.
    pub fn awaiting_rewrite(&self) -> bool {
        self.awaiting_rewrite
    }

    /// The others gave `router` up: no view guards what it held any more.
    pub fn forget(&mut self, router: &str) {
        for budget in self.budgets.values_mut() {
            budget.view.forget(router);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Capability;

    fn key(name: &str) -> ModelKey {
        ModelKey {
            name: name.into(),
            capability: Capability::Llm,
        }
    }

    fn holding(model: u32, kind: BudgetKind, holding: u64, budget: u64) -> CreditHolding {
        CreditHolding {
            model: ModelId(model),
            kind,
            holding,
            in_use: 0,
            ran_short: false,
            budget,
        }
    }

    fn read(holdings: &[(&str, &str)]) -> PoolRead {
        PoolRead {
            rewritten: Some(0),
            holdings: holdings
                .iter()
                .map(|(router, text)| (router.to_string(), text.to_string()))
                .collect(),
        }
    }

    #[test]
    fn epochs_carry_their_start() {
        assert_eq!(
            epoch_since("1780000000000-router-0-00ff"),
            1_780_000_000_000
        );
        assert_eq!(epoch_since("router-0-00ff"), 0);
    }

    #[test]
    fn a_round_follows_the_pools_and_a_loss_guards_what_was_seen() {
        let mut credits = SiteCredits::new("a", 1, 10_000);
        let name = |_| Some(key("m"));
        credits.take_holdings(100_000, vec![holding(1, BudgetKind::Requests, 2, 10)], name);
        let writes = credits.pool_writes(Some("1-x"), false);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].pool, "llm|m|requests");
        drop(writes);
        let after =
            credits.after_round(100_000, false, 0, &[read(&[("a", "1:2"), ("b", "7:5:1")])]);
        assert!(!after.forfeit);
        assert_eq!(
            *after.others_short,
            vec![(ModelId(1), BudgetKind::Requests)]
        );
        let ceiling = credits.ceiling(100_000, ModelId(1), BudgetKind::Requests, 10, false, name);
        assert_eq!(ceiling, Some(("llm|m|requests".into(), 10)));
        // The store lost its data: b's 5 and the 3 no one held are guarded for the window.
        let _ = credits.pool_writes(Some("1-x"), false);
        let after = credits.after_round(101_000, true, 100_500, &[read(&[])]);
        assert!(after.forfeit);
        let ceiling = credits.ceiling(101_000, ModelId(1), BudgetKind::Requests, 10, false, name);
        assert_eq!(ceiling.unwrap().1, 2);
        // A budget first used inside the window gets nothing until it ends.
        let ceiling = credits.ceiling(101_000, ModelId(2), BudgetKind::Tokens, 100, false, name);
        assert_eq!(ceiling.unwrap().1, 0);
        let ceiling = credits.ceiling(110_500, ModelId(2), BudgetKind::Tokens, 100, false, name);
        assert_eq!(ceiling.unwrap().1, 100);
    }

    #[test]
    fn a_router_given_up_forfeits() {
        let mut credits = SiteCredits::new("a", 1, 10_000);
        credits.take_holdings(0, vec![holding(1, BudgetKind::Tokens, 40, 100)], |_| {
            Some(key("m"))
        });
        let _ = credits.pool_writes(Some("1-x"), false);
        let mut given_up = read(&[]);
        given_up.rewritten = Some(1);
        let after = credits.after_round(50_000, false, 0, &[given_up]);
        assert!(after.forfeit && after.given_up);
    }

    #[test]
    fn nothing_is_granted_before_the_store_was_read() {
        let mut credits = SiteCredits::new("a", 1, 10_000);
        assert_eq!(
            credits.ceiling(0, ModelId(1), BudgetKind::Tokens, 100, false, |_| Some(
                key("m")
            )),
            None
        );
    }
}
