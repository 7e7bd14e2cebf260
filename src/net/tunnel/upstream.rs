//! The router's end of one tunnel, whichever codec the agent's preamble named
//! (`preamble::Codec`): a request sent with its whole body, its response's body read piece by
//! piece with flow-control credit given back as each piece is taken, and what a failure means.
//!
//! Two codecs for one release: the lean tunnel (`tunnel::link`) with agents that offer it, HTTP/2
//! with older ones. Everything above this module (`api::forward`) sees one type of each.

use std::cell::Cell;
use std::future::poll_fn;
use std::rc::Rc;

use bytes::Bytes;

use super::link::{self, LinkError};
use crate::base::latch::Latch;

/// Sends requests on one tunnel; cheap to clone.
#[derive(Clone)]
pub enum Sender {
    Lean(link::Opener),
    /// Shared by the requests on the tunnel: one pointer in every request's state.
    Http2(Rc<Http2Tunnel>),
}

/// An HTTP/2 tunnel's sending side and what is left of its stream ids.
pub struct Http2Tunnel {
    pub send: h2::client::SendRequest<Bytes>,
    pub ids: StreamIds,
}

/// The streams an HTTP/2 tunnel may still open. A client's stream ids are the odd numbers up to
/// 2^31 − 1, so one connection opens at most 2^30 streams; h2 then refuses every new one while
/// the connection stays up and answers its pings, which would leave the agent in the pool with a
/// tunnel that fails every request sent on it. The tunnel retires well before (`shard::tunnels`:
/// out of the shard, its requests in flight finished, then closed) and the agent dials a fresh
/// one. (The lean tunnel reuses the ids of finished streams and never runs out.)
pub struct StreamIds {
    left: Cell<u32>,
    /// Retire once no more than this many are left: the requests already on their way to the
    /// tunnel when it retires still find ids.
    retire_at: u32,
    retiring: Latch,
}

impl StreamIds {
    /// What one HTTP/2 connection allows a client.
    pub const HTTP2_CLIENT: u32 = 1 << 30;

    /// `streams` ids, retiring with 1/16,384 of them left (65,536 of HTTP/2's).
    pub fn new(streams: u32) -> StreamIds {
        StreamIds {
            left: Cell::new(streams),
            retire_at: streams / 16_384,
            retiring: Latch::default(),
        }
    }

    /// Takes an id for a new stream; `false` when none is left.
    fn take(&self) -> bool {
        let Some(left) = self.left.get().checked_sub(1) else {
            self.retiring.set();
            return false;
        };
        self.left.set(left);
        if left <= self.retire_at {
            self.retiring.set();
        }
        true
    }

    /// Resolves once the tunnel should retire. One task waits (the tunnel's own).
    pub async fn retiring(&self) {
        self.retiring.wait().await;
    }
}

impl Sender {
    /// Sends `request` with its whole `body` and waits for the response head. `handed_over` runs
    /// once the request is on the tunnel (HTTP/2 may first wait for a stream under the agent's
    /// concurrency limit): the start of a latency sample.
    pub async fn exchange(
        &self,
        request: http::Request<()>,
        body: Bytes,
        handed_over: impl FnOnce(),
    ) -> Result<http::Response<Body>, UpstreamError> {
        match self {
            Sender::Lean(opener) => {
                let (parts, ()) = request.into_parts();
                let target = parts
                    .uri
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
                let pending = opener.send_request(parts.method, target, parts.headers, body)?;
                handed_over();
                let response = pending.await?;
                let mut head = http::Response::new(Body::Lean(response.body));
                *head.status_mut() = response.status;
                *head.headers_mut() = response.fields;
                Ok(head)
            }
            Sender::Http2(tunnel) => {
                let mut send = tunnel.send.clone().ready().await?;
                if !tunnel.ids.take() {
                    return Err(UpstreamError::StreamIdsSpent);
                }
                handed_over();
                let (response, mut body_stream) = send.send_request(request, false)?;
                body_stream.send_data(body, true)?;
                Ok(response.await?.map(Body::Http2))
            }
        }
    }
}

/// A response body arriving over the tunnel. Dropped before its end, the stream is reset, which
/// is how the agent learns to stop its engine request.
pub enum Body {
    Lean(link::RecvStream),
    Http2(h2::RecvStream),
}

impl Body {
    /// The next piece; `None` at the end. Its bytes are credited back to the agent as it is
    /// handed out: the router holds what it took in its own buffers and bounds them itself.
    pub async fn data(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        match self {
            Body::Lean(body) => {
                let data = poll_fn(|cx| body.poll_data(cx)).await?;
                if let Ok(data) = &data {
                    body.release_capacity(data.len());
                }
                Some(data.map_err(UpstreamError::from))
            }
            Body::Http2(body) => {
                let data = body.data().await?;
                if let Ok(data) = &data {
                    // Fails only when the stream is already gone; the next read says so.
                    let _ = body.flow_control().release_capacity(data.len());
                }
                Some(data.map_err(UpstreamError::from))
            }
        }
    }
}

