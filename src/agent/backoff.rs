//! Exponential backoff with jitter for every retry loop of the agent: backend health, warm-up,
//! authentication, control sessions and tunnel connections.
//!
//! Control sessions reconnect from 1 s up to 30 s, as the seed says (run-several-routers, "Connect
//! agents to every router"), not the tunnels' 250 ms..2 s: with every agent holding a session with
//! every router of a site, and discovery dialing routers the agent only heard of, a router that
//! stays down is retried by agents × routers sessions, and a fast retry there costs more than the
//! seconds it saves after a restart. Tunnels keep 250 ms..2 s: the seed does not cover them, and
//! they reconnect only while their router's session is up.
//!
//! Pure: the caller passes the random draw (`0.0..=1.0`) so the bounds are testable, and decides
//! when to [`Backoff::reset`] (after a connection that stayed up long enough).
//!
//! Invariant: every delay lies in `[initial, max]`.

use std::time::Duration;

/// Control sessions: 1 s doubling to 30 s, with jitter (seed, "Connect agents to every router").
pub const SESSION_INITIAL: Duration = Duration::from_secs(1);
pub const SESSION_MAX: Duration = Duration::from_secs(30);
/// Tunnels and session-token refreshes: 250 ms doubling to 2 s. A router that restarts is back
/// within seconds and should have its agents back as soon (with a 30 s cap they take ~16 s); a
/// refused connect to a router that is down costs it next to nothing, even from many agents.
pub const RECONNECT_INITIAL: Duration = Duration::from_millis(250);
pub const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// A connection that stayed up this long resets its backoff.
pub const RECONNECT_RESET_AFTER: Duration = Duration::from_secs(30);
/// Backend readiness (health, discovery, warm-up): 500 ms doubling to 10 s; engines load models
/// for minutes, and a short cap registers the agent soon after the engine is ready.
pub const READINESS_INITIAL: Duration = Duration::from_millis(500);
pub const READINESS_MAX: Duration = Duration::from_secs(10);

/// Spread of the jitter around the exponential step: the delay is `step * (1 ± JITTER)`, so
/// agents restarted together do not retry in lock-step.
const JITTER: f64 = 0.2;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        assert!(!initial.is_zero() && initial <= max, "backoff bounds");
        Backoff {
            initial,
            max,
            attempt: 0,
        }
    }

    /// A control session's reconnects ([`SESSION_INITIAL`]..[`SESSION_MAX`]).
    pub fn session() -> Backoff {
        Backoff::new(SESSION_INITIAL, SESSION_MAX)
    }

    /// Tunnels and refreshes ([`RECONNECT_INITIAL`]..[`RECONNECT_MAX`]).
    pub fn reconnect() -> Backoff {
        Backoff::new(RECONNECT_INITIAL, RECONNECT_MAX)
    }

    pub fn readiness() -> Backoff {
        Backoff::new(READINESS_INITIAL, READINESS_MAX)
    }

    /// The delay before the next attempt; `random` is a uniform draw in `0.0..=1.0`.
    pub fn next_delay(&mut self, random: f64) -> Duration {
        let exponent = self.attempt.min(20) as i32;
        self.attempt = self.attempt.saturating_add(1);
        let step = (self.initial.as_secs_f64() * 2f64.powi(exponent)).min(self.max.as_secs_f64());
        let factor = 1.0 - JITTER + 2.0 * JITTER * random.clamp(0.0, 1.0);
        Duration::from_secs_f64(step * factor).clamp(self.initial, self.max)
    }

    /// The delay with a draw from `fastrand`.
    pub fn next_delay_random(&mut self) -> Duration {
        self.next_delay(fastrand::f64())
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_within_bounds() {
        let mut low = Backoff::reconnect();
        let mut high = Backoff::reconnect();
        let lows: Vec<Duration> = (0..8).map(|_| low.next_delay(0.0)).collect();
        let highs: Vec<Duration> = (0..8).map(|_| high.next_delay(1.0)).collect();
        assert_eq!(lows[0], Duration::from_millis(250), "never below initial");
        assert_eq!(highs[0], Duration::from_millis(300));
        assert_eq!(lows[1], Duration::from_millis(400));
        assert_eq!(highs[2], Duration::from_millis(1200));
        for (low, high) in lows.iter().zip(&highs) {
            assert!(low <= high);
            assert!(*low >= RECONNECT_INITIAL && *high <= RECONNECT_MAX);
        }
        assert_eq!(highs[7], RECONNECT_MAX, "capped at max");
        assert_eq!(lows[7], Duration::from_millis(1600));
    }

    #[test]
    fn sessions_back_off_from_one_second_to_thirty() {
        let mut low = Backoff::session();
        let mut high = Backoff::session();
        let lows: Vec<Duration> = (0..8).map(|_| low.next_delay(0.0)).collect();
        let highs: Vec<Duration> = (0..8).map(|_| high.next_delay(1.0)).collect();
        assert_eq!(lows[0], SESSION_INITIAL, "never below 1 s");
        assert_eq!(highs[0], Duration::from_millis(1200));
        assert_eq!(lows[1], Duration::from_millis(1600));
        assert_eq!(highs[4], Duration::from_millis(19_200));
        assert_eq!(highs[5], SESSION_MAX, "capped at 30 s");
        assert_eq!(lows[7], Duration::from_secs(24));
        for (low, high) in lows.iter().zip(&highs) {
            assert!(*low >= SESSION_INITIAL && *high <= SESSION_MAX);
        }
    }

    #[test]
    fn reset_starts_over_and_huge_attempts_do_not_overflow() {
        let mut backoff = Backoff::reconnect();
        for _ in 0..1000 {
            let delay = backoff.next_delay(0.5);
            assert!(delay <= RECONNECT_MAX);
        }
        backoff.reset();
        assert_eq!(backoff.attempt(), 0);
        assert_eq!(backoff.next_delay(0.5), Duration::from_millis(250));
        // Out-of-range draws are clamped, not trusted.
        assert_eq!(backoff.next_delay(7.0), Duration::from_millis(600));
    }
}
