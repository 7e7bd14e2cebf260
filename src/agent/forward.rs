//! Serving one tunnelled request: the router's tunnel stream in (`agent::stream`, either codec),
//! the backend's HTTP/1.1 exchange out, the response streamed back.
//!
//! ## Phases
//! 1. *enter*: count the request in flight (the guard leaves on every exit).
//! 2. *send*: rewrite the URI onto `--backend-url`, filter headers (`agent::headers`), stream the
//!    request body from the tunnel to the backend on a pooled keep-alive connection
//!    (`agent::engine_client`).
//! 3. *head*: wait for the backend's response head within `--http-timeout`, racing a reset of the
//!    stream by the router. A failure here is answered by [`ForwardError::into_response`] — the one
//!    place that turns agent errors into HTTP.
//! 4. *stream*: copy body frames back, respecting the tunnel's flow control, each frame within
//!    `--stream-write-timeout`; the backend must produce each frame within `--http-timeout`.
//!
//! ## Cancellation
//! When the router resets the stream (its client went away), the handler returns at once and drops
//! the backend request or response, which closes that backend connection instead of pooling it:
//! that is how vLLM, SGLang and the others learn to abort the generation. Only a response read to
//! the end gives its connection back (`agent::engine_client`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri, Version};
use tracing::{debug, warn};

use super::engine_client::{EngineBody, EngineClient, SendError};
use super::headers;
use super::stream::{Incoming, Reply};
use crate::net::telemetry::{Sampler, SpanOutcome, SpanQueue, StartedSpan};

const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

const BACKEND_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Requests being served now, over every router and shard. Reported in heartbeats and routing
/// signals.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<AtomicU32>);

impl InFlight {
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn enter(&self) -> InFlightGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(self.0.clone())
    }
}

/// Leaves the in-flight count when dropped, whichever way the request ended.
pub struct InFlightGuard(Arc<AtomicU32>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "in-flight count went below zero");
    }
}

/// What every forwarded request shares.
pub struct ForwardContext {
    engine: EngineClient,
    /// The path of `--backend-url` without a trailing slash, put before every request's path;
    /// empty for a URL without one.
    base_path: String,
    /// The backend authority, sent as `host`.
    backend_host: HeaderValue,
    http_timeout: Duration,
    stream_write_timeout: Option<Duration>,
    pub in_flight: InFlight,
    /// Where finished request spans go; `None` when tracing is off.
    spans: Option<SpanQueue>,
}

impl ForwardContext {
    pub fn new(
        backend_base: &str,
        http_timeout: Duration,
        stream_write_timeout: Option<Duration>,
        in_flight: InFlight,
    ) -> Result<ForwardContext, String> {
        let uri: Uri = backend_base
            .parse()
            .map_err(|_| format!("--backend-url {backend_base:?} is not a URI"))?;
        let authority = uri
            .authority()
            .ok_or_else(|| format!("--backend-url {backend_base:?} has no host"))?;
        let backend_host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| format!("--backend-url {backend_base:?} has an invalid host"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--backend-url {backend_base:?} is not an http:// URL"
            ));
        }
        let port = authority.port_u16().unwrap_or(80);
        // `[::1]` stays bracketed: it is what a socket address string takes.
        let target = format!("{}:{port}", authority.host());
        Ok(ForwardContext {
            engine: EngineClient::new(target, BACKEND_CONNECT_TIMEOUT),
            base_path: uri.path().trim_end_matches('/').to_owned(),
            backend_host,
            http_timeout,
            stream_write_timeout,
            in_flight,
            spans: None,
        })
    }

    /// Tracing on: each request records a span here.
    pub fn with_spans(mut self, spans: Option<SpanQueue>) -> ForwardContext {
        self.spans = spans;
        self
    }
}

/// Why a request could not get a backend response head. Exactly this type becomes the agent's
/// error responses.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("backend is unreachable: {0}")]
    Unavailable(String),
    #[error("backend failed: {0}")]
    Failed(String),
    #[error("backend did not answer within {0:?}")]
    Timeout(Duration),
    #[error("request path {0:?} cannot be forwarded")]
    BadPath(String),
}

