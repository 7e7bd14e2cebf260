//! A continuously refilling token bucket in exact integer arithmetic, shared by the request-rate
//! and token-rate limits.
//!
//! One token is [`UNITS_PER_TOKEN`] = 60 000 units, so a rate of R per minute refills exactly R
//! units per millisecond: no floats, no rounding drift, and the bound "admitted <= capacity +
//! rate x elapsed" holds to the unit. The level may go below zero for after-the-fact charges (output
//! tokens, other routers' usage) but never below minus one capacity, so such charges lock a key
//! out for at most one minute of refill.

use super::share::{RoundAllowance, Share};
use super::{LIMIT_MAX, Millis};

/// Fixed-point units per token (or request): milliseconds per minute, so that a per-minute rate
/// is also the refill in units per millisecond.
pub const UNITS_PER_TOKEN: i64 = 60_000;
const MILLIS_PER_SECOND: u64 = 1000;

fn units(amount: u64) -> i64 {
    // LIMIT_MAX x 60 000 < 2^56: no overflow.
    amount.min(LIMIT_MAX) as i64 * UNITS_PER_TOKEN
}

/// Why a bucket refused, with the values the `X-RateLimit-*` headers report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    /// The bucket's rate per minute.
    pub limit: u64,
    /// Whole tokens (or requests) in the bucket now, floored at zero.
    pub remaining: u64,
    /// Whole seconds, rounded up, until the refused amount fits; `None` if it never will (more
    /// than the bucket's capacity).
    pub reset_seconds: Option<u32>,
}

/// The largest capacity, in units, the store's script anchors ([`Bucket::anchor_view`]): its
/// numbers are doubles, exact up to 2^53; a level plus a minute's refill stays below that.
pub const ANCHOR_UNITS_MAX: i64 = 1 << 51;

/// A bucket's level as the sync round sends it to the store to be anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnchorView {
    pub level_units: i64,
    pub rate_per_minute: u64,
    pub capacity_units: i64,
    /// The view may start or lower the site's level. Not when the bucket was lowered at once by
    /// usage it did not take as it came (built from other routers' usage waiting for it, merged
    /// at its latest time; a start's replay of the last minute) and not anchored since: such a
    /// view is stricter than the site's by up to a minute's refill, and is only answered. A restarted router's first request
    /// lowered every router's level by most of a capacity (`tests/site_chaos.rs`: 43 of 50).
    pub settled: bool,
}

#[derive(Debug, Clone)]
pub struct Bucket {
    rate_per_minute: u64,
    capacity_units: i64,
    level_units: i64,
    /// The time `level_units` was last brought up to date.
    updated: Millis,
    /// Net tokens admitted here since the last `take_delta` (negative after refunds that crossed
    /// a round).
    delta_tokens: i64,
    /// This sync round's part of the bucket, while the routers of a site share it.
    round: RoundAllowance,
    /// What a smaller scale (`Share::rate_scale`, with silent routers) took off a level above
    /// its scaled capacity. Given back once the scale grows past `held_below_units`, so routers
    /// that were silent for a while (after a store outage, every other router is, until its
    /// next heartbeat) do not cost the key the rest of its burst: their held-back usage is then
    /// subtracted from the whole level, not from the part the live routers were left with.
    /// Never negative.
    held_units: i64,
    /// The scaled capacity `held_units` was held back under (the smallest, when several were).
    /// A scale that is not larger keeps holding it: giving it back as the level drops would let
    /// the live routers admit more than their part.
    held_below_units: i64,
    /// The scale (`Share::rate_scale`, numerator and denominator) of the last round the store
    /// answered, kept through an outage (`Share::Alone` says nothing of silent routers): the
    /// silent routers' part stays held back, and the outage's allowance is split from the
    /// level unscaled.
    scaled: (u16, u16),
    /// Since when the bucket has been full without a break (`None`: it is not full). The refill
    /// of that time was thrown away at the capacity, so usage another router admitted meanwhile,
    /// subtracted late, may be credited with it ([`Bucket::apply_remote`]); refill the bucket
    /// kept needs no credit. A new bucket has been full "since ever" (`Millis(0)`).
    full_since: Option<Millis>,
    /// See [`AnchorView::settled`]: false once [`Bucket::unsettle`] and until the next
    /// [`Bucket::anchor`].
    settled: bool,
}

