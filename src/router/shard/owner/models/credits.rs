//! A shard's models under a site's occupancy credits (seed `run-several-routers.md`,
//! "Occupancy credits"): the wallets every model keeps once the routers share the budgets, the
//! sync core's grants and news, and the round's report of what this router holds.

use super::*;

impl Models {
    /// The routers of the site share the occupancy budgets through credits: every model keeps
    /// wallets from now on, and admits nothing beyond them. Until the store answers, a router
    /// holds none, so it admits nothing on a model with a budget (seed: "A router that holds
    /// no credits ... admits nothing until the store answers").
    pub fn share_budgets(&mut self, routers: u32) {
        self.sharing = Some(Sharing {
            cap: CreditCap::Alone { routers },
            closed: false,
            live: routers,
            routers,
        });
    }

    /// The sync core's latest word on the store: reachable with `live` routers of `routers`
    /// that may be admitting, or unreachable (each router then keeps to budget ÷ `routers`).
    pub fn set_credit_cap(&mut self, reachable: bool, live: u32, routers: u32) {
        if let Some(sharing) = &mut self.sharing {
            sharing.cap = if reachable {
                CreditCap::Credits
            } else {
                CreditCap::Alone { routers }
            };
            sharing.live = live;
            sharing.routers = routers;
        }
    }

    /// The pool's answer to a refill: parked tickets may fit now.
    pub fn granted(
        &mut self,
        now: Millis,
        model: ModelId,
        kind: BudgetKind,
        granted: u64,
        acknowledged: bool,
        effects: &mut Effects,
    ) {
        if let Some(wallets) = self
            .occupancy
            .get_mut(&model)
            .and_then(|owned| owned.wallets.as_mut())
        {
            wallets.granted(now, kind, granted, acknowledged);
            self.retry_parked(now, model, effects);
            if granted > 0 {
                self.refill_for_parked(now, model, effects);
            }
        }
    }

    /// Requests still parked after a grant (it covered the first of them) or a round: ask the
    /// pool for what they need together. Without it a burst that arrives while a refill is on
    /// its way gets that refill's worth and the rest wait out their park timeout.
    fn refill_for_parked(&mut self, now: Millis, model: ModelId, effects: &mut Effects) {
        let policy = match self.occupancy.get(&model) {
            Some(owned) if owned.occupancy.parked_len() > 0 => owned.policy.clone(),
            _ => return,
        };
        let base = self.limits(model, &policy);
        let (Some(owned), Some(sharing)) = (self.occupancy.get_mut(&model), self.sharing) else {
            return;
        };
        let in_use = owned.in_use();
        let need = owned.occupancy.parked_need();
        if let Some(wallets) = owned.wallets.as_mut() {
            wallets.short(
                model,
                &base,
                in_use,
                need,
                sharing.cap,
                &mut effects.refills,
            );
        }
        ask_share_for_head(now, model, base, owned, Some(sharing), effects);
    }

    /// The sync core's news of the credits.
    pub fn credit_news(&mut self, now: Millis, news: CreditNews, effects: &mut Effects) {
        match news {
            CreditNews::Granted {
                model,
                kind,
                granted,
                acknowledged,
            } => self.granted(now, model, kind, granted, acknowledged, effects),
            CreditNews::OthersShort(short) => self.set_others_short(&short),
            CreditNews::Forfeit => self.forfeit_credits(),
            CreditNews::Closed(closed) => {
                if let Some(sharing) = &mut self.sharing {
                    sharing.closed = closed;
                }
            }
        }
    }

    /// The sync round: what this router holds of every budget it has credits for. `reached`:
    /// the last round reached the store (else the wallets give nothing back, `credits::wallet`).
    /// Requests still parked get a refill asked for them (one a round at most).
    pub fn credit_round(
        &mut self,
        now: Millis,
        reached: bool,
        out: &mut Vec<CreditHolding>,
        effects: &mut Effects,
    ) {
        for (model, owned) in self.occupancy.iter_mut() {
            let in_use = owned.in_use();
            let Some(wallets) = owned.wallets.as_mut() else {
                continue;
            };
            let healthy = healthy_in(&self.routes, *model);
            let base = pool_limits(self.admit_fraction, &owned.policy, healthy);
            let occupancy = &owned.occupancy;
            let key_in_use = |key| occupancy.key_tokens(key);
            wallets.round(now, *model, &base, in_use, key_in_use, reached, out);
        }
        let parked: Vec<ModelId> = self
            .occupancy
            .iter()
            .filter(|(_, owned)| owned.occupancy.parked_len() > 0)
            .map(|(model, _)| *model)
            .collect();
        for model in parked {
            self.refill_for_parked(now, model, effects);
        }
    }

    /// Which budgets other routers ran short of at the last round (all others: none).
    pub fn set_others_short(&mut self, short: &[(ModelId, BudgetKind)]) {
        for (model, owned) in self.occupancy.iter_mut() {
            if let Some(wallets) = owned.wallets.as_mut() {
                wallets.set_others_short(|kind| short.contains(&(*model, kind)));
            }
        }
    }

    /// What this router believed it held is no longer its (the store lost its data, or the
    /// others gave it up): requests in flight keep running, new ones need new credits.
    pub fn forfeit_credits(&mut self) {
        for owned in self.occupancy.values_mut() {
            if let Some(wallets) = owned.wallets.as_mut() {
                wallets.forfeit();
            }
        }
    }

    /// This router's credits for `model`'s `kind` budget (tests and reports).
    pub fn credits(&self, model: ModelId, kind: BudgetKind) -> Option<u64> {
        self.occupancy
            .get(&model)?
            .wallets
            .as_ref()
            .map(|wallets| wallets.credits(kind))
    }
}
