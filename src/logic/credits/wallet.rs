//! One router's wallet of credits for one occupancy budget, kept on the model's owner shard (seed
//! `run-several-routers.md`, "Occupancy credits"): requests are admitted against the credits the
//! router holds, so a request never waits on the store.
//!
//! # Rules
//! - Admit while what is in use plus the request fits the credits; otherwise the wallet ran short:
//!   it flags it (the others then keep no headroom) and the sync core asks the pool for more.
//! - Streamed output that grows a request past the credits is taken anyway (the response is
//!   already flowing) and recorded as held at the next round.
//! - Each round the wallet keeps what it uses plus a headroom (none when another router ran
//!   short) and gives the rest back.
//! - A wallet no request has used for a minute gives everything back.
//! - While the store is unreachable: admit within the credits capped at this router's share of
//!   the budget; a request larger than the share is admitted when nothing else is in use here.
//!   A round that follows one which did not reach the store gives nothing back
//!   ([`Wallet::round_unreached`]): what it would give back could not reach the pool, which still
//!   counts it as this router's, and a wallet that kept shrinking to what is in use would leave
//!   the router less than its share for the rest of the outage.
//!
//! Pure: time comes in as [`Millis`].

use crate::base::clock::Millis;

/// A wallet unused this long gives its credits back and is dropped.
pub const IDLE_RETURN_MS: u64 = 60_000;

/// What admission may use of the wallet now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// The store answers: the credits held.
    Credits,
    /// The store is unreachable: the credits held, and never more than `share` of the budget in
    /// use (one request larger than the share may run alone).
    Share { share: u64 },
    /// Admit nothing (a router cut off from the store that an agent reached again, or one the
    /// others may have given up): until the store answers.
    Closed,
}

/// A wallet's credits under a [`Cap`]: the one rule admission applies, on the owner shard
/// (`admission::occupancy`) and in the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    pub credits: u64,
    pub cap: Cap,
}

impl Allowance {
    /// Whether `need` more fits with `in_use` already in use of the budget on this router.
    pub fn allows(&self, in_use: u64, need: u64) -> bool {
        let after = in_use.saturating_add(need);
        match self.cap {
            Cap::Closed => false,
            Cap::Credits => after <= self.credits,
            Cap::Share { share } => {
                after <= self.credits.min(share)
                    // The oversized-request rule: one request larger than the share runs when
                    // nothing else is in flight here.
                    || (need > share && in_use == 0 && self.credits > 0)
            }
        }
    }
}

/// What a round decided for the wallet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundPlan {
    /// What the router holds after the round: write it to the pool.
    pub holding: u64,
    /// The wallet ran short since the last round: others keep no headroom.
    pub ran_short: bool,
}

/// The credits of one budget on one router. What is in use is not kept here: the owner's
/// occupancy is the one count of it, passed in as `in_use`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wallet {
    credits: u64,
    last_used: Millis,
    ran_short: bool,
}

impl Wallet {
    pub fn new(now: Millis) -> Wallet {
        Wallet {
            credits: 0,
            last_used: now,
            ran_short: false,
        }
    }

    pub fn credits(&self) -> u64 {
        self.credits
    }

    pub fn allowance(&self, cap: Cap) -> Allowance {
        Allowance {
            credits: self.credits,
            cap,
        }
    }

    /// Admits `need` if it fits under `cap`; a refusal under [`Cap::Credits`] flags the wallet
    /// short (the caller asks the pool for [`Wallet::want`]).
    pub fn admit(&mut self, now: Millis, in_use: u64, need: u64, cap: Cap) -> bool {
        let fits = self.allowance(cap).allows(in_use, need);
        if fits {
            self.last_used = now;
        } else if cap == Cap::Credits {
            self.ran_short = true;
        }
        fits
    }

    /// The wallet could not cover a request: others keep no headroom until the next round.
    pub fn flag_short(&mut self) {
        self.ran_short = true;
    }

    /// What to ask the pool for so `need` fits: enough for it and `headroom` more (0 when the
    /// credits cover it already).
    pub fn want(&self, in_use: u64, need: u64, headroom: u64) -> u64 {
        if in_use.saturating_add(need) <= self.credits {
            return 0;
        }
        (in_use + need + headroom).saturating_sub(self.credits)
    }

    /// Credits the pool granted.
    pub fn add(&mut self, granted: u64) {
        self.credits += granted;
    }

    /// A request used the wallet (admitted, grew, ended): it is not idle.
    pub fn touch(&mut self, now: Millis) {
        self.last_used = now;
    }

    /// The round: keep what is in use plus `headroom` (none when `others_short`), give the rest
    /// back; a wallet idle for a minute gives everything back. What is in use beyond the credits
    /// (a stream grew past them) is what the pool must record as held, without it becoming
    /// credits: as those requests end, the excess goes back instead of admitting new ones.
    pub fn round(
        &mut self,
        now: Millis,
        in_use: u64,
        headroom: u64,
        others_short: bool,
    ) -> RoundPlan {
        let ran_short = std::mem::take(&mut self.ran_short);
        let idle = in_use == 0 && now.0.saturating_sub(self.last_used.0) >= IDLE_RETURN_MS;
        let keep = if idle {
            0
        } else {
            in_use + if others_short { 0 } else { headroom }
        };
        self.credits = self.credits.min(keep);
        RoundPlan {
            holding: self.credits.max(in_use),
            ran_short,
        }
    }

