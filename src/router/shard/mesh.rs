//! The SPSC mesh: one bounded single-producer/single-consumer ring per ordered pair of shards, and
//! one doorbell per receiving shard.
//!
//! Key components: [`Mesh::build`] makes every ring up front (memory is sized at start-up, nothing
//! grows); each shard takes its [`Endpoint`]: `to[j]` producers and `from[i]` consumers, and its
//! [`Waiter`].
//!
//! Memory: a shard's inbound rings share one budget of [`INBOUND_PER_SHARD`] messages
//! ([`ring_capacity`]), so the mesh grows with the shard count, not with its square (up to 513
//! shards, see [`RING_MIN`]). With the router's 144-byte message that is 1.2 MB a shard (8192 ×
//! 144 B); a fixed 8192 a ring of the 208-byte message it had before would have been 1.7 MB a
//! *pair* — 95 MB at 8 shards, 6.9 GB at 64 — resident as soon as each ring carrying traffic
//! wrapped once. A ring's depth is a batching knob, not a limit on what is in flight: a message
//! that finds its ring full waits in the sender's outbox (`shard::outbox`).
//!
//! Wake-ups: a receiver that finds nothing to do raises its `sleeping` flag and waits on its own
//! end of a socket pair, read natively by its runtime. A sender rings (writes one byte) only when it
//! is the first to see the flag raised, so a burst of messages — or any message sent while the
//! receiver is busy — costs no system call and no wake-up at all. Both sides fence between the
//! ring operation and the flag, so a message is never stranded (see [`Sleeper::sleep`]).
//!
//! Why not the runtime's cross-thread waker: monoio's remote wake looks the target thread up in a
//! process-wide mutex-protected map on every call; that is a lock on the request path, taken by
//! every shard.
//!
//! Error handling: a full ring is a typed error ([`MeshFull`]) or hands the message back; it
//! never blocks and never grows.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering, fence};

/// Messages a shard's inbound rings hold between them: each of the `shards - 1` rings into a
/// shard holds its share ([`ring_capacity`]).
pub const INBOUND_PER_SHARD: usize = 8192;

/// The shallowest ring, however many shards: a receiver drains every ring each time it runs, so
/// a ring needs room for what one sender produces between two of its receiver's drains (with
/// hundreds of shards, a sender's share of one owner's traffic is small), and a burst beyond it
/// waits in the sender's outbox. Past 513 shards the floor makes the mesh grow with the square of
/// the shard count again: `n × (n − 1) × 16` messages, 600 MB at 512 shards.
pub const RING_MIN: usize = 16;

/// Messages each ring between two of `shards` shards holds before a sender finds it full: an
/// equal share of [`INBOUND_PER_SHARD`], at least [`RING_MIN`]. 8192 with two shards, 1170 with
/// 8, 130 with 64, 32 with 256; from 513 shards on, every ring is [`RING_MIN`] deep.
pub fn ring_capacity(shards: usize) -> usize {
    (INBOUND_PER_SHARD / shards.saturating_sub(1).max(1)).max(RING_MIN)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("mesh ring to shard {to} is full")]
pub struct MeshFull {
    pub to: usize,
}

struct Doorbell {
    /// Raised by the receiver just before it waits; the first sender to see it raised rings.
    sleeping: AtomicBool,
    /// The sending end of the receiver's socket pair (non-blocking).
    bell: UnixStream,
}

impl Doorbell {
    fn ring(&self) {
        // Pairs with the fence in `Sleeper::sleep`: either we see `sleeping` raised, or the
        // receiver sees our message when it re-checks its rings.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            // A full socket buffer means wake-ups are already pending: nothing is lost.
            let _ = (&self.bell).write(&[1]);
        }
    }
}

/// One shard's side of the mesh.
pub struct Endpoint<T> {
    shard: usize,
    to: Vec<Option<rtrb::Producer<T>>>,
    from: Vec<Option<rtrb::Consumer<T>>>,
    /// The ring [`Endpoint::pop`] reads first.
    cursor: usize,
    doorbells: Arc<[Doorbell]>,
    /// The receiving end of this shard's socket pair, until [`Endpoint::waiter`] takes it.
    bell_receiver: Option<UnixStream>,
}

