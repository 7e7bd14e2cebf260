//! A model's occupancy credits on its owner shard, when the routers of a site share its budgets
//! (seed `run-several-routers.md`, "Occupancy credits"): one [`Wallet`] for the token budget and
//! one for the request backstop. Admission keeps within them (`Limits::credits`) as well as within
//! the budget, so a request never waits on the store; a wallet that runs short asks the sync core
//! for a refill, and each round hands the sync core what the router holdings.
//!
//! Pure: time comes in as [`Millis`]; refills and round plans are returned for the caller to
//! send.

use crate::base::clock::Millis;
use crate::base::ids::ModelId;
use crate::logic::admission::occupancy::{Limits, SiteCredits};
use crate::logic::credits::BudgetKind;
use crate::logic::credits::wallet::{Cap, Wallet};

/// A wallet ran short: ask the pool of `model`'s `kind` budget for `want` more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refill {
    pub model: ModelId,
    pub kind: BudgetKind,
    pub want: u64,
    /// The whole budget, for the router's ceiling.
    pub budget: u64,
}

/// What the router holdings of one budget after a round: the sync core writes it to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditHolding {
    pub model: ModelId,
    pub kind: BudgetKind,
    pub holding: u64,
    /// What requests in flight use of it (held, never credits, when the others gave this
    /// router up).
    pub in_use: u64,
    pub ran_short: bool,
    pub budget: u64,
}

/// What the sync core tells a shard of its credits.
#[derive(Debug, Clone)]
pub enum CreditNews {
    /// The pool's answer to a [`Refill`] (0 when it had nothing free, or the store did not
    /// answer). `acknowledged`: a replica has it (always, without Sentinel).
    Granted {
        model: ModelId,
        kind: BudgetKind,
        granted: u64,
        acknowledged: bool,
    },
    /// The budgets other routers ran short of at the last round (every other: none).
    OthersShort(std::sync::Arc<Vec<(ModelId, BudgetKind)>>),
    /// What this router believed it held is no longer its: the store lost its data, or the
    /// others gave it up.
    Forfeit,
    /// Cut off from the store with an agent connected since (true), or the store answers again
    /// (false): see [`CreditCap::Closed`].
    Closed(bool),
}

/// The headroom a round keeps beyond what is in use: an eighth of the budget, at least one.
fn headroom(budget: u64) -> u64 {
    (budget / 8).max(1)
}

/// How admission may use the wallets now (set by the sync core's rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditCap {
    /// The store answers.
    Credits,
    /// The store is unreachable: at most the budget ÷ `routers` on this router.
    Alone { routers: u32 },
    /// Cut off from the store, and an agent connected since: that agent may have reported this
    /// router gone, and the others may have taken its credits back. Nothing is admitted until
    /// the store answers.
    Closed,
}

/// One model's two wallets.
#[derive(Debug, Clone)]
pub struct ModelWallets {
    tokens: Wallet,
    requests: Wallet,
    /// A refill is on its way, per kind: no second one until it is answered (or a round passes).
    refilling: [bool; 2],
    /// Another router ran short at the last round, per kind: keep no headroom.
    others_short: [bool; 2],
    /// The last grant was not acknowledged by a replica: stay at the share until one is.
    unacknowledged: bool,
}

impl ModelWallets {
    pub fn new(now: Millis) -> ModelWallets {
        ModelWallets {
            tokens: Wallet::new(now),
            requests: Wallet::new(now),
            refilling: [false; 2],
            others_short: [false; 2],
            unacknowledged: false,
        }
    }

    fn wallet(&mut self, kind: BudgetKind) -> &mut Wallet {
        match kind {
            BudgetKind::Tokens => &mut self.tokens,
            BudgetKind::Requests => &mut self.requests,
        }
    }

