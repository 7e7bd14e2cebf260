//! The data tunnel between a router shard and an agent: an agent-dialed TCP socket, authenticated by
//! the preamble, then HTTP/2 with the router as client.
//!
//! How a tunnelled request can end early, and what each end means by it:
//! - before the response head, the agent answers every backend failure with an error response
//!   (`agent::forward::ForwardError`: 503 `backend_unavailable` when the engine refused the
//!   connection, 502 `backend_error` when it failed, 504 when it did not answer);
//! - after the head, the agent resets the stream with [`BACKEND_FAILED`] when the engine's
//!   response broke off (connection reset, engine crash) or stalled past `--http-timeout`;
//! - anything else — the connection closing, a GOAWAY, another reset reason — means the tunnel or
//!   the agent itself was lost.
//!
//! [`is_backend_failure`] is the router's side of that distinction: the client hears `backend_error`
//! for the first, `agent_disconnected` for the last.

pub mod client;
pub mod link;
pub mod mux;
pub mod preamble;
pub mod tls;
pub mod wire;

/// The reset reason an agent sends on a stream whose backend response failed after its head.
pub const BACKEND_FAILED: h2::Reason = h2::Reason::INTERNAL_ERROR;

/// Whether a tunnelled stream's error is the agent saying its backend failed, rather than the
/// tunnel or the agent being lost.
pub fn is_backend_failure(error: &h2::Error) -> bool {
    error.is_reset() && error.is_remote() && error.reason() == Some(BACKEND_FAILED)
}
