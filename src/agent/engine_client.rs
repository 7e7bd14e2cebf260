//! The agent's HTTP/1.1 client to its engine: keep-alive connections, one exchange at a time on
//! each, kept in a small pool of idle ones. Each exchange runs in the request's own task: it
//! writes the request, reads the response head and then the body straight from the socket
//! (the wire format is `crate::wire::http::client`'s, the chunked decoder the router's own).
//!
//! Why not hyper: profiled under callgrind, hyper-util's pooled `Client` costs about 15 % of the
//! agent's instructions per request (SipHash of its pool key three times, a task spawned per
//! request to take the connection back), and hyper's connection-level client about 25 %: a
//! connection task per engine connection, a channel to it for each request, another for each
//! body frame, and its own response parsing (see
//! `perf/notes/2026-12-01-agent-engine-client-and-tunnel-lanes.md` and
//! `perf/notes/2026-12-02-engine-client-without-hyper-and-a-smaller-request-future.md`). The
//! agent sends one request at a time per connection to one engine at one address; none of that
//! machinery is needed.
//!
//! A connection goes back to the pool when its response body was read to the end and the
//! response let it stay open ([`EngineBody::chunk`] returns `None`). A response abandoned
//! midway (the router's client left, a timeout) drops its body and closes the connection, which
//! is how engines learn to stop generating.
//!
//! The request is written whole before the response is read. A request body that is complete
//! at once (the router sends each prompt in one piece) goes with `content-length`, in the same
//! write as its head; one still arriving goes chunked. An engine that answers early and closes
//! (a 413 for a prompt it will not read) still has its answer read after the failed write.
//!
//! Bounds: at most [`IDLE_MAX`] idle connections (one given back beyond that is closed), none
//! reused after [`IDLE_TIMEOUT`] idle or once the engine closed it (looked at on each
//! checkout); a response head at most `crate::wire::http::client::RESPONSE_HEAD_BYTES_MAX` bytes; the
//! read buffer grows by what one read brought (at most [`READ_BYTES`]) and holds at most one read
//! beyond the head, and a connection waiting for the engine holds no room for a read; a
//! chunked body's size lines and trailers are held to `crate::wire::http::chunked`'s line and trailer
//! limits (its data is streamed, one read at a time, never gathered); every wait on the engine
//! is bounded by the caller's `--http-timeout`.
//!
//! Error handling: a connection that cannot be made is [`SendError::Connect`] (the caller answers
//! 503 `backend_unavailable`); an exchange that fails after it is any other [`SendError`] (502),
//! and a body that breaks off is a [`BodyError`].

use std::io::ErrorKind;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::wire::http::chunked::{self, ChunkedDecoder};
use crate::wire::http::client::{self, Framing, RequestBody, ResponseHead, ResponseHeadError};
use crate::wire::http::response::{write_chunk, write_last_chunk};

/// Idle connections kept; the router's concurrency to this agent is bounded by `--capacity`, so
/// more would only hold sockets.
pub const IDLE_MAX: usize = 64;
/// An idle connection older than this is closed rather than reused (engines close idle
/// keep-alive connections after a while; the request would race that close).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Bytes a read may add to a connection's buffer.
pub const READ_BYTES: usize = 16 * 1024;

thread_local! {
    /// Where this thread's reads land before they are copied onto a connection's buffer
    /// ([`Conn::read_more`]). Bound: one [`READ_BYTES`] buffer per thread, whatever the
    /// connections and streams it serves.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; READ_BYTES].into_boxed_slice());
}

/// A complete request body up to this size is copied behind its head, for one write.
const COALESCE_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    #[error("engine connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("engine closed the connection before its response head")]
    ClosedEarly,
    #[error(transparent)]
    Head(#[from] ResponseHeadError),
    #[error("engine answered 101 Switching Protocols, which the agent never asks for")]
    Upgrade,
    #[error("request body from the router failed: {0}")]
    RequestBody(String),
}

