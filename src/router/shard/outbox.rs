//! Sending to other shards: the mesh endpoint, and the bounded queues of messages that found
//! their ring full.
//!
//! A mesh ring is shallow when there are many shards (`mesh::ring_capacity`), so a full ring is a
//! burst to absorb, not a refusal: a message that finds its ring full waits in the queue for that
//! shard and goes, in order, as soon as the ring drains. Every message to a shard goes behind
//! what already waits for it, so each pair of shards keeps its order; a shard that stops draining
//! holds up only what is sent to it. The queues are bounded together:
//! - past [`DEFERRED_CONGESTED`] messages new visits to other shards are refused (`503
//!   queue_full`, `hivenet_shard_mesh_full_total`): nothing is held for them yet, and requests
//!   that would add to the backlog stop coming in;
//! - at [`DEFERRED_MAX`] a message is dropped and handed back to the caller as an
//!   [`Overflow`] (logged, `hivenet_shard_mesh_dropped_total`). Answers and notices must not be
//!   lost (a lost release leaks a slot): reaching it means another shard has stopped draining its
//!   rings for a long time, and the reservation reaper gives back the occupancy a dropped release
//!   held.
//!
//! Memory: a queue allocates only when its ring is full, and one that held more than
//! [`KEPT_WHEN_EMPTY`] messages gives the room back once it empties; at the bound the queues hold
//! [`DEFERRED_MAX`] messages of 144 bytes (9.4 MB), only while a shard is not draining.

use std::collections::VecDeque;

use crate::router::shard::mesh::Endpoint;
use crate::router::shard::messages::ShardToShard;

/// Deferred messages past which visits to other shards are refused.
pub const DEFERRED_CONGESTED: usize = 4096;

/// The most deferred messages kept, to all shards together: several full inbound budgets
/// (`mesh::INBOUND_PER_SHARD`) behind a shard that is not draining.
pub const DEFERRED_MAX: usize = 65_536;

/// Room a queue keeps once it empties; a burst past it is given back.
pub const KEPT_WHEN_EMPTY: usize = 64;

/// A message the deferred queues had no room for.
#[derive(Debug)]
pub struct Overflow(pub ShardToShard);

pub struct Outbox {
    endpoint: Endpoint<ShardToShard>,
    deferred: Deferred<ShardToShard>,
}

impl Outbox {
    pub fn new(endpoint: Endpoint<ShardToShard>) -> Outbox {
        let shards = endpoint.shards();
        Outbox {
            endpoint,
            deferred: Deferred::new(shards, DEFERRED_CONGESTED, DEFERRED_MAX),
        }
    }

    pub fn endpoint(&mut self) -> &mut Endpoint<ShardToShard> {
        &mut self.endpoint
    }

    pub fn has_inbound(&self) -> bool {
        self.endpoint.has_inbound()
    }

    /// Sends `wrap(message)` at once, or hands `message` back unwrapped (the ring is full, or
    /// messages to `to` already wait); see [`Endpoint::send_wrapped`].
    pub fn send_wrapped<M>(
        &mut self,
        to: usize,
        message: M,
        wrap: impl FnOnce(M) -> ShardToShard,
    ) -> Result<(), M> {
        if self.deferred.holds_for(to) {
            return Err(message);
        }
        self.endpoint.send_wrapped(to, message, wrap)
    }

    /// Sends, or queues behind what already waits for `to`; `Err` only at [`DEFERRED_MAX`].
    #[allow(clippy::result_large_err)]
    pub fn send_or_defer(&mut self, to: usize, message: ShardToShard) -> Result<(), Overflow> {
        if self.deferred.holds_for(to) {
            return self.deferred.push(to, message).map_err(Overflow);
        }
        match self.endpoint.send_returning(to, message) {
            Ok(()) => Ok(()),
            Err(message) => self.defer(to, message),
        }
    }

    /// Queues a message whose ring is full. The first one deferred wakes this shard's mesh
    /// task if it waits on its doorbell: that task is what sends the queues once the rings
    /// drain, and the owner draining them rings nothing here.
    #[allow(clippy::result_large_err)]
    fn defer(&mut self, to: usize, message: ShardToShard) -> Result<(), Overflow> {
        let first = self.deferred.is_empty();
        self.deferred.push(to, message).map_err(Overflow)?;
        if first {
            self.endpoint.wake_own();
        }
        Ok(())
    }

