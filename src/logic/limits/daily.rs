//! Tokens per UTC day (`tokens_per_day`): input and output combined, reset at midnight UTC.
//!
//! Rules (auth-yaml reference, "Token-budget enforcement"; seed, gate 5 "Daily token admission"):
//! - Before forwarding, the worst case `estimated input + declared maximum output` must fit the
//!   remaining budget; only the estimated input is charged ("This first check does not deduct
//!   the requested maximum output").
//! - After the response, the input charge is corrected to exact usage (seed, "One input
//!   estimate": the estimate is used for "daily input admission, and the later exact-usage
//!   correction") and the exact output is charged.
//! - A non-streaming completion that no longer fits is refused and its output is not charged;
//!   "the prompt-token deduction remains". A stream's output is charged even past the budget:
//!   it was already delivered.
//!
//! Midnight: a request belongs to the day it was admitted for its input, so its input true-up
//! applies only if that day is still current (after midnight the old day's total is gone, and
//! correcting the new day for input it never charged would hand out or take tokens that day never
//! saw). Its output is charged to the day it settles in, because that is when the tokens were
//! produced and delivered: a stream started at 23:59 does not get its output free.
//!
//! Restart (`HIVENET_ROUTER_QUOTA_BACKEND=badger`): the control core persists this router's local
//! total of each budget ([`DailyBudget::take_changed_total`] hands out a total only when it moved
//! since it was last handed out) and a restarted router adds the persisted total back with
//! [`DailyBudget::restore`]. A restored total counts as already reported (the disk holds it) and
//! is not usage to publish to other routers: it was published before the restart.

use super::share::{RoundAllowance, SILENCE_SHOWS_FROM_ROUND, Share};
use super::{Day, LIMIT_MAX};

#[derive(Debug, Clone)]
pub struct DailyBudget {
    tokens_per_day: u64,
    /// The UTC day the counters below belong to.
    day: Day,
    /// Tokens used on `day` by every router (this one plus remote usage applied).
    used_tokens: u64,
    /// Tokens this router charged on `day`: the running total the sync round writes to the store.
    local_tokens: u64,
    /// Net tokens charged here on `day` since the last `take_delta`.
    delta_tokens: i64,
    /// The `(day, local total)` last handed out by `take_changed_total` or restored: what the
    /// disk database holds for this budget. Starts at `(day, 0)`, as no record means zero.
    reported: (Day, u64),
    /// This round's part of what is left, while the routers of a site share the budget (input
    /// only: output is never refused by a share).
    round: RoundAllowance,
    /// What this router leaves to silent routers.
    silence: Silence,
}

/// What the live routers leave to silent ones (seed `run-several-routers.md`: they "leave it
/// its share of what was left of each daily budget"): the silent routers' part of what was left
/// when they went silent, kept while they stay silent and through an outage that follows.
///
/// Of what was left *then*, not of the whole limit, and not of what is left *now*. Of the whole
/// limit, a router that went silent late in the day stopped every other router at once (the
/// reserve was more than what was left). Of what is left now, the reserve shrank as the live
/// routers spent, so they spent the silent router's part too. And dropped in an outage, a router
/// alone split what it believed was left, which still held the silent router's unseen usage, by
/// the routers: it spent 8,276 tokens where its part was 4,367 (`sync::simulation`, seed 37).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Silence {
    /// Silent routers when the reserve was set.
    routers: u32,
    /// Their parts, summed; what is left now caps what it holds back.
    reserve: u64,
    /// This budget saw the site with no silent router today, from a round that could tell (a
    /// new run's first rounds cannot): it knows what was left when one went silent. One that did
    /// not (a router started since, a key first used since, a new day) cannot tell, and leaves
    /// the silent routers their part of the whole budget.
    witnessed: bool,
    /// This router's last outage, until the first round after it: what it knew was left when
    /// it began, and the routers it was split between. A router silent when the store answers
    /// again may have spent its part of that unseen, however much this router spent since.
    outage: Option<Outage>,
    /// What was left at the first admission of each of the last [`SILENCE_SHOWS_FROM_ROUND`]
    /// rounds (by round modulo their number; a round without one holds the round's before), and
    /// the latest round recorded. A router shows silent three rounds after its last record;
    /// alone since then, it spends its part of what was left then, not of what is left when the
    /// others can tell. Reserved from what was left when it showed, router-0 counted router-1's
    /// part 8,000 tokens short and spent 4,656 where nothing was left (`sync::simulation`, seed
    /// 979).
    recent: [u64; SILENCE_SHOWS_FROM_ROUND as usize],
    recent_round: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outage {
    since: u32,
    left: u64,
    routers: u32,
}

impl Silence {
    /// `left` at round `round`'s first admission ([`Silence::recent`]).
    fn record(&mut self, round: u32, left: u64) {
        const ROUNDS: u32 = SILENCE_SHOWS_FROM_ROUND;
        let slot = |round: u32| (round % ROUNDS) as usize;
        match self.recent_round {
            Some(last) if last == round => {}
            // The rounds between held what the last one did, at most.
            Some(last) if last < round && round - last < ROUNDS => {
                let before = self.recent[slot(last)];
                for between in last + 1..round {
                    self.recent[slot(between)] = before;
                }
                self.recent[slot(round)] = left;
            }
            // The first, a long gap, or a new run counting from its start.
            _ => self.recent = [left; ROUNDS as usize],
        }
        self.recent_round = Some(round);
    }