impl ForwardError {
    /// The error-code reference's statuses: `backend_unavailable` is 503, `backend_error` 502.
    pub fn status(&self) -> StatusCode {
        match self {
            ForwardError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ForwardError::Failed(_) => StatusCode::BAD_GATEWAY,
            ForwardError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ForwardError::BadPath(_) => StatusCode::BAD_REQUEST,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ForwardError::Unavailable(_) => "backend_unavailable",
            ForwardError::Failed(_) | ForwardError::Timeout(_) => "backend_error",
            ForwardError::BadPath(_) => "invalid_request",
        }
    }

    /// The OpenAI-style envelope the router passes to its client.
    pub fn body(&self) -> Bytes {
        let source = match self {
            ForwardError::BadPath(_) => "agent",
            _ => "backend",
        };
        Bytes::from(
            serde_json::json!({
                "error": {"code": self.code(), "message": self.to_string(), "source": source}
            })
            .to_string(),
        )
    }

    pub fn into_response(self) -> (Response<()>, Bytes) {
        let body = self.body();
        let response = Response::builder()
            .status(self.status())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CONTENT_LENGTH, body.len())
            .body(())
            .expect("static response parts are valid");
        (response, body)
    }
}

/// The origin-form URI (`{base_path}{path?query}`) the engine gets for a tunnelled request URI;
/// `base_path` is the path of `--backend-url` (usually empty: the request's own path is kept).
pub fn backend_uri(base_path: &str, request_uri: &Uri) -> Result<Uri, ForwardError> {
    let path = request_uri.path_and_query();
    let text = path.map_or("/", |path| path.as_str());
    if !text.starts_with('/') {
        return Err(ForwardError::BadPath(text.to_owned()));
    }
    match path {
        // The common case: the request's own path, without formatting or parsing.
        Some(path) if base_path.is_empty() => Ok(Uri::from(path.clone())),
        _ => format!("{base_path}{text}")
            .parse()
            .map_err(|_| ForwardError::BadPath(text.to_owned())),
    }
}

