//! The SPSC mesh: one bounded single-producer/single-consumer ring per ordered pair of shards, and
//! one wake-up per receiving shard.
//!
//! Key components: [`Mesh::build`] makes every ring up front (memory is sized at start-up, nothing
//! grows); each shard takes its [`Endpoint`]: `to[j]` producers and `from[i]` consumers.
//!
//! Wake-ups are batched: a sender sets the receiver's `pending` flag and wakes its task only when
//! the flag was clear, so a burst of messages costs one cross-thread wake. The receiving task
//! clears the flag *before* draining, so a message pushed during a drain is never stranded.
//!
//! Error handling: a full ring is a typed error ([`MeshFull`]); the caller rejects the request. It
//! never blocks and never grows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use atomic_waker::AtomicWaker;

/// Messages each ring holds before a sender sees [`MeshFull`].
pub const RING_CAPACITY: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("mesh ring to shard {to} is full")]
pub struct MeshFull {
    pub to: usize,
}

struct Doorbell {
    pending: AtomicBool,
    waker: AtomicWaker,
}

impl Doorbell {
    fn ring(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            self.waker.wake();
        }
    }
}

/// One shard's side of the mesh.
pub struct Endpoint<T> {
    shard: usize,
    to: Vec<Option<rtrb::Producer<T>>>,
    from: Vec<Option<rtrb::Consumer<T>>>,
    doorbells: Arc<[Doorbell]>,
}

pub struct Mesh;

impl Mesh {
    /// Builds the rings for `shard_count` shards; element `i` of the result belongs to shard `i`.
    pub fn build<T>(shard_count: usize) -> Vec<Endpoint<T>> {
        let doorbells: Arc<[Doorbell]> = (0..shard_count)
            .map(|_| Doorbell {
                pending: AtomicBool::new(false),
                waker: AtomicWaker::new(),
            })
            .collect();
        let mut endpoints: Vec<Endpoint<T>> = (0..shard_count)
            .map(|shard| Endpoint {
                shard,
                to: (0..shard_count).map(|_| None).collect(),
                from: (0..shard_count).map(|_| None).collect(),
                doorbells: doorbells.clone(),
            })
            .collect();
        for sender in 0..shard_count {
            for receiver in 0..shard_count {
                if sender == receiver {
                    continue;
                }
                let (producer, consumer) = rtrb::RingBuffer::new(RING_CAPACITY);
                endpoints[sender].to[receiver] = Some(producer);
                endpoints[receiver].from[sender] = Some(consumer);
            }
        }
        endpoints
    }
}

impl<T> Endpoint<T> {
    pub fn shard(&self) -> usize {
        self.shard
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

    /// A handle that waits for this shard's doorbell without borrowing the endpoint.
    pub fn waiter(&self) -> Waiter {
        Waiter {
            shard: self.shard,
            doorbells: self.doorbells.clone(),
        }
    }

    /// Drains everything currently queued for this shard into `handle`, up to `budget` messages
    /// (so one busy sender cannot starve this shard's other tasks). Returns how many were handled.
    pub fn drain(&mut self, budget: usize, mut handle: impl FnMut(usize, T)) -> usize {
        let mut handled = 0;
        for (sender, consumer) in self.from.iter_mut().enumerate() {
            let Some(consumer) = consumer.as_mut() else {
                continue;
            };
            while handled < budget {
                match consumer.pop() {
                    Ok(message) => {
                        handle(sender, message);
                        handled += 1;
                    }
                    Err(_) => break,
                }
            }
        }
        handled
    }
}

/// Waits for one shard's doorbell.
pub struct Waiter {
    shard: usize,
    doorbells: Arc<[Doorbell]>,
}

impl Waiter {
    /// Resolves when another shard has rung this shard's doorbell since the last call.
    pub async fn wait(&self) {
        let doorbell = &self.doorbells[self.shard];
        std::future::poll_fn(|context| {
            if doorbell.pending.swap(false, Ordering::AcqRel) {
                return Poll::Ready(());
            }
            doorbell.waker.register(context.waker());
            if doorbell.pending.swap(false, Ordering::AcqRel) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivers_between_threads_in_order() {
        let mut endpoints = Mesh::build::<u32>(2);
        let mut receiver = endpoints.pop().unwrap();
        let mut sender = endpoints.pop().unwrap();
        let thread = std::thread::spawn(move || {
            for value in 0..10_000u32 {
                while sender.send(1, value).is_err() {
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0u32;
        let waiter = receiver.waiter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            while next < 10_000 {
                waiter.wait().await;
                receiver.drain(usize::MAX, |from, value| {
                    assert_eq!(from, 0);
                    assert_eq!(value, next);
                    next += 1;
                });
            }
        });
        thread.join().unwrap();
    }

    #[test]
    fn full_ring_is_an_error_not_growth() {
        let mut endpoints = Mesh::build::<u32>(2);
        let mut sender = endpoints.remove(0);
        for value in 0..RING_CAPACITY as u32 {
            sender.send(1, value).unwrap();
        }
        assert_eq!(sender.send(1, 0), Err(MeshFull { to: 1 }));
    }
}
