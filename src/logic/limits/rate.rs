//! Request-rate (RPM) and token-rate (ITPM, OTPM) limits: what each charges and when, on top of
//! [`Bucket`].

use super::bucket::{AnchorView, Bucket, Shortfall};
use super::share::Share;
use super::{LIMIT_MAX, Millis};

/// `HIVENET_ROUTER_RPM_BURST_SECONDS`: the RPM bucket's burst window. `0` (the default) keeps a
/// full minute of burst; `1..=59` caps the burst at that many seconds of the effective rate.
/// Valid range `[0, 60)` (configuration reference). Scope: every flat and per-model RPM bucket of
/// the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BurstSeconds(u8);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BurstSecondsError {
    #[error("HIVENET_ROUTER_RPM_BURST_SECONDS is {0}, outside the valid range 0 through 59")]
    OutOfRange(u64),
    #[error("HIVENET_ROUTER_RPM_BURST_SECONDS must be a whole number of seconds from 0 through 59")]
    NotANumber,
}

impl BurstSeconds {
    pub const FULL_MINUTE: BurstSeconds = BurstSeconds(0);

    pub fn new(seconds: u64) -> Result<BurstSeconds, BurstSecondsError> {
        if seconds >= 60 {
            return Err(BurstSecondsError::OutOfRange(seconds));
        }
        Ok(BurstSeconds(seconds as u8))
    }

    pub fn parse(text: &str) -> Result<BurstSeconds, BurstSecondsError> {
        let seconds: u64 = text
            .trim()
            .parse()
            .map_err(|_| BurstSecondsError::NotANumber)?;
        BurstSeconds::new(seconds)
    }

    pub fn seconds(self) -> u64 {
        self.0 as u64
    }

    /// Burst capacity for an effective rate: the full minute when `0`, else
    /// `floor(rpm x seconds / 60)` with a minimum of 1 (auth-yaml reference, "Request-rate
    /// behavior").
    pub fn capacity(self, requests_per_minute: u64) -> u64 {
        if self.0 == 0 {
            return requests_per_minute;
        }
        (requests_per_minute.saturating_mul(self.0 as u64) / 60).max(1)
    }
}

/// Requests per minute: one unit per admitted request, continuously refilling.
///
/// A flat RPM uses [`RequestRate::flat`] and [`RequestRate::admit`]; a `quota.per_model` entry
/// uses [`RequestRate::per_replica`] and [`RequestRate::admit_scaled`] with the live
/// healthy-replica count.
#[derive(Debug, Clone)]
pub struct RequestRate {
    /// Configured RPM (flat) or RPM per healthy replica (per-model).
    requests_per_minute: u64,
    /// Healthy replicas the bucket is currently sized for; 1 for a flat RPM.
    replicas: u32,
    burst: BurstSeconds,
    bucket: Bucket,
}

/// Outcome of a request-rate check that passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// One request taken; this many whole requests are left.
    Taken { remaining: u64 },
    /// No healthy replica: the per-model check is skipped so routing can return the more
    /// accurate availability error (auth-yaml reference, "Per-replica request limit").
    Skipped,
}

impl RequestRate {
    pub fn flat(now: Millis, requests_per_minute: u64, burst: BurstSeconds) -> RequestRate {
        RequestRate::per_replica(now, requests_per_minute, burst)
    }

    pub fn per_replica(
        now: Millis,
        requests_per_minute_per_replica: u64,
        burst: BurstSeconds,
    ) -> RequestRate {
        let rate = requests_per_minute_per_replica.min(LIMIT_MAX);
        RequestRate {
            requests_per_minute: rate,
            replicas: 1,
            burst,
            bucket: Bucket::new(now, rate, burst.capacity(rate)),
        }
    }

    /// The effective limit now, for headers.
    pub fn limit(&self) -> u64 {
        self.bucket.rate_per_minute()
    }

    pub fn remaining(&self, now: Millis) -> u64 {
        self.bucket.remaining(now)
    }

    /// The bucket's level at `now` in requests, below zero when it owes (for the site's
    /// simulation).
    #[cfg(test)]
    pub fn level(&self, now: Millis) -> i64 {
        self.bucket.level(now)
    }

    /// Take one request, within this router's `share` of the limit.
    pub fn admit(&mut self, now: Millis, share: Share) -> Result<u64, Shortfall> {
        self.bucket.try_take_shared(now, 1, share)?;
        Ok(self.bucket.remaining(now))
    }

    /// Take over `previous`'s usage after a reload (same replica count, same used amount).
    pub fn inherit(&mut self, now: Millis, previous: &RequestRate) {
        self.rescale(now, previous.replicas);
        self.bucket.inherit(now, &previous.bucket);
    }

    fn rescale(&mut self, now: Millis, healthy_replicas: u32) {
        if healthy_replicas != self.replicas {
            let rate = self
                .requests_per_minute
                .saturating_mul(healthy_replicas as u64)
                .min(LIMIT_MAX);
            self.bucket.set_rate(now, rate, self.burst.capacity(rate));
            self.replicas = healthy_replicas;
        }
    }

