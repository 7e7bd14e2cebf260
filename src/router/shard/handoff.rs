//! Handing a client connection to the shard that owns its key.
//!
//! A request whose key has limits visits the key's owner twice or three times (`Visit::Quota` at
//! admission, `Visit::Settle` before a buffered answer, or the release notice of a stream): with
//! the owner on another shard, each is a message, an answer and usually a wake-up
//! (`perf/notes/2026-12-06-shard-scaling.md`: a remote key costs a JSON request 1.22x the
//! instructions of a local one). An SDK client sends every request of a keep-alive connection
//! with the same key, so the shard that accepts a connection reads its first request's head and,
//! when the key is limited and owned elsewhere, gives the connection itself to the owner: the
//! socket and the bytes read so far, over the mesh, before anything of the request has run. The
//! owner serves it from the first request on, and every request with that key is local to it.
//!
//! Only the first request decides: a connection whose later requests use other keys stays where
//! it went (each of those visits its owner as before). A connection moves at most once.
//!
//! Load: keys do not spread evenly when one tenant is most of the traffic. A shard gives a
//! connection away only while the owner holds no more than [`SLACK`] connections (or an eighth)
//! more than the giver would keep ([`worth_moving`]); past that it serves the connection itself,
//! with the visits. So a hot key costs at most that imbalance, never one core doing every
//! request.
//!
//! Off with `--connection-handoff off` (`HIVENET_ROUTER_CONNECTION_HANDOFF`), and with one shard.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::BytesMut;

use crate::router::metrics::ShardMetrics;
use crate::router::shard::messages::ShardToShard;
use crate::router::shard::state::Shard;

/// A client connection on its way to another shard: the socket, out of the giver's runtime, and
/// what was read of it (the first request's head at least). Boxed in the message: the mesh's
/// messages stay the size of a visit.
#[derive(Debug)]
pub struct Handoff {
    pub socket: std::net::TcpStream,
    pub read: BytesMut,
    pub peer: Option<std::net::IpAddr>,
}

/// How many connections an owner may hold beyond what the giver keeps before the giver stops
/// handing it more (the larger of this and an eighth of the giver's).
pub const SLACK: i64 = 8;

/// How many client connections each shard serves or is about to: its open ones, and those
/// another shard gave it that it has not taken yet. Read to keep a hot key from piling every
/// connection onto its owner. Its own counters, not `hivenet_shard_connections_open`: a burst of
/// connections (a client opening 64 at once) is given away before the owner takes any, and
/// counts that left out the ones in transit let one shard give it nearly all of them (measured:
/// 56 of 64 connections on one shard, its throughput 0.84x). Present when connections may move.
#[derive(Debug, Clone)]
pub struct Loads {
    shards: Arc<[Load]>,
}

/// One shard's count, on a cache line of its own: its shard writes it for every connection it
/// opens or closes, the others only when they give it one.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Load(AtomicI64);

impl Loads {
    /// `None` with fewer than two shards: there is nowhere to move to.
    pub fn new(shards: usize) -> Option<Loads> {
        (shards > 1).then(|| Loads {
            shards: (0..shards).map(|_| Load::default()).collect(),
        })
    }

    /// A connection opened on `shard`, or closed there (`-1`).
    pub fn add(&self, shard: usize, connections: i64) {
        if let Some(load) = self.shards.get(shard) {
            load.0.fetch_add(connections, Ordering::Relaxed);
        }
    }

    fn of(&self, shard: usize) -> i64 {
        self.shards
            .get(shard)
            .map_or(i64::MAX, |load| load.0.load(Ordering::Relaxed))
    }

    /// May `giver` hand one of its connections to `owner`? (One relaxed load each: two shards
    /// deciding at once may each move one more than the rule allows, never lose one.)
    pub fn may_move(&self, giver: usize, owner: usize) -> bool {
        worth_moving(self.of(giver), self.of(owner))
    }
}

