//! The queue from an HTTP/1.1 connection's reader task to its writer: requests read ahead, in
//! order, at most `capacity` of them. Single-threaded (both ends live on one shard), one sender,
//! one receiver, no atomics.
//!
//! Why not `tokio::sync::mpsc`: its channel allocates its slots in blocks of 32 whatever the
//! bound, so every HTTP/1.1 connection would hold a 9.5 KB block (32 slots of 296 bytes) from its
//! first request on, idle keep-alive connections included. Here the slots are a `VecDeque` that
//! grows to what the client actually pipelines: one slot for a client that sends one request at a
//! time, never more than `capacity` (rounded up to a power of two by `VecDeque`).
//!
//! Closing, as with a channel: when the sender is dropped the receiver drains what is queued and
//! then gets `None`; when the receiver is dropped a send fails and hands its item back, and what
//! was queued is dropped at once (each queued request releases what it holds).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// A queue of at most `capacity` items (`capacity` ≥ 1).
pub fn pipeline<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    assert!(capacity > 0, "a pipeline holds at least one item");
    let shared = Rc::new(Shared {
        // One slot: enough for a client that sends one request at a time. A pipelining client
        // grows it (to 4, then 8).
        items: RefCell::new(VecDeque::with_capacity(1)),
        capacity,
        sender_alive: Cell::new(true),
        receiver_alive: Cell::new(true),
        waiting_sender: RefCell::new(None),
        waiting_receiver: RefCell::new(None),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    items: RefCell<VecDeque<T>>,
    capacity: usize,
    sender_alive: Cell<bool>,
    receiver_alive: Cell<bool>,
    /// The sender's task while the queue is full; the latest poll's waker.
    waiting_sender: RefCell<Option<Waker>>,
    /// The receiver's task while the queue is empty; the latest poll's waker.
    waiting_receiver: RefCell<Option<Waker>>,
}

/// Keeps the latest waker in `slot`, reusing the one there when it wakes the same task.
fn park(slot: &RefCell<Option<Waker>>, waker: &Waker) {
    crate::base::latch::keep_waker(&mut slot.borrow_mut(), waker);
}

fn wake(slot: &RefCell<Option<Waker>>) {
    // Taken before waking: a waker may run code that parks again.
    let waker = slot.borrow_mut().take();
    if let Some(waker) = waker {
        waker.wake();
    }
}

/// The reader's end.
pub struct Sender<T> {
    shared: Rc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `item`, waiting while the queue is full. `Err(item)` once the receiver is gone.
    pub async fn send(&self, item: T) -> Result<(), T> {
        let shared = &*self.shared;
        let open = std::future::poll_fn(|context| {
            if !shared.receiver_alive.get() {
                return Poll::Ready(false);
            }
            if shared.items.borrow().len() < shared.capacity {
                return Poll::Ready(true);
            }
            park(&shared.waiting_sender, context.waker());
            Poll::Pending
        })
        .await;
        if !open {
            return Err(item);
        }
        shared.items.borrow_mut().push_back(item);
        wake(&shared.waiting_receiver);
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.shared.sender_alive.set(false);
        wake(&self.shared.waiting_receiver);
    }
}

/// The writer's end.
pub struct Receiver<T> {
    shared: Rc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// Whether nothing is queued (the writer is about to wait for the client).
    pub fn is_empty(&self) -> bool {
        self.shared.items.borrow().is_empty()
    }

    /// The next item in order; `None` once the sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        let shared = &*self.shared;
        std::future::poll_fn(|context| {
            let item = shared.items.borrow_mut().pop_front();
            match item {
                Some(item) => {
                    wake(&shared.waiting_sender);
                    Poll::Ready(Some(item))
                }
                None if !shared.sender_alive.get() => Poll::Ready(None),
                None => {
                    park(&shared.waiting_receiver, context.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.receiver_alive.set(false);
        // Outside the borrow: an item's drop may run arbitrary code.
        let queued = std::mem::take(&mut *self.shared.items.borrow_mut());
        drop(queued);
        wake(&self.shared.waiting_sender);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::latch::testing::counting_waker;
    use futures_util::FutureExt;
    use std::future::Future;
    use std::pin::pin;
    use std::task::Context;

    #[test]
    fn items_come_out_in_order_then_none_once_the_sender_is_gone() {
        let (sender, mut receiver) = pipeline(8);
        assert!(receiver.is_empty());
        for item in 0..5 {
            sender.send(item).now_or_never().unwrap().unwrap();
        }
        assert!(!receiver.is_empty());
        drop(sender);
        let received: Vec<i32> =
            std::iter::from_fn(|| receiver.recv().now_or_never().unwrap()).collect();
        assert_eq!(received, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_full_queue_makes_the_sender_wait_until_an_item_is_taken() {
        let (sender, mut receiver) = pipeline(2);
        sender.send(1).now_or_never().unwrap().unwrap();
        sender.send(2).now_or_never().unwrap().unwrap();
        let (woken, waker) = counting_waker();
        let mut context = Context::from_waker(&waker);
        let mut third = pin!(sender.send(3));
        assert!(third.as_mut().poll(&mut context).is_pending());
        assert_eq!(woken.woken(), 0);

        assert_eq!(receiver.recv().now_or_never(), Some(Some(1)));
        assert_eq!(woken.woken(), 1);
        assert_eq!(third.as_mut().poll(&mut context), Poll::Ready(Ok(())));
        assert_eq!(receiver.recv().now_or_never(), Some(Some(2)));
        assert_eq!(receiver.recv().now_or_never(), Some(Some(3)));
    }

    #[test]
    fn a_waiting_receiver_is_woken_by_a_send_and_by_the_sender_leaving() {
        let (sender, mut receiver) = pipeline(8);
        let (woken, waker) = counting_waker();
        let mut context = Context::from_waker(&waker);
        {
            let mut next = pin!(receiver.recv());
            assert!(next.as_mut().poll(&mut context).is_pending());
            sender.send(7).now_or_never().unwrap().unwrap();
            assert_eq!(woken.woken(), 1);
            assert_eq!(next.as_mut().poll(&mut context), Poll::Ready(Some(7)));
        }
        let mut next = pin!(receiver.recv());
        assert!(next.as_mut().poll(&mut context).is_pending());
        drop(sender);
        assert_eq!(woken.woken(), 2);
        assert_eq!(next.as_mut().poll(&mut context), Poll::Ready(None));
    }

    #[test]
    fn once_the_receiver_is_gone_sends_fail_and_queued_items_are_dropped() {
        let item = Rc::new(());
        let (sender, receiver) = pipeline(1);
        sender.send(item.clone()).now_or_never().unwrap().unwrap();
        // The queue is full: a second send waits, and is woken when the receiver leaves.
        let (woken, waker) = counting_waker();
        let mut context = Context::from_waker(&waker);
        let mut blocked = pin!(sender.send(item.clone()));
        assert!(blocked.as_mut().poll(&mut context).is_pending());
        assert_eq!(Rc::strong_count(&item), 3);

        drop(receiver);
        assert_eq!(woken.woken(), 1);
        // The queued item went with the receiver; the blocked one comes back to its sender.
        let Poll::Ready(Err(returned)) = blocked.as_mut().poll(&mut context) else {
            panic!("a send after the receiver left must fail");
        };
        assert_eq!(Rc::strong_count(&item), 2);
        drop(returned);
        assert!(sender.send(item.clone()).now_or_never().unwrap().is_err());
        assert_eq!(Rc::strong_count(&item), 1);
    }

    #[test]
    fn one_request_at_a_time_keeps_one_slot_and_pipelining_grows_it() {
        // One slot for a client that waits for each answer (a tokio channel would hold 32 from
        // the first request on); pipelining grows it up to the bound.
        let (sender, mut receiver) = pipeline(8);
        for item in 0..100 {
            sender.send(item).now_or_never().unwrap().unwrap();
            assert_eq!(receiver.recv().now_or_never(), Some(Some(item)));
        }
        assert_eq!(receiver.shared.items.borrow().capacity(), 1);
        for item in 0..8 {
            sender.send(item).now_or_never().unwrap().unwrap();
        }
        assert!(sender.send(8).now_or_never().is_none(), "full at 8");
        assert_eq!(receiver.shared.items.borrow().capacity(), 8);
    }
}
