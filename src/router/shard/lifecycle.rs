//! A shard's part in a graceful shutdown (SIGTERM), in two steps the control core orders.
//!
//! 1. **Drain**: the shard stops accepting connections, `/health` answers `503`, a request that
//!    arrives on a connection already open is refused with `503` and `connection: close`, h2c
//!    connections get a GOAWAY. Requests already admitted run on.
//! 2. **End** (`--drain-timeout` later, if any are left): the shard closes its agent tunnels, so
//!    every request still forwarded ends with an error the client can read (a final SSE error
//!    event, or a `503`), and the agents stop the backend requests.
//!
//! Single-threaded: one per shard, set from its control inbox.

use std::cell::Cell;

use crate::base::latch::{Latch, Signal};

#[derive(Default)]
pub struct Lifecycle {
    draining: Cell<bool>,
    /// The accept loop waits on it (one waiter).
    stop_accepting: Latch,
    /// Every tunnel task waits on it.
    ending: Signal,
}

impl Lifecycle {
    pub fn drain(&self) {
        self.draining.set(true);
        self.stop_accepting.set();
    }

    pub fn end(&self) {
        self.drain();
        self.ending.set();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    pub fn is_ending(&self) -> bool {
        self.ending.is_set()
    }

    /// Resolves when the shard stops accepting connections.
    pub async fn stopped_accepting(&self) {
        self.stop_accepting.wait().await
    }

    /// Resolves when requests still in flight are to be ended.
    pub async fn ending(&self) {
        self.ending.wait().await
    }
}