    /// The reserve under `share`, given what is `left` of a budget of `limit` now. A router
    /// that goes silent adds its part of what is left now; one that comes back (its held-back
    /// usage is counted now) takes its part of the reserve away.
    fn reserve(&mut self, share: Share, left: u64, limit: u64) -> u64 {
        let outage = match share {
            Share::Shared { .. } => self.outage.take(),
            _ => None,
        };
        if let Share::Shared { round, .. } = share {
            self.record(round, left);
        }
        // What was left when a router that shows silent now went silent, at most.
        let left_then = self.recent.iter().copied().fold(left, u64::max);
        match share {
            Share::Whole => *self = Silence::default(),
            Share::Shared {
                round, silent: 0, ..
            } => {
                // A new run sees every record fresh: a silent router shows only once it has
                // missed three heartbeats under this run's eyes.
                *self = Silence {
                    witnessed: self.witnessed || round >= SILENCE_SHOWS_FROM_ROUND,
                    recent: self.recent,
                    recent_round: self.recent_round,
                    ..Silence::default()
                };
            }
            Share::Shared { live, silent, .. } if silent != self.routers => {
                let routers = u128::from(live.max(1)) + u128::from(silent);
                let part_of = |tokens: u64, of: u32| {
                    (u128::from(tokens) * u128::from(of)).div_ceil(routers) as u64
                };
                self.reserve = if !self.witnessed {
                    part_of(limit, silent)
                } else if silent > self.routers {
                    // Silent since this router's outage: each may have spent its part of what
                    // was left when the outage began, where this router spent its own part
                    // (`sync::simulation`, seed 354: 229,843 tokens of a 225,699 budget).
                    let unseen = outage.map_or(0, |outage| {
                        (u128::from(outage.left) * u128::from(silent - self.routers))
                            .div_ceil(u128::from(outage.routers.max(1)))
                            as u64
                    });
                    self.reserve + part_of(left_then, silent - self.routers).max(unseen)
                } else {
                    (u128::from(self.reserve) * u128::from(silent))
                        .div_ceil(u128::from(self.routers)) as u64
                };
                self.routers = silent;
            }
            Share::Alone { since, routers } => {
                if self.outage.is_none_or(|outage| outage.since != since) {
                    self.outage = Some(Outage {
                        since,
                        left,
                        routers,
                    });
                }
            }
            Share::Shared { .. } => {}
        }
        // Kept whole, used up to what is left: capped as it was set, the part of two silent
        // routers was halved for the one left silent when the other came back, where its own
        // part was twice that (`sync::simulation`, seed 760: 4,371 tokens where 316 were left).
        self.reserve.min(left)
    }
}

/// What a daily admission charged: the estimated input, on `day`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailyAdmission {
    pub day: Day,
    pub input_tokens: u64,
}

/// A daily refusal: the budget and what is left of it (the `X-RateLimit-Remaining-Tokens` value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailyShortfall {
    pub limit: u64,
    pub remaining: u64,
    /// The refusal was because of the declared maximum output (the estimate alone would fit).
    pub because_of_max_output: bool,
}

/// After-response outcome of the daily budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailySettlement {
    /// The output fit what was left of the day's budget. A non-streaming response that does not
    /// fit is refused with `token_limit_exceeded` and `X-RateLimit-Remaining-Tokens: 0`.
    pub output_fit: bool,
    /// Output tokens charged (0 when a non-streaming output did not fit).
    pub output_tokens_charged: u64,
    /// Tokens left today after settling.
    pub remaining: u64,
}

impl DailyBudget {
    pub fn new(day: Day, tokens_per_day: u64) -> DailyBudget {
        DailyBudget {
            tokens_per_day: tokens_per_day.min(LIMIT_MAX),
            day,
            used_tokens: 0,
            local_tokens: 0,
            delta_tokens: 0,
            reported: (day, 0),
            round: RoundAllowance::NONE,
            silence: Silence::default(),
        }
    }

    pub fn limit(&self) -> u64 {
        self.tokens_per_day
    }

    /// Start a new day at zero when the UTC day has moved on. An earlier `day` (a caller whose
    /// clock stepped back) changes nothing: the budget never goes back to a previous day.
    fn roll(&mut self, day: Day) {
        if day > self.day {
            self.day = day;
            self.used_tokens = 0;
            self.local_tokens = 0;
            // Yesterday's unpublished usage no longer limits anyone.
            self.delta_tokens = 0;
            self.round.reset();
            // A new day: nothing of it is unseen yet.
            self.silence = Silence::default();
        }
    }

    /// Tokens left on `day`.
    pub fn remaining(&self, day: Day) -> u64 {
        if day > self.day {
            return self.tokens_per_day;
        }
        self.tokens_per_day.saturating_sub(self.used_tokens)
    }

    /// The day this budget counts (for the site's simulation): a router whose clock is behind
    /// counts on the day the others already reached.
    #[cfg(test)]
    pub fn day(&self) -> Day {
        self.day
    }

    /// Tokens used on `day` by every router.
    pub fn used(&self, day: Day) -> u64 {
        if day > self.day { 0 } else { self.used_tokens }
    }

