//! A single-threaded, set-once signal: "the client connection's read side ended". One task sets it,
//! any number of futures wait on it. No atomics: it never leaves its shard.

use std::cell::{Cell, RefCell};
use std::task::{Poll, Waker};

#[derive(Default)]
pub struct Latch {
    set: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

impl Latch {
    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub fn set(&self) {
        if !self.set.replace(true) {
            for waker in self.wakers.borrow_mut().drain(..) {
                waker.wake();
            }
        }
    }

    pub async fn wait(&self) {
        std::future::poll_fn(|context| {
            if self.set.get() {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|waker| waker.will_wake(context.waker())) {
                wakers.push(context.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// Runs two futures until the first finishes; the other is dropped.
pub async fn race<A: std::future::Future, B: std::future::Future>(
    first: A,
    second: B,
) -> futures_util::future::Either<A::Output, B::Output> {
    use futures_util::future::{Either, select};
    match select(std::pin::pin!(first), std::pin::pin!(second)).await {
        Either::Left((output, _)) => Either::Left(output),
        Either::Right((output, _)) => Either::Right(output),
    }
}
