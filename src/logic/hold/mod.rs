//! Hold at zero (seed `hold-at-zero.md`): requests for a model asleep on this site wait for its
//! wake instead of failing.
//!
//! - [`book`]: which requests are held, the per-model hold limits and the pending demand (pure
//!   logic; one book per shard, for the models the shard owns).
//! - [`HoldSettings`]: the `--wake-*` flags, validated at start-up.
//! - [`HeldTotal`]: `--wake-hold-max-total`, the one limit across every model, shared by the
//!   shards as a single atomic counter (the hold path is cold; no lock is taken).
//! - [`HoldEnded`] and [`HoldMetrics`]: `hivenet_wake_holds_total{outcome}` and
//!   `hivenet_wake_hold_seconds`.
//!
//! The request path that uses them is `api::hold` (hold, keepalives, release) and the owner's
//! side in `shard::state`; the sibling map that says which models may be held is
//! `crate::logic::sibling::map`.

pub mod book;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub use book::{ClientId, HoldBook, HoldLimits, HoldRefusal};

/// `--wake-hold-budget` default: how long a request is held when its placement sets no budget.
pub const DEFAULT_HOLD_BUDGET: Duration = Duration::from_secs(300);
/// `--wake-keepalive` default.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);
/// What `Retry-After` (and the envelope's `retry_after`) says on every `model_waking`.
pub const RETRY_AFTER_SECONDS: u32 = 30;

/// The hold-at-zero flags, as start-up validated them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSettings {
    /// `--wake-hold-budget`: greater than zero.
    pub budget: Duration,
    /// `--wake-hold-max` and `--wake-hold-max-per-key`.
    pub limits: HoldLimits,
    /// `--wake-hold-max-total`.
    pub max_total: u32,
    /// `--wake-keepalive`: zero sends no keepalives (plain status codes).
    pub keepalive: Duration,
}

impl Default for HoldSettings {
    fn default() -> Self {
        HoldSettings {
            budget: DEFAULT_HOLD_BUDGET,
            limits: HoldLimits::default(),
            max_total: 1000,
            keepalive: DEFAULT_KEEPALIVE,
        }
    }
}

impl HoldSettings {
    /// Validates the flags as given (limits as signed numbers, so that `-1` is refused with the
    /// flag's name rather than by the argument parser). A budget or limit must be greater than
    /// zero; the keepalive may be zero (off) but the duration parser already refuses negatives.
    pub fn new(
        budget: Duration,
        per_model: i64,
        per_key: i64,
        total: i64,
        keepalive: Duration,
    ) -> Result<HoldSettings, String> {
        if budget.is_zero() {
            return Err("--wake-hold-budget must be greater than 0".into());
        }
        let positive = |flag: &str, value: i64| -> Result<u32, String> {
            match u32::try_from(value) {
                Ok(value) if value > 0 => Ok(value),
                _ => Err(format!(
                    "{flag} must be between 1 and {}, got {value}",
                    u32::MAX
                )),
            }
        };
        Ok(HoldSettings {
            budget,
            limits: HoldLimits {
                per_model: positive("--wake-hold-max", per_model)?,
                per_key: positive("--wake-hold-max-per-key", per_key)?,
            },
            max_total: positive("--wake-hold-max-total", total)?,
            keepalive,
        })
    }
}

/// The router-wide count of held requests, against `--wake-hold-max-total`.
#[derive(Debug)]
pub struct HeldTotal {
    held: AtomicU32,
    max: u32,
}

impl HeldTotal {
    pub fn new(max: u32) -> HeldTotal {
        HeldTotal {
            held: AtomicU32::new(0),
            max,
        }
    }

    /// Takes one place; false when every place is taken.
    pub fn take(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < self.max).then_some(held + 1)
            })
            .is_ok()
    }

    /// Gives back a place taken with [`HeldTotal::take`].
    pub fn give_back(&self) {
        let previous = self.held.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(previous > 0, "a place given back twice");
    }

    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Acquire)
    }
}

/// How a hold ended, the `outcome` label of `hivenet_wake_holds_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnded {
    /// An agent for the model registered: the request continues as a normal request.
    Released = 0,
    /// The hold budget ran out: `503 model_waking`.
    Expired = 1,
    /// A hold limit was reached: `503 model_waking` at once, never held.
    Full = 2,
    /// The client disconnected while held (audited as 499).
    Cancelled = 3,
}

