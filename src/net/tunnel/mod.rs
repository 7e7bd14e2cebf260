//! The data tunnel between a router shard and an agent: an agent-dialed TCP socket, authenticated
//! by the preamble, then the lean tunnel ([`link`]) with the router as client; HTTP/2 with agents
//! older than it (`preamble::Codec`).
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
//! `upstream::UpstreamError::is_backend_failure` is the router's side of that distinction: the
//! client hears `backend_error` for the first, `agent_disconnected` for the last.

pub mod link;
pub mod mux;
pub mod preamble;
pub mod tls;
pub mod upstream;
pub mod wire;

/// The reset reason an agent sends on a stream whose backend response failed after its head:
/// the same code in both codecs (HTTP/2's `INTERNAL_ERROR`).
pub const BACKEND_FAILED: u32 = 0x2;