/// Why a response body broke off. The connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("engine connection failed mid-body: {0}")]
    Io(#[from] std::io::Error),
    #[error("engine closed the connection before the body's end")]
    Truncated,
    #[error(transparent)]
    Chunked(#[from] chunked::BodyError),
}

/// Keep-alive HTTP/1.1 connections to one `host:port`.
pub struct EngineClient {
    target: String,
    connect_timeout: Duration,
    idle: Pool,
}

type Pool = Arc<Mutex<Vec<Idle>>>;

struct Idle {
    conn: Conn,
    since: Instant,
}

/// One connection and the bytes read from it but not yet used.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    /// Reads what the engine sent onto the end of `buf`; `Ok(0)` when it closed. Cancel-safe.
    ///
    /// Waits until the socket is readable before it needs room, then reads into the thread's
    /// scratch and copies what came: a stream waiting for its next token holds no read buffer,
    /// and one that came holds its bytes, not a read's room. With a 16 KiB buffer reserved
    /// before each wait, 1,000 open streams held 16 MB of them, four fifths of what the agent
    /// spent per open stream (`perf/notes/2026-12-06-memory-per-open-stream.md`).
    async fn read_more(&mut self) -> std::io::Result<usize> {
        loop {
            self.stream.readable().await?;
            let read = SCRATCH.with_borrow_mut(|scratch| -> std::io::Result<usize> {
                let read = self.stream.try_read(scratch)?;
                self.buf.extend_from_slice(&scratch[..read]);
                Ok(read)
            });
            match read {
                Err(error) if error.kind() == ErrorKind::WouldBlock => continue,
                read => return read,
            }
        }
    }
}

impl EngineClient {
    /// `target` is the engine's `host:port`.
    pub fn new(target: String, connect_timeout: Duration) -> EngineClient {
        EngineClient {
            target,
            connect_timeout,
            idle: Arc::default(),
        }
    }

    /// The `host:port` this client dials.
    #[cfg(test)]
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Sends `request` (its URI in origin form, its `host` header set, no hop-by-hop or framing
    /// fields) on an idle connection, or on a new one, and reads the response head.
    pub async fn send<B>(&self, request: Request<B>) -> Result<Response<EngineBody>, SendError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let mut conn = match self.checkout() {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        let (parts, mut body) = request.into_parts();
        let target = parts.uri.path_and_query().map_or("/", |path| path.as_str());
        // The first piece of the body: when it is also the last, the body has a length.
        let mut first = Bytes::new();
        while !body.is_end_stream() {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        first = data;
                        break;
                    }
                }
                Some(Err(error)) => return Err(SendError::RequestBody(error.to_string())),
                None => break,
            }
        }
        let complete = body.is_end_stream();
        let framing = if !complete {
            RequestBody::Chunked
        } else if first.is_empty() && bodiless(&parts.method) {
            RequestBody::None
        } else {
            RequestBody::Length(first.len() as u64)
        };
        let mut out = BytesMut::with_capacity(512 + first.len().min(COALESCE_BYTES_MAX));
        client::write_request_head(&mut out, &parts.method, target, &parts.headers, framing);
        let written = if complete {
            write_whole(&mut conn.stream, out, first).await
        } else {
            write_chunked(&mut conn.stream, out, first, &mut body).await
        };
        // A failed write still reads the head: the engine may have answered without reading
        // the whole request, then closed (a 413 for a prompt it will not read).
        let mut write_failed = None;
        match written {
            Ok(()) => {}
            Err(Written::Body(error)) => return Err(SendError::RequestBody(error)),
            Err(Written::Io(error))
                if matches!(
                    error.kind(),
                    ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
                ) =>
            {
                write_failed = Some(error);
            }
            Err(Written::Io(error)) => return Err(error.into()),
        }
        let keep_alive = write_failed.is_none();
        let head = match (read_head(&mut conn).await, write_failed) {
            (Ok(head), _) => head,
            (Err(_), Some(error)) => return Err(error.into()),
            (Err(error), None) => return Err(error),
        };
        let ResponseHead {
            status,
            headers,
            framing,
            keep_alive: reusable,
            ..
        } = head;
        let state = match framing {
            Framing::Empty => BodyState::Done,
            Framing::Length(length) => BodyState::Length(length),
            Framing::Chunked => BodyState::Chunked(ChunkedDecoder::new(u64::MAX)),
            Framing::UntilClose => BodyState::UntilClose,
        };
        let mut body = EngineBody {
            conn: Some(conn),
            state,
            keep_alive: keep_alive && reusable,
            idle: self.idle.clone(),
        };
        if body.is_end() {
            body.finish();
        }
        let mut response = Response::new(body);
        *response.status_mut() = http::StatusCode::from_u16(status)
            .map_err(|_| ResponseHeadError::Malformed("bad status"))?;
        *response.headers_mut() = headers;
        Ok(response)
    }

    /// The most recently used idle connection that is still open and fresh.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(Idle { conn, since }) = idle.pop() {
            if since.elapsed() > IDLE_TIMEOUT {
                // Given back in order: every one left is older still.
                idle.clear();
                return None;
            }
            // An open idle connection has nothing to read; a closed one reads its end (or,
            // from a confused engine, stray bytes): either way it cannot carry a request.
            if let Err(error) = conn.stream.try_read(&mut [0u8; 1])
                && error.kind() == ErrorKind::WouldBlock
            {
                return Some(conn);
            }
        }
        None
    }

    async fn connect(&self) -> Result<Conn, SendError> {
        let failed = |reason: String| SendError::Connect {
            target: self.target.clone(),
            reason,
        };
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.target))
            .await
            .map_err(|_| failed(format!("timed out after {:?}", self.connect_timeout)))?
            .map_err(|error| failed(error.to_string()))?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            buf: BytesMut::new(),
        })
    }
}

