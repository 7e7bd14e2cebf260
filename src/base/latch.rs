//! A single-threaded, set-once signal: "the client connection's read side ended". One task sets it,
//! one task waits on it (the latest waker wins). No atomics: it never leaves its shard.
//!
//! Why one waker and not a list: a task polls its wait future on every wake-up of anything it is
//! racing against, and wakers that do not compare equal (`will_wake`) would pile up in a list —
//! measured at a fifth of the router's CPU under load before this was a single slot.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Keeps the latest waker in `slot`, reusing the one there when it wakes the same task: the
/// one way every single-waiter slot here and in `shard::waiters` and `front::pipeline` parks.
pub fn keep_waker(slot: &mut Option<Waker>, waker: &Waker) {
    match slot {
        Some(kept) => kept.clone_from(waker),
        None => *slot = Some(waker.clone()),
    }
}

#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Latch {
    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub fn set(&self) {
        if !self.set.replace(true)
            && let Some(waker) = self.waker.borrow_mut().take()
        {
            waker.wake();
        }
    }

    /// Resolves once the latch is set. Only one task may wait at a time.
    pub async fn wait(&self) {
        std::future::poll_fn(|context| {
            if self.set.get() {
                return Poll::Ready(());
            }
            keep_waker(&mut self.waker.borrow_mut(), context.waker());
            Poll::Pending
        })
        .await
    }
}

/// A set-once signal any number of tasks wait on, each in its own slot: a waiter that is polled
/// again replaces its own waker, and gives its slot back when dropped, so wakers never pile up.
/// Bound: one slot per waiter alive at once (a shard's tunnels and held requests), reused.
#[derive(Default)]
pub struct Signal {
    set: Cell<bool>,
    slots: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl Signal {
    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub fn set(&self) {
        if self.set.replace(true) {
            return;
        }
        let wakers: Vec<Waker> = self
            .slots
            .borrow_mut()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        for waker in wakers {
            waker.wake();
        }
    }

    /// Resolves once the signal is set.
    pub fn wait(&self) -> SignalWait<'_> {
        SignalWait {
            signal: self,
            slot: None,
        }
    }
}

/// The future of [`Signal::wait`].
pub struct SignalWait<'s> {
    signal: &'s Signal,
    slot: Option<usize>,
}

impl Future for SignalWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let signal = self.signal;
        if signal.set.get() {
            return Poll::Ready(());
        }
        let mut slots = signal.slots.borrow_mut();
        let slot = match self.slot {
            Some(slot) => slot,
            None => {
                let slot = signal.free.borrow_mut().pop().unwrap_or_else(|| {
                    slots.push(None);
                    slots.len() - 1
                });
                self.slot = Some(slot);
                slot
            }
        };
        keep_waker(&mut slots[slot], context.waker());
        Poll::Pending
    }
}

impl Drop for SignalWait<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.signal.slots.borrow_mut()[slot] = None;
            self.signal.free.borrow_mut().push(slot);
        }
    }
}

/// Runs two futures until the first finishes; the other is dropped. `first` is polled first.
///
/// A plain future rather than an `async fn`: an `async fn` keeps its arguments and their pinned
/// copies in its state, and moves them into place on the first poll.
pub fn race<A: Future, B: Future>(first: A, second: B) -> Race<A, B> {
    Race { first, second }
}

pin_project_lite::pin_project! {
    /// The future [`race`] returns.
    #[must_use = "futures do nothing unless polled"]
    pub struct Race<A, B> {
        #[pin]
        first: A,
        #[pin]
        second: B,
    }
}

impl<A: Future, B: Future> Future for Race<A, B> {
    type Output = futures_util::future::Either<A::Output, B::Output>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        use futures_util::future::Either;
        let this = self.project();
        if let Poll::Ready(output) = this.first.poll(context) {
            return Poll::Ready(Either::Left(output));
        }
        this.second.poll(context).map(Either::Right)
    }
}

/// A waker that counts its wake-ups, for the tests of this module and of other single-task
/// wake-up code (`front::pipeline`).
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    pub(crate) struct CountingWake(pub(crate) AtomicUsize);

    impl CountingWake {
        pub(crate) fn woken(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    impl Wake for CountingWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A fresh counter and a waker that counts into it.
    pub(crate) fn counting_waker() -> (Arc<CountingWake>, Waker) {
        let counter = Arc::new(CountingWake(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::CountingWake;
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Context;

    #[test]
    fn repeated_polls_with_unequal_wakers_keep_only_the_latest() {
        let latch = Latch::default();
        let mut counters = Vec::new();
        for _ in 0..1000 {
            // Wakers that do not compare equal, and a fresh wait future per poll, as `race`
            // builds them: the latch must not accumulate them.
            let counter = Arc::new(CountingWake(AtomicUsize::new(0)));
            let waker = Waker::from(counter.clone());
            let mut context = Context::from_waker(&waker);
            let mut wait = std::pin::pin!(latch.wait());
            assert!(wait.as_mut().poll(&mut context).is_pending());
            counters.push(counter);
        }
        latch.set();
        let woken: usize = counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
        assert_eq!(woken, 1, "only the latest waiter is woken");
        assert_eq!(counters.last().unwrap().0.load(Ordering::Relaxed), 1);
        let waker = Waker::from(counters[0].clone());
        let mut context = Context::from_waker(&waker);
        let mut wait = std::pin::pin!(latch.wait());
        assert!(wait.as_mut().poll(&mut context).is_ready());
    }

    #[test]
    fn a_signal_wakes_every_waiter_once_and_reuses_the_slots_of_dropped_ones() {
        let signal = Signal::default();
        let counters: Vec<Arc<CountingWake>> = (0..3)
            .map(|_| Arc::new(CountingWake(AtomicUsize::new(0))))
            .collect();
        let mut waits: Vec<_> = (0..3).map(|_| Box::pin(signal.wait())).collect();
        for _ in 0..100 {
            for (wait, counter) in waits.iter_mut().zip(&counters) {
                let waker = Waker::from(counter.clone());
                assert!(
                    wait.as_mut()
                        .poll(&mut Context::from_waker(&waker))
                        .is_pending()
                );
            }
        }
        drop(waits.pop());
        let mut again = Box::pin(signal.wait());
        let waker = Waker::from(counters[2].clone());
        assert!(
            again
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(
            signal.slots.borrow().len(),
            3,
            "the dropped waiter's slot is reused"
        );
        signal.set();
        let woken: Vec<usize> = counters
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .collect();
        assert_eq!(woken, vec![1, 1, 1]);
        assert!(
            again
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready()
        );
    }
}
