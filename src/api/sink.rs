//! Where a response goes: the client connection, behind one small trait so the request phases do
//! not care whether the client speaks HTTP/1.1 or HTTP/2.

use std::future::Future;

use crate::error::Rejection;

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

    /// Starts a streamed response (`text/event-stream` and the like); the head is sent at once.
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

    /// Ends a streamed response.
    fn end_stream(&mut self) -> impl Future<Output = Result<(), ClientGone>>;

    /// Runs `future` unless the client goes away first, in which case `None`.
    fn until_client_gone<F: Future>(
        &mut self,
        future: F,
    ) -> impl Future<Output = Option<F::Output>>;

    /// Asks the connection to close after this response.
    fn close_after(&mut self);

    /// The status of the response head written for the current request (0: none yet).
    fn status(&self) -> u16;

    /// The current request's ID, sent back as `X-Request-ID` on its response head.
    fn set_request_id(&mut self, id: [u8; 36]);

    /// The current request's trace context, sent back as `traceparent` on its response head
    /// (`None`: tracing is off, no header).
    fn set_traceparent(
        &mut self,
        traceparent: Option<[u8; crate::telemetry::context::TRACEPARENT_LEN]>,
    );

    /// Answers with the rejection's status, headers (`api::refusal::Headers`) and envelope.
    fn reject(&mut self, rejection: &Rejection) -> impl Future<Output = Result<(), ClientGone>> {
        async move {
            if rejection.close {
                self.close_after();
            }
            let body = rejection.body();
            let mut headers = crate::api::refusal::Headers::default();
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