    /// The round after one that did not reach the store: the credits stay as they are (the pool
    /// counts them as this router's until a rewrite reaches it), idle or not; what is in use
    /// beyond them is reported held, as in [`Wallet::round`].
    pub fn round_unreached(&mut self, in_use: u64) -> RoundPlan {
        RoundPlan {
            holding: self.credits.max(in_use),
            ran_short: std::mem::take(&mut self.ran_short),
        }
    }

    /// Holding nothing with nothing in use, unused for [`IDLE_RETURN_MS`]: a wallet that comes
    /// and goes with its users (a key's share) may be dropped.
    pub fn is_idle(&self, now: Millis, in_use: u64) -> bool {
        self.is_empty(in_use) && now.0.saturating_sub(self.last_used.0) >= IDLE_RETURN_MS
    }

    /// Holding nothing with nothing in use: the owner may drop it.
    pub fn is_empty(&self, in_use: u64) -> bool {
        self.credits == 0 && in_use == 0
    }

    /// The others gave this router up (or the store lost its data): what it believed it held is
    /// no longer its. What is in use stays in use; new admissions need new credits.
    pub fn forfeit(&mut self) {
        self.credits = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> Millis {
        Millis(seconds * 1000)
    }

    #[test]
    fn admits_within_the_credits_and_flags_a_shortfall() {
        let mut wallet = Wallet::new(at(0));
        wallet.add(100);
        assert!(wallet.admit(at(0), 0, 60, Cap::Credits));
        assert!(!wallet.admit(at(0), 60, 50, Cap::Credits));
        assert_eq!(wallet.want(60, 50, 20), 30);
        assert_eq!(wallet.want(60, 40, 20), 0, "covered already");
        wallet.add(30);
        assert!(wallet.admit(at(0), 60, 50, Cap::Credits));
        let plan = wallet.round(at(1), 110, 20, false);
        assert!(plan.ran_short);
        assert_eq!(plan.holding, 130, "in use 110 and 20 of headroom");
    }

    #[test]
    fn a_round_keeps_use_plus_headroom_and_none_when_others_ran_short() {
        let mut wallet = Wallet::new(at(0));
        wallet.add(100);
        assert!(wallet.admit(at(0), 0, 30, Cap::Credits));
        assert_eq!(wallet.round(at(1), 30, 20, false).holding, 50);
        assert_eq!(wallet.round(at(2), 30, 20, true).holding, 30);
        wallet.touch(at(3));
        assert_eq!(
            wallet.round(at(4), 0, 20, false).holding,
            20,
            "nothing in use: the headroom"
        );
    }

    #[test]
    fn streamed_growth_past_the_credits_is_held_and_never_becomes_credits() {
        let mut wallet = Wallet::new(at(0));
        wallet.add(10);
        assert!(wallet.admit(at(0), 0, 10, Cap::Credits));
        // The stream grew to 25 in use.
        assert_eq!(wallet.round(at(1), 25, 0, false).holding, 25);
        // The stream ends: the excess goes back, it does not admit others.
        assert!(!wallet.admit(at(2), 0, 11, Cap::Credits));
        assert_eq!(wallet.round(at(3), 0, 0, false).holding, 0);
    }

    #[test]
    fn an_idle_wallet_gives_everything_back() {
        let mut wallet = Wallet::new(at(0));
        wallet.add(40);
        assert!(wallet.admit(at(0), 0, 10, Cap::Credits));
        wallet.touch(at(1));
        assert_eq!(wallet.round(at(30), 0, 40, false).holding, 40);
        assert_eq!(wallet.round(at(61), 0, 40, false).holding, 0);
        assert!(wallet.is_empty(0));
    }

    #[test]
    fn with_the_store_unreachable_the_share_caps_the_credits() {
        let mut wallet = Wallet::new(at(0));
        wallet.add(80);
        let alone = Cap::Share { share: 50 };
        assert!(wallet.admit(at(0), 0, 40, alone));
        assert!(!wallet.admit(at(0), 40, 20, alone), "over the share");
        // One request larger than the share runs when nothing else is in use here.
        assert!(wallet.admit(at(0), 0, 70, alone));
        assert!(!wallet.admit(at(0), 70, 1, alone));
    }

    #[test]
    fn without_credits_nothing_is_admitted_alone_or_closed() {
        let mut wallet = Wallet::new(at(0));
        assert!(!wallet.admit(at(0), 0, 70, Cap::Share { share: 50 }));
        wallet.add(10);
        assert!(!wallet.admit(at(0), 0, 1, Cap::Closed));
    }

    #[test]
    fn rounds_that_cannot_reach_the_store_give_nothing_back() {
        let mut wallet = Wallet::new(at(0));
        wallet.add(6);
        // The last round that reached the store left 6; requests end during the outage, and
        // the rounds that follow keep the 6 (the pool still counts them as this router's).
        for second in 1..=120 {
            let plan = wallet.round_unreached(0);
            assert_eq!(plan.holding, 6, "second {second}");
        }
        assert_eq!(wallet.credits(), 6);
        assert!(wallet.allowance(Cap::Share { share: 4 }).allows(3, 1));
        assert!(!wallet.allowance(Cap::Share { share: 4 }).allows(4, 1));
        // Once a round reaches the store again, the usual rules apply: idle for a minute, all
        // goes back.
        assert_eq!(wallet.round(at(121), 0, 2, false).holding, 0);
    }
}