impl Shard {
    /// The shard a connection whose first request presents `key` should move to, if any: the
    /// key is limited, owned elsewhere, and that owner is not too busy ([`Loads::may_move`]).
    pub fn handoff_target(&self, key: &crate::logic::auth::keys::KeyRecord) -> Option<usize> {
        let loads = self.settings.handoff.as_ref()?;
        if self.lifecycle.is_draining() || !crate::router::shard::owner::quotas::is_limited(key) {
            return None;
        }
        let owner = key.tenant_id.owner(self.count);
        (owner != self.id && loads.may_move(self.id, owner)).then_some(owner)
    }

    /// Gives the connection to shard `to`; hands it back when the ring there is full or other
    /// messages already wait for room (the caller then serves it itself).
    pub fn hand_off(&self, to: usize, handoff: Handoff) -> Result<(), Handoff> {
        let mut outbox = self.outbox.borrow_mut();
        if outbox.has_deferred() {
            return Err(handoff);
        }
        let loads = self.settings.handoff.as_ref();
        // Counted on the owner from now on, so the next decisions here and there see it.
        loads.inspect(|loads| loads.add(to, 1));
        match outbox.send(to, ShardToShard::Connection(Box::new(handoff))) {
            Ok(()) => {
                ShardMetrics::add(&self.metrics.connections_handed_off_total, 1);
                Ok(())
            }
            Err(ShardToShard::Connection(handoff)) => {
                loads.inspect(|loads| loads.add(to, -1));
                Err(*handoff)
            }
            Err(_) => unreachable!("the mesh hands back the message it was given"),
        }
    }
}

/// Whether a connection counted in `giver_open` should move to a shard holding `owner_open`:
/// after the move the owner may hold at most [`SLACK`] (or an eighth of the giver's) more than
/// the giver.
pub fn worth_moving(giver_open: i64, owner_open: i64) -> bool {
    let giver_after = giver_open.saturating_sub(1);
    let owner_after = owner_open.saturating_add(1);
    owner_after <= giver_after.saturating_add(SLACK.max(giver_after / 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_owner_takes_the_connection() {
        assert!(worth_moving(1, 0));
        assert!(worth_moving(40, 10));
    }

    #[test]
    fn a_busy_owner_is_left_alone_past_the_slack() {
        // After the move: giver 0, owner 8 (the slack) ... 9.
        assert!(worth_moving(1, 7));
        assert!(!worth_moving(1, 8));
        // After the move: giver 799, an eighth of it 99; owner 898 ... 899.
        assert!(worth_moving(800, 897));
        assert!(!worth_moving(800, 898));
    }

    #[test]
    fn one_hot_key_keeps_the_shards_within_the_slack() {
        // 2 shards, the kernel's accepts alternate, every connection's key owned by shard 0:
        // shard 1 gives what it accepts away until the owner holds the slack more.
        let mut open = [0i64, 0];
        for accepted in 0..1_000 {
            let front = accepted % 2;
            open[front] += 1;
            if front == 1 && worth_moving(open[1], open[0]) {
                open[1] -= 1;
                open[0] += 1;
            }
        }
        assert_eq!(open[0] + open[1], 1_000);
        let gap = open[0] - open[1];
        assert!((0..=SLACK.max(open[1] / 8) + 1).contains(&gap), "{open:?}");
        assert!(open[1] > 400, "{open:?}");
    }

    #[test]
    fn a_shard_that_is_not_there_takes_nothing() {
        let loads = Loads::new(2).unwrap();
        loads.add(0, 1);
        assert!(loads.may_move(0, 1));
        assert!(!loads.may_move(0, 7));
        assert!(Loads::new(1).is_none());
    }

    #[test]
    fn a_burst_given_away_before_the_owner_takes_any_stops_at_the_slack() {
        // 32 connections open on shard 0 at once, every key owned by shard 1, which has taken
        // none of them yet: the ones in transit count on it.
        let loads = Loads::new(2).unwrap();
        loads.add(0, 32);
        let mut given = 0;
        for _ in 0..32 {
            if loads.may_move(0, 1) {
                loads.add(1, 1);
                loads.add(0, -1);
                given += 1;
            }
        }
        assert_eq!((loads.of(0), loads.of(1)), (32 - given, given));
        assert!(loads.of(1) - loads.of(0) <= SLACK, "{given}");
        assert!(given >= 16, "{given}");
    }
}