    /// Sends `wrap(message)`, or queues it behind what already waits for `to`; hands `message`
    /// back unwrapped only at [`DEFERRED_MAX`].
    pub fn send_or_defer_wrapped<M>(
        &mut self,
        to: usize,
        message: M,
        wrap: impl FnOnce(M) -> ShardToShard,
    ) -> Result<(), M> {
        if self.deferred.is_full() {
            return Err(message);
        }
        let sent = self.send_or_defer(to, wrap(message));
        debug_assert!(sent.is_ok(), "the bound was checked before");
        Ok(())
    }

    /// Sends what was deferred, oldest first for each shard, until its ring is full again.
    pub fn flush(&mut self) {
        if self.deferred.is_empty() {
            return;
        }
        for to in 0..self.deferred.queues.len() {
            while let Some(message) = self.deferred.pop(to) {
                if let Err(message) = self.endpoint.send_returning(to, message) {
                    self.deferred.push_front(to, message);
                    break;
                }
            }
        }
    }

    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Too much is deferred: visits to other shards are refused until it drains.
    pub fn is_congested(&self) -> bool {
        self.deferred.is_congested()
    }

    pub fn deferred_len(&self) -> usize {
        self.deferred.len()
    }
}

/// A FIFO per receiving shard, with a congestion mark and a hard bound on all of them together.
#[derive(Debug)]
struct Deferred<T> {
    queues: Vec<VecDeque<T>>,
    /// What all the queues hold.
    len: usize,
    congested: usize,
    max: usize,
}

impl<T> Deferred<T> {
    fn new(shards: usize, congested: usize, max: usize) -> Deferred<T> {
        debug_assert!(congested <= max);
        Deferred {
            queues: (0..shards).map(|_| VecDeque::new()).collect(),
            len: 0,
            congested,
            max,
        }
    }

    /// Whether anything waits for `to`: a message to it must go behind.
    fn holds_for(&self, to: usize) -> bool {
        !self.queues[to].is_empty()
    }

    /// Queues at the back of `to`'s queue; hands the item back at the bound.
    fn push(&mut self, to: usize, item: T) -> Result<(), T> {
        if self.len >= self.max {
            return Err(item);
        }
        self.queues[to].push_back(item);
        self.len += 1;
        Ok(())
    }

    /// Puts back at the front what was just popped (never over the bound: it was in).
    fn push_front(&mut self, to: usize, item: T) {
        self.queues[to].push_front(item);
        self.len += 1;
    }

