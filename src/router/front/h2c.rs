//! HTTP/2 with prior knowledge (h2c) for clients that speak it: the same request phases as HTTP/1.1,
//! one task per stream, on the shard that accepted the connection.
//!
//! A client that resets its stream (or drops the connection) is "gone" for the phases exactly as an
//! HTTP/1.1 client that closes its socket: the agent-side stream is reset and the slot released.
//! Responses respect the client's flow-control window: a slow reader holds its own stream back and
//! never makes the router buffer without bound.

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::future::Either;
use h2::server::SendResponse;
use monoio_compat::StreamWrapper;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::base::latch::race;
use crate::router::api::authenticate::{self, HeadCredentials, now_unix_ms};
use crate::router::api::sink::{ClientGone, Sink};
use crate::router::api::{self, ClientRequest};
use crate::router::error::Rejection;
use crate::router::shard::state::Shard;
use crate::wire::http::request::Method;

const BUFFER_BYTES: usize = 64 * 1024;

/// The client socket with the bytes already read while sniffing for the preface put back in front.
struct Prefixed {
    prefix: Bytes,
    inner: StreamWrapper<monoio::net::TcpStream>,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let take = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(take));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(context, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(context, buf)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(context)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(context)
    }
}

/// The bound on a client's header list (RFC 9113 §6.5.2: names, values and 32 bytes a field).
pub const HEADER_LIST_BYTES_MAX: u32 = 64 * 1024;

/// The HTTP/2 server settings of a client connection: stream concurrency, the receive window and
/// the header list bound. Shared with the fuzz target so it parses as the router does.
pub fn server_builder() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(256)
        .initial_window_size(1024 * 1024)
        .max_header_list_size(HEADER_LIST_BYTES_MAX);
    builder
}

/// Serves one h2c connection. Its time is bounded as HTTP/1.1's is: the handshake and every
/// stretch without an open stream get `--client-header-timeout` (a bare preface, or HEADERS that
/// never end, are closed then), each body `--client-body-timeout` between frames and
/// `--request-timeout` in all. A source that resets too many streams has its connections closed
/// with `ENHANCE_YOUR_CALM` (its resets would otherwise reach the agents' tunnels).
pub async fn serve(shard: Rc<Shard>, stream: monoio::net::TcpStream, prefix: Bytes) {
    let peer = stream.peer_addr().ok().map(|address| address.ip());
    let io = Prefixed {
        prefix,
        inner: StreamWrapper::new_with_buffer_size(stream, BUFFER_BYTES, BUFFER_BYTES),
    };
    let header_timeout = shard.settings.client_header_timeout;
    let handshake = server_builder().handshake::<_, Bytes>(io);
    let mut connection = match monoio::time::timeout(header_timeout, handshake).await {
        Ok(Ok(connection)) => connection,
        _ => return,
    };
    let streams = Rc::new(OpenStreams {
        open: Cell::new(0),
        idle_since: Cell::new(Instant::now()),
    });
    let mut going_away = false;
    loop {
        if shard.lifecycle.is_draining() && !going_away {
            // Streams already open finish; the client opens no more here.
            connection.graceful_shutdown();
            going_away = true;
        }
        let wait = if streams.open.get() == 0 {
            header_timeout.saturating_sub(streams.idle_since.get().elapsed())
        } else {
            header_timeout
        }
        .min(DRAIN_CHECK_INTERVAL);
        match race(connection.accept(), monoio::time::sleep(wait)).await {
            Either::Left(Some(Ok((request, respond)))) => {
                if shard.clients.is_refused(peer, Instant::now()) {
                    connection.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                    break;
                }
                let open = OpenStream::new(&streams);
                monoio::spawn(serve_stream(shard.clone(), request, respond, peer, open));
            }
            Either::Left(Some(Err(_)) | None) => return,
            Either::Right(()) => {
                if streams.open.get() == 0 && streams.idle_since.get().elapsed() >= header_timeout {
                    connection.graceful_shutdown();
                    break;
                }
            }
        }
    }
    // Let the GOAWAY reach the client, briefly.
    let closing = std::future::poll_fn(|context| connection.poll_closed(context));
    let _ = monoio::time::timeout(CLOSE_GRACE, closing).await;
}

/// How often an idle or busy connection looks whether the shard is draining.
const DRAIN_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a closing connection may take to deliver its GOAWAY.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The connection's open streams, and since when it has had none.
struct OpenStreams {
    open: Cell<usize>,
    idle_since: Cell<Instant>,
}

/// One open stream of a connection; the connection is idle again when the last one drops.
struct OpenStream(Rc<OpenStreams>);

