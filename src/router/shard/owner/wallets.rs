//! A model's occupancy credits on its owner shard, when the routers of a site share its budgets
//! (seed `run-several-routers.md`, "Occupancy credits"): one [`Wallet`] for the token budget, one
//! for the request backstop, and one for each key's B4 share in use here. Admission keeps within them (`Limits::credits`) as well as within
//! the budget, so a request never waits on the store; a wallet that runs short asks the sync core
//! for a refill, and each round hands the sync core what the router holdings.
//!
//! Pure: time comes in as [`Millis`]; refills and round plans are returned for the caller to
//! send.

use std::collections::HashMap;

use crate::base::clock::Millis;
use crate::base::ids::{KeyId, ModelId};
use crate::logic::admission::occupancy::{Limits, ShareCredits, SiteCredits};
use crate::logic::credits::BudgetKind;
use crate::logic::credits::wallet::{Allowance, Cap, Wallet};

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

/// One budget's wallet, with its refills.
#[derive(Debug, Clone)]
struct BudgetWallet {
    wallet: Wallet,
    /// A refill is on its way: no second one until it is answered (or a round passes).
    refilling: bool,
    /// Another router ran short at the last round: keep no headroom.
    others_short: bool,
}

impl BudgetWallet {
    fn new(now: Millis) -> BudgetWallet {
        BudgetWallet {
            wallet: Wallet::new(now),
            refilling: false,
            others_short: false,
        }
    }

    /// Requests needing `need` did not fit with `used` in use: the refill that would let them
    /// (none while one is on its way).
    fn short(
        &mut self,
        model: ModelId,
        kind: BudgetKind,
        budget: u64,
        used: u64,
        need: u64,
    ) -> Option<Refill> {
        let want = self.wallet.want(used, need, headroom(budget));
        if want == 0 {
            return None;
        }
        self.wallet.flag_short();
        (!std::mem::replace(&mut self.refilling, true)).then_some(Refill {
            model,
            kind,
            want,
            budget,
        })
    }

    /// The round's plan, as [`CreditHolding`] (`None`: nothing held before or now, nothing to
    /// write).
    fn round(
        &mut self,
        now: Millis,
        model: ModelId,
        kind: BudgetKind,
        budget: u64,
        used: u64,
        reached: bool,
    ) -> Option<CreditHolding> {
        self.refilling = false;
        if budget == 0 {
            // No such budget (or no longer): nothing is held of it.
            self.wallet.forfeit();
            return None;
        }
        let had = self.wallet.credits();
        let plan = match reached {
            true => self
                .wallet
                .round(now, used, headroom(budget), self.others_short),
            false => self.wallet.round_unreached(used),
        };
        if had == 0 && plan.holding == 0 && !plan.ran_short {
            return None;
        }
        Some(CreditHolding {
            model,
            kind,
            holding: plan.holding,
            in_use: used,
            ran_short: plan.ran_short,
            budget,
        })
    }
}

/// A key's wallet for its B4 share of the model.
#[derive(Debug, Clone)]
struct ShareWallet {
    budget: BudgetWallet,
    /// The key's `max_occupancy_share`, as its latest request carried it (sizes the budget at a
    /// round).
    share: f64,
    /// The pool answered a refill with nothing since the last round: the share is in use on the
    /// site.
    spent: bool,
}

impl ShareWallet {
    fn new(now: Millis, share: f64) -> ShareWallet {
        ShareWallet {
            budget: BudgetWallet::new(now),
            share,
            spent: false,
        }
    }
}

/// One model's wallets: the token budget, the request backstop, and the B4 share of each key
/// with one in use here. Bound: one share wallet per key with requests or credits here, or used
/// in the last minute ([`IDLE_RETURN_MS`]).
#[derive(Debug, Clone)]
pub struct ModelWallets {
    tokens: BudgetWallet,
    requests: BudgetWallet,
    shares: HashMap<KeyId, ShareWallet>,
    /// The last grant was not acknowledged by a replica: stay at the share until one is.
    unacknowledged: bool,
}

/// A key's B4 share of `share_base_tokens` (`admission::occupancy`'s rule); 0 without one.
fn share_limit(share: f64, share_base_tokens: u64) -> u64 {
    if share > 0.0 {
        (share * share_base_tokens as f64).floor() as u64
    } else {
        0
    }
}

impl ModelWallets {
    pub fn new(now: Millis) -> ModelWallets {
        ModelWallets {
            tokens: BudgetWallet::new(now),
            requests: BudgetWallet::new(now),
            shares: HashMap::new(),
            unacknowledged: false,
        }
    }

