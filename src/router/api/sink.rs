//! Where a response goes: the client connection, behind one small trait so the request phases do
//! not care whether the client speaks HTTP/1.1 or HTTP/2.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::router::error::Rejection;

/// The most a sink holds corked before it writes out (`Sink::stream_data_corked`).
pub const CORKED_BYTES_MAX: usize = 16 * 1024;

/// The client connection broke or closed; the request is over and the connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

pub trait Sink {
    /// A complete response with a known body.
    fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> impl Future<Output = Result<(), ClientGone>>;

    /// Starts a streamed response (`text/event-stream` and the like). The head may wait in the
    /// connection's buffer ("corked") until the next write, [`Sink::flush`] or
    /// [`Sink::end_stream`], so that a proxied stream whose head, events and end arrive together
    /// leaves in one write; whoever then waits for more flushes first.
    fn start_stream(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
    ) -> impl Future<Output = Result<(), ClientGone>>;

    /// Starts a streamed `200` response for hold at zero's first keepalive. Unlike
    /// [`Sink::start_stream`] the status is not counted in the HTTP metrics: the request's real
    /// status, known only when it ends, is counted by whoever writes it (`api::hold`).
    fn start_keepalive(
        &mut self,
        content_type: &str,
    ) -> impl Future<Output = Result<(), ClientGone>>;

    /// Sends part of a streamed response, flushed to the socket before this resolves.
    fn stream_data(&mut self, data: &[u8]) -> impl Future<Output = Result<(), ClientGone>>;

    /// Ends a streamed response, writing whatever is corked with it.
    fn end_stream(&mut self) -> impl Future<Output = Result<(), ClientGone>>;

    /// Like [`Sink::stream_data`], but the data may wait in the connection's buffer as a
    /// stream's head does ([`Sink::start_stream`]). A sink writes out once it holds
    /// [`CORKED_BYTES_MAX`], so corking never buffers without bound. By default nothing waits.
    fn stream_data_corked(&mut self, data: &[u8]) -> impl Future<Output = Result<(), ClientGone>> {
        self.stream_data(data)
    }

    /// Writes out whatever is corked.
    fn flush(&mut self) -> impl Future<Output = Result<(), ClientGone>> {
        std::future::ready(Ok(()))
    }

    /// Runs `future` unless the client goes away first, in which case `None`.
    fn until_client_gone<F: Future>(
        &mut self,
        future: F,
    ) -> impl Future<Output = Option<F::Output>>;

    /// Asks the connection to close after this response.
    fn close_after(&mut self);

    /// A streamed response waits for its next part, everything written out: the sink may give
    /// back the buffers it holds for writing, so that thousands of open streams between two
    /// tokens hold none (`perf/notes/2026-12-06-memory-per-open-stream.md`). By default nothing.
    fn waiting(&mut self) {}

    /// The status of the response head written for the current request (0: none yet).
    fn status(&self) -> u16;

    /// The current request's ID, sent back as `X-Request-ID` on its response head.
    fn set_request_id(&mut self, id: [u8; 36]);

    /// The current request's trace context, sent back as `traceparent` on its response head
    /// (`None`: tracing is off, no header).
    fn set_traceparent(
        &mut self,
        traceparent: Option<[u8; crate::net::telemetry::context::TRACEPARENT_LEN]>,
    );

    /// Answers with the rejection's status, headers (`api::refusal::Headers`) and envelope.
    fn reject(&mut self, rejection: &Rejection) -> impl Future<Output = Result<(), ClientGone>> {
        async move {
            if rejection.close {
                self.close_after();
            }
            let body = rejection.body();
            let mut headers = crate::router::api::refusal::Headers::default();
            let headers = headers.of(rejection);
            self.respond(
                rejection.status,
                "application/json",
                headers.as_slice(),
                &body,
            )
            .await
        }
    }
}

pin_project_lite::pin_project! {
    /// What [`Sink::until_client_gone`] returns: `future`'s output, or `None` once `gone`
    /// resolves; `gone` is polled first, so a client known to be gone wins.
    ///
    /// A plain future rather than an `async fn`: an `async fn` taking a future keeps the future
    /// as its argument and again in what it awaits, so each wrapping level doubled the request
    /// path's futures, and every `.await` copies a future whole (`shard::timer`).
    #[must_use = "futures do nothing unless polled"]
    pub struct UntilGone<F, G> {
        #[pin]
        future: F,
        #[pin]
        gone: G,
    }
}

impl<F: Future, G: Future> UntilGone<F, G> {
    pub fn new(future: F, gone: G) -> Self {
        UntilGone { future, gone }
    }
}

impl<F: Future, G: Future> Future for UntilGone<F, G> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.gone.poll(context).is_ready() {
            return Poll::Ready(None);
        }
        this.future.poll(context).map(Some)
    }
}