    fn pop(&mut self, to: usize) -> Option<T> {
        let queue = &mut self.queues[to];
        let item = queue.pop_front()?;
        self.len -= 1;
        if queue.is_empty() && queue.capacity() > KEPT_WHEN_EMPTY {
            queue.shrink_to(KEPT_WHEN_EMPTY);
        }
        Some(item)
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_congested(&self) -> bool {
        self.len >= self.congested
    }

    fn is_full(&self) -> bool {
        self.len >= self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::{ModelId, Ticket};
    use crate::router::shard::mesh::{Mesh, ring_capacity};
    use crate::router::shard::owner::Notice;

    fn cancel(sequence: u64) -> ShardToShard {
        ShardToShard::Notice(Notice::Cancel {
            ticket: Ticket { shard: 0, sequence },
            model: ModelId(1),
        })
    }

    fn sequence_of(message: &ShardToShard) -> u64 {
        match message {
            ShardToShard::Notice(Notice::Cancel { ticket, .. }) => ticket.sequence,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_deferred_queues_mark_congestion_then_refuse_past_their_bound_together() {
        let mut deferred = Deferred::new(3, 2, 3);
        assert!(deferred.push(1, 10).is_ok());
        assert!(!deferred.is_congested());
        assert!(deferred.push(2, 20).is_ok());
        assert!(deferred.is_congested());
        assert!(deferred.push(1, 11).is_ok());
        assert!(deferred.is_full());
        assert_eq!(deferred.push(2, 21), Err(21));
        assert_eq!(deferred.pop(2), Some(20));
        assert!(deferred.push(1, 12).is_ok());
        assert_eq!(deferred.len(), 3);
        assert_eq!(deferred.pop(1), Some(10));
        assert_eq!(deferred.pop(1), Some(11));
        assert_eq!(deferred.pop(1), Some(12));
        assert_eq!(deferred.pop(2), None);
        assert!(deferred.is_empty());
    }

    #[test]
    fn a_full_ring_defers_in_order_and_a_full_queue_hands_the_message_back() {
        let mut endpoints = Mesh::build::<ShardToShard>(2).unwrap();
        let mut receiver = endpoints.pop().unwrap();
        let mut outbox = Outbox::new(endpoints.pop().unwrap());
        let mut sent = 0;
        while sent < ring_capacity(2) as u64 + DEFERRED_MAX as u64 {
            outbox.send_or_defer(1, cancel(sent)).unwrap();
            sent += 1;
        }
        assert_eq!(outbox.deferred_len(), DEFERRED_MAX);
        assert!(outbox.is_congested());
        let Err(Overflow(refused)) = outbox.send_or_defer(1, cancel(sent)) else {
            panic!("the bound let one more in")
        };
        assert_eq!(sequence_of(&refused), sent);
        let wrapped = outbox.send_or_defer_wrapped(1, sent, cancel);
        assert_eq!(wrapped, Err(sent), "the bound let a wrapped one in");

        // The receiver drains; the deferred messages follow in the order they were sent.
        let mut received = Vec::new();
        while received.len() < sent as usize {
            while let Some((_, message)) = receiver.pop() {
                received.push(sequence_of(&message));
            }
            outbox.flush();
        }
        assert_eq!(received, (0..sent).collect::<Vec<_>>());
        assert!(!outbox.has_deferred());
        assert!(!outbox.is_congested());
        assert!(
            outbox.deferred.queues[1].capacity() <= KEPT_WHEN_EMPTY,
            "the burst's room was kept"
        );
    }

    #[test]
    fn the_first_message_deferred_wakes_the_shards_own_mesh_task() {
        use std::io::Read;
        let mut endpoints = Mesh::build::<ShardToShard>(2).unwrap();
        let _receiver = endpoints.pop().unwrap();
        let mut endpoint = endpoints.pop().unwrap();
        let (socket, sleeper) = endpoint.waiter().into_parts();
        let mut outbox = Outbox::new(endpoint);
        for sequence in 0..ring_capacity(2) as u64 {
            outbox.send_or_defer(1, cancel(sequence)).unwrap();
        }
        let mut byte = [0u8; 8];
        // The mesh task waits on its doorbell, as it does with nothing deferred.
        sleeper.sleep();
        outbox.send_or_defer(1, cancel(u64::MAX)).unwrap();
        assert_eq!(
            (&socket).read(&mut byte).expect("woken"),
            1,
            "a deferred message left for a mesh task nobody wakes"
        );
        // It is awake now and sends the queue as the ring drains: no more rings.
        sleeper.wake();
        outbox.send_or_defer(1, cancel(u64::MAX - 1)).unwrap();
        assert!((&socket).read(&mut byte).is_err(), "rung again");
    }

    #[test]
    fn a_shard_that_stops_draining_holds_up_only_what_is_sent_to_it() {
        let mut endpoints = Mesh::build::<ShardToShard>(3).unwrap();
        let mut draining = endpoints.pop().unwrap();
        let mut stopped = endpoints.pop().unwrap();
        let mut outbox = Outbox::new(endpoints.pop().unwrap());
        let burst = ring_capacity(3) as u64 + 100;
        for sequence in 0..burst {
            outbox
                .send_or_defer_wrapped(1, sequence, cancel)
                .expect("deferred, not refused");
        }
        assert_eq!(outbox.deferred_len(), 100);

        // Shard 2 hears at once, though shard 1's queue is not empty.
        outbox.send_or_defer(2, cancel(7)).unwrap();
        let Some((0, message)) = draining.pop() else {
            panic!("held up behind another shard's backlog")
        };
        assert_eq!(sequence_of(&message), 7);
        assert_eq!(outbox.deferred_len(), 100);

        // A wrapped send to shard 1 may not overtake what waits for it; to shard 2 it goes.
        assert_eq!(outbox.send_wrapped(1, burst, cancel), Err(burst));
        outbox.send_wrapped(2, 8, cancel).unwrap();

        // Shard 1 drains at last: everything, in order, the deferred after the ring's.
        let mut received = Vec::new();
        while received.len() < burst as usize {
            while let Some((_, message)) = stopped.pop() {
                received.push(sequence_of(&message));
            }
            outbox.flush();
        }
        assert_eq!(received, (0..burst).collect::<Vec<_>>());
        assert!(!outbox.has_deferred());
    }
}