    fn budget_wallet(&mut self, kind: BudgetKind) -> Option<&mut BudgetWallet> {
        match kind {
            BudgetKind::Tokens => Some(&mut self.tokens),
            BudgetKind::Requests => Some(&mut self.requests),
            BudgetKind::Share(key) => self.shares.get_mut(&key).map(|share| &mut share.budget),
        }
    }

    /// The cap admission holds a budget of `budget` to under `cap`.
    fn cap_of(&self, budget: u64, cap: CreditCap, routers_live: u32) -> Cap {
        let share = |routers: u32| budget / u64::from(routers.max(1));
        match cap {
            CreditCap::Credits if self.unacknowledged => Cap::Share {
                share: share(routers_live),
            },
            CreditCap::Credits => Cap::Credits,
            CreditCap::Alone { routers } => Cap::Share {
                share: share(routers),
            },
            CreditCap::Closed => Cap::Closed,
        }
    }

    /// `limits` with this router's credits under `cap`.
    pub fn limit(&self, limits: Limits, cap: CreditCap, routers_live: u32) -> Limits {
        let allowance = |wallet: &BudgetWallet, budget: u64| {
            wallet
                .wallet
                .allowance(self.cap_of(budget, cap, routers_live))
        };
        Limits {
            credits: Some(SiteCredits {
                tokens: allowance(&self.tokens, limits.budget_tokens),
                requests: allowance(&self.requests, limits.max_inflight),
            }),
            ..limits
        }
    }

    /// This router's credits for `key`'s share of `limit` tokens under `cap` (none held for a
    /// key without a wallet).
    pub fn share_credits(
        &self,
        key: KeyId,
        limit: u64,
        cap: CreditCap,
        routers_live: u32,
    ) -> ShareCredits {
        let cap = self.cap_of(limit, cap, routers_live);
        match self.shares.get(&key) {
            Some(share) => ShareCredits {
                allowance: share.budget.wallet.allowance(cap),
                spent: share.spent,
            },
            None => ShareCredits {
                allowance: Allowance { credits: 0, cap },
                spent: false,
            },
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
            let wallet = self.budget_wallet(kind).expect("the model's own budgets");
            out.extend(wallet.short(model, kind, budget, used, need));
        }
    }

    /// A request of `key` needing `need` tokens did not fit (`used` in use by the key here): the
    /// refill of the key's `share` of the model that would let it, when it is within the share
    /// and the key's pool did not say it has nothing free since the last round.
    #[allow(clippy::too_many_arguments)]
    pub fn share_short(
        &mut self,
        now: Millis,
        model: ModelId,
        key: KeyId,
        share: f64,
        limits: &Limits,
        used: u64,
        need: u64,
        cap: CreditCap,
        out: &mut Vec<Refill>,
    ) {
        let budget = share_limit(share, limits.share_base_tokens);
        if cap != CreditCap::Credits || budget == 0 || used.saturating_add(need) > budget {
            // Nothing to ask: the store does not answer, or no credits would let it.
            return;
        }
        if self.shares.get(&key).is_some_and(|wallet| wallet.spent) {
            // The pool said it has nothing free since the last round: ask again after it.
            return;
        }
        let wallet = self
            .shares
            .entry(key)
            .or_insert_with(|| ShareWallet::new(now, share));
        wallet.share = share;
        wallet.budget.wallet.touch(now);
        out.extend(
            wallet
                .budget
                .short(model, BudgetKind::Share(key), budget, used, need),
        );
    }

    /// The pool's answer to a refill (a key's share wallet is kept for it, so what the pool
    /// granted is written back at the next round whatever happened to the key meanwhile).
    pub fn granted(&mut self, now: Millis, kind: BudgetKind, granted: u64, acknowledged: bool) {
        if let BudgetKind::Share(key) = kind {
            let wallet = self
                .shares
                .entry(key)
                .or_insert_with(|| ShareWallet::new(now, 0.0));
            wallet.spent = granted == 0;
        }
        if let Some(wallet) = self.budget_wallet(kind) {
            wallet.refilling = false;
            wallet.wallet.add(granted);
        }
        if granted > 0 {
            self.unacknowledged = !acknowledged;
        }
    }

    /// A request was admitted, grew or ended (of `key`, when it holds a share): the wallets are
    /// in use.
    pub fn touch(&mut self, now: Millis, key: Option<KeyId>) {
        self.tokens.wallet.touch(now);
        self.requests.wallet.touch(now);
        if let Some(share) = key.and_then(|key| self.shares.get_mut(&key)) {
            share.budget.wallet.touch(now);
        }
    }