/// Why a tunnelled exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error(transparent)]
    Lean(#[from] LinkError),
    #[error(transparent)]
    Http2(#[from] h2::Error),
    /// The HTTP/2 tunnel has no stream id left (it is retiring; see [`StreamIds`]).
    #[error("the tunnel's HTTP/2 stream ids are spent")]
    StreamIdsSpent,
}

impl UpstreamError {
    /// Whether the agent reset the stream saying its backend failed after the response head
    /// (`tunnel::BACKEND_FAILED`), rather than the tunnel or the agent being lost.
    pub fn is_backend_failure(&self) -> bool {
        match self {
            UpstreamError::Lean(error) => error.is_reset_by_peer(super::BACKEND_FAILED),
            UpstreamError::Http2(error) => {
                error.is_reset()
                    && error.is_remote()
                    && error.reason() == Some(h2::Reason::from(super::BACKEND_FAILED))
            }
            UpstreamError::StreamIdsSpent => false,
        }
    }

    /// Whether the agent refused the stream because its end of the tunnel holds as many open
    /// streams as it takes (`mux::STREAMS_MAX`; `REFUSED_STREAM` on HTTP/2 too): the agent is
    /// full, not gone.
    pub fn is_refused(&self) -> bool {
        match self {
            UpstreamError::Lean(error) => error.is_reset_by_peer(super::mux::REFUSED_STREAM),
            UpstreamError::Http2(error) => {
                error.is_reset()
                    && error.is_remote()
                    && error.reason() == Some(h2::Reason::REFUSED_STREAM)
            }
            UpstreamError::StreamIdsSpent => false,
        }
    }
}

#[cfg(test)]
mod tests {
    /// A stream the agent refused for its stream limit is told apart from a backend failure and
    /// from a lost tunnel.
    #[test]
    fn a_refused_stream_is_neither_a_backend_failure_nor_a_lost_tunnel() {
        use crate::net::tunnel::link::LinkError;
        let refused = UpstreamError::Lean(LinkError::Reset {
            reason: crate::net::tunnel::mux::REFUSED_STREAM,
            remote: true,
        });
        assert!(refused.is_refused() && !refused.is_backend_failure());
        let failed = UpstreamError::Lean(LinkError::Reset {
            reason: crate::net::tunnel::BACKEND_FAILED,
            remote: true,
        });
        assert!(!failed.is_refused() && failed.is_backend_failure());
        for lost in [
            UpstreamError::Lean(LinkError::Closed),
            UpstreamError::Lean(LinkError::Reset {
                reason: crate::net::tunnel::mux::REFUSED_STREAM,
                remote: false,
            }),
            UpstreamError::StreamIdsSpent,
        ] {
            assert!(!lost.is_refused() && !lost.is_backend_failure(), "{lost:?}");
        }
    }

    use super::{StreamIds, UpstreamError};

    #[test]
    fn an_http2_tunnel_retires_before_its_stream_ids_run_out() {
        let ids = StreamIds::new(StreamIds::HTTP2_CLIENT);
        assert_eq!(ids.retire_at, 65_536);
        ids.left.set(65_538);
        assert!(ids.take() && !ids.retiring.is_set());
        assert!(ids.take() && ids.retiring.is_set(), "65,536 left: retire");
        // The requests already on their way still find ids, down to the last.
        ids.left.set(1);
        assert!(ids.take());
        assert!(!ids.take(), "none left");
        let small = StreamIds::new(8);
        assert_eq!(small.retire_at, 0);
        for _ in 0..7 {
            assert!(small.take() && !small.retiring.is_set());
        }
        assert!(small.take() && small.retiring.is_set());
    }

    /// The router forwards some fields from its client's head (`anthropic-version`,
    /// `anthropic-beta`), and the lean tunnel's length prefix carries a value of at most 65,535
    /// bytes (`wire::encode` panics past it, on the shard). The client head bounds keep every
    /// such value under that: this fails if one is raised past it.
    #[test]
    fn no_client_head_carries_a_value_longer_than_the_tunnel_can() {
        let tunnel_value_max = usize::from(u16::MAX);
        let http1 = crate::wire::http::request::HeadLimits::default().head_bytes_max;
        assert!(http1 <= tunnel_value_max + 1, "{http1}");
        let h2c = crate::router::front::h2c::HEADER_LIST_BYTES_MAX as usize;
        assert!(h2c <= tunnel_value_max + 1, "{h2c}");
    }
}
