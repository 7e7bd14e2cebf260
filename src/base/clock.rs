//! The router's clocks, read in one place. A leaf module: it imports nothing from the crate.
//!
//! - [`Millis`]: monotonic milliseconds since the process's origin ([`origin`]), shared by every
//!   shard so a deadline computed on one shard means the same on another. Limits, parking and
//!   reaping run on it; a wall-clock step never refills or drains a bucket.
//! - [`Day`]: the UTC calendar day daily budgets count in, from the wall clock.
//! - [`now_unix_ms`]: wall-clock milliseconds, for expiries that other processes set.
//!
//! Pure logic never reads a clock: its callers pass `Millis`, `Day` or Unix milliseconds in.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Monotonic time in milliseconds since [`origin`] (or, in tests of pure logic, since any origin
/// the test picks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Millis(pub u64);

impl Millis {
    pub fn from_seconds(seconds: u64) -> Millis {
        Millis(seconds.saturating_mul(1000))
    }

    pub fn plus_ms(self, milliseconds: u64) -> Millis {
        Millis(self.0.saturating_add(milliseconds))
    }

    /// Milliseconds from `self` to `later` (0 when `later` is not later).
    pub fn until(self, later: Millis) -> u64 {
        later.0.saturating_sub(self.0)
    }
}

/// A UTC calendar day: whole days since 1970-01-01 UTC. Daily budgets reset when it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Day(pub u32);

pub const SECONDS_PER_DAY: u64 = 86_400;

impl Day {
    /// The UTC day containing `unix_seconds` (UTC has no leap-second days in Unix time).
    pub fn from_unix_seconds(unix_seconds: u64) -> Day {
        Day((unix_seconds / SECONDS_PER_DAY) as u32)
    }

    /// Seconds from `unix_seconds` to the next UTC midnight, for a daily budget's reset header.
    pub fn seconds_until_next(unix_seconds: u64) -> u32 {
        (SECONDS_PER_DAY - unix_seconds % SECONDS_PER_DAY) as u32
    }
}

/// The process's monotonic origin: the first time anything asked for it (start-up reads it
/// before any shard starts).
pub fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Monotonic milliseconds now.
pub fn now() -> Millis {
    at(Instant::now())
}

/// The [`Millis`] of an instant (instants before the origin are the origin).
pub fn at(instant: Instant) -> Millis {
    Millis(instant.saturating_duration_since(origin()).as_millis() as u64)
}

/// The current UTC day from the wall clock: what daily budgets count in.
pub fn utc_today() -> Day {
    let unix_seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    Day::from_unix_seconds(unix_seconds)
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Where pure logic reads the time it was handed: the real clocks for a shard ([`SystemClock`]),
/// a fixed moment in tests and simulations ([`Frozen`]). Each reading is taken only when an
/// operation needs it.
pub trait Clock {
    fn now(&self) -> Millis;
    fn today(&self) -> Day;
    fn unix_ms(&self) -> i64;
}

/// The process's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        now()
    }

    fn today(&self) -> Day {
        utc_today()
    }

    fn unix_ms(&self) -> i64 {
        now_unix_ms()
    }
}

/// One fixed moment: virtual time for tests and simulations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frozen {
    pub now: Millis,
    pub today: Day,
    pub unix_ms: i64,
}

impl Frozen {
    pub fn at(now: Millis) -> Frozen {
        Frozen {
            now,
            ..Frozen::default()
        }
    }
}

impl Clock for Frozen {
    fn now(&self) -> Millis {
        self.now
    }

    fn today(&self) -> Day {
        self.today
    }

    fn unix_ms(&self) -> i64 {
        self.unix_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_from_unix_seconds_changes_exactly_at_midnight() {
        // 2024-06-01T00:00:00Z = 1717200000.
        assert_eq!(Day::from_unix_seconds(1_717_199_999), Day(19_874));
        assert_eq!(Day::from_unix_seconds(1_717_200_000), Day(19_875));
        assert_eq!(Day::seconds_until_next(1_717_199_999), 1);
        assert_eq!(Day::seconds_until_next(1_717_200_000), 86_400);
    }

    #[test]
    fn instants_map_onto_one_origin() {
        let before = origin();
        let later = before + std::time::Duration::from_millis(1500);
        assert_eq!(at(later), Millis(1500));
        assert_eq!(at(before), Millis(0));
        assert_eq!(Millis(10).until(Millis(25)), 15);
        assert_eq!(Millis(25).until(Millis(10)), 0);
    }
}