    /// The round: keep what is in use plus headroom, hand back the rest (`credits::wallet`);
    /// after a round that did not reach the store (`reached` false), keep everything.
    /// `in_use`: (tokens, requests) in flight here; `key_in_use`: what a key's requests hold.
    /// A key's share wallet that holds nothing, with nothing in use, idle for a minute, goes.
    #[allow(clippy::too_many_arguments)]
    pub fn round(
        &mut self,
        now: Millis,
        model: ModelId,
        limits: &Limits,
        in_use: (u64, u64),
        key_in_use: impl Fn(KeyId) -> u64,
        reached: bool,
        out: &mut Vec<CreditHolding>,
    ) {
        let kinds = [
            (BudgetKind::Tokens, limits.budget_tokens, in_use.0),
            (BudgetKind::Requests, limits.max_inflight, in_use.1),
        ];
        for (kind, budget, used) in kinds {
            let wallet = self.budget_wallet(kind).expect("the model's own budgets");
            out.extend(wallet.round(now, model, kind, budget, used, reached));
        }
        self.shares.retain(|key, share| {
            let used = key_in_use(*key);
            let budget = share_limit(share.share, limits.share_base_tokens);
            let kind = BudgetKind::Share(*key);
            out.extend(share.budget.round(now, model, kind, budget, used, reached));
            share.spent = false;
            !share.budget.wallet.is_idle(now, used)
        });
    }

    /// Which of this model's budgets another router ran short of at the last round.
    pub fn set_others_short(&mut self, short: impl Fn(BudgetKind) -> bool) {
        self.tokens.others_short = short(BudgetKind::Tokens);
        self.requests.others_short = short(BudgetKind::Requests);
        for (key, share) in &mut self.shares {
            share.budget.others_short = short(BudgetKind::Share(*key));
        }
    }

    /// What this router believed it held is no longer its (the store lost its data, or the
    /// others gave it up).
    pub fn forfeit(&mut self) {
        self.tokens.wallet.forfeit();
        self.requests.wallet.forfeit();
        for share in self.shares.values_mut() {
            share.budget.wallet.forfeit();
        }
    }

    /// Holding nothing with nothing in use.
    pub fn is_empty(&self, in_use: (u64, u64)) -> bool {
        self.tokens.wallet.is_empty(in_use.0)
            && self.requests.wallet.is_empty(in_use.1)
            && self
                .shares
                .values()
                .all(|share| share.budget.wallet.credits() == 0)
    }

    pub fn credits(&self, kind: BudgetKind) -> u64 {
        match kind {
            BudgetKind::Tokens => self.tokens.wallet.credits(),
            BudgetKind::Requests => self.requests.wallet.credits(),
            BudgetKind::Share(key) => self
                .shares
                .get(&key)
                .map_or(0, |share| share.budget.wallet.credits()),
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
        wallets.granted(Millis(0), BudgetKind::Tokens, 150, true);
        wallets.granted(Millis(0), BudgetKind::Requests, 2, true);
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
        wallets.granted(Millis(0), BudgetKind::Requests, 4, true);
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
        wallets.granted(Millis(0), BudgetKind::Requests, 6, false);
        let budget = limits(0, 6);
        let credits = wallets
            .limit(budget, CreditCap::Credits, 3)
            .credits
            .unwrap();
        assert!(!credits.requests.allows(2, 1), "6 / 3 live routers");
        wallets.granted(Millis(0), BudgetKind::Requests, 0, true);
        assert!(wallets.unacknowledged, "a refusal acknowledges nothing new");
        wallets.granted(Millis(0), BudgetKind::Requests, 1, true);
        let credits = wallets
            .limit(budget, CreditCap::Credits, 3)
            .credits
            .unwrap();
        assert!(credits.requests.allows(5, 1));
    }

    #[test]
    fn a_round_reports_what_is_held_and_hands_back_the_rest() {
        let mut wallets = ModelWallets::new(Millis(0));
        wallets.granted(Millis(0), BudgetKind::Tokens, 500, true);
        let mut holdings = Vec::new();
        wallets.round(
            Millis(1_000),
            ModelId(1),
            &limits(800, 0),
            (100, 1),
            |_| 0,
            true,
            &mut holdings,
        );
        assert_eq!(
            holdings.len(),
            1,
            "no request credits held: nothing to write"
        );
        assert_eq!(holdings[0].holding, 200, "100 in use and 100 of headroom");
        wallets.set_others_short(|kind| kind == BudgetKind::Tokens);
        holdings.clear();
        wallets.round(
            Millis(2_000),
            ModelId(1),
            &limits(800, 0),
            (100, 1),
            |_| 0,
            true,
            &mut holdings,
        );
        assert_eq!(
            holdings[0].holding, 100,
            "another router ran short: no headroom"
        );
    }
}
