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

use super::share::{NOT_REACHED_YET, RoundAllowance, SILENCE_SHOWS_FROM_ROUND, Share};
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
    /// The least of those parts, at most: a router that comes back takes this much of the
    /// reserve away, whichever it is (parts differ: each is of what was left when its router went
    /// silent). Halved for one of two, the reserve fell 5,694 tokens short of the part of the
    /// router still silent, set 12 s before the other's, and the live routers could spend them
    /// (`sync::simulation`, seed 3,590).
    least_part: u64,
    /// This budget saw the site with no silent router today, from a round that could tell (a
    /// new run's first rounds cannot): it knows what was left when one went silent. One that did
    /// not (a router started since, a key first used since, a new day) cannot tell, and leaves
    /// the silent routers their part of the whole budget.
    witnessed: bool,
    /// This router's last outage, until the first round after it: what it knew was left when
    /// it began, and the routers it was split between. A router silent when the store answers
    /// again may have spent its part of that unseen, however much this router spent since.
    outage: Option<Outage>,
    /// What was left at the first admission of each of the last [`RECENT_ROUNDS`] rounds (by
    /// round modulo their number; a round without one holds the round's before), and the latest
    /// round recorded. A router shows silent four rounds after the round that read its last
    /// record; alone since then, it spends its part of what was left then, not of what is left
    /// when the others can tell. Reserved from what was left when it showed, router-0 counted
    /// router-1's part 8,000 tokens short and spent 4,656 where nothing was left
    /// (`sync::simulation`, seed 979).
    recent: [u64; RECENT_ROUNDS as usize],
    recent_round: Option<u32>,
    /// The late routers' part of what was left at their last record (`Share::Shared`'s `late`),
    /// set at each round the store answers and kept through an outage that follows. Apart from
    /// `reserve`: a late router is on time again or shows silent within three rounds, and
    /// folded into the silent routers' parts, one back on time took a share of an older silent
    /// router's part away with it.
    late: u64,
}

/// The rounds [`Silence::recent`] keeps: the five from the one that read a router's last record
/// to the one it shows silent in, and the two before. The view it spends its part of was read
/// before this router's round that read the record, by a round that published everything this
/// router had published at its round before: what it saw left is at most what was left then.
/// And where the reply of its last round was lost (the record written, the view not read), its
/// view is a round older still. What was left at the round that read the record is less by what
/// the routers used meanwhile: kept from five rounds, router-0's part came short and the site
/// spent past its day's budget (`sync::simulation`, seeds 965, 3,907 and 8,940, by 37 to 184
/// tokens).
const RECENT_ROUNDS: u32 = SILENCE_SHOWS_FROM_ROUND + 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outage {
    since: u32,
    left: u64,
    routers: u32,
}