    /// Take one request from an RPM scaled to `healthy_replicas` (effective limit =
    /// `requests_per_minute_per_replica x healthy agents serving the model`); zero replicas skip
    /// the check.
    pub fn admit_scaled(
        &mut self,
        now: Millis,
        healthy_replicas: u32,
        share: Share,
    ) -> Result<RateDecision, Shortfall> {
        if healthy_replicas == 0 {
            return Ok(RateDecision::Skipped);
        }
        self.rescale(now, healthy_replicas);
        let remaining = self.admit(now, share)?;
        Ok(RateDecision::Taken { remaining })
    }

    pub fn is_full(&self, now: Millis) -> bool {
        self.bucket.is_full(now)
    }

    pub fn take_delta(&mut self) -> u64 {
        self.bucket.take_delta()
    }

    /// The bucket, for other routers' usage (`KeyLimits::apply_remote`, `KeyLimits::replay`).
    pub(super) fn bucket_mut(&mut self) -> &mut Bucket {
        &mut self.bucket
    }

    /// See [`Bucket::anchor_view`].
    pub fn anchor_view(&self, now: Millis) -> Option<AnchorView> {
        self.bucket.anchor_view(now)
    }

    /// See [`Bucket::anchor`].
    pub fn anchor(&mut self, now: Millis, site_units: i64, share: Share, lower_only: bool) {
        self.bucket.anchor(now, site_units, share, lower_only)
    }

    /// See [`Bucket::unsettle`].
    pub fn unsettle(&mut self) {
        self.bucket.unsettle()
    }
}

/// Tokens per minute, with a one-minute capacity (seed, B4: "a continuously refilling one-minute
/// bucket"; `HIVENET_ROUTER_RPM_BURST_SECONDS` applies to RPM only).
///
/// Input tokens are taken before forwarding with [`TokenRate::take`]; output tokens are checked
/// with [`TokenRate::check_not_drained`] at admission and charged after the response with
/// [`TokenRate::charge`].
#[derive(Debug, Clone)]
pub struct TokenRate {
    bucket: Bucket,
}

impl TokenRate {
    pub fn new(now: Millis, tokens_per_minute: u64) -> TokenRate {
        let rate = tokens_per_minute.min(LIMIT_MAX);
        TokenRate {
            bucket: Bucket::new(now, rate, rate),
        }
    }

    pub fn limit(&self) -> u64 {
        self.bucket.rate_per_minute()
    }

    pub fn remaining(&self, now: Millis) -> u64 {
        self.bucket.remaining(now)
    }

    /// Take over `previous`'s usage after a reload.
    pub fn inherit(&mut self, now: Millis, previous: &TokenRate) {
        self.bucket.inherit(now, &previous.bucket);
    }

    pub fn take(&mut self, now: Millis, tokens: u64, share: Share) -> Result<(), Shortfall> {
        self.bucket.try_take_shared(now, tokens, share)
    }

    pub fn refund(&mut self, tokens: u64) {
        self.bucket.refund(tokens)
    }

    pub fn check_not_drained(&mut self, now: Millis) -> Result<(), Shortfall> {
        self.bucket.check_not_drained(now)
    }

    /// Charge exact usage after the response, at most one minute's worth; returns what was
    /// charged.
    pub fn charge(&mut self, now: Millis, tokens: u64) -> u64 {
        self.bucket.charge(now, tokens)
    }

    pub fn is_full(&self, now: Millis) -> bool {
        self.bucket.is_full(now)
    }

    pub fn take_delta(&mut self) -> u64 {
        self.bucket.take_delta()
    }

    /// The bucket, for other routers' usage (`KeyLimits::apply_remote`, `KeyLimits::replay`).
    pub(super) fn bucket_mut(&mut self) -> &mut Bucket {
        &mut self.bucket
    }

    /// See [`Bucket::anchor_view`].
    pub fn anchor_view(&self, now: Millis) -> Option<AnchorView> {
        self.bucket.anchor_view(now)
    }

    /// See [`Bucket::anchor`].
    pub fn anchor(&mut self, now: Millis, site_units: i64, share: Share, lower_only: bool) {
        self.bucket.anchor(now, site_units, share, lower_only)
    }