impl Bucket {
    /// A full bucket: a new key starts with its whole burst (auth-yaml reference, "Request-rate
    /// behavior": "can initially hold up to one minute's configured capacity").
    pub fn new(now: Millis, rate_per_minute: u64, capacity: u64) -> Bucket {
        let capacity_units = units(capacity.max(1));
        Bucket {
            rate_per_minute: rate_per_minute.min(LIMIT_MAX),
            capacity_units,
            level_units: capacity_units,
            updated: now,
            delta_tokens: 0,
            round: RoundAllowance::NONE,
            held_units: 0,
            held_below_units: 0,
            scaled: (1, 1),
            full_since: Some(Millis(0)),
            settled: true,
        }
    }

    pub fn rate_per_minute(&self) -> u64 {
        self.rate_per_minute
    }

    pub fn capacity(&self) -> u64 {
        (self.capacity_units / UNITS_PER_TOKEN) as u64
    }

    /// The level at `now` without changing anything. A `now` earlier than the last update (a
    /// caller bug or reordered events) refills nothing.
    fn level_at(&self, now: Millis) -> i64 {
        if self.level_units >= self.capacity_units || now <= self.updated {
            return self.level_units;
        }
        let gap_units = (self.capacity_units - self.level_units) as u64;
        let refill_units = (now.0 - self.updated.0).saturating_mul(self.rate_per_minute);
        self.level_units + refill_units.min(gap_units) as i64
    }

    fn refill(&mut self, now: Millis) {
        if self.full_since.is_none()
            && now > self.updated
            && self.level_units < self.capacity_units
            && self.rate_per_minute > 0
        {
            // When the refill reached the capacity, if it did by `now`.
            let gap_units = (self.capacity_units - self.level_units) as u64;
            let filled_at = self.updated.0 + gap_units.div_ceil(self.rate_per_minute);
            if filled_at <= now.0 {
                self.full_since = Some(Millis(filled_at));
            }
        }
        self.level_units = self.level_at(now);
        if now > self.updated {
            self.updated = now;
        }
    }

    /// After anything that lowered the level: the bucket is no longer full.
    fn lowered(&mut self) {
        if self.level_units < self.capacity_units {
            self.full_since = None;
        }
    }

    /// Brings the level up to date under `share`: with silent routers, the live ones may use only
    /// their part of the capacity and the refill (`Share::rate_scale`). A level above the scaled
    /// capacity is brought down to it, and what that takes off is held back until the scale
    /// grows again (`held_units`).
    fn refill_shared(&mut self, now: Millis, share: Share) {
        // Alone, the silent routers of the last round keep their part: they may be spending it
        // still, and giving it back made a third of this router's whole view, their parts
        // included, its allowance for the outage (`sync::simulation`, seed 400: a router that
        // had two routers silent spent 246 requests alone where its part was 135).
        let (numerator, denominator) = match share {
            Share::Alone { .. } => (u64::from(self.scaled.0), u64::from(self.scaled.1)),
            share => share.rate_scale(),
        };
        let scale = |units: u64| {
            (u128::from(units) * u128::from(numerator) / u128::from(denominator)) as u64
        };
        let capacity_units = scale(self.capacity_units as u64) as i64;
        if self.held_units > 0 && capacity_units > self.held_below_units {
            // The scale grew: what the smaller one held back is the key's again.
            self.level_units = (self.level_units + self.held_units).min(self.capacity_units);
            self.held_units = 0;
        }
        self.scaled = (
            numerator.min(u64::from(u16::MAX)) as u16,
            denominator.min(u64::from(u16::MAX)) as u16,
        );
        if numerator == denominator {
            self.refill(now);
            return;
        }
        if now > self.updated && self.level_units < capacity_units {
            let gap_units = (capacity_units - self.level_units) as u64;
            let refill_units = scale((now.0 - self.updated.0).saturating_mul(self.rate_per_minute));
            self.level_units += refill_units.min(gap_units) as i64;
        }
        if self.level_units > capacity_units {
            self.held_units += self.level_units - capacity_units;
            self.held_below_units = capacity_units;
            self.level_units = capacity_units;
        }
        if now > self.updated {
            self.updated = now;
        }
        // Under a smaller scale the bucket is never full: no refill of this time is credited.
        self.lowered();
    }