    /// `limits` with this router's credits under `cap`.
    pub fn limit(&self, limits: Limits, cap: CreditCap, routers_live: u32) -> Limits {
        let share = |budget: u64, routers: u32| budget / u64::from(routers.max(1));
        let cap_of = |budget: u64| match cap {
            CreditCap::Credits if self.unacknowledged => Cap::Share {
                share: share(budget, routers_live),
            },
            CreditCap::Credits => Cap::Credits,
            CreditCap::Alone { routers } => Cap::Share {
                share: share(budget, routers),
            },
            CreditCap::Closed => Cap::Closed,
        };
        Limits {
            credits: Some(SiteCredits {
                tokens: self.tokens.allowance(cap_of(limits.budget_tokens)),
                requests: self.requests.allowance(cap_of(limits.max_inflight)),
            }),
            ..limits
        }
    }

    /// Requests needing `need` (tokens, requests) did not fit: the refills that would let them
    /// (none while the store is unreachable, or while one is on its way).
    pub fn short(
        &mut self,
        model: ModelId,
        limits: &Limits,
        in_use: (u64, u64),
        need: (u64, u64),
        cap: CreditCap,
        out: &mut Vec<Refill>,
    ) {
        if cap != CreditCap::Credits {
            return;
        }
        let asks = [
            (BudgetKind::Tokens, limits.budget_tokens, in_use.0, need.0),
            (BudgetKind::Requests, limits.max_inflight, in_use.1, need.1),
        ];
        for (kind, budget, used, need) in asks {
            if budget == 0 {
                continue;
            }
            let want = self.wallet(kind).want(used, need, headroom(budget));
            if want == 0 {
                continue;
            }
            self.wallet(kind).flag_short();
            if !std::mem::replace(&mut self.refilling[kind.index()], true) {
                out.push(Refill {
                    model,
                    kind,
                    want,
                    budget,
                });
            }
        }
    }

    /// The pool's answer to a refill.
    pub fn granted(&mut self, kind: BudgetKind, granted: u64, acknowledged: bool) {
        self.refilling[kind.index()] = false;
        self.wallet(kind).add(granted);
        if granted > 0 {
            self.unacknowledged = !acknowledged;
        }
    }

    /// A request was admitted, grew or ended: the wallets are in use.
    pub fn touch(&mut self, now: Millis) {
        self.tokens.touch(now);
        self.requests.touch(now);
    }

    /// The round: keep what is in use plus headroom, hand back the rest (`credits::wallet`);
    /// after a round that did not reach the store (`reached` false), keep everything.
    /// `in_use`: (tokens, requests) in flight here.
    pub fn round(
        &mut self,
        now: Millis,
        model: ModelId,
        limits: &Limits,
        in_use: (u64, u64),
        reached: bool,
        out: &mut Vec<CreditHolding>,
    ) {
        self.refilling = [false; 2];
        let kinds = [
            (BudgetKind::Tokens, limits.budget_tokens, in_use.0),
            (BudgetKind::Requests, limits.max_inflight, in_use.1),
        ];
        for (kind, budget, used) in kinds {
            if budget == 0 {
                // No such budget (or no longer): nothing is held of it.
                self.wallet(kind).forfeit();
                continue;
            }
            let others_short = self.others_short[kind.index()];
            let wallet = self.wallet(kind);
            let had = wallet.credits();
            let plan = match reached {
                true => wallet.round(now, used, headroom(budget), others_short),
                false => wallet.round_unreached(used),
            };
            if had == 0 && plan.holding == 0 && !plan.ran_short {
                // Nothing held before or now: nothing to write.
                continue;
            }
            out.push(CreditHolding {
                model,
                kind,
                holding: plan.holding,
                in_use: used,
                ran_short: plan.ran_short,
                budget,
            });
        }
    }

    /// Whether another router ran short of `kind` at the last round.
    pub fn set_others_short(&mut self, kind: BudgetKind, short: bool) {
        self.others_short[kind.index()] = short;
    }

    /// What this router believed it held is no longer its (the store lost its data, or the
    /// others gave it up).
    pub fn forfeit(&mut self) {
        self.tokens.forfeit();
        self.requests.forfeit();
    }

    /// Holding nothing with nothing in use.
    pub fn is_empty(&self, in_use: (u64, u64)) -> bool {
        self.tokens.is_empty(in_use.0) && self.requests.is_empty(in_use.1)
    }

