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
            let mut waker = self.waker.borrow_mut();
            match waker.as_mut() {
                Some(waker) => waker.clone_from(context.waker()),
                None => *waker = Some(context.waker().clone()),
            }
            Poll::Pending
        })
        .await
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Wake};

    struct CountingWake(AtomicUsize);

    impl Wake for CountingWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

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
}