    /// The level at `now` in whole tokens, below zero when it owes (for the site's simulation).
    #[cfg(test)]
    pub fn level(&self, now: Millis) -> i64 {
        self.level_at(now) / UNITS_PER_TOKEN
    }

    /// Whole tokens available at `now`, floored at zero.
    pub fn remaining(&self, now: Millis) -> u64 {
        (self.level_at(now).max(0) / UNITS_PER_TOKEN) as u64
    }

    /// Full at `now`: nothing admitted within the last refill period, so dropping the bucket and
    /// recreating it full later loses nothing (idle cleanup).
    pub fn is_full(&self, now: Millis) -> bool {
        self.level_at(now) >= self.capacity_units
    }

    fn shortfall(&self, amount: u64) -> Shortfall {
        let need_units = units(amount);
        let reset_seconds = if need_units > self.capacity_units || self.rate_per_minute == 0 {
            None
        } else {
            let missing_units = (need_units - self.level_units).max(0) as u64;
            let wait_ms = missing_units.div_ceil(self.rate_per_minute);
            Some(wait_ms.div_ceil(MILLIS_PER_SECOND).min(u32::MAX as u64) as u32)
        };
        Shortfall {
            limit: self.rate_per_minute,
            remaining: (self.level_units.max(0) / UNITS_PER_TOKEN) as u64,
            reset_seconds,
        }
    }

    /// Take `amount` if the bucket holds it at `now`; otherwise change nothing.
    pub fn try_take(&mut self, now: Millis, amount: u64) -> Result<(), Shortfall> {
        self.try_take_shared(now, amount, Share::Whole)
    }

    /// [`Bucket::try_take`] within this router's `share` of a limit the routers of a site enforce
    /// together (`limits::share`).
    pub fn try_take_shared(
        &mut self,
        now: Millis,
        amount: u64,
        share: Share,
    ) -> Result<(), Shortfall> {
        self.refill_shared(now, share);
        let need_units = units(amount);
        if self.level_units < need_units {
            return Err(self.shortfall(amount));
        }
        if let Some(split) = share.rate_split() {
            // Alone after rounds with silent routers, the level is the live routers' part of the
            // site's (`refill_shared`): the outage's split is of the whole, as the site's level.
            let (numerator, denominator) = self.scaled;
            let level_units = match share {
                Share::Alone { .. } if numerator < denominator => {
                    (i128::from(self.level_units) * i128::from(denominator)
                        / i128::from(numerator.max(1))) as i64
                }
                _ => self.level_units,
            };
            if let Err(left_units) = self.round.check(
                split,
                level_units,
                need_units,
                now.0,
                self.rate_per_minute,
                self.capacity_units,
            ) {
                return Err(Shortfall {
                    limit: self.rate_per_minute,
                    remaining: (left_units / UNITS_PER_TOKEN) as u64,
                    // The next round, at most `--sync-interval` (10 s at most) away.
                    reset_seconds: Some(1),
                });
            }
            self.round.take(need_units);
        }
        self.level_units -= need_units;
        self.lowered();
        self.delta_tokens += amount.min(LIMIT_MAX) as i64;
        Ok(())
    }

    /// Admit only if at least one whole token is left, taking nothing: the check for a bucket
    /// that is charged after the fact (seed, B4: "If recent output drains the bucket, the next
    /// request is rejected").
    pub fn check_not_drained(&mut self, now: Millis) -> Result<(), Shortfall> {
        self.refill(now);
        if self.level_units < UNITS_PER_TOKEN {
            return Err(self.shortfall(1));
        }
        Ok(())
    }

    /// Give back an amount taken by [`Bucket::try_take`] for a request that was refused later.
    pub fn refund(&mut self, amount: u64) {
        let amount_units = units(amount);
        self.level_units = (self.level_units + amount_units).min(self.capacity_units);
        self.round.refund(amount_units);
        self.delta_tokens -= amount.min(LIMIT_MAX) as i64;
    }

    /// Charge usage that already happened. One charge takes at most one capacity (seed, B4: "One
    /// response can drain at most one minute of capacity") and the level never drops below minus
    /// one capacity. Returns the tokens charged (what the sync round will publish).
    pub fn charge(&mut self, now: Millis, amount: u64) -> u64 {
        self.refill(now);
        let charged = amount.min(self.capacity());
        self.level_units = (self.level_units - units(charged)).max(-self.capacity_units);
        self.lowered();
        self.delta_tokens += charged as i64;
        charged
    }