impl OpenStream {
    fn new(streams: &Rc<OpenStreams>) -> OpenStream {
        streams.open.set(streams.open.get() + 1);
        OpenStream(streams.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let streams = &self.0;
        streams.open.set(streams.open.get() - 1);
        if streams.open.get() == 0 {
            streams.idle_since.set(Instant::now());
        }
    }
}

async fn serve_stream(
    shard: Rc<Shard>,
    request: http::Request<h2::RecvStream>,
    respond: SendResponse<Bytes>,
    peer: Option<std::net::IpAddr>,
    _open: OpenStream,
) {
    let started = Instant::now();
    let mut sink = H2Sink {
        respond,
        stream: None,
        shard: shard.clone(),
        status: 0,
        request_id: None,
        traceparent: None,
    };
    let (parts, mut body_stream) = request.into_parts();
    let (route, method) = match route_of(&parts) {
        Ok(routed) => routed,
        Err(rejection) => {
            let _ = sink.reject(&rejection).await;
            return;
        }
    };
    let header_bytes = |name: &str| parts.headers.get(name).map(|value| value.as_bytes());
    // Credentials before the body, as on HTTP/1.1: a refused client costs no body buffer.
    if !body_stream.is_end_stream() {
        let target = parts
            .uri
            .path_and_query()
            .map_or(&b"/"[..], |target| target.as_str().as_bytes());
        let credentials = HeadCredentials {
            route,
            target,
            authorization: header_bytes("authorization"),
            x_api_key: header_bytes("x-api-key"),
        };
        if let Err(rejection) = authenticate::on_head(&shard, credentials, now_unix_ms()) {
            let _ = sink.reject(&rejection).await;
            return;
        }
    }
    let limit = api::BodyLimit::of(route, shard.settings.max_request_bytes);
    let deadline = started + shard.settings.request_timeout;
    let mut body = BytesMut::new();
    let Some(mut lease) = shard.clients.lease_body(0) else {
        let _ = sink.reject(&Rejection::bodies_full()).await;
        return;
    };
    loop {
        let wait = shard
            .settings
            .client_body_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let next = race(
            crate::router::shard::timer::timeout(wait, body_stream.data()),
            std::future::poll_fn(|context| sink.respond.poll_reset(context)),
        )
        .await;
        match next {
            Either::Right(_) => {
                shard.clients.stream_reset(peer, Instant::now());
                return;
            }
            Either::Left(Err(_elapsed)) => {
                let _ = sink.reject(&Rejection::client_timeout()).await;
                return;
            }
            Either::Left(Ok(None)) => break,
            Either::Left(Ok(Some(Err(_)))) => return,
            Either::Left(Ok(Some(Ok(chunk)))) => {
                let _ = body_stream.flow_control().release_capacity(chunk.len());
                if limit.exceeded_by((body.len() + chunk.len()) as u64) {
                    let _ = sink.reject(&limit.refusal()).await;
                    return;
                }
                if !lease.grow_to(body.len() + chunk.len()) {
                    let _ = sink.reject(&Rejection::bodies_full()).await;
                    return;
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
    drop(lease);
    let mut request = client_request(&parts, route, method, body.freeze(), started, peer);
    request.span = shard.accounting.start_span(|| {
        parts
            .headers
            .get("traceparent")
            .map(|value| value.as_bytes())
    });
    if api::serve(&shard, &request, &mut sink).await.is_err() {
        // The client reset the stream (or dropped the connection) before its answer was done.
        shard.clients.stream_reset(peer, Instant::now());
    }
}

/// The router's method for an HTTP/2 request's `:method`, as `api::route` reads it.
pub fn method_of(method: &http::Method) -> Method {
    match *method {
        http::Method::GET => Method::Get,
        http::Method::HEAD => Method::Head,
        http::Method::POST => Method::Post,
        http::Method::PUT => Method::Put,
        http::Method::DELETE => Method::Delete,
        _ => Method::Other,
    }
}

/// The route of an HTTP/2 request head, decided before its body is read; a rejection is answered
/// at once. Pure: the stream task and the fuzz target (`fuzz/fuzz_targets/h2c_request.rs`) call it.
pub fn route_of(parts: &http::request::Parts) -> Result<(api::Route, Method), Rejection> {
    let method = method_of(&parts.method);
    let route = api::route(method, parts.uri.path().as_bytes())?;
    Ok((route, method))
}

/// Maps a routed HTTP/2 request head and its whole body to the [`ClientRequest`] the request phases
/// take, exactly as HTTP/1.1 heads are mapped: header values copied as sent, the request ID
/// checked or generated. Pure apart from the random request ID generated when the client sent
/// none.
pub fn client_request(
    parts: &http::request::Parts,
    route: api::Route,
    method: Method,
    body: Bytes,
    received_at: Instant,
    peer: Option<std::net::IpAddr>,
) -> ClientRequest {
    let header_bytes = |name: &str| parts.headers.get(name).map(|value| value.as_bytes());
    let header = |name: &str| header_bytes(name).map(Bytes::copy_from_slice);
    let target = parts.uri.path_and_query().map_or_else(
        || Bytes::from_static(b"/"),
        |target| Bytes::copy_from_slice(target.as_str().as_bytes()),
    );
    ClientRequest {
        route,
        method,
        target,
        body,
        request_id: {
            let mut id = [0u8; 36];
            crate::router::audit::request_id(header_bytes("x-request-id"), &mut id);
            id
        },
        client_id: crate::logic::hold::ClientId::of_headers(
            header_bytes("x-client-request-id"),
            header_bytes("x-request-id"),
        ),
        anthropic_version: header("anthropic-version"),
        anthropic_beta: header("anthropic-beta"),
        authorization: header("authorization"),
        x_api_key: header("x-api-key"),
        received_at,
        peer,
        // Started by the caller, which knows whether tracing is on.
        span: None,
    }
}

struct H2Sink {
    respond: SendResponse<Bytes>,
    stream: Option<h2::SendStream<Bytes>>,
    /// Where this connection's responses are counted.
    shard: Rc<Shard>,
    /// The status of the response head, once written (0 before).
    status: u16,
    /// The request's ID, returned as `X-Request-ID`.
    request_id: Option<[u8; 36]>,
    /// The request's trace context, returned as `traceparent` (tracing on only).
    traceparent: Option<[u8; crate::net::telemetry::context::TRACEPARENT_LEN]>,
}

impl H2Sink {
    /// Sends the response head; the caller counts the status.
    fn head(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
        content_length: Option<usize>,
        end_of_stream: bool,
    ) -> Result<(), ClientGone> {
        self.status = status;
        let mut response = http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type);
        match content_length {
            Some(length) => response = response.header(http::header::CONTENT_LENGTH, length),
            None => response = response.header(http::header::CACHE_CONTROL, "no-cache"),
        }
        if let Some(id) = &self.request_id {
            response = response.header("x-request-id", id.as_slice());
        }
        if let Some(traceparent) = &self.traceparent {
            response = response.header("traceparent", traceparent.as_slice());
        }
        for (name, value) in extra_headers {
            response = response.header(*name, *value);
        }
        let response = response.body(()).map_err(|_| ClientGone)?;
        let stream = self
            .respond
            .send_response(response, end_of_stream)
            .map_err(|_| ClientGone)?;
        self.stream = Some(stream);
        Ok(())
    }

    /// Sends `data` as the client's window allows.
    async fn send(&mut self, mut data: Bytes, end_of_stream: bool) -> Result<(), ClientGone> {
        let stream = self.stream.as_mut().ok_or(ClientGone)?;
        loop {
            if data.is_empty() {
                if end_of_stream {
                    stream
                        .send_data(Bytes::new(), true)
                        .map_err(|_| ClientGone)?;
                }
                return Ok(());
            }
            stream.reserve_capacity(data.len());
            let granted = match std::future::poll_fn(|context| stream.poll_capacity(context)).await
            {
                Some(Ok(granted)) => granted,
                _ => return Err(ClientGone),
            };
            if granted == 0 {
                continue;
            }
            let part = data.split_to(granted.min(data.len()));
            let last = end_of_stream && data.is_empty();
            stream.send_data(part, last).map_err(|_| ClientGone)?;
            if last {
                return Ok(());
            }
        }
    }
}

impl Sink for H2Sink {
    async fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), ClientGone> {
        self.shard.metrics.count_response(status);
        self.head(
            status,
            content_type,
            extra_headers,
            Some(body.len()),
            body.is_empty(),
        )?;
        if body.is_empty() {
            return Ok(());
        }
        self.send(Bytes::copy_from_slice(body), true).await
    }

    async fn start_stream(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
    ) -> Result<(), ClientGone> {
        self.shard.metrics.count_response(status);
        self.head(status, content_type, extra_headers, None, false)
    }

    async fn start_keepalive(&mut self, content_type: &str) -> Result<(), ClientGone> {
        self.head(200, content_type, &[], None, false)
    }

    async fn stream_data(&mut self, data: &[u8]) -> Result<(), ClientGone> {
        self.send(Bytes::copy_from_slice(data), false).await
    }

    async fn end_stream(&mut self) -> Result<(), ClientGone> {
        let stream = self.stream.as_mut().ok_or(ClientGone)?;
        stream.send_data(Bytes::new(), true).map_err(|_| ClientGone)
    }

    fn until_client_gone<F: std::future::Future>(
        &mut self,
        future: F,
    ) -> impl std::future::Future<Output = Option<F::Output>> {
        let respond = &mut self.respond;
        let stream = &mut self.stream;
        let reset = std::future::poll_fn(move |context| match stream.as_mut() {
            Some(stream) => stream.poll_reset(context),
            None => respond.poll_reset(context),
        });
        crate::router::api::sink::UntilGone::new(future, reset)
    }

    fn close_after(&mut self) {}

    fn status(&self) -> u16 {
        self.status
    }

    fn set_request_id(&mut self, id: [u8; 36]) {
        self.request_id = Some(id);
    }

    fn set_traceparent(
        &mut self,
        traceparent: Option<[u8; crate::net::telemetry::context::TRACEPARENT_LEN]>,
    ) {
        self.traceparent = traceparent;
    }
}