    /// This router's running total for its current day (the per-router total the sync round
    /// writes, seed `run-several-routers.md`, "How it works", step 3).
    pub fn local_total(&self) -> (Day, u64) {
        (self.day, self.local_tokens)
    }

    fn charge(&mut self, tokens: u64) {
        self.used_tokens = self.used_tokens.saturating_add(tokens);
        self.local_tokens = self.local_tokens.saturating_add(tokens);
        self.delta_tokens += tokens as i64;
    }

    fn uncharge(&mut self, tokens: u64) {
        self.used_tokens = self.used_tokens.saturating_sub(tokens);
        self.local_tokens = self.local_tokens.saturating_sub(tokens);
        self.delta_tokens -= tokens as i64;
    }

    /// Admit a request whose worst case is `input_tokens + max_output_tokens`; charge the input.
    /// Refuses when the day's budget is spent, even for a request estimated at zero tokens.
    ///
    /// `share`: with other routers, the input estimate must also fit this router's part of what
    /// is left (`limits::share`); the declared output is checked against the whole budget only.
    pub fn admit(
        &mut self,
        day: Day,
        input_tokens: u64,
        max_output_tokens: Option<u64>,
        share: Share,
    ) -> Result<DailyAdmission, DailyShortfall> {
        self.roll(day);
        let input_tokens = input_tokens.min(LIMIT_MAX);
        let max_output_tokens = max_output_tokens.unwrap_or(0).min(LIMIT_MAX);
        let remaining = self.remaining(day);
        if remaining == 0 || input_tokens + max_output_tokens > remaining {
            return Err(DailyShortfall {
                limit: self.tokens_per_day,
                remaining,
                because_of_max_output: max_output_tokens > 0 && input_tokens <= remaining,
            });
        }
        let ours =
            remaining.saturating_sub(self.silence.reserve(share, remaining, self.tokens_per_day));
        let refused = |remaining| DailyShortfall {
            limit: self.tokens_per_day,
            remaining,
            because_of_max_output: false,
        };
        if ours == 0 || input_tokens > ours {
            return Err(refused(ours));
        }
        if let Some(split) = share.daily_split() {
            let need = input_tokens as i64;
            if let Err(left) = self.round.check(split, ours as i64, need, 0, 0, 0) {
                return Err(refused(left as u64));
            }
            self.round.take(need);
        }
        self.charge(input_tokens);
        Ok(DailyAdmission {
            day: self.day,
            input_tokens,
        })
    }

    /// Give back an admission's input charge: a later check refused the request before it was
    /// forwarded. A charge from a day that has ended is gone already.
    pub fn refund(&mut self, admission: DailyAdmission) {
        if admission.day == self.day {
            self.uncharge(admission.input_tokens);
            self.round.refund(admission.input_tokens as i64);
        }
    }

    /// Correct the input to exact usage and charge the output (see the module doc for midnight).
    /// `output_may_be_refused`: the response has not reached the client yet (non-streaming), so
    /// output that does not fit is refused instead of charged.
    pub fn settle(
        &mut self,
        day: Day,
        admission: DailyAdmission,
        exact_input_tokens: u64,
        exact_output_tokens: u64,
        output_may_be_refused: bool,
    ) -> DailySettlement {
        self.roll(day);
        // What this router charges beyond the admitted input counts against its part of what
        // is left too (`share::RoundAllowance`; seed `run-several-routers.md`: "Daily budgets
        // spend at most what was left at the outage's start divided by the routers"). Before,
        // only the input estimate did: cut off from the store, one router spent every token
        // left of a 900-token budget in output (issue 33: 798 where 290 was its part).
        if admission.day == self.day {
            let exact_input_tokens = exact_input_tokens.min(LIMIT_MAX);
            if exact_input_tokens >= admission.input_tokens {
                let more = exact_input_tokens - admission.input_tokens;
                self.charge(more);
                self.round.take(more as i64);
            } else {
                let less = admission.input_tokens - exact_input_tokens;
                self.uncharge(less);
                self.round.refund(less as i64);
            }
        }
        let exact_output_tokens = exact_output_tokens.min(LIMIT_MAX);
        let output_fit = exact_output_tokens <= self.remaining(day);
        let output_tokens_charged = if output_fit || !output_may_be_refused {
            self.charge(exact_output_tokens);
            self.round.take(exact_output_tokens as i64);
            exact_output_tokens
        } else {
            0
        };
        DailySettlement {
            output_fit,
            output_tokens_charged,
            remaining: if output_fit { self.remaining(day) } else { 0 },
        }
    }

    /// Take over `previous`'s totals after a reload ("usage and today's totals survive a
    /// reload"), under this budget's limit.
    pub fn inherit(&mut self, previous: &DailyBudget) {
        if previous.day >= self.day {
            self.day = previous.day;
            self.used_tokens = previous.used_tokens;
            self.local_tokens = previous.local_tokens;
            self.delta_tokens = previous.delta_tokens;
            self.reported = previous.reported;
            // A reload during an outage keeps today's usage and this router's share of it.
            self.round = previous.round;
            self.silence = previous.silence;
        }
    }

