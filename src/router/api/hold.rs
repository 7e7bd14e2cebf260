//! Hold at zero on the request path: the keepalives a held client receives, and what the client
//! sees once they have started (seed `hold-at-zero.md`, "What the client sees").
//!
//! [`HoldSink`] wraps every inference request's sink. Until [`HoldSink::arm`] it passes every call
//! through (one branch each). Once armed — the request is held — every wait the request path makes
//! through [`Sink::until_client_gone`] also sends a keepalive each interval until the response
//! starts: an SSE comment (`: keep-alive`) to a streaming request, a single space to any other.
//! The first keepalive sends `200` and the headers, so the status can no longer change; an answer
//! after it is written in the body:
//! - success: the body (or the SSE events) as it comes;
//! - error, streaming request: a final SSE event, `data: {"error":…}` for OpenAI endpoints, an
//!   Anthropic `error` event for `/v1/messages`;
//! - error, any other request: the JSON error envelope after the spaces.
//!
//! The status the request ended with (not the `200` on the wire) is what [`Sink::status`]
//! reports to the audit log and what the HTTP metrics count.

use std::time::{Duration, Instant};

use crate::base::ids::Dialect;
use crate::base::latch::race;
use crate::router::api::sink::{ClientGone, Sink};
use crate::router::error::Rejection;
use crate::router::metrics::ShardMetrics;
use futures_util::future::Either;

/// What a held request's keepalives look like.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// `--wake-keepalive`; zero arms nothing.
    pub interval: Duration,
    /// The request asked for a stream (`"stream": true`).
    pub stream: bool,
    pub dialect: Dialect,
}

pub struct HoldSink<'s, S: Sink> {
    inner: &'s mut S,
    metrics: &'s ShardMetrics,
    keepalive: Option<Keepalive>,
    /// When the next keepalive is due; `None` before the hold, or once the response started.
    next: Option<Instant>,
    /// A keepalive sent `200` and the headers.
    committed: bool,
    /// The status the request's answer had (0: none yet), whatever went on the wire.
    status: u16,
}

impl<'s, S: Sink> HoldSink<'s, S> {
    pub fn new(inner: &'s mut S, metrics: &'s ShardMetrics) -> Self {
        HoldSink {
            inner,
            metrics,
            keepalive: None,
            next: None,
            committed: false,
            status: 0,
        }
    }

    /// The request is held: keepalives start one interval from now (none when the interval is 0).
    pub fn arm(&mut self, keepalive: Keepalive) {
        if keepalive.interval.is_zero() {
            return;
        }
        self.keepalive = Some(keepalive);
        self.next = Some(Instant::now() + keepalive.interval);
    }

    /// Whether a keepalive has committed the `200` head.
    pub fn committed(&self) -> bool {
        self.committed
    }

    /// The response starts: no keepalive after this.
    fn started(&mut self) {
        self.next = None;
    }

    async fn send_keepalive(&mut self) -> Result<(), ClientGone> {
        let Some(keepalive) = self.keepalive else {
            return Ok(());
        };
        if !self.committed {
            let content_type = if keepalive.stream {
                "text/event-stream"
            } else {
                "application/json"
            };
            self.inner.start_keepalive(content_type).await?;
            self.committed = true;
        }
        let bytes: &[u8] = if keepalive.stream {
            b": keep-alive\n\n"
        } else {
            b" "
        };
        self.inner.stream_data(bytes).await
    }

    /// Writes an error after a committed head, ends the response and counts its status.
    async fn error_in_body(&mut self, status: u16, event: &[u8]) -> Result<(), ClientGone> {
        self.metrics.count_response(status);
        self.status = status;
        self.inner.stream_data(event).await?;
        self.inner.end_stream().await
    }