/// Serves one stream to completion or cancellation.
pub async fn serve(mut request: Incoming, mut reply: Reply, context: Arc<ForwardContext>) {
    let _in_flight = context.in_flight.enter();
    // Tracing off: this one branch is all it costs.
    let traced = context.spans.as_ref().map(|spans| {
        let (span, engine_call) = start_spans(&mut request.headers, spans.sampler());
        let name = crate::net::telemetry::span_name(request.uri.path());
        (span, engine_call, name, request_id_of(&request.headers))
    });
    // The engine's answer as its client span reports it: its status (0: none) and, without
    // one, why.
    let mut engine_answer: (u16, Option<&'static str>) = (0, None);
    let (status, error_code) = match send_to_backend(request, &mut reply, &context).await {
        Some(Ok(response)) => {
            let status = response.status().as_u16();
            engine_answer = (status, None);
            stream_to_router(response, reply, &context).await;
            (status, None)
        }
        Some(Err(error)) => {
            warn!(%error, "answering the router with an agent error");
            let code = error.code();
            engine_answer = (0, Some(code));
            let (head, body) = error.into_response();
            let status = head.status().as_u16();
            if reply.send_head(head, false).is_ok() {
                // A few hundred bytes, below any initial window: no wait for credit.
                let _ = reply
                    .send_data(body, true, context.stream_write_timeout)
                    .await;
            }
            (status, Some(code))
        }
        // The router reset the stream: its client went away (nginx's 499).
        None => (499, None),
    };
    if let (Some((span, engine_call, name, request_id)), Some(spans)) = (traced, &context.spans) {
        let (engine_status, engine_error) = engine_answer;
        spans.push(engine_call.finish(
            name,
            SpanOutcome {
                status: engine_status,
                request_id,
                model: None,
                error_code: engine_error,
            },
        ));
        let outcome = SpanOutcome {
            status,
            request_id,
            model: None,
            error_code,
        };
        spans.push(span.finish(name, outcome));
    }
}

/// The agent's spans for a request: its server span, a child of the router's (its
/// `traceparent`) or a new trace when the router sent none, and under it the client span of
/// the engine call. The engine gets the client span's context in place of the router's.
fn start_spans(headers: &mut http::HeaderMap, sampler: Sampler) -> (StartedSpan, StartedSpan) {
    let span = StartedSpan::start(headers.get(TRACEPARENT).map(HeaderValue::as_bytes), sampler);
    let engine_call = span.client();
    let traceparent = HeaderValue::from_bytes(&engine_call.context.traceparent())
        .expect("a traceparent is ASCII hex digits and dashes");
    headers.insert(TRACEPARENT, traceparent);
    (span, engine_call)
}

/// The router's `x-request-id`, when it is the 36 bytes of a UUID's text.
fn request_id_of(headers: &http::HeaderMap) -> Option<[u8; 36]> {
    headers
        .get("x-request-id")
        .and_then(|value| value.as_bytes().try_into().ok())
}

/// Phases *send* and *head*. `None` when the router reset the stream meanwhile.
async fn send_to_backend(
    request: Incoming,
    reply: &mut Reply,
    context: &ForwardContext,
) -> Option<Result<Response<EngineBody>, ForwardError>> {
    let uri = match backend_uri(&context.base_path, &request.uri) {
        Ok(uri) => uri,
        Err(error) => return Some(Err(error)),
    };
    let mut backend_request = Request::new(request.body);
    *backend_request.method_mut() = request.method;
    *backend_request.uri_mut() = uri;
    *backend_request.version_mut() = Version::HTTP_11;
    *backend_request.headers_mut() = request.headers;
    headers::to_backend(backend_request.headers_mut(), &context.backend_host);

    let exchange = tokio::time::timeout(context.http_timeout, context.engine.send(backend_request));
    tokio::select! {
        result = exchange => Some(match result {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error @ SendError::Connect { .. })) => Err(ForwardError::Unavailable(error.to_string())),
            Ok(Err(error)) => Err(ForwardError::Failed(error.to_string())),
            Err(_) => Err(ForwardError::Timeout(context.http_timeout)),
        }),
        reason = reply.reset() => {
            debug!(%reason, "router reset the stream before the backend answered");
            None
        }
    }
}