impl Silence {
    /// `left` at round `round`'s first admission ([`Silence::recent`]).
    fn record(&mut self, round: u32, left: u64) {
        const ROUNDS: u32 = RECENT_ROUNDS;
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
        // Alone before this run could tell a silent router: what every other router may hold.
        let mut unseen_others = 0;
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
                let routers = live.max(1).saturating_add(silent);
                let part_of = |tokens: u64, of: u32| parts(tokens, of, routers);
                if !self.witnessed {
                    self.reserve = part_of(limit, silent);
                    self.least_part = part_of(limit, 1);
                } else if silent > self.routers {
                    // Silent since this router's outage: each may have spent its part of what
                    // was left when the outage began, where this router spent its own part
                    // (`sync::simulation`, seed 354: 229,843 tokens of a 225,699 budget).
                    let new = silent - self.routers;
                    let unseen = outage.map_or(0, |outage| parts(outage.left, new, outage.routers));
                    let added = part_of(left_then, new).max(unseen);
                    let each = added / u64::from(new);
                    self.least_part = if self.routers == 0 {
                        each
                    } else {
                        self.least_part.min(each)
                    };
                    self.reserve += added;
                } else {
                    let back = u64::from(self.routers - silent);
                    self.reserve = self
                        .reserve
                        .saturating_sub(self.least_part.saturating_mul(back));
                }
                self.routers = silent;
            }
            Share::Alone { since, routers, .. } => {
                if self.outage.is_none_or(|outage| outage.since != since) {
                    self.outage = Some(Outage {
                        since,
                        left,
                        routers,
                    });
                }
                // A run whose rounds could not tell a silent router yet took every record for
                // live: any other router may have been alone since before this run started,
                // spending its part of what was left then, unseen. Alone, it leaves each its
                // part of the whole budget, as it does a silent router it did not see go silent
                // (router-1's new run, alone after two rounds, took two routers alone for
                // seconds for live and spent its part of what it believed was left, their
                // unseen usage included: `sync::simulation`, seed 710). A run that never reached
                // the store has no view to split at all. The run's rounds tell, not this
                // budget's: a key first used at an early round, next at the outage, is as sure of
                // the site as its router.
                if since > NOT_REACHED_YET && since < SILENCE_SHOWS_FROM_ROUND {
                    unseen_others = parts(limit, routers.saturating_sub(1), routers);
                }
            }
            Share::Shared { .. } => {}
        }
        // A late router may have been cut off just after its last record, within the last
        // rounds, and spend its part of what was left then unseen (`Share::for_daily`). Through
        // an outage, the routers late at the last round the store answered: a router late at
        // this budget's last admission minutes before, on time since, has published what it
        // spent (kept, router 0 of `tests/shared_limits.rs` spent 187 tokens of its 289 alone).
        let then = if self.witnessed { left_then } else { limit };
        match share {
            Share::Shared {
                live, silent, late, ..
            } => self.late = parts(then, late, live.max(1).saturating_add(silent)),
            Share::Alone { routers, late, .. } => self.late = parts(then, late, routers),
            Share::Whole => {}
        }
        // A live router whose totals this router has not read whole since the store lost its
        // data (`sync::whole`): what this router counts of it may be short by all it published
        // while this router was cut off. While the store answers, it is left its part of the
        // whole budget until its totals are read, a round or two. Alone, nothing bounds what
        // this router does not know: it spends none of the budget, as when it cannot read a
        // total (router-0 of `sync::simulation`'s seed 102,286 spent 3,588 tokens where 324
        // were left).
        let unread = match share {
            Share::Shared {
                live,
                silent,
                unread,
                ..
            } => parts(limit, unread, live.max(1).saturating_add(silent)),
            Share::Alone { unread, .. } if unread > 0 => left,
            _ => 0,
        };
        // Kept whole, used up to what is left: capped as it was set, the part of two silent
        // routers was halved for the one left silent when the other came back, where its own
        // part was twice that (`sync::simulation`, seed 760: 4,371 tokens where 316 were left).
        self.reserve
            .saturating_add(self.late)
            .max(unseen_others)
            .max(unread)
            .min(left)
    }
}

/// `of` routers' part of `tokens` split between `among` (at least one), rounded up: a part held
/// back for other routers errs on the side of the limit.
fn parts(tokens: u64, of: u32, among: u32) -> u64 {
    (u128::from(tokens) * u128::from(of))
        .div_ceil(u128::from(among.max(1)))
        .min(u128::from(u64::MAX)) as u64
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
        (self.day, self.published_total())
    }

    /// What this router has told the site it charged today: its own usage, and a net refund
    /// not offset yet ([`DailyBudget::take_delta`] never publishes one as negative usage).
    ///
    /// The others count this router by its published usage; its total in the store must say
    /// the same. Written as the lower usage, a total read after the store lost its data, beside
    /// another router's memory of this one (which holds the refund), made every reader count
    /// the refund as the others' usage: one to ten tokens counted twice for the rest of the day
    /// (`sync::simulation`, seeds 25,383, 57,964 and others of the long mode). The refund is
    /// offset against this router's next usage, in its published usage and in its total alike.
    fn published_total(&self) -> u64 {
        self.local_tokens
            .saturating_add(self.delta_tokens.min(0).unsigned_abs())
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
        let ours = remaining.saturating_sub(self.silence.reserve(
            share.unlisted_as_silent(),
            remaining,
            self.tokens_per_day,
        ));
        let refused = |remaining| DailyShortfall {
            limit: self.tokens_per_day,
            remaining,
            because_of_max_output: false,
        };
        if ours == 0 || input_tokens > ours {
            return Err(refused(ours));
        }
        if let Some(split) = share.for_daily().daily_split() {
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
    /// remembers of them when the store has lost its data (`sync::daily_fields::daily_records`).
    pub fn others(&self) -> (Day, u64) {
        (self.day, self.used_tokens.saturating_sub(self.local_tokens))
    }

    /// This router's total as published ([`DailyBudget::local_total`]), when it changed since
    /// the last call (or since it was restored): the value the disk database must hold for
    /// `day`. After midnight the new day's total is handed out once it is charged; a new day with
    /// nothing charged has nothing to write (no record means zero).
    pub fn take_changed_total(&mut self) -> Option<(Day, u64)> {
        let current = (self.day, self.published_total());
        if current == self.reported {
            return None;
        }
        let same_day = self.reported.0 == self.day;
        self.reported = current;
        (same_day || current.1 > 0).then_some(current)
    }

    /// Hand the local total out again at the next [`DailyBudget::take_changed_total`], changed
    /// or not: the store that held it lost its data.
    pub fn mark_unreported(&mut self) {
        if self.published_total() > 0 {
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
mod tests;