    /// Usage other routers charged on `day` (sync round). Usage for a day already over is
    /// ignored; usage for a later day starts that day here.
    pub fn apply_remote(&mut self, day: Day, tokens: u64) {
        self.roll(day);
        if day == self.day {
            self.used_tokens = self.used_tokens.saturating_add(tokens.min(LIMIT_MAX));
        }
    }

    /// What the other routers of the site charged on `day` in all, read from the store (seed
    /// `run-several-routers.md`, "How it works": a budget's total is the sum of the routers'
    /// running totals). Replaces what was known of them when it is more, so reading twice counts
    /// nothing twice; usage published after the read is added with
    /// [`DailyBudget::apply_remote`].
    ///
    /// Never less: a day's totals only grow, so a store that reads less lost data (restarted
    /// empty, or a replica promoted before it had the latest writes), and what this router holds
    /// in memory is the better count (seed, "Deploy Valkey": "After a total loss the routers
    /// rebuild from what they hold in memory"). Replaced by a smaller read, a budget reopened
    /// what a gone router had spent (`sync::simulation`, seed 8: 305,165 tokens of 300,000).
    pub fn set_others_total(&mut self, day: Day, tokens: u64) {
        self.roll(day);
        if day == self.day {
            let known = self.used_tokens.saturating_sub(self.local_tokens);
            self.used_tokens = self
                .local_tokens
                .saturating_add(known.max(tokens.min(LIMIT_MAX)));
        }
    }

    /// Net tokens charged here since the last call, with the day they belong to. A net refund
    /// is kept and offsets the next round.
    pub fn take_delta(&mut self) -> (Day, u64) {
        if self.delta_tokens <= 0 {
            return (self.day, 0);
        }
        let delta = self.delta_tokens as u64;
        self.delta_tokens = 0;
        (self.day, delta)
    }

    /// What the other routers charged on this budget's day, as this router counts them: what it
    /// remembers of them when the store has lost its data (`sync::round::daily_records`).
    pub fn others(&self) -> (Day, u64) {
        (self.day, self.used_tokens.saturating_sub(self.local_tokens))
    }

    /// This router's total, when it changed since the last call (or since it was restored): the
    /// value the disk database must hold for `day`. After midnight the new day's total is handed
    /// out once it is charged; a new day with nothing charged has nothing to write (no record
    /// means zero).
    pub fn take_changed_total(&mut self) -> Option<(Day, u64)> {
        let current = (self.day, self.local_tokens);
        if current == self.reported {
            return None;
        }
        let same_day = self.reported.0 == self.day;
        self.reported = current;
        (same_day || self.local_tokens > 0).then_some(current)
    }

    /// Hand the local total out again at the next [`DailyBudget::take_changed_total`], changed
    /// or not: the store that held it lost its data.
    pub fn mark_unreported(&mut self) {
        if self.local_tokens > 0 {
            self.reported = (self.day, u64::MAX);
        }
    }

    /// Add `tokens` this router charged on `day` before a restart (read back from the disk
    /// database). Counts against the budget and in the local total, but is no sync delta: other
    /// routers heard of it before the restart. A total for a day already over is ignored; one for
    /// a later day starts that day here.
    pub fn restore(&mut self, day: Day, tokens: u64) {
        self.roll(day);
        if day != self.day {
            return;
        }
        let tokens = tokens.min(LIMIT_MAX);
        self.used_tokens = self.used_tokens.saturating_add(tokens);
        self.local_tokens = self.local_tokens.saturating_add(tokens);
        let stored = if self.reported.0 == day {
            self.reported.1
        } else {
            0
        };
        self.reported = (day, stored.saturating_add(tokens));
    }