pub struct Mesh;

impl Mesh {
    /// Builds the rings for `shard_count` shards; element `i` of the result belongs to shard `i`.
    pub fn build<T>(shard_count: usize) -> std::io::Result<Vec<Endpoint<T>>> {
        let mut receivers = Vec::with_capacity(shard_count);
        let mut doorbells = Vec::with_capacity(shard_count);
        for _ in 0..shard_count {
            let (bell, receiver) = UnixStream::pair()?;
            bell.set_nonblocking(true)?;
            receiver.set_nonblocking(true)?;
            doorbells.push(Doorbell {
                sleeping: AtomicBool::new(false),
                bell,
            });
            receivers.push(Some(receiver));
        }
        let doorbells: Arc<[Doorbell]> = doorbells.into();
        let capacity = ring_capacity(shard_count);
        let mut endpoints: Vec<Endpoint<T>> = (0..shard_count)
            .map(|shard| Endpoint {
                shard,
                to: (0..shard_count).map(|_| None).collect(),
                from: (0..shard_count).map(|_| None).collect(),
                cursor: 0,
                doorbells: doorbells.clone(),
                bell_receiver: receivers[shard].take(),
            })
            .collect();
        for sender in 0..shard_count {
            for receiver in 0..shard_count {
                if sender == receiver {
                    continue;
                }
                let (producer, consumer) = rtrb::RingBuffer::new(capacity);
                endpoints[sender].to[receiver] = Some(producer);
                endpoints[receiver].from[sender] = Some(consumer);
            }
        }
        Ok(endpoints)
    }
}

impl<T> Endpoint<T> {
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// How many shards the mesh joins.
    pub fn shards(&self) -> usize {
        self.to.len()
    }

    /// Sends to another shard. Sending to oneself is a bug: owners call local state directly.
    pub fn send(&mut self, to: usize, message: T) -> Result<(), MeshFull> {
        self.send_returning(to, message)
            .map_err(|_| MeshFull { to })
    }

    /// Like [`Endpoint::send`], but a full ring hands the message back so the caller can keep it.
    pub fn send_returning(&mut self, to: usize, message: T) -> Result<(), T> {
        let producer = self.to[to]
            .as_mut()
            .expect("mesh send to self or to a shard that does not exist");
        producer
            .push(message)
            .map_err(|rtrb::PushError::Full(message)| message)?;
        self.doorbells[to].ring();
        Ok(())
    }

    /// Sends `wrap(message)` when the ring to `to` has room; when it is full, hands `message`
    /// back as it came, unwrapped, so the caller gets its own type back and never has to match
    /// the mesh's message for the variant it sent. `wrap` runs only once room is certain (this
    /// is the ring's one producer: room it sees cannot be taken), so what it allocates is never
    /// thrown away.
    pub fn send_wrapped<M>(
        &mut self,
        to: usize,
        message: M,
        wrap: impl FnOnce(M) -> T,
    ) -> Result<(), M> {
        let producer = self.to[to]
            .as_mut()
            .expect("mesh send to self or to a shard that does not exist");
        let Ok(slot) = producer.write_chunk_uninit(1) else {
            return Err(message);
        };
        slot.fill_from_iter(std::iter::once(wrap(message)));
        self.doorbells[to].ring();
        Ok(())
    }

    /// Rings this shard's own doorbell, when its mesh task is waiting on it: something other than
    /// another shard's message needs that task (a message of its own deferred by another task).
    pub fn wake_own(&self) {
        self.doorbells[self.shard].ring();
    }

    /// Whether any ring into this shard holds a message.
    pub fn has_inbound(&self) -> bool {
        self.from
            .iter()
            .flatten()
            .any(|consumer| !consumer.is_empty())
    }

    /// The next message queued for this shard, with the shard that sent it: from the ring it read
    /// last while that one has any, then from the next in turn. The caller bounds how many it
    /// takes before it lets its other tasks run.
    ///
    /// One message at a time, not a drain into a closure or a buffer: the caller applies each
    /// with nothing of the mesh borrowed, so applying may send (an answer, a notice), and the
    /// message is moved once out of the ring rather than into a staging vector and out again.
    pub fn pop(&mut self) -> Option<(usize, T)> {
        let rings = self.from.len();
        for _ in 0..rings {
            let sender = self.cursor;
            if let Some(message) = self.from[sender]
                .as_mut()
                .and_then(|consumer| consumer.pop().ok())
            {
                return Some((sender, message));
            }
            self.cursor = (sender + 1) % rings;
        }
        None
    }