    /// See [`Bucket::unsettle`].
    pub fn unsettle(&mut self) {
        self.bucket.unsettle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_seconds_range() {
        assert_eq!(BurstSeconds::new(0).unwrap(), BurstSeconds::FULL_MINUTE);
        assert_eq!(BurstSeconds::new(1).unwrap().seconds(), 1);
        assert_eq!(BurstSeconds::new(59).unwrap().seconds(), 59);
        assert_eq!(
            BurstSeconds::new(60).unwrap_err(),
            BurstSecondsError::OutOfRange(60)
        );
        assert_eq!(
            BurstSeconds::parse("-1").unwrap_err(),
            BurstSecondsError::NotANumber
        );
        assert_eq!(
            BurstSeconds::parse("1.5").unwrap_err(),
            BurstSecondsError::NotANumber
        );
        assert_eq!(BurstSeconds::parse(" 30 ").unwrap().seconds(), 30);
        assert_eq!(
            BurstSeconds::new(60).unwrap_err().to_string(),
            "HIVENET_ROUTER_RPM_BURST_SECONDS is 60, outside the valid range 0 through 59"
        );
    }

    #[test]
    fn burst_capacity_formula() {
        assert_eq!(BurstSeconds::new(0).unwrap().capacity(100), 100);
        assert_eq!(BurstSeconds::new(1).unwrap().capacity(100), 1);
        assert_eq!(BurstSeconds::new(1).unwrap().capacity(30), 1); // floor 0.5, minimum 1
        assert_eq!(BurstSeconds::new(10).unwrap().capacity(100), 16);
        assert_eq!(BurstSeconds::new(59).unwrap().capacity(100), 98);
        assert_eq!(BurstSeconds::new(59).unwrap().capacity(60), 59);
    }

    #[test]
    fn burst_limits_initial_requests_but_not_the_rate() {
        let now = Millis(0);
        let mut rate = RequestRate::flat(now, 120, BurstSeconds::new(1).unwrap());
        rate.admit(now, Share::Whole).unwrap();
        rate.admit(now, Share::Whole).unwrap();
        assert!(rate.admit(now, Share::Whole).is_err());
        // 120/min = one every 500 ms.
        rate.admit(Millis(500), Share::Whole).unwrap();
        assert!(rate.admit(Millis(500), Share::Whole).is_err());
    }

    #[test]
    fn exactly_at_the_limit() {
        let now = Millis(0);
        let mut rate = RequestRate::flat(now, 3, BurstSeconds::FULL_MINUTE);
        assert_eq!(rate.admit(now, Share::Whole), Ok(2));
        assert_eq!(rate.admit(now, Share::Whole), Ok(1));
        assert_eq!(rate.admit(now, Share::Whole), Ok(0));
        let shortfall = rate.admit(now, Share::Whole).unwrap_err();
        assert_eq!((shortfall.limit, shortfall.remaining), (3, 0));
        assert_eq!(shortfall.reset_seconds, Some(20));
        // After exactly 60 s, the full minute is back.
        let later = Millis::from_seconds(60);
        assert_eq!(rate.admit(later, Share::Whole), Ok(2));
    }

    #[test]
    fn per_replica_rpm_scales_and_skips_without_replicas() {
        let now = Millis(0);
        let mut rate = RequestRate::per_replica(now, 10, BurstSeconds::FULL_MINUTE);
        assert_eq!(
            rate.admit_scaled(now, 0, Share::Whole),
            Ok(RateDecision::Skipped)
        );
        for _ in 0..30 {
            assert!(matches!(
                rate.admit_scaled(now, 3, Share::Whole),
                Ok(RateDecision::Taken { .. })
            ));
        }
        assert_eq!(rate.limit(), 30);
        let shortfall = rate.admit_scaled(now, 3, Share::Whole).unwrap_err();
        assert_eq!(shortfall.limit, 30);
        // Scaling to five replicas does not hand out the difference to a bucket in use.
        assert!(rate.admit_scaled(now, 5, Share::Whole).is_err());
        // The burst-seconds rule applies to the replica-scaled rate.
        let mut short = RequestRate::per_replica(now, 10, BurstSeconds::new(30).unwrap());
        for _ in 0..15 {
            short.admit_scaled(now, 3, Share::Whole).unwrap();
        }
        assert!(short.admit_scaled(now, 3, Share::Whole).is_err());
    }

    #[test]
    fn output_rate_rejects_next_request_once_drained() {
        let now = Millis(0);
        let mut output = TokenRate::new(now, 1000);
        output.check_not_drained(now).unwrap();
        assert_eq!(output.charge(now, 999), 999);
        output.check_not_drained(now).unwrap();
        output.charge(now, 1);
        let shortfall = output.check_not_drained(now).unwrap_err();
        assert_eq!(shortfall.remaining, 0);
        assert_eq!(shortfall.reset_seconds, Some(1));
        output.check_not_drained(Millis(60)).unwrap();
    }

    #[test]
    fn one_response_drains_at_most_one_minute() {
        let now = Millis(0);
        let mut output = TokenRate::new(now, 1000);
        output.charge(now, 400);
        assert_eq!(output.charge(now, 50_000), 1000);
        // Level 600 - 1000 = -400: locked out until it has refilled 401 tokens, 24.06 s.
        assert!(output.check_not_drained(Millis(24_000)).is_err());
        output.check_not_drained(Millis(24_060)).unwrap();
        assert!(output.is_full(Millis::from_seconds(84)));
    }

    #[test]
    fn input_rate_takes_the_estimate() {
        let now = Millis(0);
        let mut input = TokenRate::new(now, 1000);
        input.take(now, 600, Share::Whole).unwrap();
        let shortfall = input.take(now, 600, Share::Whole).unwrap_err();
        assert_eq!(shortfall.remaining, 400);
        assert_eq!(shortfall.reset_seconds, Some(12));
        input
            .take(Millis::from_seconds(12), 600, Share::Whole)
            .unwrap();
    }
}