    /// Subtract usage other routers admitted (the sync round, seed `run-several-routers.md`,
    /// "How it works", step 2). Not counted in this router's delta.
    ///
    /// `age_ms`: how long ago the usage was admitted (last round's, held back while the store was
    /// unreachable, or replayed at start-up). Had it been subtracted then, the bucket would have
    /// refilled by now all the same, unless it was full: the refill thrown away at the capacity
    /// within those `age_ms` is what the usage is credited with (seed, "Store back": not charged
    /// again). Crediting the whole refill since, as before, counted the refill twice while the
    /// bucket was in use, and let three routers under sustained load admit 1.2 to 3 times the rate
    /// (issue 33).
    pub fn apply_remote(&mut self, now: Millis, amount: u64, age_ms: u64, share: Share) {
        self.refill_shared(now, share);
        let full_ms = match self.full_since {
            Some(since) => now
                .0
                .saturating_sub(since.0.max(now.0.saturating_sub(age_ms))),
            None => 0,
        };
        let wasted = full_ms.saturating_mul(self.rate_per_minute) / UNITS_PER_TOKEN as u64;
        let amount = amount.saturating_sub(wasted);
        self.level_units = (self.level_units - units(amount)).max(-self.capacity_units);
        self.lowered();
    }

    /// Subtract a start's replay of the other routers' usage of the last minute: `history` holds
    /// when each batch was admitted (this process's clock) and how much, oldest first.
    ///
    /// A minute of usage comes at once here, not round by round. Subtracted batch by batch
    /// ([`Bucket::apply_remote`]), it is credited no refill once the first batch lowered the
    /// level: a router that had taken one request before its first round saw the site a
    /// minute's refill poorer than it was, and the store started the site's level there
    /// (issue 33, seeds 255 and 390: -650 where the site had about 0, and nothing admitted for
    /// 30 s after healing). A bucket full since ever credited each batch its whole age instead,
    /// and saw a saturated site almost full. So the history is walked as the site's bucket
    /// lived it, from full at the first batch, refilling between batches up to the capacity,
    /// and what the walk leaves short of the capacity now is subtracted at once.
    pub fn replay(&mut self, now: Millis, history: &[(Millis, u64)], share: Share) {
        let Some(&(first, _)) = history.first() else {
            return;
        };
        let mut level_units = self.capacity_units;
        let mut at = first;
        for &(admitted, amount) in history {
            level_units = self.refilled(level_units, at, admitted);
            level_units = (level_units - units(amount)).max(-self.capacity_units);
            at = at.max(admitted);
        }
        let short_units = self.capacity_units - self.refilled(level_units, at, now);
        self.refill_shared(now, share);
        self.level_units = (self.level_units - short_units).max(-self.capacity_units);
        self.lowered();
    }

    /// `level_units` at `from`, refilled until `to` up to the capacity.
    fn refilled(&self, level_units: i64, from: Millis, to: Millis) -> i64 {
        if to <= from || level_units >= self.capacity_units {
            return level_units;
        }
        let gap_units = (self.capacity_units - level_units) as u64;
        let refill_units = (to.0 - from.0).saturating_mul(self.rate_per_minute);
        level_units + refill_units.min(gap_units) as i64
    }

    /// What the sync round asks the store to anchor this bucket to ([`Bucket::anchor`]): its
    /// level now, with what a smaller scale holds back, when it holds less than half its
    /// capacity. Buckets above half have room for every router's share whatever their views
    /// say; below it, views that drifted apart (a restart, usage lost in a crash, credits
    /// applied in another order) decide who starves. `None` also for capacities past what the
    /// store's script counts exactly ([`ANCHOR_UNITS_MAX`]).
    pub fn anchor_view(&self, now: Millis) -> Option<AnchorView> {
        let level_units = self.level_at(now) + self.held_units;
        (self.capacity_units <= ANCHOR_UNITS_MAX && level_units < self.capacity_units / 2)
            .then_some(AnchorView {
                level_units,
                rate_per_minute: self.rate_per_minute,
                capacity_units: self.capacity_units,
                settled: self.settled,
            })
    }

