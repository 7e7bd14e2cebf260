//! The router's end of one tunnel, whichever codec the agent's preamble named
//! (`preamble::Codec`): a request sent with its whole body, its response's body read piece by
//! piece with flow-control credit given back as each piece is taken, and what a failure means.
//!
//! Two codecs for one release: the lean tunnel (`tunnel::link`) with agents that offer it, HTTP/2
//! with older ones. Everything above this module (`api::forward`) sees one type of each.

use std::future::poll_fn;

use bytes::Bytes;

use super::link::{self, LinkError};

/// Sends requests on one tunnel; cheap to clone.
#[derive(Clone)]
pub enum Sender {
    Lean(link::Opener),
    Http2(h2::client::SendRequest<Bytes>),
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
            Sender::Http2(send) => {
                let mut send = send.clone().ready().await?;
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
        }
    }
}

#[cfg(test)]
mod tests {
    /// The router forwards some fields from its client's head (`anthropic-version`,
    /// `anthropic-beta`), and the lean tunnel's length prefix carries a value of at most 65,535
    /// bytes (`wire::encode` panics past it, on the shard). The client head bounds keep every
    /// such value under that: this fails if one is raised past it.
    #[test]
    fn no_client_head_carries_a_value_longer_than_the_tunnel_can() {
        let tunnel_value_max = usize::from(u16::MAX);
        let http1 = crate::http::request::HeadLimits::default().head_bytes_max;
        assert!(http1 <= tunnel_value_max + 1, "{http1}");
        let h2c = crate::front::h2c::HEADER_LIST_BYTES_MAX as usize;
        assert!(h2c <= tunnel_value_max + 1, "{h2c}");
    }
}