    /// Nothing to keep: the budget belongs to a past UTC day, or nothing was used today.
    pub fn is_idle(&self, day: Day) -> bool {
        day > self.day || self.used_tokens == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `router::sync::simulation` seed 8: the store restarted without its data and a router
    /// read the totals again; they said less than it knew, and its budget reopened.
    #[test]
    fn a_smaller_total_read_from_the_store_lowers_nothing() {
        let mut budget = DailyBudget::new(MONDAY, 1_000);
        budget.admit(MONDAY, 100, None, Share::Whole).expect("fits");
        budget.set_others_total(MONDAY, 600);
        assert_eq!(budget.used(MONDAY), 700);
        // The store lost its data: the others' totals read again are smaller.
        budget.set_others_total(MONDAY, 50);
        assert_eq!(budget.used(MONDAY), 700);
        // A larger read (usage published meanwhile) counts.
        budget.set_others_total(MONDAY, 650);
        assert_eq!(budget.used(MONDAY), 750);
    }
    use proptest::prelude::*;

    const MONDAY: Day = Day(20_000);
    const TUESDAY: Day = Day(20_001);

    /// Issue 33, the daily budget with the store down: three routers, 900 tokens a day, 102 spent
    /// before the outage. Cut off, one router admits requests of 14 input and 20 output tokens
    /// until refused: what it spends stays within its third of the 798 left (and one request's
    /// output past it). Before, only the input estimates counted against its third: it spent
    /// all 798.
    #[test]
    fn cut_off_a_router_spends_its_part_of_what_was_left_output_included() {
        let mut budget = DailyBudget::new(MONDAY, 900);
        let before = budget.admit(MONDAY, 102, None, Share::Whole).unwrap();
        budget.settle(MONDAY, before, 102, 0, false);
        let alone = Share::Alone {
            since: 40,
            routers: 3,
        };
        let mut spent = 0;
        while let Ok(admission) = budget.admit(MONDAY, 14, None, alone) {
            let settled = budget.settle(MONDAY, admission, 14, 20, false);
            spent += 14 + settled.output_tokens_charged;
            assert!(spent < 798, "spent everything left");
        }
        let part = (900 - 102) / 3;
        assert!(spent >= part - 34, "spent {spent}, its part is {part}");
        assert!(spent <= part + 20, "spent {spent}, its part is {part}");
        // A new round of a shared store starts a new allowance from what is left.
        let shared = Share::Shared {
            round: 41,
            live: 3,
            silent: 0,
        };
        assert!(budget.admit(MONDAY, 14, None, shared).is_ok());
    }

    /// Seed 354 of `sync::simulation`: the store answered too late for a while, each of three
    /// routers spent its third of the 9,000 left alone, and two of them went silent during it
    /// (one crashed, one shut down before its last round could publish). Back with the store,
    /// this router left the silent ones their part of what it believed was left, after its own
    /// third: 4,000 of 6,000, where each had spent up to 3,000 unseen. It now leaves them their
    /// part of what was left when the outage began.
    #[test]
    fn routers_silent_after_an_outage_keep_what_they_could_spend_in_it() {
        let mut budget = DailyBudget::new(MONDAY, 100_000);
        let everyone = |round| Share::Shared {
            round,
            live: 3,
            silent: 0,
        };
        assert!(budget.admit(MONDAY, 0, None, everyone(49)).is_ok());
        budget.apply_remote(MONDAY, 91_000);
        let alone = Share::Alone {
            since: 50,
            routers: 3,
        };
        let mut spent = 0;
        while budget.admit(MONDAY, 100, None, alone).is_ok() {
            spent += 100;
        }
        assert_eq!(spent, 3_000, "its third of the 9,000 left");
        let back = Share::Shared {
            round: 51,
            live: 1,
            silent: 2,
        };
        // 6,000 left as it knows; the silent two may have spent all of it.
        assert!(budget.admit(MONDAY, 100, None, back).is_err());
        // They come back and publish what they spent: 2,000 of their 6,000 were left.
        budget.apply_remote(MONDAY, 4_000);
        assert!(budget.admit(MONDAY, 100, None, everyone(52)).is_ok());
    }

    /// Seed 979 of `sync::simulation`: router-1 wrote its last record at round 7, with 30,000
    /// left, and spends its part of that alone; the others can tell only at round 10, when they
    /// have spent 9,000 more. Its part is of the 30,000, not of the 21,000.
    #[test]
    fn a_router_that_shows_silent_late_keeps_its_part_of_what_was_left_at_its_last_record() {
        let live = |round| Share::Shared {
            round,
            live: 3,
            silent: 0,
        };
        let mut budget = DailyBudget::new(MONDAY, 100_000);
        budget.apply_remote(MONDAY, 70_000);
        assert!(budget.admit(MONDAY, 0, None, live(7)).is_ok());
        for round in 8..10 {
            budget.apply_remote(MONDAY, 4_500);
            assert!(budget.admit(MONDAY, 0, None, live(round)).is_ok());
        }
        let silent = Share::Shared {
            round: 10,
            live: 2,
            silent: 1,
        };
        let mut spent = 0;
        while budget.admit(MONDAY, 100, None, silent).is_ok() {
            spent += 100;
        }
        // 21,000 left, 10,000 of it router-1's; the round's part of the rest is half.
        assert_eq!(spent, (21_000 - 10_000) / 2);
        // Past the four rounds, a new silence is reckoned from later rounds.
        let mut budget = DailyBudget::new(MONDAY, 100_000);
        budget.apply_remote(MONDAY, 70_000);
        assert!(budget.admit(MONDAY, 0, None, live(7)).is_ok());
        budget.apply_remote(MONDAY, 9_000);
        assert!(budget.admit(MONDAY, 0, None, live(11)).is_ok());
        let silent = Share::Shared {
            round: 12,
            live: 2,
            silent: 1,
        };
        let mut spent = 0;
        while budget.admit(MONDAY, 100, None, silent).is_ok() {
            spent += 100;
        }
        assert_eq!(spent, (21_000 - 7_000) / 2);
    }

    /// Seed 760 of `sync::simulation`: both other routers show silent with 12,000 left, a part
    /// of 4,000 each that the 3,000 left now cannot hold; one comes back. The one still silent
    /// keeps its whole part, not half of what was held back for both.
    #[test]
    fn a_silent_router_keeps_its_whole_part_when_another_comes_back() {
        let shared = |round, live, silent| Share::Shared {
            round,
            live,
            silent,
        };
        let mut budget = DailyBudget::new(MONDAY, 100_000);
        budget.apply_remote(MONDAY, 88_000);
        assert!(budget.admit(MONDAY, 0, None, shared(7, 3, 0)).is_ok());
        budget.apply_remote(MONDAY, 9_000);
        assert!(budget.admit(MONDAY, 100, None, shared(8, 1, 2)).is_err());
        // Router-2 is back, its usage counted: 2,000 left, 4,000 of it still router-1's.
        budget.apply_remote(MONDAY, 1_000);
        assert!(budget.admit(MONDAY, 100, None, shared(9, 2, 1)).is_err());
        // Past what router-1 may spend, the rest is the live routers'.
        let mut budget = DailyBudget::new(MONDAY, 100_000);
        budget.apply_remote(MONDAY, 70_000);
        assert!(budget.admit(MONDAY, 0, None, shared(7, 3, 0)).is_ok());
        budget.apply_remote(MONDAY, 9_000);
        assert!(budget.admit(MONDAY, 0, None, shared(8, 1, 2)).is_ok());
        // 21,000 left less router-1's 10,000; the round's part is half.
        let mut spent = 0;
        while budget.admit(MONDAY, 100, None, shared(9, 2, 1)).is_ok() {
            spent += 100;
        }
        assert_eq!(spent, (21_000 - 10_000) / 2);
    }

    /// Seed 37 of `sync::simulation`: router-2 went silent with about 36,000 tokens left, the
    /// others stopped admitting at once (the reserve was a third of the whole 135,486), then
    /// the store went down and router-1 alone split what it believed was left, router-2's
    /// unseen usage included, by three: 8,276 tokens where its part was 4,367.
    #[test]
    fn silent_routers_keep_their_part_of_what_was_left_when_they_went_silent() {
        let shared = |round| Share::Shared {
            round,
            live: 3,
            silent: 0,
        };
        let silent = |round| Share::Shared {
            round,
            live: 2,
            silent: 1,
        };
        let mut budget = DailyBudget::new(MONDAY, 135_000);
        // A run's first rounds see every record fresh: they witness nothing.
        assert!(budget.admit(MONDAY, 0, None, shared(1)).is_ok());
        budget.apply_remote(MONDAY, 99_000);
        assert!(budget.admit(MONDAY, 100, None, shared(1)).is_ok());
        assert!(budget.admit(MONDAY, 100, None, silent(2)).is_err());
        let mut budget = DailyBudget::new(MONDAY, 135_000);
        budget.apply_remote(MONDAY, 99_000);
        assert!(budget.admit(MONDAY, 0, None, shared(9)).is_ok());
        // 36,000 left: 12,000 of it is the silent router's; the live ones use the rest.
        let mut spent = 0;
        for round in 10..30 {
            while budget.admit(MONDAY, 100, None, silent(round)).is_ok() {
                spent += 100;
            }
        }
        assert!(
            (23_900..=24_000).contains(&spent),
            "the live routers may use 24,000 of the 36,000 left, this one spent {spent}"
        );
        assert!(
            budget.admit(MONDAY, 100, None, silent(30)).is_err(),
            "the reserve does not shrink as the live routers spend"
        );
        // The store goes down: alone, this router splits what is left less the reserve.
        let mut budget = DailyBudget::new(MONDAY, 135_000);
        budget.apply_remote(MONDAY, 99_000);
        assert!(budget.admit(MONDAY, 0, None, shared(9)).is_ok());
        assert!(budget.admit(MONDAY, 100, None, silent(10)).is_ok());
        let alone = Share::Alone {
            since: 11,
            routers: 3,
        };
        let mut alone_spent = 0;
        while budget.admit(MONDAY, 100, None, alone).is_ok() {
            alone_spent += 100;
        }
        let part = (36_000 - 100 - 12_000) / 3;
        assert!(
            alone_spent <= part + 100 && alone_spent + 100 >= part,
            "alone it spent {alone_spent}, its part is {part}"
        );
        // The silent router comes back and its usage is counted: nothing is left to it.
        budget.apply_remote(MONDAY, 5_000);
        let back = Share::Shared {
            round: 12,
            live: 3,
            silent: 0,
        };
        let left = budget.remaining(MONDAY);
        let mut shared_spent = 0;
        while budget.admit(MONDAY, 100, None, back).is_ok() {
            shared_spent += 100;
        }
        assert!(
            shared_spent + 100 >= left / 3,
            "back to three live routers, the round's part is a third of the {left} left: {shared_spent}"
        );
        // A budget that did not see the router go silent (its router started since) cannot
        // tell what was left then: it leaves the silent router its part of the whole budget.
        let mut budget = DailyBudget::new(MONDAY, 135_000);
        budget.apply_remote(MONDAY, 99_000);
        assert!(budget.admit(MONDAY, 100, None, silent(10)).is_err());
        let mut budget = DailyBudget::new(MONDAY, 135_000);
        budget.apply_remote(MONDAY, 50_000);
        let mut unwitnessed = 0;
        while budget.admit(MONDAY, 100, None, silent(10)).is_ok() {
            unwitnessed += 100;
        }
        // 85,000 left less a third of the whole 135,000, split between the two live routers.
        let part = (85_000 - 45_000) / 2;
        assert!(
            (part - 100..=part).contains(&unwitnessed),
            "the round's part is {part}, this router spent {unwitnessed}"
        );
    }

    #[test]
    fn worst_case_must_fit_but_only_input_is_charged() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        let admission = budget.admit(MONDAY, 300, Some(700), Share::Whole).unwrap();
        assert_eq!(admission.input_tokens, 300);
        assert_eq!(budget.remaining(MONDAY), 700);
        let refused = budget
            .admit(MONDAY, 300, Some(500), Share::Whole)
            .unwrap_err();
        assert_eq!(refused.remaining, 700);
        assert!(refused.because_of_max_output);
        let refused = budget.admit(MONDAY, 800, None, Share::Whole).unwrap_err();
        assert!(!refused.because_of_max_output);
    }