/// Methods whose requests carry no body unless they have one: no framing field is sent for
/// them when it is empty.
fn bodiless(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::DELETE | http::Method::OPTIONS
    )
}

/// Why writing a request stopped.
enum Written {
    Io(std::io::Error),
    /// The tunnelled body failed (the router reset the stream); what was written is unfinished.
    Body(String),
}

/// The head and the whole body: one write when the body is small, else two.
async fn write_whole(
    stream: &mut TcpStream,
    mut out: BytesMut,
    body: Bytes,
) -> Result<(), Written> {
    if body.len() <= COALESCE_BYTES_MAX {
        out.extend_from_slice(&body);
        return stream.write_all(&out).await.map_err(Written::Io);
    }
    stream.write_all(&out).await.map_err(Written::Io)?;
    stream.write_all(&body).await.map_err(Written::Io)
}

/// The head, then the body chunk by chunk as it arrives, then the last chunk. A body that
/// fails midway is left unfinished: the connection then cannot be reused, and the engine sees
/// it close.
async fn write_chunked<B>(
    stream: &mut TcpStream,
    mut out: BytesMut,
    first: Bytes,
    body: &mut B,
) -> Result<(), Written>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    write_chunk(&mut out, &first);
    loop {
        stream.write_all(&out).await.map_err(Written::Io)?;
        out.clear();
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    write_chunk(&mut out, &data);
                }
            }
            Some(Err(error)) => return Err(Written::Body(error.to_string())),
            None => {
                write_last_chunk(&mut out);
                return stream.write_all(&out).await.map_err(Written::Io);
            }
        }
    }
}

/// Reads until a final response head is parsed; interim (1xx) heads are skipped. The body's
/// first bytes stay in the buffer.
async fn read_head(conn: &mut Conn) -> Result<ResponseHead, SendError> {
    loop {
        if !conn.buf.is_empty()
            && let Some(head) = client::parse_response_head(&conn.buf)?
        {
            conn.buf.advance(head.head_bytes);
            if head.status == 101 {
                return Err(SendError::Upgrade);
            }
            if head.is_interim() {
                continue;
            }
            return Ok(head);
        }
        if conn.read_more().await? == 0 {
            return Err(SendError::ClosedEarly);
        }
    }
}