    /// This shard's doorbell, to wait on from its own runtime. Call once.
    pub fn waiter(&mut self) -> Waiter {
        Waiter {
            shard: self.shard,
            doorbells: self.doorbells.clone(),
            receiver: self
                .bell_receiver
                .take()
                .expect("the mesh waiter is taken once"),
        }
    }
}

/// Waits for one shard's doorbell.
pub struct Waiter {
    shard: usize,
    doorbells: Arc<[Doorbell]>,
    receiver: UnixStream,
}

impl Waiter {
    /// The parts the shard's runtime needs: the socket to read, and a handle that raises and
    /// lowers the flag.
    pub fn into_parts(self) -> (UnixStream, Sleeper) {
        (
            self.receiver,
            Sleeper {
                shard: self.shard,
                doorbells: self.doorbells,
            },
        )
    }
}

/// Raises and lowers a shard's `sleeping` flag.
pub struct Sleeper {
    shard: usize,
    doorbells: Arc<[Doorbell]>,
}

impl Sleeper {
    /// Raises the flag. Returns false when messages arrived meanwhile (`has_inbound` is checked by
    /// the caller after this, behind the fence): then lower it with [`Sleeper::wake`] and drain.
    pub fn sleep(&self) {
        self.doorbells[self.shard]
            .sleeping
            .store(true, Ordering::Relaxed);
        // Pairs with the fence in `Doorbell::ring`.
        fence(Ordering::SeqCst);
    }