    pub fn credits(&self, kind: BudgetKind) -> u64 {
        match kind {
            BudgetKind::Tokens => self.tokens.credits(),
            BudgetKind::Requests => self.requests.credits(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tokens: u64, requests: u64) -> Limits {
        Limits {
            budget_tokens: tokens,
            max_inflight: requests,
            ..Limits::default()
        }
    }

    #[test]
    fn a_short_wallet_asks_once_until_answered() {
        let mut wallets = ModelWallets::new(Millis(0));
        let mut refills = Vec::new();
        let budget = limits(800, 4);
        let ask = |wallets: &mut ModelWallets, refills: &mut Vec<Refill>| {
            wallets.short(
                ModelId(1),
                &budget,
                (0, 0),
                (50, 1),
                CreditCap::Credits,
                refills,
            )
        };
        ask(&mut wallets, &mut refills);
        assert_eq!(refills.len(), 2);
        assert_eq!(refills[0].want, 150, "50 and an eighth of 800");
        assert_eq!(refills[1].want, 2, "one and the least headroom");
        ask(&mut wallets, &mut refills);
        assert_eq!(refills.len(), 2, "one refill at a time");
        wallets.granted(BudgetKind::Tokens, 150, true);
        wallets.granted(BudgetKind::Requests, 2, true);
        let limited = wallets.limit(budget, CreditCap::Credits, 2);
        let credits = limited.credits.unwrap();
        assert!(credits.tokens.allows(0, 150));
        assert!(!credits.tokens.allows(100, 51));
        assert!(credits.requests.allows(1, 1));
        assert!(!credits.requests.allows(2, 1));
    }

    #[test]
    fn no_refill_while_the_store_is_unreachable_and_the_share_caps() {
        let mut wallets = ModelWallets::new(Millis(0));
        wallets.granted(BudgetKind::Requests, 4, true);
        let budget = limits(0, 6);
        let mut refills = Vec::new();
        wallets.short(
            ModelId(1),
            &budget,
            (4, 4),
            (0, 1),
            CreditCap::Alone { routers: 3 },
            &mut refills,
        );
        assert!(refills.is_empty());
        let credits = wallets
            .limit(budget, CreditCap::Alone { routers: 3 }, 3)
            .credits
            .unwrap();
        assert!(credits.requests.allows(1, 1));
        assert!(!credits.requests.allows(2, 1), "6 / 3 routers");
    }

    #[test]
    fn an_unacknowledged_grant_keeps_the_router_at_its_share() {
        let mut wallets = ModelWallets::new(Millis(0));
        wallets.granted(BudgetKind::Requests, 6, false);
        let budget = limits(0, 6);
        let credits = wallets
            .limit(budget, CreditCap::Credits, 3)
            .credits
            .unwrap();
        assert!(!credits.requests.allows(2, 1), "6 / 3 live routers");
        wallets.granted(BudgetKind::Requests, 0, true);
        assert!(wallets.unacknowledged, "a refusal acknowledges nothing new");
        wallets.granted(BudgetKind::Requests, 1, true);
        let credits = wallets
            .limit(budget, CreditCap::Credits, 3)
            .credits
            .unwrap();
        assert!(credits.requests.allows(5, 1));
    }

    #[test]
    fn a_round_reports_what_is_held_and_hands_back_the_rest() {
        let mut wallets = ModelWallets::new(Millis(0));
        wallets.granted(BudgetKind::Tokens, 500, true);
        let mut holdings = Vec::new();
        wallets.round(
            Millis(1_000),
            ModelId(1),
            &limits(800, 0),
            (100, 1),
            true,
            &mut holdings,
        );
        assert_eq!(
            holdings.len(),
            1,
            "no request credits held: nothing to write"
        );
        assert_eq!(holdings[0].holding, 200, "100 in use and 100 of headroom");
        wallets.set_others_short(BudgetKind::Tokens, true);
        holdings.clear();
        wallets.round(
            Millis(2_000),
            ModelId(1),
            &limits(800, 0),
            (100, 1),
            true,
            &mut holdings,
        );
        assert_eq!(
            holdings[0].holding, 100,
            "another router ran short: no headroom"
        );
    }
}