    /// Set the level from the site's level the store keeps ([`Bucket::anchor_view`]):
    /// `site_units` counts every router's published usage, this router's up to the round that
    /// returned it; what was admitted here since the round took its usage (`delta_tokens`, not
    /// published yet) is subtracted again. The refill between the store's reading and now is
    /// not added: the anchor errs on the side of the limit by a few milliseconds of refill.
    ///
    /// With silent routers (`share`'s [`Share::rate_scale`] below one) the site's level only
    /// lowers this view: the store refills it at the whole rate, the silent routers' part
    /// included, which they may be spending unseen. Anchored up to it, the live routers admitted
    /// the whole rate while a router cut off from the store admitted its part besides
    /// (`perf/site-chaos.sh`, store-cut-kill: 322 requests in 12.4 s where 290 were allowed).
    ///
    /// `lower_only`: the site's level only lowers this view, as with silent routers: for a few
    /// rounds after a failover, when the promoted replica's levels may miss decrements it had
    /// not received (stale high: every router anchored up to them, `sync::simulation`, seed
    /// 1,329).
    pub fn anchor(&mut self, now: Millis, site_units: i64, share: Share, lower_only: bool) {
        let pending_units = self
            .delta_tokens
            .clamp(-(LIMIT_MAX as i64), LIMIT_MAX as i64)
            * UNITS_PER_TOKEN;
        let site_units =
            (site_units - pending_units).clamp(-self.capacity_units, self.capacity_units);
        let (numerator, denominator) = share.rate_scale();
        if numerator != denominator || lower_only {
            self.refill_shared(now, share);
            if site_units < self.level_units {
                self.level_units = site_units;
                self.lowered();
            }
            self.settled = true;
            return;
        }
        self.level_units = site_units;
        if now > self.updated {
            self.updated = now;
        }
        self.held_units = 0;
        self.held_below_units = 0;
        self.scaled = (1, 1);
        self.full_since = (self.level_units >= self.capacity_units).then_some(now);
        self.settled = true;
    }

    /// The level was just lowered by other routers' usage merged at its latest time (a holder
    /// built from usage waiting for it): stricter than the site's by up to a merge window's
    /// refill, it may not lower the site's level until it is anchored.
    pub fn unsettle(&mut self) {
        self.settled = false;
    }

    /// Tokens admitted here since the last call, for the sync round to publish. A net refund is
    /// kept and offsets the next round's usage instead of being published as negative usage.
    pub fn take_delta(&mut self) -> u64 {
        if self.delta_tokens <= 0 {
            return 0;
        }
        let delta = self.delta_tokens as u64;
        self.delta_tokens = 0;
        delta
    }

    /// Take over `previous`'s usage after a configuration reload: the same amount used (capacity
    /// minus level), the same unpublished delta and what is left of this round's share, under
    /// this bucket's new rate and capacity.
    pub fn inherit(&mut self, now: Millis, previous: &Bucket) {
        // What a smaller scale held back is not used.
        let used_units = previous.capacity_units - (previous.level_at(now) + previous.held_units);
        self.refill(now);
        self.level_units =
            (self.capacity_units - used_units).clamp(-self.capacity_units, self.capacity_units);
        self.delta_tokens = previous.delta_tokens;
        // A reload during a round or an outage does not hand out a new share.
        self.round = previous.round;
        self.full_since = previous.full_since;
        self.settled = previous.settled;
        self.lowered();
    }

    /// Change rate and capacity (a replica-scaled RPM whose healthy-replica count changed). A full
    /// bucket stays full; otherwise the level is kept and clamped to the new capacity, so a
    /// replica count that flaps never mints tokens for a bucket in use.
    pub fn set_rate(&mut self, now: Millis, rate_per_minute: u64, capacity: u64) {
        self.refill(now);
        let was_full = self.level_units >= self.capacity_units;
        self.rate_per_minute = rate_per_minute.min(LIMIT_MAX);
        self.capacity_units = units(capacity.max(1));
        if was_full || self.level_units > self.capacity_units {
            self.level_units = self.capacity_units;
        }
        self.level_units = self.level_units.max(-self.capacity_units);
        self.lowered();
    }
}

#[cfg(test)]
mod tests;