/// Phase *stream*. A body read to its end has given its connection back to the pool by then
/// (`EngineBody::chunk`); any other way out drops the body and closes the connection.
async fn stream_to_router(
    response: Response<EngineBody>,
    mut reply: Reply,
    context: &ForwardContext,
) {
    let (parts, mut body) = response.into_parts();
    let mut head = Response::new(());
    *head.status_mut() = parts.status;
    *head.headers_mut() = parts.headers;
    headers::to_router(head.headers_mut());
    let end_of_stream = body.is_end();
    if let Err(error) = reply.send_head(head, end_of_stream) {
        debug!(%error, "stream closed before the response head");
        return;
    }
    if end_of_stream {
        return;
    }
    loop {
        let chunk = tokio::select! {
            chunk = tokio::time::timeout(context.http_timeout, body.chunk()) => chunk,
            reason = reply.reset() => {
                // Dropping `body` here closes the backend connection: the engine cancels.
                debug!(%reason, "router reset the stream mid-response");
                return;
            }
        };
        match chunk {
            Err(_) => {
                warn!(timeout = ?context.http_timeout, "backend stalled mid-response");
                reply.send_reset(crate::net::tunnel::BACKEND_FAILED);
                return;
            }
            Ok(None) => {
                let _ = reply.send_data(Bytes::new(), true, None).await;
                return;
            }
            Ok(Some(Err(error))) => {
                // The engine's connection broke mid-response (a crash, a reset): the router tells
                // its client the backend failed, not that the agent was lost (`crate::net::tunnel`).
                warn!(%error, "backend response body failed");
                reply.send_reset(crate::net::tunnel::BACKEND_FAILED);
                return;
            }
            Ok(Some(Ok(data))) => {
                // A body whose end is known and reached ends the stream with its last chunk: no
                // empty DATA frame after it for the router to read.
                let last = body.is_end();
                if let Err(error) = reply
                    .send_data(data, last, context.stream_write_timeout)
                    .await
                {
                    debug!(%error, "cannot write the response to the router");
                    reply.send_reset(crate::net::tunnel::mux::CANCEL);
                    return;
                }
                if last {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_uri_keeps_path_and_query() {
        let uri: Uri = "http://router/v1/chat/completions?x=1".parse().unwrap();
        assert_eq!(backend_uri("", &uri).unwrap(), "/v1/chat/completions?x=1");
        let bare: Uri = "/health".parse().unwrap();
        assert_eq!(backend_uri("/prefix", &bare).unwrap(), "/prefix/health");
    }

    #[test]
    fn the_backend_url_gives_the_dial_target_and_the_path_prefix() {
        let context =
            |url: &str| ForwardContext::new(url, Duration::from_secs(1), None, InFlight::default());
        let plain = context("http://127.0.0.1:8000/").unwrap();
        assert_eq!(plain.base_path, "");
        assert_eq!(plain.engine.target(), "127.0.0.1:8000");
        let prefixed = context("http://engine/prefix/").unwrap();
        assert_eq!(prefixed.base_path, "/prefix");
        assert_eq!(prefixed.engine.target(), "engine:80");
        assert_eq!(
            context("http://[::1]:9/").unwrap().engine.target(),
            "[::1]:9"
        );
        assert!(context("https://engine:443").is_err());
    }

    #[test]
    fn errors_map_to_status_and_envelope() {
        let unavailable = ForwardError::Unavailable("connection refused".into());
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = serde_json::from_slice(&unavailable.body()).unwrap();
        assert_eq!(body["error"]["code"], "backend_unavailable");
        assert_eq!(body["error"]["source"], "backend");
        let timeout = ForwardError::Timeout(Duration::from_secs(120));
        assert_eq!(timeout.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(timeout.code(), "backend_error");
        let (head, body) = timeout.into_response();
        assert_eq!(
            head.headers()["content-length"],
            body.len().to_string().as_str()
        );
    }

    use crate::net::tunnel::preamble::Codec;

    /// Sends one GET through an in-memory tunnel speaking `codec` to `serve` and returns the
    /// answer.
    async fn one_request(
        codec: Codec,
        backend: &str,
        http_timeout: Duration,
    ) -> (StatusCode, serde_json::Value, InFlight) {
        let (status, chunks, in_flight) = exchange(codec, backend, http_timeout).await;
        (
            status,
            serde_json::from_slice(&chunks.concat()).unwrap(),
            in_flight,
        )
    }

    /// Like [`one_request`], with the body as the data frames' payloads, in order.
    async fn exchange(
        codec: Codec,
        backend: &str,
        http_timeout: Duration,
    ) -> (StatusCode, Vec<Bytes>, InFlight) {
        let in_flight = InFlight::default();
        let context =
            Arc::new(ForwardContext::new(backend, http_timeout, None, in_flight.clone()).unwrap());
        let (router_io, agent_io) = tokio::io::duplex(1 << 16);
        let (status, mut body) = match codec {
            Codec::Lean => {
                use crate::net::tunnel::link;
                let (mut acceptor, connection) = link::server(agent_io);
                tokio::spawn(connection);
                tokio::spawn(async move {
                    while let Some((request, body, reply)) = acceptor.accept().await {
                        let incoming = crate::agent::stream::Incoming::lean(request, body);
                        tokio::spawn(serve(incoming, Reply::Lean(reply), context.clone()));
                    }
                });
                let (opener, connection) = link::client(router_io);
                tokio::spawn(connection);
                let target = http::uri::PathAndQuery::from_static("/v1/models");
                let pending = opener
                    .send_request(
                        http::Method::GET,
                        target,
                        http::HeaderMap::new(),
                        Bytes::new(),
                    )
                    .unwrap();
                let response = pending.await.unwrap();
                let body = crate::net::tunnel::upstream::Body::Lean(response.body);
                (response.status, body)
            }
            Codec::Http2 => {
                tokio::spawn(async move {
                    let mut connection = h2::server::handshake(agent_io).await.unwrap();
                    while let Some(Ok((request, respond))) = connection.accept().await {
                        let incoming = crate::agent::stream::Incoming::http2(request);
                        tokio::spawn(serve(incoming, Reply::http2(respond), context.clone()));
                    }
                });
                let (mut router, connection) = h2::client::handshake(router_io).await.unwrap();
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                let request = Request::get("http://router/v1/models").body(()).unwrap();
                let (response, _) = router.send_request(request, true).unwrap();
                let response = response.await.unwrap();
                let status = response.status();
                (
                    status,
                    crate::net::tunnel::upstream::Body::Http2(response.into_body()),
                )
            }
        };
        let mut chunks = Vec::new();
        while let Some(chunk) = body.data().await {
            chunks.push(chunk.unwrap());
        }
        (status, chunks, in_flight)
    }

    /// An engine that reads one request and writes `answer`, then waits for the close.
    async fn one_answer_backend(answer: String) -> std::net::SocketAddr {
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = backend.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = backend.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = socket.read(&mut head).await.unwrap();
            socket.write_all(answer.as_bytes()).await.unwrap();
            let _ = socket.read(&mut head).await;
        });
        addr
    }

    #[tokio::test]
    async fn a_body_of_known_length_ends_the_stream_with_its_last_chunk() {
        for codec in [Codec::Lean, Codec::Http2] {
            let body = r#"{"object":"list","data":[]}"#;
            let addr = one_answer_backend(format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ))
            .await;
            let (status, chunks, _) =
                exchange(codec, &format!("http://{addr}"), Duration::from_secs(5)).await;
            assert_eq!(status, StatusCode::OK);
            // One data frame that ends the stream, not the body then an empty frame to end it.
            assert_eq!(
                chunks,
                vec![Bytes::from_static(br#"{"object":"list","data":[]}"#)],
                "{codec:?}"
            );
        }
    }

    #[tokio::test]
    async fn an_engine_field_too_long_for_the_tunnel_is_dropped_not_fatal() {
        for codec in [Codec::Lean, Codec::Http2] {
            let body = r#"{"object":"list","data":[]}"#;
            // A field name over the lean tunnel's 255 bytes.
            let addr = one_answer_backend(format!(
                "HTTP/1.1 200 OK\r\nx-{}: 1\r\ncontent-length: {}\r\n\r\n{body}",
                "a".repeat(300),
                body.len()
            ))
            .await;
            let (status, chunks, _) =
                exchange(codec, &format!("http://{addr}"), Duration::from_secs(5)).await;
            assert_eq!(status, StatusCode::OK, "{codec:?}");
            assert_eq!(
                chunks.concat(),
                br#"{"object":"list","data":[]}"#,
                "{codec:?}"
            );
        }
    }

    #[tokio::test]
    async fn unreachable_backend_is_a_503() {
        // Bound then dropped: nothing listens on that port any more.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        for codec in [Codec::Lean, Codec::Http2] {
            let (status, body, in_flight) =
                one_request(codec, &format!("http://{closed}"), Duration::from_secs(5)).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(body["error"]["code"], "backend_unavailable");
            assert_eq!(body["error"]["source"], "backend");
            // The guard leaves just after the last frame is queued; give that task a moment.
            for _ in 0..100 {
                if in_flight.get() == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(in_flight.get(), 0);
        }
    }

    #[tokio::test]
    async fn silent_backend_is_a_504_after_the_http_timeout() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket);
            }
        });
        for codec in [Codec::Lean, Codec::Http2] {
            let (status, body, _) =
                one_request(codec, &format!("http://{addr}"), Duration::from_millis(200)).await;
            assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
            assert_eq!(body["error"]["code"], "backend_error");
        }
    }

    #[test]
    fn in_flight_guard_returns_to_zero() {
        let in_flight = InFlight::default();
        let first = in_flight.enter();
        let second = in_flight.enter();
        assert_eq!(in_flight.get(), 2);
        drop(first);
        drop(second);
        assert_eq!(in_flight.get(), 0);
    }
}