    #[test]
    fn exactly_at_the_limit_and_spent() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        budget.admit(MONDAY, 600, Some(400), Share::Whole).unwrap();
        budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
        assert_eq!(budget.remaining(MONDAY), 0);
        let refused = budget.admit(MONDAY, 0, None, Share::Whole).unwrap_err();
        assert_eq!((refused.limit, refused.remaining), (1000, 0));
    }

    #[test]
    fn true_up_adds_or_refunds_and_output_is_deducted() {
        let mut budget = DailyBudget::new(MONDAY, 10_000);
        let admission = budget.admit(MONDAY, 500, None, Share::Whole).unwrap();
        let settled = budget.settle(MONDAY, admission, 450, 200, false);
        assert_eq!(budget.used(MONDAY), 650);
        assert_eq!(settled.remaining, 9_350);
        let admission = budget.admit(MONDAY, 500, None, Share::Whole).unwrap();
        budget.settle(MONDAY, admission, 700, 0, false);
        assert_eq!(budget.used(MONDAY), 1_350);
    }

    #[test]
    fn buffered_output_that_does_not_fit_is_refused_not_charged() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        let admission = budget.admit(MONDAY, 900, None, Share::Whole).unwrap();
        let settled = budget.settle(MONDAY, admission, 900, 200, true);
        assert!(!settled.output_fit);
        assert_eq!(settled.output_tokens_charged, 0);
        assert_eq!(settled.remaining, 0);
        // The prompt deduction remains.
        assert_eq!(budget.used(MONDAY), 900);
    }

    #[test]
    fn streamed_output_past_the_budget_is_still_charged() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        let admission = budget.admit(MONDAY, 900, None, Share::Whole).unwrap();
        let settled = budget.settle(MONDAY, admission, 900, 200, false);
        assert!(!settled.output_fit);
        assert_eq!(settled.output_tokens_charged, 200);
        assert_eq!(budget.used(MONDAY), 1100);
        assert_eq!(budget.remaining(MONDAY), 0);
        assert!(budget.admit(MONDAY, 1, None, Share::Whole).is_err());
    }

    #[test]
    fn resets_at_utc_midnight() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        budget.admit(MONDAY, 1000, None, Share::Whole).unwrap();
        assert!(budget.admit(MONDAY, 1, None, Share::Whole).is_err());
        assert!(!budget.is_idle(MONDAY));
        assert!(budget.is_idle(TUESDAY));
        assert_eq!(budget.remaining(TUESDAY), 1000);
        budget.admit(TUESDAY, 1000, None, Share::Whole).unwrap();
        // A clock stepping back does not reopen Monday.
        assert!(budget.admit(MONDAY, 1, None, Share::Whole).is_err());
    }

    #[test]
    fn admitted_before_midnight_settled_after() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        let admission = budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
        // Settles on Tuesday: Monday's input correction is dropped with Monday's total, the
        // output is charged to Tuesday, when it was delivered.
        let settled = budget.settle(TUESDAY, admission, 10, 300, false);
        assert!(settled.output_fit);
        assert_eq!(budget.used(TUESDAY), 300);
        assert_eq!(budget.local_total(), (TUESDAY, 300));
        // A refund of Monday's charge does not give Tuesday free tokens.
        budget.refund(admission);
        assert_eq!(budget.used(TUESDAY), 300);
    }

    #[test]
    fn refund_returns_the_input_charge() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        let admission = budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
        budget.refund(admission);
        assert_eq!(budget.used(MONDAY), 0);
        assert_eq!(budget.take_delta(), (MONDAY, 0));
    }

    #[test]
    fn local_plus_remote_usage_respects_the_budget() {
        let mut router_a = DailyBudget::new(MONDAY, 1000);
        let mut router_b = DailyBudget::new(MONDAY, 1000);
        let mut admitted = 0;
        for _round in 0..100 {
            for _ in 0..3 {
                admitted += router_a
                    .admit(MONDAY, 10, None, Share::Whole)
                    .map_or(0, |a| a.input_tokens);
                admitted += router_b
                    .admit(MONDAY, 10, None, Share::Whole)
                    .map_or(0, |a| a.input_tokens);
            }
            let (day_a, delta_a) = router_a.take_delta();
            let (day_b, delta_b) = router_b.take_delta();
            router_a.apply_remote(day_b, delta_b);
            router_b.apply_remote(day_a, delta_a);
        }
        // Over by at most what both routers admitted in one round before hearing of each other
        // (seed `run-several-routers.md`: "within one sync interval of usage").
        assert!((1000..=1060).contains(&admitted), "admitted {admitted}");
        assert_eq!(router_a.remaining(MONDAY), 0);
        assert_eq!(router_b.remaining(MONDAY), 0);
        // Yesterday's remote usage is ignored once the day has moved on.
        router_a.apply_remote(TUESDAY, 5);
        router_a.apply_remote(MONDAY, 500);
        assert_eq!(router_a.used(TUESDAY), 5);
    }

    #[test]
    fn changed_total_is_handed_out_once_per_change() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        assert_eq!(budget.take_changed_total(), None, "nothing charged yet");
        let admission = budget.admit(MONDAY, 300, None, Share::Whole).unwrap();
        assert_eq!(budget.take_changed_total(), Some((MONDAY, 300)));
        assert_eq!(budget.take_changed_total(), None);
        budget.settle(MONDAY, admission, 250, 100, false);
        // The sync delta is independent of what was reported to disk.
        assert_eq!(budget.take_delta(), (MONDAY, 350));
        assert_eq!(budget.take_changed_total(), Some((MONDAY, 350)));
        // A refund back to zero is a change too: the disk must not keep the old total.
        let admission = budget.admit(MONDAY, 50, None, Share::Whole).unwrap();
        budget.refund(admission);
        assert_eq!(
            budget.take_changed_total(),
            None,
            "back where it was reported"
        );
        let mut refunded = DailyBudget::new(MONDAY, 1000);
        let admission = refunded.admit(MONDAY, 50, None, Share::Whole).unwrap();
        assert_eq!(refunded.take_changed_total(), Some((MONDAY, 50)));
        refunded.refund(admission);
        assert_eq!(refunded.take_changed_total(), Some((MONDAY, 0)));
    }

    #[test]
    fn changed_total_across_midnight() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        budget.admit(MONDAY, 400, None, Share::Whole).unwrap();
        assert_eq!(budget.take_changed_total(), Some((MONDAY, 400)));
        budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
        // Midnight passes before Monday's last change was handed out: Tuesday has nothing to
        // write until it is charged (Monday's final total is no longer needed by anyone).
        assert_eq!(budget.remaining(TUESDAY), 1000);
        budget.admit(TUESDAY, 0, None, Share::Whole).unwrap();
        assert_eq!(budget.take_changed_total(), None);
        budget.admit(TUESDAY, 70, None, Share::Whole).unwrap();
        assert_eq!(budget.take_changed_total(), Some((TUESDAY, 70)));
        assert_eq!(budget.take_changed_total(), None);
    }

    #[test]
    fn restore_counts_against_today_without_a_sync_delta() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        budget.restore(MONDAY, 600);
        assert_eq!(budget.used(MONDAY), 600);
        assert_eq!(budget.remaining(MONDAY), 400);
        assert_eq!(budget.local_total(), (MONDAY, 600));
        assert_eq!(
            budget.take_delta(),
            (MONDAY, 0),
            "published before the restart"
        );
        assert_eq!(
            budget.take_changed_total(),
            None,
            "the disk holds it already"
        );
        budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
        assert_eq!(budget.take_changed_total(), Some((MONDAY, 700)));
        assert_eq!(budget.take_delta(), (MONDAY, 100));
        let refused = budget.admit(MONDAY, 301, None, Share::Whole).unwrap_err();
        assert_eq!(refused.remaining, 300);
    }

    #[test]
    fn restore_for_a_past_day_is_ignored() {
        let mut budget = DailyBudget::new(TUESDAY, 1000);
        budget.restore(MONDAY, 600);
        assert_eq!(budget.used(TUESDAY), 0);
        assert_eq!(budget.take_changed_total(), None);
        // A total for a later day starts that day.
        let mut budget = DailyBudget::new(MONDAY, 1000);
        budget.admit(MONDAY, 10, None, Share::Whole).unwrap();
        budget.restore(TUESDAY, 600);
        assert_eq!(budget.used(TUESDAY), 600);
        assert_eq!(budget.take_changed_total(), None);
    }

    #[test]
    fn reload_keeps_what_was_reported() {
        let mut budget = DailyBudget::new(MONDAY, 1000);
        budget.admit(MONDAY, 100, None, Share::Whole).unwrap();
        assert_eq!(budget.take_changed_total(), Some((MONDAY, 100)));
        let mut reloaded = DailyBudget::new(MONDAY, 2000);
        reloaded.inherit(&budget);
        assert_eq!(reloaded.take_changed_total(), None);
    }

    proptest! {
        /// Within one day, the total after every request has settled equals exact usage.
        #[test]
        fn totals_after_settle_equal_exact_usage(
            requests in proptest::collection::vec(
                (0u64..5_000, 0u64..5_000, 0u64..5_000, proptest::option::of(0u64..5_000)),
                1..100,
            ),
        ) {
            let mut budget = DailyBudget::new(MONDAY, LIMIT_MAX);
            let mut exact_total = 0u64;
            for (estimate, exact_input, exact_output, max_output) in requests {
                let admission = budget.admit(MONDAY, estimate, max_output, Share::Whole).unwrap();
                budget.settle(MONDAY, admission, exact_input, exact_output, false);
                exact_total += exact_input + exact_output;
            }
            prop_assert_eq!(budget.used(MONDAY), exact_total);
            prop_assert_eq!(budget.take_delta(), (MONDAY, exact_total));
        }

        /// Admission never lets today's charged input pass the budget.
        #[test]
        fn admitted_input_never_exceeds_budget(
            limit in 1u64..100_000,
            estimates in proptest::collection::vec(0u64..10_000, 1..100),
        ) {
            let mut budget = DailyBudget::new(MONDAY, limit);
            for estimate in estimates {
                let _ = budget.admit(MONDAY, estimate, None, Share::Whole);
                prop_assert!(budget.used(MONDAY) <= limit);
            }
        }
    }
}
