//! Rate-limited log lines for events a peer can cause at will (a refused tunnel connection, a
//! failed accept): at most one line per interval for one kind of event, and that line says how
//! many were left out since the previous one, so a flood costs the log one line per interval
//! instead of one per event, and the operator still learns its size.
//!
//! Owns the decision only: the caller passes the monotonic time in and writes the line. Must not
//! read a clock or log. Invariant: every noted event is either the one a line is written for or
//! counted in the next line's `suppressed`.

use std::time::{Duration, Instant};

/// One kind of event's line budget.
#[derive(Debug, Clone)]
pub struct LogLimit {
    /// At most one line per this long.
    interval: Duration,
    last_line_at: Option<Instant>,
    /// Events noted since the last line and not logged.
    suppressed: u64,
}

impl LogLimit {
    pub const fn new(interval: Duration) -> LogLimit {
        LogLimit {
            interval,
            last_line_at: None,
            suppressed: 0,
        }
    }

    /// Notes one event at `now`. `Some(suppressed)`: write a line for it now, saying that
    /// `suppressed` events were left out since the previous line. `None`: leave it out.
    pub fn note(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_line_at
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            self.suppressed += 1;
            return None;
        }
        self.last_line_at = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(10);

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let start = Instant::now();
        let mut limit = LogLimit::new(INTERVAL);
        assert_eq!(limit.note(start), Some(0));
        for second in 0..100 {
            let now = start + Duration::from_millis(second * 90);
            assert_eq!(limit.note(now), None, "at {second}");
        }
        // Exactly one interval after the first line: the next line, with the 100 left out.
        assert_eq!(limit.note(start + INTERVAL), Some(100));
        assert_eq!(limit.note(start + INTERVAL), None);
        // Quiet for a while: the next event is logged at once, with the one left out.
        assert_eq!(limit.note(start + INTERVAL * 5), Some(1));
        assert_eq!(limit.note(start + INTERVAL * 6), Some(0));
    }

    #[test]
    fn a_clock_that_seems_to_go_back_suppresses_rather_than_floods() {
        let start = Instant::now() + INTERVAL;
        let mut limit = LogLimit::new(INTERVAL);
        assert_eq!(limit.note(start), Some(0));
        assert_eq!(limit.note(start - Duration::from_secs(5)), None);
        assert_eq!(limit.note(start + INTERVAL), Some(1));
    }
}