    /// Lowers the flag (the receiver is awake again and will drain).
    pub fn wake(&self) {
        self.doorbells[self.shard]
            .sleeping
            .store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn delivers_between_threads_in_order_without_lost_wakeups() {
        let mut endpoints = Mesh::build::<u32>(2).unwrap();
        let mut receiver = endpoints.pop().unwrap();
        let mut sender = endpoints.pop().unwrap();
        let thread = std::thread::spawn(move || {
            for value in 0..100_000u32 {
                while sender.send(1, value).is_err() {
                    std::thread::yield_now();
                }
            }
        });
        let (socket, sleeper) = receiver.waiter().into_parts();
        socket.set_nonblocking(false).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut next = 0u32;
        let mut byte = [0u8; 64];
        while next < 100_000 {
            while let Some((from, value)) = receiver.pop() {
                assert_eq!(from, 0);
                assert_eq!(value, next);
                next += 1;
            }
            if next == 100_000 {
                break;
            }
            sleeper.sleep();
            if receiver.has_inbound() {
                sleeper.wake();
                continue;
            }
            // A lost wake-up would block here until the timeout and fail the test.
            let rung = (&socket).read(&mut byte).expect("woken before the timeout");
            assert!(rung > 0, "doorbell closed");
        }
        thread.join().unwrap();
    }

    #[test]
    fn pop_reads_every_sender_in_order_and_goes_on_where_it_stopped() {
        let mut endpoints = Mesh::build::<(usize, u32)>(3).unwrap();
        let mut receiver = endpoints.pop().unwrap();
        for value in 0..3 {
            endpoints[0].send(2, (0, value)).unwrap();
            endpoints[1].send(2, (1, value)).unwrap();
        }
        let mut popped = Vec::new();
        while let Some((from, (sender, value))) = receiver.pop() {
            assert_eq!(from, sender);
            popped.push((sender, value));
            if popped.len() == 2 {
                // A message from the first sender while the receiver is on it comes after the
                // two already queued, before the second sender's.
                endpoints[0].send(2, (0, 3)).unwrap();
            }
        }
        let expected = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)];
        assert_eq!(popped, expected);
        // The cursor stays on the second sender: its next message comes before the first's.
        endpoints[0].send(2, (0, 4)).unwrap();
        endpoints[1].send(2, (1, 3)).unwrap();
        assert_eq!(receiver.pop(), Some((1, (1, 3))));
        assert_eq!(receiver.pop(), Some((0, (0, 4))));
        assert_eq!(receiver.pop(), None);
    }

    #[test]
    fn a_busy_receiver_is_not_rung() {
        let mut endpoints = Mesh::build::<u32>(2).unwrap();
        let mut receiver = endpoints.pop().unwrap();
        let mut sender = endpoints.pop().unwrap();
        let (socket, sleeper) = receiver.waiter().into_parts();
        sender.send(1, 1).unwrap();
        let mut byte = [0u8; 8];
        assert!((&socket).read(&mut byte).is_err(), "rung while awake");
        sleeper.sleep();
        sender.send(1, 2).unwrap();
        sender.send(1, 3).unwrap();
        assert_eq!(
            (&socket).read(&mut byte).unwrap(),
            1,
            "rung once for a burst"
        );
    }

    #[test]
    fn a_wrapped_send_to_a_full_ring_hands_back_the_unwrapped_message() {
        let mut endpoints = Mesh::build::<(u8, u32)>(2).unwrap();
        let mut receiver = endpoints.pop().unwrap();
        let mut sender = endpoints.pop().unwrap();
        for value in 0..ring_capacity(2) as u32 {
            sender.send_wrapped(1, value, |value| (7, value)).unwrap();
        }
        let mut wrapped = false;
        let refused = sender.send_wrapped(1, u32::MAX, |value| {
            wrapped = true;
            (7, value)
        });
        assert_eq!(refused, Err(u32::MAX));
        assert!(!wrapped, "wrapped for a ring with no room");
        assert_eq!(receiver.pop(), Some((0, (7, 0))));
        // One slot free again: the next wrapped send goes in after the others.
        sender.send_wrapped(1, 42, |value| (8, value)).unwrap();
        let mut last = None;
        while let Some((_, message)) = receiver.pop() {
            last = Some(message);
        }
        assert_eq!(last, Some((8, 42)));
    }

    #[test]
    fn the_rings_into_a_shard_share_one_budget_whatever_the_shard_count() {
        assert_eq!(ring_capacity(1), INBOUND_PER_SHARD);
        assert_eq!(ring_capacity(2), 8192);
        assert_eq!(ring_capacity(8), 1170);
        assert_eq!(ring_capacity(64), 130);
        assert_eq!(ring_capacity(256), 32);
        assert_eq!(ring_capacity(513), RING_MIN);
        assert_eq!(ring_capacity(1024), RING_MIN);
        for shards in 2..=1024 {
            let inbound = (shards - 1) * ring_capacity(shards);
            assert!(
                inbound <= INBOUND_PER_SHARD.max((shards - 1) * RING_MIN),
                "{shards} shards: {inbound} messages into one shard"
            );
        }
        // What the mesh reserves for the router's own message, linear in the shard count.
        let message = std::mem::size_of::<crate::router::shard::messages::ShardToShard>();
        let mesh_bytes = |shards: usize| shards * (shards - 1) * ring_capacity(shards) * message;
        assert!(mesh_bytes(64) <= 64 * INBOUND_PER_SHARD * message);
        assert!(mesh_bytes(512) <= 512 * INBOUND_PER_SHARD * message);
        assert!(mesh_bytes(1024) <= 1024 * 1023 * RING_MIN * message);
    }

    #[test]
    fn rings_are_built_at_their_share() {
        let mut endpoints = Mesh::build::<u32>(8).unwrap();
        let mut sender = endpoints.remove(0);
        for value in 0..ring_capacity(8) as u32 {
            sender.send(3, value).unwrap();
        }
        assert_eq!(sender.send(3, 0), Err(MeshFull { to: 3 }));
        // The other rings are untouched by the full one.
        sender.send(4, 0).unwrap();
    }

    #[test]
    fn full_ring_is_an_error_not_growth() {
        let mut endpoints = Mesh::build::<u32>(2).unwrap();
        let mut sender = endpoints.remove(0);
        for value in 0..ring_capacity(2) as u32 {
            sender.send(1, value).unwrap();
        }
        assert_eq!(sender.send(1, 0), Err(MeshFull { to: 1 }));
    }
}