    /// [`Sink::until_client_gone`] for a held request: a keepalive each interval until `future`
    /// resolves or the client goes.
    async fn held_until_client_gone<F: std::future::Future>(
        &mut self,
        mut next: Instant,
        future: F,
    ) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        loop {
            let tick = crate::router::shard::timer::sleep_until(next);
            match self
                .inner
                .until_client_gone(race(future.as_mut(), tick))
                .await
            {
                None => return None,
                Some(Either::Left(output)) => return Some(output),
                Some(Either::Right(())) => {
                    if self.send_keepalive().await.is_err() {
                        return None;
                    }
                    let interval = self
                        .keepalive
                        .map_or(Duration::from_secs(1), |keepalive| keepalive.interval);
                    next = Instant::now() + interval;
                    self.next = Some(next);
                }
            }
        }
    }
}

impl<S: Sink> Sink for HoldSink<'_, S> {
    async fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), ClientGone> {
        self.started();
        if !self.committed {
            self.status = status;
            return self
                .inner
                .respond(status, content_type, extra_headers, body)
                .await;
        }
        if status >= 400 {
            // A backend's own error body: to a streaming client as an SSE event in its dialect
            // and the router's codes (the envelope for OpenAI endpoints, an `error` event whose
            // message starts with the code for Anthropic's), as is after the spaces to any other.
            let event = match self.keepalive {
                Some(keepalive) if keepalive.stream => {
                    crate::router::error::backend_error_event(keepalive.dialect, status, body)
                }
                _ => body.to_vec(),
            };
            return self.error_in_body(status, &event).await;
        }
        self.metrics.count_response(status);
        self.status = status;
        self.inner.stream_data(body).await?;
        self.inner.end_stream().await
    }

    async fn reject(&mut self, rejection: &Rejection) -> Result<(), ClientGone> {
        self.started();
        if !self.committed {
            self.status = rejection.status;
            return self.inner.reject(rejection).await;
        }
        let event = match self.keepalive {
            Some(keepalive) if keepalive.stream => rejection.stream_event(keepalive.dialect),
            _ => rejection.body(),
        };
        self.error_in_body(rejection.status, &event).await
    }

    async fn start_stream(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
    ) -> Result<(), ClientGone> {
        self.started();
        self.status = status;
        if self.committed {
            // The head went with the first keepalive; the events follow the comments.
            self.metrics.count_response(status);
            return Ok(());
        }
        self.inner
            .start_stream(status, content_type, extra_headers)
            .await
    }

    async fn stream_data_corked(&mut self, data: &[u8]) -> Result<(), ClientGone> {
        self.started();
        self.inner.stream_data_corked(data).await
    }

    async fn flush(&mut self) -> Result<(), ClientGone> {
        self.inner.flush().await
    }

    async fn start_keepalive(&mut self, content_type: &str) -> Result<(), ClientGone> {
        self.inner.start_keepalive(content_type).await
    }

    async fn stream_data(&mut self, data: &[u8]) -> Result<(), ClientGone> {
        self.started();
        self.inner.stream_data(data).await
    }

    async fn end_stream(&mut self) -> Result<(), ClientGone> {
        self.inner.end_stream().await
    }

    fn until_client_gone<F: std::future::Future>(
        &mut self,
        future: F,
    ) -> impl std::future::Future<Output = Option<F::Output>> {
        // Not held (nearly every request): the inner sink's plain future, one branch. Held: the
        // keepalive loop, boxed so that its state does not grow every request's future.
        match self.next {
            None => Either::Left(self.inner.until_client_gone(future)),
            Some(next) => Either::Right(Box::pin(self.held_until_client_gone(next, future))),
        }
    }

    fn close_after(&mut self) {
        self.inner.close_after();
    }

    fn waiting(&mut self) {
        self.inner.waiting();
    }

    fn status(&self) -> u16 {
        if self.status != 0 {
            self.status
        } else {
            self.inner.status()
        }
    }

    fn set_request_id(&mut self, id: [u8; 36]) {
        self.inner.set_request_id(id);
    }

    fn set_traceparent(
        &mut self,
        traceparent: Option<[u8; crate::net::telemetry::context::TRACEPARENT_LEN]>,
    ) {
        self.inner.set_traceparent(traceparent);
    }
}
