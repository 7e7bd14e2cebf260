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
    /// The scale (`Share::rate_scale`, numerator and denominator) the level was last brought up
    /// to date under: a smaller one holds back the part of the level the routers that went
    /// silent since may spend.
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
    pub fn anchor(&mut self, now: Millis, site_units: i64, share: Share) {
        let pending_units = self
            .delta_tokens
            .clamp(-(LIMIT_MAX as i64), LIMIT_MAX as i64)
            * UNITS_PER_TOKEN;
        let site_units =
            (site_units - pending_units).clamp(-self.capacity_units, self.capacity_units);
        let (numerator, denominator) = share.rate_scale();
        if numerator != denominator {
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(seconds: u64) -> Millis {
        Millis::from_seconds(seconds)
    }

    #[test]
    fn starts_full_and_refuses_exactly_past_capacity() {
        let mut bucket = Bucket::new(at(0), 60, 60);
        for _ in 0..60 {
            bucket.try_take(at(0), 1).unwrap();
        }
        let shortfall = bucket.try_take(at(0), 1).unwrap_err();
        assert_eq!(shortfall.limit, 60);
        assert_eq!(shortfall.remaining, 0);
        // 60 per minute: one per second.
        assert_eq!(shortfall.reset_seconds, Some(1));
    }

    #[test]
    fn refills_continuously_not_at_the_minute() {
        let mut bucket = Bucket::new(at(0), 60, 60);
        bucket.try_take(at(0), 60).unwrap();
        assert!(bucket.try_take(Millis(999), 1).is_err());
        bucket.try_take(Millis(1000), 1).unwrap();
        assert!(bucket.try_take(Millis(1000), 1).is_err());
    }

    #[test]
    fn full_again_after_exactly_sixty_seconds() {
        let mut bucket = Bucket::new(at(0), 100, 100);
        bucket.try_take(at(0), 100).unwrap();
        assert!(!bucket.is_full(Millis(59_999)));
        assert_eq!(bucket.remaining(Millis(59_999)), 99);
        assert!(bucket.is_full(at(60)));
        bucket.try_take(at(60), 100).unwrap();
    }

    #[test]
    fn refused_take_changes_nothing() {
        let mut bucket = Bucket::new(at(0), 10, 10);
        bucket.try_take(at(0), 4).unwrap();
        assert!(bucket.try_take(at(0), 7).is_err());
        assert_eq!(bucket.remaining(at(0)), 6);
        assert_eq!(bucket.take_delta(), 4);
    }

    #[test]
    fn more_than_capacity_never_fits() {
        let mut bucket = Bucket::new(at(0), 10, 10);
        assert_eq!(bucket.try_take(at(0), 11).unwrap_err().reset_seconds, None);
    }

    #[test]
    fn charge_is_clamped_to_one_capacity_and_locks_out_at_most_a_minute() {
        let mut bucket = Bucket::new(at(0), 600, 600);
        assert_eq!(bucket.charge(at(0), 1_000_000), 600);
        assert_eq!(bucket.charge(at(0), 1_000_000), 600);
        // Two huge responses: the floor is minus one capacity, so back to full two minutes later
        // and not drained after one minute.
        assert!(bucket.check_not_drained(Millis(59_999)).is_err());
        bucket.check_not_drained(Millis(60_100)).unwrap();
        assert!(bucket.is_full(at(120)));
    }

    #[test]
    fn refund_restores_level_and_delta() {
        let mut bucket = Bucket::new(at(0), 100, 100);
        bucket.try_take(at(0), 30).unwrap();
        bucket.refund(30);
        assert!(bucket.is_full(at(0)));
        assert_eq!(bucket.take_delta(), 0);
        // A refund after the round took the delta offsets the next round.
        bucket.try_take(at(0), 30).unwrap();
        assert_eq!(bucket.take_delta(), 30);
        bucket.refund(30);
        bucket.try_take(at(0), 50).unwrap();
        assert_eq!(bucket.take_delta(), 20);
    }

    #[test]
    fn local_plus_remote_usage_respects_the_limit() {
        // Two routers share a 100/min limit; each applies the other's delta every second.
        let mut router_a = Bucket::new(at(0), 100, 100);
        let mut router_b = Bucket::new(at(0), 100, 100);
        let mut admitted = 0u64;
        for second in 0..=120u64 {
            let now = at(second);
            for _ in 0..10 {
                admitted += router_a.try_take(now, 1).is_ok() as u64;
                admitted += router_b.try_take(now, 1).is_ok() as u64;
            }
            let delta_a = router_a.take_delta();
            let delta_b = router_b.take_delta();
            router_a.apply_remote(now, delta_b, 0, Share::Whole);
            router_b.apply_remote(now, delta_a, 0, Share::Whole);
        }
        // Allowed over 120 s: one burst plus the refill, plus what one round can overshoot (each
        // router spends the same last-known level once before it hears of the other).
        let allowed = 100 + 100 * 120 / 60;
        assert!(admitted <= allowed + 100, "admitted {admitted}");
        // And well above a single router's share: both were used.
        assert!(admitted >= allowed - 10, "admitted {admitted}");
    }

    /// Below half its capacity a bucket asks to be anchored; the anchor sets the site's level
    /// less what was admitted here since the round took its usage; a view built from merged
    /// usage is not settled until anchored.
    #[test]
    fn an_anchor_sets_the_sites_level_less_what_was_admitted_since() {
        let mut bucket = Bucket::new(at(0), 60, 60);
        assert_eq!(bucket.anchor_view(at(0)), None, "full: nothing to ask");
        bucket.try_take(at(0), 40).unwrap();
        let view = bucket.anchor_view(at(0)).expect("below half");
        assert_eq!(view.level_units, 20 * UNITS_PER_TOKEN);
        assert!(view.settled);
        assert_eq!(bucket.take_delta(), 40);
        // Admitted after the round took its usage: not in the store's level yet.
        bucket.try_take(at(0), 3).unwrap();
        bucket.anchor(at(0), 5 * UNITS_PER_TOKEN, Share::Whole);
        assert_eq!(bucket.remaining(at(0)), 2);
        assert_eq!(
            bucket.take_delta(),
            3,
            "the anchor publishes nothing itself"
        );
        bucket.unsettle();
        assert!(!bucket.anchor_view(at(0)).expect("low").settled);
        bucket.anchor(at(0), 0, Share::Whole);
        assert!(bucket.anchor_view(at(0)).expect("low").settled);
    }

    /// With a silent router, the site's level only lowers a view: the store refills it at the
    /// whole rate, the silent router's part included (`perf/site-chaos.sh`, store-cut-kill).
    #[test]
    fn with_a_silent_router_the_sites_level_only_lowers_the_view() {
        let silent = Share::Shared {
            round: 7,
            live: 2,
            silent: 1,
            late: 0,
            at_least: 0,
        };
        let mut bucket = Bucket::new(at(0), 60, 60);
        bucket.try_take(at(0), 60).unwrap();
        assert_eq!(bucket.take_delta(), 60);
        // 30 s later: the store's level refilled 30, the live routers' part of it 20.
        bucket.anchor(at(30), 30 * UNITS_PER_TOKEN, silent);
        assert_eq!(bucket.remaining(at(30)), 20);
        bucket.anchor(at(30), 5 * UNITS_PER_TOKEN, silent);
        assert_eq!(bucket.remaining(at(30)), 5, "a lower level lowers the view");
        // With every router live, the site's level is the view, up or down.
        let everyone = Share::Shared {
            round: 8,
            live: 3,
            silent: 0,
            late: 0,
            at_least: 0,
        };
        bucket.anchor(at(30), 30 * UNITS_PER_TOKEN, everyone);
        assert_eq!(bucket.remaining(at(30)), 30);
    }

    #[test]
    fn remote_usage_drains_local_bucket() {
        let mut bucket = Bucket::new(at(0), 60, 60);
        bucket.apply_remote(at(0), 60, 0, Share::Whole);
        assert!(bucket.try_take(at(0), 1).is_err());
        assert_eq!(bucket.take_delta(), 0);
        bucket.try_take(at(1), 1).unwrap();
    }

    /// After a store outage: this router's first round saw the two others' stale heartbeats.
    const TWO_SILENT: Share = Share::Shared {
        round: 1,
        live: 1,
        silent: 2,
        late: 0,
        at_least: 0,
    };
    const THREE_LIVE: Share = Share::Shared {
        round: 2,
        live: 3,
        silent: 0,
        late: 0,
        at_least: 0,
    };

    #[test]
    fn with_silent_routers_the_live_one_uses_its_part_however_the_level_drops() {
        let mut bucket = Bucket::new(at(0), 30, 30);
        let admitted = (0..30)
            .filter(|_| bucket.try_take_shared(at(0), 1, TWO_SILENT).is_ok())
            .count();
        assert_eq!(admitted, 10);
        // It refills its part of the rate: one request every six seconds.
        assert!(bucket.try_take_shared(at(5), 1, TWO_SILENT).is_err());
        bucket.try_take_shared(at(6), 1, TWO_SILENT).unwrap();
        assert!(bucket.try_take_shared(at(6), 1, TWO_SILENT).is_err());
    }

    #[test]
    fn usage_applied_while_routers_were_silent_is_charged_once_when_they_are_live() {
        // Regression (tests/shared_limits.rs, store_stopped_each_router_enforces_its_share): a key
        // used only on router A during a store outage showed 1 request left on router B instead
        // of 21. B applied A's 8 in its first round after the outage, which still saw A and C as
        // silent, and the bucket cut to a third stayed cut once they were live again.
        let mut bucket = Bucket::new(at(0), 30, 30);
        bucket.apply_remote(at(0), 8, 0, TWO_SILENT);
        assert_eq!(bucket.remaining(at(0)), 2, "a third, less the usage");
        bucket.try_take_shared(at(0), 1, THREE_LIVE).unwrap();
        assert_eq!(bucket.remaining(at(0)), 21);
    }

    #[test]
    fn a_scale_that_shrinks_again_holds_back_again() {
        let mut bucket = Bucket::new(at(0), 30, 30);
        bucket.try_take_shared(at(0), 3, TWO_SILENT).unwrap();
        bucket.try_take_shared(at(0), 3, Share::Whole).unwrap();
        assert_eq!(bucket.remaining(at(0)), 24);
        let admitted = (0..30)
            .filter(|_| bucket.try_take_shared(at(0), 1, TWO_SILENT).is_ok())
            .count();
        assert_eq!(admitted, 10);
        bucket.try_take_shared(at(0), 1, Share::Whole).unwrap();
        assert_eq!(bucket.remaining(at(0)), 13);
    }

    /// Seed 400 of `sync::simulation`: router-1 had both others silent, their parts held back,
    /// its view 135 requests; then the store stopped answering. Alone, the held parts came back
    /// and a third of the whole view was its allowance: 246 requests where its part was 135,
    /// while the two others, cut off, spent theirs. Alone, the silent routers keep their part.
    #[test]
    fn alone_after_silent_routers_their_parts_stay_held() {
        let mut bucket = Bucket::new(at(0), 30, 30);
        bucket.try_take_shared(at(0), 4, TWO_SILENT).unwrap();
        assert_eq!(bucket.remaining(at(0)), 6);
        let alone = Share::Alone {
            since: 1,
            routers: 3,
        };
        let admitted = (0..30)
            .filter(|_| bucket.try_take_shared(at(0), 1, alone).is_ok())
            .count();
        assert_eq!(
            admitted, 6,
            "its part, the 10 of 30 it had, less the 4 it took"
        );
        // Back with the store and every router live, the held parts are the key's again.
        bucket.try_take_shared(at(0), 1, THREE_LIVE).unwrap();
        assert_eq!(bucket.remaining(at(0)), 19);
    }

    #[test]
    fn time_going_backwards_refills_nothing() {
        let mut bucket = Bucket::new(at(10), 60, 60);
        bucket.try_take(at(10), 60).unwrap();
        assert!(bucket.try_take(at(5), 1).is_err());
        bucket.try_take(at(11), 1).unwrap();
    }

    #[test]
    fn rescaling_keeps_a_full_bucket_full_and_a_used_one_used() {
        let mut bucket = Bucket::new(at(0), 10, 10);
        bucket.set_rate(at(0), 30, 30);
        assert_eq!(bucket.remaining(at(0)), 30);
        bucket.try_take(at(0), 25).unwrap();
        bucket.set_rate(at(0), 10, 10);
        assert_eq!(bucket.remaining(at(0)), 5);
        bucket.set_rate(at(0), 30, 30);
        assert_eq!(bucket.remaining(at(0)), 5);
    }

    #[test]
    fn inherit_keeps_usage_under_a_new_limit() {
        let mut previous = Bucket::new(at(0), 100, 100);
        previous.try_take(at(0), 40).unwrap();
        let mut raised = Bucket::new(at(0), 200, 200);
        raised.inherit(at(0), &previous);
        assert_eq!(raised.remaining(at(0)), 160);
        assert_eq!(raised.take_delta(), 40);
        let mut lowered = Bucket::new(at(0), 30, 30);
        lowered.inherit(at(0), &previous);
        assert_eq!(lowered.remaining(at(0)), 0);
        assert!(lowered.try_take(at(0), 1).is_err());
    }

    /// A minute of a saturated site's usage, replayed at once on a bucket that took one request
    /// of its own first, leaves it where the site's bucket is (seeds 255 and 390).
    #[test]
    fn a_replay_of_a_saturated_minute_leaves_the_sites_level() {
        // 1,200 a minute: the burst at 0, then the rate, 10 every 500 ms, until 60 s.
        let mut history = vec![(at(0), 1_200)];
        history.extend((1..=120).map(|half_seconds| (Millis(half_seconds * 500), 10)));
        let mut site = Bucket::new(at(0), 1_200, 1_200);
        for &(admitted, amount) in &history {
            site.apply_remote(admitted, amount, 0, Share::Whole);
        }
        let mut started = Bucket::new(at(61), 1_200, 1_200);
        started.try_take(at(61), 1).unwrap();
        started.replay(at(61), &history, Share::Whole);
        assert_eq!(started.level(at(61)), site.level(at(61)) - 1);
        assert!(site.level(at(61)).abs() <= 40, "{}", site.level(at(61)));
    }

    proptest! {
        /// A new bucket that replays a history ends where a bucket that lived it is.
        #[test]
        fn a_replay_is_the_history_lived(
            rate in 1u64..10_000,
            steps in proptest::collection::vec((0u64..5_000, 1u64..5_000), 1..100),
            after_ms in 0u64..120_000,
        ) {
            let mut lived = Bucket::new(Millis(0), rate, rate);
            let mut now = 0;
            let mut history = Vec::new();
            for (advance_ms, amount) in steps {
                now += advance_ms;
                lived.apply_remote(Millis(now), amount, 0, Share::Whole);
                history.push((Millis(now), amount));
            }
            let end = Millis(now + after_ms);
            let mut replayed = Bucket::new(end, rate, rate);
            replayed.replay(end, &history, Share::Whole);
            prop_assert_eq!(replayed.level_at(end), lived.level_at(end));
        }

        /// Over any sequence of takes at non-decreasing times, what was admitted never exceeds
        /// the capacity plus the refill over the elapsed time.
        #[test]
        fn admitted_never_exceeds_burst_plus_refill(
            rate in 1u64..10_000,
            capacity in 1u64..10_000,
            steps in proptest::collection::vec((0u64..5_000, 1u64..50), 1..200),
        ) {
            let mut bucket = Bucket::new(Millis(0), rate, capacity);
            let mut now = 0u64;
            let mut admitted = 0u64;
            for (advance_ms, amount) in steps {
                now += advance_ms;
                if bucket.try_take(Millis(now), amount).is_ok() {
                    admitted += amount;
                }
                let bound_units = capacity as u128 * UNITS_PER_TOKEN as u128
                    + now as u128 * rate as u128;
                prop_assert!(admitted as u128 * UNITS_PER_TOKEN as u128 <= bound_units);
            }
            prop_assert_eq!(bucket.take_delta(), admitted);
        }

        /// A take refused at one moment succeeds once `reset_seconds` have passed.
        #[test]
        fn reset_seconds_is_enough(
            rate in 1u64..10_000,
            capacity in 1u64..10_000,
            used in 0u64..10_000,
            amount in 1u64..10_000,
        ) {
            let mut bucket = Bucket::new(Millis(0), rate, capacity);
            bucket.charge(Millis(0), used);
            if let Err(shortfall) = bucket.try_take(Millis(0), amount) {
                if let Some(seconds) = shortfall.reset_seconds {
                    prop_assert!(bucket.try_take(Millis::from_seconds(seconds as u64), amount).is_ok());
                } else {
                    prop_assert!(amount > capacity);
                }
            }
        }
    }

    /// Issue 33, sustained load: three routers share a key of 1,200 requests a minute, each offered
    /// 500 a second, each running its sync round every 200 ms at its own phase and subtracting the
    /// others' usage of their last round (published at their round, applied at its own). Over 20 s
    /// after the burst is spent the site admits about what the rate allows, and no router is
    /// starved. Before, the others' usage was credited with what the bucket "refilled since"
    /// although the bucket had refilled meanwhile anyway: 1.2 to 3 times the rate got through.
    #[test]
    fn three_routers_under_sustained_load_admit_the_rate_between_them() {
        const RATE: u64 = 1200;
        const ROUTERS: usize = 3;
        const ROUND_MS: u64 = 200;
        const FROM_MS: u64 = 5_000;
        const UNTIL_MS: u64 = 25_000;
        let mut buckets: Vec<Bucket> = (0..ROUTERS)
            .map(|_| Bucket::new(Millis(0), RATE, RATE))
            .collect();
        let mut rounds = [0u32; ROUTERS];
        // Usage published: (publisher, admitted at, amount); each router reads what is new.
        let mut published: Vec<(usize, u64, u64)> = Vec::new();
        let mut read = [0usize; ROUTERS];
        let mut admitted = [0u64; ROUTERS];
        for now in 0..UNTIL_MS {
            for router in 0..ROUTERS {
                if (now + router as u64 * 67).is_multiple_of(ROUND_MS) {
                    rounds[router] += 1;
                    let delta = buckets[router].take_delta();
                    published.push((router, now, delta));
                    let share = Share::Shared {
                        round: rounds[router],
                        live: ROUTERS as u32,
                        silent: 0,
                        late: 0,
                        at_least: 0,
                    };
                    for &(publisher, at, amount) in &published[read[router]..] {
                        if publisher != router {
                            buckets[router].apply_remote(Millis(now), amount, now - at, share);
                        }
                    }
                    read[router] = published.len();
                }
                if now.is_multiple_of(2) {
                    let share = Share::Shared {
                        round: rounds[router],
                        live: ROUTERS as u32,
                        silent: 0,
                        late: 0,
                        at_least: 0,
                    };
                    if buckets[router]
                        .try_take_shared(Millis(now), 1, share)
                        .is_ok()
                        && now >= FROM_MS
                    {
                        admitted[router] += 1;
                    }
                }
            }
        }
        let allowed = RATE * (UNTIL_MS - FROM_MS) / 60_000;
        let total: u64 = admitted.iter().sum();
        eprintln!("admitted {total} ({admitted:?}); the rate allows {allowed}");
        // The seed's excess: within one round's shares (each router's first request of a round).
        let rounds_in_window = (UNTIL_MS - FROM_MS) / ROUND_MS;
        assert!(
            total <= allowed + rounds_in_window,
            "admitted {total} ({admitted:?}) where the rate allows {allowed}"
        );
        for (router, count) in admitted.iter().enumerate() {
            assert!(
                *count >= allowed / ROUTERS as u64 / 2,
                "router {router} admitted {count} of {total} ({admitted:?}): starved"
            );
        }
    }
}