impl HoldEnded {
    pub const ALL: [HoldEnded; 4] = [
        HoldEnded::Released,
        HoldEnded::Expired,
        HoldEnded::Full,
        HoldEnded::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HoldEnded::Released => "released",
            HoldEnded::Expired => "expired",
            HoldEnded::Full => "full",
            HoldEnded::Cancelled => "cancelled",
        }
    }
}

/// Upper bounds (seconds) of the `hivenet_wake_hold_seconds` buckets: cold starts run from
/// seconds (a small model) to many minutes (a large one on a cold node), up to the 1 h budget cap.
pub const HOLD_SECONDS_BUCKETS: [f64; 11] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 240.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// One shard's hold counters (the shard is their only writer; `/metrics` sums the shards).
#[derive(Debug, Default)]
pub struct HoldMetrics {
    outcomes: [AtomicU64; 4],
    /// Cumulative per bucket is computed at render time; each slot counts its own range.
    buckets: [AtomicU64; HOLD_SECONDS_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl HoldMetrics {
    /// Counts a hold that ended after `held` (a refused hold, `Full`, has no duration).
    pub fn ended(&self, outcome: HoldEnded, held: Option<Duration>) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(held) = held {
            let seconds = held.as_secs_f64();
            let bucket = HOLD_SECONDS_BUCKETS
                .iter()
                .position(|bound| seconds <= *bound)
                .unwrap_or(HOLD_SECONDS_BUCKETS.len());
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
            self.sum_micros
                .fetch_add(held.as_micros() as u64, Ordering::Relaxed);
        }
    }

    pub fn outcome(&self, outcome: HoldEnded) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }

    /// Per-bucket counts (not cumulative; the last is above every bound), and the sum in
    /// seconds.
    pub fn durations(&self) -> ([u64; HOLD_SECONDS_BUCKETS.len() + 1], f64) {
        let counts = std::array::from_fn(|index| self.buckets[index].load(Ordering::Relaxed));
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        (counts, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_zero_and_negative_values() {
        let ok = HoldSettings::new(Duration::from_secs(1), 1, 1, 1, Duration::ZERO).unwrap();
        assert_eq!(ok.keepalive, Duration::ZERO);
        assert!(HoldSettings::new(Duration::ZERO, 1, 1, 1, Duration::ZERO).is_err());
        for (per_model, per_key, total, flag) in [
            (0, 1, 1, "--wake-hold-max "),
            (1, -1, 1, "--wake-hold-max-per-key"),
            (1, 1, 0, "--wake-hold-max-total"),
            (1, 1, i64::MAX, "--wake-hold-max-total"),
        ] {
            let error = HoldSettings::new(
                Duration::from_secs(1),
                per_model,
                per_key,
                total,
                Duration::ZERO,
            )
            .unwrap_err();
            assert!(error.starts_with(flag), "{error}");
        }
    }

    #[test]
    fn held_total_is_bounded_and_given_back() {
        let total = HeldTotal::new(2);
        assert!(total.take());
        assert!(total.take());
        assert!(!total.take());
        total.give_back();
        assert!(total.take());
        assert_eq!(total.held(), 2);
    }

    #[test]
    fn hold_durations_fall_in_their_buckets() {
        let metrics = HoldMetrics::default();
        metrics.ended(HoldEnded::Released, Some(Duration::from_millis(500)));
        metrics.ended(HoldEnded::Expired, Some(Duration::from_secs(300)));
        metrics.ended(HoldEnded::Expired, Some(Duration::from_secs(7200)));
        metrics.ended(HoldEnded::Full, None);
        let (buckets, sum) = metrics.durations();
        assert_eq!(buckets[0], 1);
        assert_eq!(buckets[7], 1, "300 s is in the 300 s bucket");
        assert_eq!(buckets[HOLD_SECONDS_BUCKETS.len()], 1);
        assert!((sum - 7500.5).abs() < 1e-6);
        assert_eq!(metrics.outcome(HoldEnded::Expired), 2);
        assert_eq!(metrics.outcome(HoldEnded::Full), 1);
    }
}
