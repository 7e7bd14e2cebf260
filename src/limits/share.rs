//! This router's part of a limit the routers of a site enforce together (seed
//! `run-several-routers.md`, "How it works" and "When the store is unreachable").
//!
//! Every router keeps each key's buckets in memory and subtracts the usage the others publish
//! once per sync round. Between two rounds it cannot see the others, so it admits at most its
//! share: what was left at the round divided by the live routers. The sync core decides which
//! [`Share`] applies (store up or not, live and silent routers) and the owner shards pass it to
//! every admission; the buckets apply it.
//!
//! Pure: no clock, no I/O. Output tokens are never refused by a share (they are charged after the
//! response); only input-side admissions (a request, an input estimate) take one.

/// How much of a site-wide limit this router may admit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Share {
    /// No other router counts (no shared store): the whole limit.
    #[default]
    Whole,
    /// The store answers. Between two rounds, at most what was left at the round divided by
    /// `live` (this router included); the first admission of a round passes whenever the limit
    /// has room. `silent` routers stopped heartbeating without leaving: they may still spend their
    /// share unseen, so the live routers use `live / (live + silent)` of each rate limit and leave
    /// `silent / (live + silent)` of each daily budget untouched.
    Shared { round: u32, live: u32, silent: u32 },
    /// The store has been unreachable for three sync intervals, or has not answered yet: this
    /// router alone enforces `limit / routers` of each rate limit, and of each daily budget at
    /// most what was left when it lost the store divided by `routers` (counted from the round
    /// `since`, when the outage began).
    Alone { since: u32, routers: u32 },
}

impl Share {
    /// The fraction of a rate limit's capacity and refill this router's view may use, as
    /// (numerator, denominator); (1, 1) for the whole limit.
    pub fn rate_scale(self) -> (u64, u64) {
        match self {
            Share::Whole => (1, 1),
            Share::Shared { live, silent, .. } => {
                let live = u64::from(live.max(1));
                (live, live + u64::from(silent))
            }
            Share::Alone { routers, .. } => (1, u64::from(routers.max(1))),
        }
    }

    /// The per-round split: (round, divisor), or `None` when nothing is split between rounds.
    /// A rate limit is split only while the store answers (alone, its refill is scaled instead);
    /// a daily budget is split in both cases, and alone the "round" is the start of the outage.
    pub fn rate_round(self) -> Option<(u32, u64)> {
        match self {
            Share::Shared { round, live, .. } if live > 1 => Some((round, u64::from(live))),
            _ => None,
        }
    }

    /// See [`Share::rate_round`]: (round, divisor) for a daily budget.
    pub fn daily_round(self) -> Option<(u32, u64)> {
        match self {
            Share::Whole => None,
            Share::Shared { round, live, .. } => (live > 1).then_some((round, u64::from(live))),
            Share::Alone { since, routers } => (routers > 1).then_some((since, u64::from(routers))),
        }
    }

    /// Of a daily budget of `limit`, what the live routers leave to silent ones.
    pub fn daily_reserve(self, limit: u64) -> u64 {
        match self {
            Share::Shared { live, silent, .. } if silent > 0 => {
                let routers = u128::from(live.max(1)) + u128::from(silent);
                (u128::from(limit) * u128::from(silent)).div_ceil(routers) as u64
            }
            _ => 0,
        }
    }
}

/// What one bucket has admitted in the current round, for the per-round split. 16 bytes per
/// bucket; [`RoundAllowance::NONE`] until the bucket is used under a split share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundAllowance {
    round: u32,
    /// Something was admitted this round: the "first request passes" rule has been used.
    taken: bool,
    /// What is left of this round's allowance, in the bucket's units.
    left: i64,
}

impl RoundAllowance {
    pub const NONE: RoundAllowance = RoundAllowance {
        round: u32::MAX,
        taken: false,
        left: 0,
    };

    /// Whether `need` may be admitted this round, given `level` (what the bucket, or the part of
    /// it this router may use, holds now) and the share's `(round, divisor)`. On the first call
    /// of a round the allowance is `level / divisor`. Takes nothing: call [`RoundAllowance::take`]
    /// once the admission is certain. `Err` carries what is left of the allowance.
    pub fn check(&mut self, split: (u32, u64), level: i64, need: i64) -> Result<(), i64> {
        let (round, divisor) = split;
        if self.round != round {
            *self = RoundAllowance {
                round,
                taken: false,
                left: level.max(0) / divisor as i64,
            };
        }
        if self.taken && need > self.left {
            return Err(self.left.max(0));
        }
        Ok(())
    }

    pub fn take(&mut self, need: i64) {
        self.taken = true;
        self.left -= need;
    }

    /// Give back what [`RoundAllowance::take`] took for an admission refused later in the same
    /// request (within the same round: the owner refunds synchronously).
    pub fn refund(&mut self, amount: i64) {
        if self.round != u32::MAX {
            self.left += amount;
        }
    }

    /// Forget the round (a new UTC day starts every budget afresh).
    pub fn reset(&mut self) {
        *self = RoundAllowance::NONE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_scales_nothing_and_splits_nothing() {
        assert_eq!(Share::Whole.rate_scale(), (1, 1));
        assert_eq!(Share::Whole.rate_round(), None);
        assert_eq!(Share::Whole.daily_round(), None);
        assert_eq!(Share::Whole.daily_reserve(1000), 0);
    }

    #[test]
    fn shared_splits_each_round_and_leaves_silent_routers_their_part() {
        let share = Share::Shared {
            round: 7,
            live: 2,
            silent: 1,
        };
        assert_eq!(share.rate_scale(), (2, 3));
        assert_eq!(share.rate_round(), Some((7, 2)));
        assert_eq!(share.daily_round(), Some((7, 2)));
        assert_eq!(share.daily_reserve(1000), 334);
    }

    #[test]
    fn one_live_router_splits_nothing() {
        let share = Share::Shared {
            round: 1,
            live: 1,
            silent: 0,
        };
        assert_eq!(share.rate_round(), None);
        assert_eq!(share.daily_round(), None);
        assert_eq!(share.rate_scale(), (1, 1));
    }

    #[test]
    fn alone_scales_rates_and_splits_daily_from_the_outage() {
        let share = Share::Alone {
            since: 3,
            routers: 4,
        };
        assert_eq!(share.rate_scale(), (1, 4));
        assert_eq!(share.rate_round(), None);
        assert_eq!(share.daily_round(), Some((3, 4)));
    }

    #[test]
    fn the_first_admission_of_a_round_passes_then_the_allowance_holds() {
        let mut allowance = RoundAllowance::NONE;
        // 10 left, 3 routers: an allowance of 3; the first request of 5 passes anyway.
        assert_eq!(allowance.check((1, 3), 10, 5), Ok(()));
        allowance.take(5);
        assert_eq!(allowance.check((1, 3), 5, 1), Err(0));
        // The next round starts a new allowance from what is left.
        assert_eq!(allowance.check((2, 3), 9, 3), Ok(()));
        allowance.take(3);
        assert_eq!(allowance.check((2, 3), 6, 1), Err(0));
        allowance.refund(3);
        assert_eq!(allowance.check((2, 3), 9, 3), Ok(()));
    }
}
