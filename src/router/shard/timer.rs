//! Timeouts and sleeps with their timer on the heap, for the request path.
//!
//! monoio's `Sleep` holds its timer entry inline: 640 bytes aligned to 128, because the entry's
//! shared state is cache-padded. Held in an async fn, that alignment pads every enclosing future
//! up to a multiple of 128 and the sleep's bytes repeat at each level that keeps its sub-future
//! alongside its arguments: with sleeps held inline the request path's futures reach 10 KiB, and
//! since each `.await` on a sub-future copies the whole of it into its parent's state, `memmove`
//! then takes 7 % of the router's CPU per request in a profile
//! (`perf/notes/2026-12-01-where-requests-wait-and-the-stream-cork.md`). A boxed timer costs one
//! allocation per wait and keeps the futures a few hundred bytes.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use monoio::time::{Sleep, Timeout};

/// `monoio::time::timeout`, boxed (see the module doc).
pub fn timeout<F: Future>(duration: Duration, future: F) -> Pin<Box<Timeout<F>>> {
    Box::pin(monoio::time::timeout(duration, future))
}

/// `monoio::time::sleep_until`, boxed (see the module doc).
pub fn sleep_until(deadline: Instant) -> Pin<Box<Sleep>> {
    Box::pin(monoio::time::sleep_until(deadline.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boxed_timer_keeps_a_future_small_and_plainly_aligned() {
        assert!(
            std::mem::align_of::<Sleep>() >= 64,
            "why this module exists"
        );
        assert_eq!(std::mem::size_of::<Pin<Box<Sleep>>>(), 8);
        assert_eq!(std::mem::align_of::<Pin<Box<Sleep>>>(), 8);
        type Wrapped = Pin<Box<Timeout<std::future::Ready<()>>>>;
        assert_eq!(std::mem::size_of::<Wrapped>(), 8);
    }

    #[test]
    fn the_boxed_timeout_fires_and_passes_a_ready_value() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("a test runtime");
        runtime.block_on(async {
            let ready = timeout(Duration::from_secs(5), std::future::ready(7)).await;
            assert_eq!(ready.ok(), Some(7));
            let silent = timeout(Duration::from_millis(5), std::future::pending::<()>()).await;
            assert!(silent.is_err());
            let started = Instant::now();
            sleep_until(started + Duration::from_millis(5)).await;
            assert!(started.elapsed() >= Duration::from_millis(5));
        });
    }
}
