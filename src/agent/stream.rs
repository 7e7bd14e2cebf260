//! The agent's end of one tunnelled stream, whichever codec the router accepted
//! (`tunnel::preamble::Codec`): the request as it arrived, its body for the engine client, and
//! where the answer goes. Two codecs for one release: the lean tunnel (`tunnel::link`), and
//! HTTP/2 with routers older than it. `agent::forward` sees one type of each.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, Method, Response, Uri};
use hyper::body::{Body, Frame};

use crate::net::tunnel::link::{self, LinkError};
use crate::net::tunnel::wire;

/// A request from the router.
pub struct Incoming {
    pub method: Method,
    /// Origin form: the path and query the router asked for.
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: RequestBody,
}

impl Incoming {
    pub fn lean(request: link::Request, body: link::RecvStream) -> Incoming {
        Incoming {
            method: request.method,
            uri: Uri::from(request.target),
            headers: request.fields,
            body: RequestBody::Lean(body),
        }
    }

    pub fn http2(request: http::Request<RecvStream>) -> Incoming {
        let (parts, body) = request.into_parts();
        Incoming {
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body: RequestBody::Http2 {
                recv: body,
                data_done: false,
            },
        }
    }
}

/// The request body as the engine client takes it. Flow-control credit goes back to the router
/// as the engine client takes each piece, so the router's sending is paced by the engine's
/// reading.
pub enum RequestBody {
    Lean(link::RecvStream),
    Http2 { recv: RecvStream, data_done: bool },
}

/// Why the request body or the stream failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Lean(#[from] LinkError),
    #[error(transparent)]
    Http2(#[from] h2::Error),
    #[error("router stream closed")]
    Closed,
    #[error("router did not take a chunk within {0:?}")]
    Timeout(Duration),
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        match self.get_mut() {
            RequestBody::Lean(recv) => match ready!(recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    recv.release_capacity(data.len());
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Some(Err(error)) => Poll::Ready(Some(Err(error.into()))),
                None => Poll::Ready(None),
            },
            RequestBody::Http2 { recv, data_done } => {
                if !*data_done {
                    match ready!(recv.poll_data(cx)) {
                        Some(Ok(data)) => {
                            // Releasing can only fail when the stream is already gone; the next
                            // poll reports that.
                            let _ = recv.flow_control().release_capacity(data.len());
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                        Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                        None => *data_done = true,
                    }
                }
                match ready!(recv.poll_trailers(cx)) {
                    Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                    Ok(None) => Poll::Ready(None),
                    Err(error) => Poll::Ready(Some(Err(error.into()))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Lean(recv) => recv.is_end_stream(),
            RequestBody::Http2 { recv, .. } => recv.is_end_stream(),
        }
    }
}

/// Where a request's answer goes: its head, then its body. Dropped before the body's end, the
/// stream is reset.
pub enum Reply {
    Lean(link::Responder),
    Http2 {
        respond: SendResponse<Bytes>,
        /// The body's sender, once the head went.
        send: Option<SendStream<Bytes>>,
    },
}

impl Reply {
    pub fn http2(respond: SendResponse<Bytes>) -> Reply {
        Reply::Http2 {
            respond,
            send: None,
        }
    }

    /// Resolves when the router reset the stream or the tunnel ended: nobody wants the answer.
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<StreamError> {
        match self {
            Reply::Lean(responder) => responder.poll_reset(cx).map(StreamError::from),
            Reply::Http2 {
                send: Some(send), ..
            } => send.poll_reset(cx).map(reset_by_router),
            Reply::Http2 {
                respond,
                send: None,
            } => respond.poll_reset(cx).map(reset_by_router),
        }
    }

    pub async fn reset(&mut self) -> StreamError {
        poll_fn(|cx| self.poll_reset(cx)).await
    }

    /// The response head; `end`: there is no body.
    pub fn send_head(&mut self, head: Response<()>, end: bool) -> Result<(), StreamError> {
        match self {
            Reply::Lean(responder) => {
                let (mut parts, ()) = head.into_parts();
                // The engine's head: a field the tunnel cannot carry (a name over 255 bytes, say)
                // is dropped rather than breaking every stream on the tunnel.
                let dropped = wire::drop_unfit_fields(&mut parts.headers, wire::STATUS_BYTES);
                if dropped > 0 {
                    tracing::warn!(dropped, "engine response fields too long for the tunnel");
                }
                Ok(responder.send_response(parts.status, parts.headers, end)?)
            }
            Reply::Http2 { respond, send } => {
                *send = Some(respond.send_response(head, end)?);
                Ok(())
            }
        }
    }

    /// Sends a piece of the body as the router's credit allows, within `timeout` (the rolling
    /// `--stream-write-timeout`); `end`: its last byte ends the stream.
    pub async fn send_data(
        &mut self,
        data: Bytes,
        end: bool,
        timeout: Option<Duration>,
    ) -> Result<(), StreamError> {
        let write = async {
            match self {
                Reply::Lean(responder) => Ok(responder.send_data(data, end).await?),
                Reply::Http2 { send: None, .. } => Err(StreamError::Closed),
                Reply::Http2 {
                    send: Some(send), ..
                } => send_http2(send, data, end).await,
            }
        };
        match timeout {
            Some(limit) => tokio::time::timeout(limit, write)
                .await
                .map_err(|_| StreamError::Timeout(limit))?,
            None => write.await,
        }
    }

    /// Resets the stream with `reason` (`tunnel::BACKEND_FAILED`, `tunnel::mux::CANCEL`).
    pub fn send_reset(&mut self, reason: u32) {
        match self {
            Reply::Lean(responder) => responder.send_reset(reason),
            Reply::Http2 {
                send: Some(send), ..
            } => send.send_reset(h2::Reason::from(reason)),
            Reply::Http2 {
                respond,
                send: None,
            } => respond.send_reset(h2::Reason::from(reason)),
        }
    }
}

fn reset_by_router(reset: Result<h2::Reason, h2::Error>) -> StreamError {
    match reset {
        Ok(reason) => StreamError::Http2(h2::Error::from(reason)),
        Err(error) => StreamError::Http2(error),
    }
}

async fn send_http2(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    end: bool,
) -> Result<(), StreamError> {
    if data.is_empty() {
        if end {
            send.send_data(data, true)?;
        }
        return Ok(());
    }
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let granted = match poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(granted)) => granted,
            Some(Err(error)) => return Err(error.into()),
            None => return Err(StreamError::Closed),
        };
        if granted == 0 {
            continue;
        }
        let chunk = data.split_to(granted.min(data.len()));
        send.send_data(chunk, end && data.is_empty())?;
    }
    Ok(())
}
