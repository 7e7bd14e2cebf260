//! One process per router ID (issue 37, finding 4): two processes started with one
//! `--router-id` wrote one heartbeat field, one pool holding and one daily field between them,
//! and the others counted them as one router. Each process now claims its router ID in the store
//! (`hivenet:{site}:owner:{router}`, `SET NX` with an expiry of [`ttl`], renewed by each round)
//! under a value of its own ([`value`]), and the rules here say what it does with what it reads.
//!
//! # Rules
//! - At start ([`AtStart`]): a claim held by another process is waited on for its whole expiry
//!   plus one sync interval. A process that crashed renews nothing, so its claim expires within
//!   that wait and the new process takes the ID (a restart after a crash still works). A claim
//!   still held after it was renewed: another process is alive under this ID, and this one
//!   refuses to start, naming it.
//! - At run time: a round that reads another process's value in the claim (this process was cut
//!   off from the store past the expiry, and another one started meanwhile) steps down: it stops
//!   writing to the store and enforces its share of every limit alone, as during an outage,
//!   until the claim is free again (the other process stopped).
//!
//! Pure: what the store answered and the time come in, decisions go out.

use std::time::Duration;

use super::site::MISSED_ROUNDS;

/// The shortest claim: a round late by a slow store or a busy machine must not let it lapse.
pub const TTL_MIN: Duration = Duration::from_secs(2);

/// How long a claim lasts without renewal: the heartbeat's live window (three sync intervals), at
/// least [`TTL_MIN`].
pub fn ttl(interval: Duration) -> Duration {
    (interval * MISSED_ROUNDS).max(TTL_MIN)
}

/// This process's claim value: random, so two processes never share one, and readable, so the
/// other process's log names this one (`{random} pid {pid} on {host}, peer ID {peer}`).
pub fn value(random: u64, pid: u32, host: &str, peer_id: &str) -> String {
    format!("{random:016x} pid {pid} on {host}, peer ID {peer_id}")
}

/// What a start-up does after one look at the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// This process holds the router ID.
    Ours,
    /// Look again shortly: the claim is free but was not taken yet, or another process's claim
    /// may still expire.
    Wait,
    /// Another process renewed its claim: it runs. Holds its value.
    Refuse(String),
}

/// The start-up's look at the claim, over successive reads.
#[derive(Debug, Clone)]
pub struct AtStart {
    mine: String,
    /// How long another process's claim is waited on: its expiry plus one sync interval.
    patience_ms: u64,
    /// The other process's value and when it was first read.
    other: Option<(String, u64)>,
}

impl AtStart {
    pub fn new(mine: &str, interval: Duration) -> AtStart {
        AtStart {
            mine: mine.to_owned(),
            patience_ms: (ttl(interval) + interval).as_millis() as u64,
            other: None,
        }
    }

    /// One read of the claim (after this process's `SET NX`): `holder` is who holds it.
    pub fn read(&mut self, now_ms: u64, holder: Option<&str>) -> Decision {
        let Some(holder) = holder else {
            return Decision::Wait;
        };
        if holder == self.mine {
            return Decision::Ours;
        }
        match &self.other {
            // The same process's claim, read before: still there past its expiry, so renewed.
            Some((other, since)) if other == holder => {
                if now_ms.saturating_sub(*since) > self.patience_ms {
                    Decision::Refuse(holder.to_owned())
                } else {
                    Decision::Wait
                }
            }
            // A first read, or another process took it meanwhile: wait from now.
            _ => {
                self.other = Some((holder.to_owned(), now_ms));
                Decision::Wait
            }
        }
    }

    /// The longest a start-up may wait on a claim, for the log.
    pub fn patience(&self) -> Duration {
        Duration::from_millis(self.patience_ms)
    }
}

/// A round's read of the claim: `None` while this process holds it, else the holder's value.
/// A claim read empty was released by this process's own last round.
pub fn other_holder<'a>(mine: &str, holder: Option<&'a str>) -> Option<&'a str> {
    holder.filter(|holder| *holder != mine)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_claim_lasts_three_intervals_and_at_least_two_seconds() {
        assert_eq!(ttl(Duration::from_millis(200)), TTL_MIN);
        assert_eq!(ttl(SECOND), 3 * SECOND);
        assert_eq!(ttl(10 * SECOND), 30 * SECOND);
    }

    #[test]
    fn a_free_claim_is_ours_at_once() {
        let mine = value(1, 10, "host-a", "peer-a");
        let mut start = AtStart::new(&mine, SECOND);
        assert_eq!(start.read(0, Some(&mine)), Decision::Ours);
    }

    #[test]
    fn a_crashed_process_claim_is_waited_out() {
        let mine = value(1, 10, "host-a", "peer-a");
        let crashed = value(2, 11, "host-a", "peer-a");
        let mut start = AtStart::new(&mine, SECOND);
        assert_eq!(start.patience(), 4 * SECOND);
        assert_eq!(start.read(0, Some(&crashed)), Decision::Wait);
        assert_eq!(start.read(2_500, Some(&crashed)), Decision::Wait);
        // It expired: this process's SET NX took it.
        assert_eq!(start.read(3_000, Some(&mine)), Decision::Ours);
    }

    #[test]
    fn a_claim_renewed_past_its_expiry_refuses_the_start() {
        let mine = value(1, 10, "host-a", "peer-a");
        let running = value(2, 11, "host-b", "peer-b");
        let mut start = AtStart::new(&mine, SECOND);
        assert_eq!(start.read(100, Some(&running)), Decision::Wait);
        assert_eq!(start.read(4_100, Some(&running)), Decision::Wait);
        assert_eq!(
            start.read(4_101, Some(&running)),
            Decision::Refuse(running.clone())
        );
        assert!(running.contains("pid 11 on host-b"), "{running}");
    }

    #[test]
    fn another_holder_restarts_the_wait_and_an_empty_read_waits() {
        let mine = value(1, 10, "h", "p");
        let (first, second) = (value(2, 11, "h", "p"), value(3, 12, "h", "p"));
        let mut start = AtStart::new(&mine, SECOND);
        assert_eq!(start.read(0, Some(&first)), Decision::Wait);
        assert_eq!(start.read(3_000, None), Decision::Wait);
        assert_eq!(start.read(3_500, Some(&second)), Decision::Wait);
        assert_eq!(start.read(7_000, Some(&second)), Decision::Wait);
        assert_eq!(
            start.read(7_501, Some(&second)),
            Decision::Refuse(second.clone())
        );
    }

    #[test]
    fn a_round_reads_who_else_holds_the_id() {
        assert_eq!(other_holder("me", Some("me")), None);
        assert_eq!(other_holder("me", None), None);
        assert_eq!(other_holder("me", Some("other")), Some("other"));
    }
}
