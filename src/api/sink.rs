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

    /// Answers with the rejection's status, headers and envelope; a 401 carries the reference's
    /// bearer challenge.
    fn reject(&mut self, rejection: &Rejection) -> impl Future<Output = Result<(), ClientGone>> {
        async move {
            if rejection.close {
                self.close_after();
            }
            let body = rejection.body();
            let mut retry_after = itoa::Buffer::new();
            let mut requests = itoa::Buffer::new();
            let mut tokens = itoa::Buffer::new();
            let mut headers: [(&str, &[u8]); 4] = [("", b""); 4];
            let mut count = 0;
            if rejection.status == 401 {
                headers[count] = ("www-authenticate", b"Bearer realm=\"hivenet-router\"");
                count += 1;
            }
            if let Some(seconds) = rejection.retry_after_seconds {
                headers[count] = ("retry-after", retry_after.format(seconds).as_bytes());
                count += 1;
            }
            if let Some(remaining) = rejection.remaining_requests {
                headers[count] = (
                    "x-ratelimit-remaining-requests",
                    requests.format(remaining).as_bytes(),
                );
                count += 1;
            }
            if let Some(remaining) = rejection.remaining_tokens {
                headers[count] = (
                    "x-ratelimit-remaining-tokens",
                    tokens.format(remaining).as_bytes(),
                );
                count += 1;
            }
            self.respond(
                rejection.status,
                "application/json",
                &headers[..count],
                &body,
            )
            .await
        }
    }
}
