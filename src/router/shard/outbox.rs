//! Sending to other shards: the mesh endpoint, and the bounded queue of messages that found
//! their ring full.
//!
//! A visit that finds its ring full is refused (`503 queue_full`): nothing is held for it yet.
//! Answers and notices must not be lost (a lost release leaks a slot), so they wait in the
//! deferred queue and go first, in order, as soon as the rings drain. The queue is bounded:
//! - past [`DEFERRED_CONGESTED`] messages new visits to other shards are refused, so requests
//!   that would add to it stop coming in;
//! - at [`DEFERRED_MAX`] a message is dropped and handed back to the caller as an
//!   [`Overflow`] (logged, `hivenet_shard_mesh_dropped_total`). Reaching it means another shard
//!   has stopped draining its rings for a long time; the reservation reaper gives back the
//!   occupancy a dropped release held.

use std::collections::VecDeque;

use crate::router::shard::mesh::Endpoint;
use crate::router::shard::messages::ShardToShard;

/// Deferred messages past which visits to other shards are refused.
pub const DEFERRED_CONGESTED: usize = 4096;

/// The most deferred messages kept: with a ring of `mesh::RING_CAPACITY` (8192) per shard pair,
/// this is several full rings' worth behind a shard that is not draining.
pub const DEFERRED_MAX: usize = 65_536;

/// A message the deferred queue had no room for.
#[derive(Debug)]
pub struct Overflow(pub ShardToShard);

pub struct Outbox {
    endpoint: Endpoint<ShardToShard>,
    deferred: Deferred<(usize, ShardToShard)>,
}

impl Outbox {
    pub fn new(endpoint: Endpoint<ShardToShard>) -> Outbox {
        Outbox {
            endpoint,
            deferred: Deferred::new(DEFERRED_CONGESTED, DEFERRED_MAX),
        }
    }

    pub fn endpoint(&mut self) -> &mut Endpoint<ShardToShard> {
        &mut self.endpoint
    }

    pub fn has_inbound(&self) -> bool {
        self.endpoint.has_inbound()
    }

    /// Sends `wrap(message)` at once, or hands `message` back unwrapped (the ring is full);
    /// see [`Endpoint::send_wrapped`].
    pub fn send_wrapped<M>(
        &mut self,
        to: usize,
        message: M,
        wrap: impl FnOnce(M) -> ShardToShard,
    ) -> Result<(), M> {
        self.endpoint.send_wrapped(to, message, wrap)
    }

    /// Sends, or queues behind what is already deferred; `Err` only at [`DEFERRED_MAX`].
    #[allow(clippy::result_large_err)]
    pub fn send_or_defer(&mut self, to: usize, message: ShardToShard) -> Result<(), Overflow> {
        if !self.deferred.is_empty() {
            return self
                .deferred
                .push((to, message))
                .map_err(|(_, message)| Overflow(message));
        }
        match self.endpoint.send_returning(to, message) {
            Ok(()) => Ok(()),
            Err(message) => self
                .deferred
                .push((to, message))
                .map_err(|(_, message)| Overflow(message)),
        }
    }

    /// Sends what was deferred, oldest first, until a ring is full again.
    pub fn flush(&mut self) {
        while let Some((to, message)) = self.deferred.pop() {
            if let Err(message) = self.endpoint.send_returning(to, message) {
                self.deferred.push_front((to, message));
                break;
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

/// A FIFO with a congestion mark and a hard bound.
#[derive(Debug)]
struct Deferred<T> {
    queue: VecDeque<T>,
    congested: usize,
    max: usize,
}

impl<T> Deferred<T> {
    fn new(congested: usize, max: usize) -> Deferred<T> {
        debug_assert!(congested <= max);
        Deferred {
            queue: VecDeque::new(),
            congested,
            max,
        }
    }

    /// Queues at the back; hands the item back when full.
    fn push(&mut self, item: T) -> Result<(), T> {
        if self.queue.len() >= self.max {
            return Err(item);
        }
        self.queue.push_back(item);
        Ok(())
    }

    /// Puts back at the front what was just popped (never over the bound: it was in).
    fn push_front(&mut self, item: T) {
        self.queue.push_front(item);
    }

    fn pop(&mut self) -> Option<T> {
        self.queue.pop_front()
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn len(&self) -> usize {
        self.queue.len()
    }

    fn is_congested(&self) -> bool {
        self.queue.len() >= self.congested
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::{ModelId, Ticket};
    use crate::router::shard::mesh::{Mesh, RING_CAPACITY};
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
    fn the_deferred_queue_marks_congestion_then_refuses_past_its_bound() {
        let mut deferred = Deferred::new(2, 3);
        assert!(deferred.push(1).is_ok());
        assert!(!deferred.is_congested());
        assert!(deferred.push(2).is_ok());
        assert!(deferred.is_congested());
        assert!(deferred.push(3).is_ok());
        assert_eq!(deferred.push(4), Err(4));
        assert_eq!(deferred.pop(), Some(1));
        assert!(deferred.push(4).is_ok());
        assert_eq!(deferred.len(), 3);
    }

    #[test]
    fn a_full_ring_defers_in_order_and_a_full_queue_hands_the_message_back() {
        let mut endpoints = Mesh::build::<ShardToShard>(2).unwrap();
        let mut receiver = endpoints.pop().unwrap();
        let mut outbox = Outbox::new(endpoints.pop().unwrap());
        let mut sent = 0;
        while sent < RING_CAPACITY as u64 + DEFERRED_MAX as u64 {
            outbox.send_or_defer(1, cancel(sent)).unwrap();
            sent += 1;
        }
        assert_eq!(outbox.deferred_len(), DEFERRED_MAX);
        assert!(outbox.is_congested());
        let Err(Overflow(refused)) = outbox.send_or_defer(1, cancel(sent)) else {
            panic!("the bound let one more in")
        };
        assert_eq!(sequence_of(&refused), sent);

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
    }
}