/// A response body, read from the engine connection as it is asked for.
pub struct EngineBody {
    /// `None` once the body ended or failed (the connection went back to the pool or closed);
    /// always `None` in [`BodyState::Done`].
    conn: Option<Conn>,
    state: BodyState,
    /// The connection may carry another exchange once this body is read to its end.
    keep_alive: bool,
    idle: Pool,
}

enum BodyState {
    /// Bytes of a `content-length` body still to come.
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
    Done,
}

impl EngineBody {
    /// The body's next bytes as the engine sent them; `None` at its end. Cancel-safe: dropping
    /// the future between reads loses nothing.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, BodyError>> {
        loop {
            // A body that reached `Done` has let go of its connection (`finish`): `None` here.
            let conn = self.conn.as_mut()?;
            if conn.buf.is_empty() {
                match conn.read_more().await {
                    Ok(0) if matches!(self.state, BodyState::UntilClose) => {
                        self.state = BodyState::Done;
                        self.conn = None;
                        return None;
                    }
                    Ok(0) => return Some(Err(self.fail(BodyError::Truncated))),
                    Ok(_) => continue,
                    Err(error) => return Some(Err(self.fail(error.into()))),
                }
            }
            let (data, ended) = match &mut self.state {
                BodyState::Done => return None,
                BodyState::Length(remaining) => {
                    let take = (*remaining).min(conn.buf.len() as u64);
                    *remaining -= take;
                    (conn.buf.split_to(take as usize).freeze(), *remaining == 0)
                }
                BodyState::Chunked(decoder) => {
                    let mut data = BytesMut::with_capacity(conn.buf.len());
                    let progress = match decoder.decode(&conn.buf, &mut data) {
                        Ok(progress) => progress,
                        Err(error) => return Some(Err(self.fail(error.into()))),
                    };
                    conn.buf.advance(progress.consumed);
                    (data.freeze(), progress.done)
                }
                BodyState::UntilClose => (conn.buf.split().freeze(), false),
            };
            if ended {
                self.state = BodyState::Done;
                self.finish();
            }
            if !data.is_empty() {
                return Some(Ok(data));
            }
            if ended {
                return None;
            }
        }
    }

    /// Whether the body has been read to its end.
    pub fn is_end(&self) -> bool {
        matches!(self.state, BodyState::Done)
    }

    fn fail(&mut self, error: BodyError) -> BodyError {
        self.conn = None;
        error
    }

    /// The body's end: the connection goes back to the pool when the response let it stay open
    /// and the engine sent nothing after it.
    fn finish(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !self.keep_alive || !conn.buf.is_empty() {
            return;
        }
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if idle.len() < IDLE_MAX {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Empty, Full, StreamBody};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;

    /// An engine answering every request with `ok`; counts the connections it accepted. With
    /// `close_after_answer`, it closes each connection after its first answer without saying so
    /// (as an engine's idle timeout does).
    async fn engine(close_after_answer: bool) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 4096];
                    let mut held = Vec::new();
                    loop {
                        let Ok(read) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        held.extend_from_slice(&buffer[..read]);
                        while let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") {
                            held.drain(..end + 4);
                            let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if socket.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                            if close_after_answer {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (target, accepted)
    }

    /// An engine for one exchange: reads until the request bytes end with `request_end`, hands
    /// them over, writes `answer` and closes.
    async fn one_exchange(
        request_end: &'static [u8],
        answer: &'static [u8],
    ) -> (String, tokio::sync::oneshot::Receiver<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let (sent, received) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = vec![0u8; 4096];
            while !request.ends_with(request_end) {
                let read = socket.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the request ended early: {request:?}");
                request.extend_from_slice(&buffer[..read]);
            }
            let _ = sent.send(request);
            socket.write_all(answer).await.unwrap();
        });
        (target, received)
    }

    fn client(target: String) -> EngineClient {
        EngineClient::new(target, Duration::from_secs(1))
    }

    fn get() -> Request<Empty<Bytes>> {
        Request::get("/v1/models")
            .header("host", "engine")
            .body(Empty::new())
            .unwrap()
    }

    /// The whole body, and whether the body said it ended with its last chunk.
    async fn read_to_end(body: &mut EngineBody) -> Result<Vec<u8>, BodyError> {
        let mut whole = Vec::new();
        while let Some(chunk) = body.chunk().await {
            whole.extend_from_slice(&chunk?);
        }
        assert!(body.is_end());
        Ok(whole)
    }

    /// One exchange, its body read to the end when `read`.
    async fn exchange(client: &EngineClient, read: bool) {
        let mut body = client.send(get()).await.unwrap().into_body();
        if read {
            assert_eq!(read_to_end(&mut body).await.unwrap(), b"ok");
        }
    }

    fn idle_count(client: &EngineClient) -> usize {
        client.idle.lock().unwrap().len()
    }

    #[tokio::test]
    async fn a_connection_whose_body_was_read_serves_the_next_request() {
        let (target, accepted) = engine(false).await;
        let client = client(target);
        for _ in 0..5 {
            exchange(&client, true).await;
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 1);
        assert_eq!(idle_count(&client), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_takes_its_connection_with_it() {
        let (target, accepted) = engine(false).await;
        let client = client(target);
        exchange(&client, false).await;
        exchange(&client, true).await;
        exchange(&client, true).await;
        assert_eq!(accepted.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_pooled_connection_the_engine_closed_is_not_used() {
        let (target, accepted) = engine(true).await;
        let client = client(target);
        for _ in 0..3 {
            exchange(&client, true).await;
            // The engine's close reaches the pooled connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn at_most_idle_max_connections_are_kept() {
        let (target, _) = engine(false).await;
        let client = client(target);
        let mut bodies = Vec::new();
        for _ in 0..IDLE_MAX + 3 {
            bodies.push(client.send(get()).await.unwrap().into_body());
        }
        for mut body in bodies {
            read_to_end(&mut body).await.unwrap();
        }
        assert_eq!(idle_count(&client), IDLE_MAX);
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert!(matches!(
            client(closed.to_string()).send(get()).await,
            Err(SendError::Connect { .. })
        ));
    }

    #[tokio::test]
    async fn a_complete_body_goes_with_its_length_in_one_piece() {
        let (target, request) =
            one_exchange(b"{}", b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        let post = Request::post("/v1/chat/completions")
            .header("host", "engine")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = client(target).send(post).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            request.await.unwrap(),
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine\r\ncontent-length: 2\r\n\r\n{}"
        );
    }

    #[tokio::test]
    async fn a_body_still_arriving_goes_chunked() {
        let (target, request) = one_exchange(
            b"0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        let (pieces, arriving) = tokio::sync::mpsc::channel::<Result<_, std::io::Error>>(4);
        let stream = tokio_stream_of(arriving);
        let post = Request::post("/v1/chat/completions")
            .body(StreamBody::new(stream))
            .unwrap();
        let client = client(target);
        let sending = tokio::spawn(async move { client.send(post).await.map(|r| r.status()) });
        for piece in [&b"{\"a\":"[..], b"1}"] {
            pieces
                .send(Ok(hyper::body::Frame::data(Bytes::from_static(piece))))
                .await
                .unwrap();
            tokio::task::yield_now().await;
        }
        drop(pieces);
        assert_eq!(sending.await.unwrap().unwrap(), 200);
        let request = String::from_utf8(request.await.unwrap()).unwrap();
        assert!(
            request
                .contains("transfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n"),
            "{request:?}"
        );
    }

    #[tokio::test]
    async fn a_request_body_that_fails_midway_is_a_send_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut sink = Vec::new();
            let _ = socket.read_to_end(&mut sink).await;
        });
        let (pieces, arriving) = tokio::sync::mpsc::channel(4);
        pieces
            .send(Ok(hyper::body::Frame::data(Bytes::from_static(b"{"))))
            .await
            .unwrap();
        pieces
            .send(Err(std::io::Error::other("stream reset")))
            .await
            .unwrap();
        let post = Request::post("/v1/chat/completions")
            .body(StreamBody::new(tokio_stream_of(arriving)))
            .unwrap();
        let client = client(target);
        assert!(matches!(
            client.send(post).await,
            Err(SendError::RequestBody(reason)) if reason == "stream reset"
        ));
        assert_eq!(idle_count(&client), 0);
    }

    fn tokio_stream_of<T: Send + 'static>(
        mut receiver: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| {
            receiver.poll_recv(cx)
        }))
    }

    #[tokio::test]
    async fn chunked_and_until_close_bodies_are_read_and_interim_heads_skipped() {
        let (target, _) = one_exchange(
            b"\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n3\r\n ok\r\n0\r\n\r\n",
        )
        .await;
        let client = client(target);
        let response = client.send(get()).await.unwrap();
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let mut body = response.into_body();
        assert_eq!(read_to_end(&mut body).await.unwrap(), b"data: ok");
        assert_eq!(idle_count(&client), 1, "a chunked body has a known end");

        let (target, _) =
            one_exchange(b"\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\nuntil the close").await;
        let client = self::client(target);
        let mut body = client.send(get()).await.unwrap().into_body();
        assert_eq!(read_to_end(&mut body).await.unwrap(), b"until the close");
        assert_eq!(idle_count(&client), 0, "the close ended that connection");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_not_an_end() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nshort\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        ] {
            let answer: &'static [u8] = Box::leak(answer.to_vec().into_boxed_slice());
            let (target, _) = one_exchange(b"\r\n\r\n", answer).await;
            let client = client(target);
            let mut body = client.send(get()).await.unwrap().into_body();
            let mut failed = false;
            while let Some(chunk) = body.chunk().await {
                if chunk.is_err() {
                    failed = true;
                    break;
                }
            }
            assert!(failed, "{}", String::from_utf8_lossy(answer));
            assert!(!body.is_end());
            assert_eq!(idle_count(&client), 0);
        }
    }

    #[tokio::test]
    async fn an_early_answer_to_a_body_the_engine_will_not_read_is_still_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 1024];
            let _ = socket.read(&mut head).await.unwrap();
            let answer = b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 3\r\n\r\nbig";
            socket.write_all(answer).await.unwrap();
            // Closed with the rest of the request unread: the client's write fails.
        });
        let post = Request::post("/v1/chat/completions")
            .body(Full::new(Bytes::from(vec![b'x'; 8 << 20])))
            .unwrap();
        let response = client(target).send(post).await.unwrap();
        assert_eq!(response.status(), 413);
        assert_eq!(
            read_to_end(&mut response.into_body()).await.unwrap(),
            b"big"
        );
    }

    /// Thousands of streams wait for their next token at once: a 16 KiB read buffer each was
    /// most of what an open stream cost the agent (`Conn::read_more`).
    #[tokio::test]
    async fn a_stream_waiting_for_its_next_token_holds_no_room_for_a_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let (next_token, mut token_due) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = vec![0u8; 1024];
            let _ = socket.read(&mut head).await.unwrap();
            let first = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n8\r\ndata: a\n\r\n";
            socket.write_all(first).await.unwrap();
            token_due.recv().await;
            socket
                .write_all(b"8\r\ndata: b\n\r\n0\r\n\r\n")
                .await
                .unwrap();
        });
        let mut body = client(target).send(get()).await.unwrap().into_body();
        assert_eq!(body.chunk().await.unwrap().unwrap(), &b"data: a\n"[..]);
        let held = body.conn.as_ref().expect("the body is open").buf.capacity();
        assert!(
            held < 256,
            "a waiting stream holds {held} bytes of read room"
        );
        next_token.send(()).await.unwrap();
        assert_eq!(read_to_end(&mut body).await.unwrap(), b"data: b\n");
    }

    #[tokio::test]
    async fn a_malformed_head_or_an_early_close_is_a_send_error() {
        let (target, _) =
            one_exchange(b"\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").await;
        assert!(matches!(
            client(target).send(get()).await,
            Err(SendError::Head(ResponseHeadError::Malformed(_)))
        ));
        let (target, _) = one_exchange(b"\r\n\r\n", b"").await;
        assert!(matches!(
            client(target).send(get()).await,
            Err(SendError::ClosedEarly)
        ));
    }
}
