//! One client connection over HTTP/1.1: a reader task that parses requests (pipelined requests are
//! read ahead, at most [`PIPELINE_DEPTH`]) and a writer that answers them strictly in order
//! (`front::writer`). This module accepts the connection and runs its reader.
//!
//! Why two tasks: the writer must notice a client that goes away while its request waits for
//! capacity or for the first token, and with completion-based I/O a read cannot be dropped halfway
//! without losing bytes. So one read is always outstanding, in the reader, and its end sets the
//! connection's `gone` latch that the request phases watch.
//!
//! The reader's steps for one request, in the order they run, are [`read_request`]'s: read the
//! head, route it, check its credentials, answer `100 Continue`, read the body, hand the request
//! to the writer. Each step either passes on what the next needs or stops with an [`Exit`].
//!
//! Error handling: bad input is answered in the error envelope with the right status (400, 404,
//! 405, 408, 413, 431, 505); where the byte stream can no longer be trusted the answer carries
//! `connection: close` and the connection ends. Nothing here can affect another connection.

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, Splitable};
use monoio::net::TcpStream;

use crate::base::latch::{Latch, race};
use crate::router::api::authenticate::{self, HeadCredentials, now_unix_ms};
use crate::router::api::{self, ClientRequest};
use crate::router::error::Rejection;
use crate::router::front::handoff;
use crate::router::front::pipeline::{self, Sender};
use crate::router::front::writer::{Answers, Http1Sink, Inbound, write_loop};
use crate::router::metrics::ShardMetrics;
use crate::router::shard::clients::{ConnectionPermit, Refusal};
use crate::router::shard::state::Shard;
use crate::wire::http::chunked::ChunkedDecoder;
use crate::wire::http::request::{
    BodyFraming, HeadError, HeadLimits, HeadWait, Method, RequestHead, Version, is_h2_preface,
    parse_head,
};
use futures_util::future::Either;

/// How long a refused connection's one answer may take to write.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Requests read ahead of the one being answered.
const PIPELINE_DEPTH: usize = 8;
/// Bytes requested from the socket per read while a request is arriving (a head or body part
/// already in the buffer).
const READ_CHUNK_BYTES: usize = 16 * 1024;
/// Bytes requested per read while no request is in progress: the read buffer a connection that
/// has sent nothing yet, or an idle keep-alive one, holds (with one read always posted, the buffer
/// is allocated while the connection waits). A head or body that does not fit grows it by
/// [`READ_CHUNK_BYTES`]; most chat request heads and small bodies arrive in one such read.
const IDLE_READ_BYTES: usize = 4 * 1024;
/// After refusing a request whose body is still arriving, keep reading (and discarding) this long
/// so the client sees the answer rather than a reset.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Granularity of the read kept outstanding after a `connection: close` request (it loops until
/// the client leaves or the answer is written, so this bounds nothing but one read).
const WATCH_CLOSE_READ_TIMEOUT: Duration = Duration::from_secs(3600);

pub async fn serve(shard: Rc<Shard>, stream: TcpStream) {
    ShardMetrics::add(&shard.metrics.connections_accepted_total, 1);
    let peer = stream.peer_addr().ok().map(|address| address.ip());
    let permit = match shard.clients.open_connection(peer, Instant::now()) {
        Ok(permit) => permit,
        Err(refusal) => return refuse(&shard, stream, refusal).await,
    };
    let open = OpenConnection::new(shard.clone(), permit);
    let _ = stream.set_nodelay(true);
    serve_sniffed(shard, stream, open).await;
}

/// A connection counted as open (`connections_open`, and the shard's connection cap through its
/// permit) until dropped, whichever task serves it.
struct OpenConnection {
    shard: Rc<Shard>,
    _permit: ConnectionPermit,
}

impl OpenConnection {
    fn new(shard: Rc<Shard>, permit: ConnectionPermit) -> OpenConnection {
        ShardMetrics::gauge(&shard.metrics.connections_open, 1);
        if let Some(loads) = &shard.settings.handoff {
            loads.add(shard.id, 1);
        }
        OpenConnection {
            shard,
            _permit: permit,
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        ShardMetrics::gauge(&self.shard.metrics.connections_open, -1);
        if let Some(loads) = &self.shard.settings.handoff {
            loads.add(self.shard.id, -1);
        }
    }
}

/// Answers a connection the shard will not serve with one HTTP/1.1 error and closes it (an h2c
/// client sees the connection close).
async fn refuse(shard: &Shard, mut stream: TcpStream, refusal: Refusal) {
    let rejection = match refusal {
        Refusal::Connections => Rejection::connections_full(),
        Refusal::Resets => {
            Rejection::too_many_resets(shard.settings.client_limits.resets.penalty.as_secs() as u32)
        }
    };
    shard.metrics.count_response(rejection.status);
    let body = rejection.body();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: {}\r\nconnection: close\r\n\r\n",
        rejection.status,
        crate::wire::http::response::reason_phrase(rejection.status),
        body.len(),
        rejection.retry_after_seconds.unwrap_or(1),
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    let write = stream.write_all(answer);
    let _ = monoio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
    let _ = stream.shutdown().await;
}

/// Reads until the first bytes tell HTTP/1.1 from HTTP/2 with prior knowledge, then serves the
/// connection with the matching codec, those bytes included.
///
/// The codec runs in a task of its own, spawned once the first bytes tell which: the task
/// allocated when the connection is accepted holds only this sniffing state, so a connection that
/// has sent nothing yet costs 15 KiB less than if it held a codec's (`perf/memory.sh`). One more
/// task per connection, none per request, and the executor polls the codec's future directly.
async fn serve_sniffed(shard: Rc<Shard>, mut stream: TcpStream, open: OpenConnection) {
    let mut first = BytesMut::with_capacity(IDLE_READ_BYTES);
    let deadline = Instant::now() + shard.settings.client_header_timeout;
    loop {
        match is_h2_preface(&first) {
            Some(true) => {
                monoio::spawn(async move {
                    let _open = open;
                    crate::router::front::h2c::serve(shard, stream, first.freeze()).await;
                });
                return;
            }
            Some(false) => break,
            None => {}
        }
        let start = first.len();
        let end = first.capacity();
        let left = deadline.saturating_duration_since(Instant::now());
        // monoio's own timeout, inline: this task's size is set by the sniffing state anyway, and a
        // boxed timer would add a kilobyte to every connection that has sent nothing yet.
        match monoio::time::timeout(left, stream.read(first.slice_mut(start..end))).await {
            Ok((Ok(read), slice)) if read > 0 => first = slice.into_inner(),
            // Closed, failed or silent before the first request: nothing to answer.
            _ => return,
        }
    }
    let (stream, first) = match handoff::hand_off(&shard, stream, first) {
        Some(kept) => kept,
        // Given to the key's owner: this shard no longer counts it.
        None => return,
    };
    monoio::spawn(async move {
        let _open = open;
        serve_http1(&shard, stream, first).await;
    });
}

/// Serves a connection another shard handed this one (`shard::handoff`): counted as open here,
/// then read on from the bytes that came with it.
pub fn adopt(shard: Rc<Shard>, handoff: crate::router::shard::handoff::Handoff) {
    // The giver counted it here while it was on its way (`Shard::hand_off`); from now on it
    // counts as open, or not at all.
    if let Some(loads) = &shard.settings.handoff {
        loads.add(shard.id, -1);
    }
    let permit = match shard.clients.open_connection(handoff.peer, Instant::now()) {
        Ok(permit) => permit,
        Err(refusal) => {
            if let Ok(stream) = TcpStream::from_std(handoff.socket) {
                monoio::spawn(async move { refuse(&shard, stream, refusal).await });
            }
            return;
        }
    };
    let stream = match TcpStream::from_std(handoff.socket) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(shard = shard.id, %error, "a client connection handed to this shard could not be served");
            return;
        }
    };
    let open = OpenConnection::new(shard.clone(), permit);
    monoio::spawn(async move {
        let _open = open;
        serve_http1(&shard, stream, handoff.read).await;
    });
}

async fn serve_http1(shard: &Rc<Shard>, stream: TcpStream, first: BytesMut) {
    let peer = stream.peer_addr().ok().map(|address| address.ip());
    let (reader, writer) = stream.into_split();
    let gone = Rc::new(Latch::default());
    let writer_done = Rc::new(Latch::default());
    let answers = Rc::new(Answers::default());
    let (to_writer, from_reader) = pipeline::pipeline(PIPELINE_DEPTH);
    let reader = Reader {
        socket: reader,
        buf: first,
        writer_done: writer_done.clone(),
        stop_with_writer: true,
        peer,
        answers: answers.clone(),
        waited_for_second: false,
    };
    let reading = monoio::spawn(read_loop(shard.clone(), reader, to_writer, gone.clone()));
    let mut sink = Http1Sink::new(writer, gone, answers, shard.clone());
    write_loop(shard, &mut sink, from_reader).await;
    sink.shutdown().await;
    writer_done.set();
    reading.await;
}

struct Reader {
    socket: OwnedReadHalf<TcpStream>,
    buf: BytesMut,
    writer_done: Rc<Latch>,
    /// Whether a finished writer ends a read (false while lingering: the writer is done by then).
    stop_with_writer: bool,
    /// The client's address, for the audit log.
    peer: Option<std::net::IpAddr>,
    /// What the writer is doing: whether the connection is quiet (an answer streamed for a
    /// while: from then on a read between requests takes no buffer until a byte is in,
    /// [`Reader::fill`]), and whether it is idle (`read_head`'s timeout).
    answers: Rc<Answers>,
    /// The reader has waited once with nothing buffered: for the connection's second request,
    /// unless its first one's body came after its head (that wait took no buffer either).
    waited_for_second: bool,
}

enum ReadEnd {
    /// The client closed or the socket failed.
    Closed,
    /// No byte within the allowed time.
    TimedOut,
    /// The writer finished (the connection is closing).
    WriterDone,
}

impl Reader {
    /// Reads more bytes onto the end of `buf`, within `timeout`: [`Reader::fill_for`] with
    /// [`Wait::Within`]. Returned as it is, not awaited in a future of its own (see
    /// `fill_for`).
    fn fill(
        &mut self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<usize, ReadEnd>> + '_ {
        self.fill_for(timeout, Wait::Within)
    }

    /// Reads more bytes onto the end of `buf`; `wait` says what `timeout` bounds.
    ///
    /// Between requests (`buf` empty) a read is posted at once, so that a client that leaves
    /// is noticed while its request runs; with completion-based I/O that read holds its buffer
    /// until bytes come, for as long as an answer streams. So where that wait may be long the
    /// read asks for one byte ([`Reader::read_first_byte`]) and takes its buffer once that byte
    /// is in, at one more read for the request that follows:
    /// - the wait for a connection's second request: a new connection's first answer may stream
    ///   for minutes, and one that is kept idle in a client's pool holds nothing either; a
    ///   client that sends many short requests pays the one read once;
    /// - every wait on a connection that has carried an answer streaming for a while (`quiet`).
    ///
    /// One function with the read inline, the one-byte read a branch of it: a read awaited in a
    /// future of its own, or either of two, costs every request 100 to 200 instructions
    /// (`perf/instructions.sh`).
    async fn fill_for(&mut self, mut timeout: Duration, wait: Wait) -> Result<usize, ReadEnd> {
        let mut first = None;
        if !self.buf.is_empty() {
            self.make_room(READ_CHUNK_BYTES);
        } else if self.waited_for_second && !self.answers.is_quiet() {
            self.make_room(IDLE_READ_BYTES);
        } else {
            self.waited_for_second = true;
            let started = Instant::now();
            let byte = self.read_first_byte(timeout, wait).await?;
            self.make_room(IDLE_READ_BYTES);
            self.buf.extend_from_slice(&[byte]);
            first = Some(byte);
            // A request has begun: an idle wait's time is over, the head's runs from here.
            if wait == Wait::Within {
                timeout = timeout.saturating_sub(started.elapsed());
            }
        }
        let buf = std::mem::take(&mut self.buf);
        let start = buf.len();
        let end = buf.capacity();
        let read = self.socket.read(buf.slice_mut(start..end));
        let stop = writer_done(&self.writer_done, self.stop_with_writer);
        // The timer inline, not boxed: the reader's task is not nested in the request path's
        // futures, and a boxed timer would add a kilobyte to every idle keep-alive connection.
        let wait = if first.is_some() { Wait::Within } else { wait };
        let expiry = expiry(timeout, wait, &self.answers);
        match race(race(read, expiry), stop).await {
            Either::Left(Either::Left((result, slice))) => {
                self.buf = slice.into_inner();
                bytes_read(result).map(|read| usize::from(first.is_some()) + read)
            }
            // The buffer went with the cancelled read; the connection is ending anyway. A byte
            // read first stays: the client stalled partway (`read_head` answers 408).
            Either::Left(Either::Right(())) => {
                if let Some(byte) = first {
                    self.buf.extend_from_slice(&[byte]);
                }
                Err(ReadEnd::TimedOut)
            }
            Either::Right(()) => Err(ReadEnd::WriterDone),
        }
    }

    /// One byte, read into a buffer of one: a wait for the next request (or the client leaving)
    /// that holds no read buffer.
    async fn read_first_byte(&mut self, timeout: Duration, wait: Wait) -> Result<u8, ReadEnd> {
        let read = self.socket.read(Vec::with_capacity(1));
        let stop = writer_done(&self.writer_done, self.stop_with_writer);
        let expiry = expiry(timeout, wait, &self.answers);
        match race(race(read, expiry), stop).await {
            Either::Left(Either::Left((Ok(1), byte))) => Ok(byte[0]),
            Either::Left(Either::Left(_)) => Err(ReadEnd::Closed),
            Either::Left(Either::Right(())) => Err(ReadEnd::TimedOut),
            Either::Right(()) => Err(ReadEnd::WriterDone),
        }
    }

    /// At least half of `want` bytes of room after what `buf` holds. An empty buffer no request
    /// holds any more is reused in place.
    fn make_room(&mut self, want: usize) {
        if self.buf.capacity() - self.buf.len() < want / 2 {
            self.buf.reserve(want);
        }
    }
}

/// What a read's timeout bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// A request in progress (its head or body part-read), or a wait that is not for a request.
    Within,
    /// The wait for the next request: the timeout is how long the connection may be idle, and
    /// it is not idle while an answer is written, however long that streams.
    Idle,
}

/// Resolves once `timeout` has passed, and for an [`Wait::Idle`] wait, once the connection has
/// been idle that long: an answer being written when the time is up, or one that ended
/// meanwhile, starts it again. Never drops the read it is raced against to start again (a read
/// dropped may have taken bytes).
async fn expiry(timeout: Duration, wait: Wait, answers: &Answers) {
    let mut finished = answers.finished();
    monoio::time::sleep(timeout).await;
    while wait == Wait::Idle && (answers.is_busy() || answers.finished() != finished) {
        finished = answers.finished();
        monoio::time::sleep(timeout).await;
    }
}

/// A completed read's bytes; none (the client closed) or an error ends the connection.
fn bytes_read(result: std::io::Result<usize>) -> Result<usize, ReadEnd> {
    match result {
        Ok(0) | Err(_) => Err(ReadEnd::Closed),
        Ok(read) => Ok(read),
    }
}

/// Resolves when the writer has finished, if that ends a read (`stop_with_writer`); never
/// otherwise (lingering: the writer is done by then).
async fn writer_done(writer_done: &Latch, stop_with_writer: bool) {
    if stop_with_writer {
        writer_done.wait().await
    } else {
        std::future::pending().await
    }
}

async fn read_loop(
    shard: Rc<Shard>,
    mut reader: Reader,
    to_writer: Sender<Inbound>,
    gone: Rc<Latch>,
) {
    let end = read_requests(&shard, &mut reader, &to_writer).await;
    match end {
        ReadOutcome::Closed => gone.set(),
        ReadOutcome::Stop => {}
        ReadOutcome::Linger => linger(&mut reader).await,
        ReadOutcome::WatchClose => {
            if watch_close(&mut reader).await {
                gone.set();
            }
        }
    }
}

/// After the last request a client will send (`connection: close`), keep a read outstanding anyway:
/// it is how a client that leaves before its answer is noticed. Anything it still sends is
/// discarded. True when the client went away; false when the writer finished first.
async fn watch_close(reader: &mut Reader) -> bool {
    loop {
        reader.buf.clear();
        match reader.fill(WATCH_CLOSE_READ_TIMEOUT).await {
            Ok(_) | Err(ReadEnd::TimedOut) => {}
            Err(ReadEnd::Closed) => return true,
            Err(ReadEnd::WriterDone) => return false,
        }
    }
}

/// How the reading of a connection's requests ends.
enum ReadOutcome {
    /// The client's side ended: any request still in progress has lost its client.
    Closed,
    /// No more requests will be read (close requested, or the writer is done).
    Stop,
    /// A request was refused while its body may still be arriving: drain before closing.
    Linger,
    /// The last request has been read (`connection: close`); watch for the client leaving.
    WatchClose,
}

/// Reads the connection's requests one after the other, handing each to the writer, until one
/// of them ends the reading; returns how it ended.
async fn read_requests(
    shard: &Shard,
    reader: &mut Reader,
    to_writer: &Sender<Inbound>,
) -> ReadOutcome {
    loop {
        if let Err(exit) = read_request(shard, reader, to_writer).await
            && let Some(outcome) = exit.answer(to_writer).await
        {
            return outcome;
        }
    }
}

/// One request, from its head to the writer: the steps, in the order they run. `Ok` when the
/// connection goes on to its next request; otherwise the [`Exit`] to take.
async fn read_request(
    shard: &Shard,
    reader: &mut Reader,
    to_writer: &Sender<Inbound>,
) -> Result<(), Exit> {
    let settings = &shard.settings;
    let arrived = read_head(reader, settings.client_header_timeout).await?;
    let route = find_route(&arrived)?;
    let body_limit = api::BodyLimit::of(route, settings.max_request_bytes);
    check_credentials(shard, reader.buf.len(), &arrived, route)?;
    answer_continue(to_writer, &arrived.head, body_limit).await?;
    // The request body, complete within the request deadline (`--request-timeout`) and with no
    // gap over `--client-body-timeout`.
    let body_deadline = arrived.received_at + settings.request_timeout;
    let body = read_body(shard, reader, &arrived.head, body_limit, body_deadline).await?;
    hand_over(shard, reader.peer, to_writer, &arrived, route, body).await
}

/// Where one request's steps stop other than by going on to the next request: the answer to
/// queue for the writer, if any, and how the reading ends.
enum Exit {
    /// Answer with this rejection, closing the connection (whether or not the writer still
    /// takes it), then end the reading with the outcome.
    Refuse(Rejection, ReadOutcome),
    /// Answer with this rejection and read the next request; when the rejection closes the
    /// connection, end the reading with the outcome instead. Ends with `Stop` if the writer is
    /// gone.
    Answer(Rejection, ReadOutcome),
    /// End the reading with this outcome, with no answer to queue.
    End(ReadOutcome),
}

impl Exit {
    /// After a request's steps stopped: queues the answer the exit carries. Returns how the
    /// reading ends, or `None` to read the next request.
    async fn answer(self, to_writer: &Sender<Inbound>) -> Option<ReadOutcome> {
        match self {
            Exit::Refuse(rejection, outcome) => {
                let _ = to_writer.send(Inbound::Reject(rejection.closing())).await;
                Some(outcome)
            }
            Exit::Answer(rejection, if_closing) => {
                let close = rejection.close;
                if to_writer.send(Inbound::Reject(rejection)).await.is_err() {
                    return Some(ReadOutcome::Stop);
                }
                close.then_some(if_closing)
            }
            Exit::End(outcome) => Some(outcome),
        }
    }
}

/// A read that ended while a request was part-read: the client stalled (408, closing), left,
/// or the writer finished.
impl From<ReadEnd> for Exit {
    fn from(end: ReadEnd) -> Exit {
        match end {
            ReadEnd::TimedOut => Exit::Refuse(Rejection::client_timeout(), ReadOutcome::Stop),
            ReadEnd::Closed => Exit::End(ReadOutcome::Closed),
            ReadEnd::WriterDone => Exit::End(ReadOutcome::Stop),
        }
    }
}

/// A request whose head has been read: what the steps after [`read_head`] share.
struct Arrived {
    head: RequestHead,
    /// The head's bytes, split off the read buffer; `head`'s spans index them.
    bytes: Bytes,
    /// When the head was parsed: the request deadline runs from here (idle keep-alive time
    /// before it does not count).
    received_at: Instant,
}

impl Arrived {
    /// Where the request target (path and query) lies in `bytes`.
    fn target_range(&self) -> std::ops::Range<usize> {
        let head = &self.head;
        let end = head.query.map_or(head.path.end, |query| query.end);
        head.path.start as usize..end as usize
    }
}

/// Whether `head` announces a body (a `content-length` of 0 announces none).
fn announces_body(head: &RequestHead) -> bool {
    !matches!(
        head.framing,
        BodyFraming::None | BodyFraming::ContentLength(0)
    )
}

/// Step 1, run while the connection waits for a request: reads until a whole head is in the
/// buffer, within `timeout`, and returns it split off the buffer. Exits with a closing 431 or
/// 400 for a head over the limits or malformed, a 408 for a client that stalls partway, and no
/// answer for one that stays idle, leaves, or a writer that finished.
async fn read_head(reader: &mut Reader, timeout: Duration) -> Result<Arrived, Exit> {
    let limits = HeadLimits::default();
    let mut started = Instant::now();
    let mut after_idle = false;
    let mut wait = HeadWait::default();
    loop {
        let parsed = if wait.ready(&reader.buf, &limits) {
            parse_head(&reader.buf, &limits)
        } else {
            Ok(None)
        };
        match parsed {
            Ok(Some(head)) => {
                let received_at = Instant::now();
                let bytes = reader.buf.split_to(head.head_bytes).freeze();
                return Ok(Arrived {
                    head,
                    bytes,
                    received_at,
                });
            }
            Ok(None) => {}
            Err(HeadError::TooLarge) => {
                let rejection = Rejection::headers_too_large();
                return Err(Exit::Refuse(rejection, ReadOutcome::Linger));
            }
            Err(HeadError::Malformed(reason)) => {
                let rejection = Rejection::request_invalid(format!("malformed request: {reason}"));
                return Err(Exit::Refuse(rejection, ReadOutcome::Linger));
            }
        }
        // Part of a head already here (or arrived before the time ran out: `Reader::fill`'s
        // first byte) means a stalled client, not an idle keep-alive one.
        let partial = !reader.buf.is_empty();
        if partial && after_idle {
            // The head's time runs from its first bytes, not from the idle wait before them
            // (read only here: most heads arrive whole with their first bytes).
            started = Instant::now();
        }
        let left = timeout.saturating_sub(started.elapsed());
        let idle = if partial { Wait::Within } else { Wait::Idle };
        match reader.fill_for(left, idle).await {
            Ok(_) => after_idle = !partial,
            Err(ReadEnd::TimedOut) if !partial && reader.buf.is_empty() => {
                return Err(Exit::End(ReadOutcome::Stop));
            }
            Err(end) => return Err(end.into()),
        }
    }
}

/// Step 2, once the head is in: the route it names. Exits with a closing 505 for an HTTP
/// version other than 1.0 and 1.1. An unknown route or method is answered at once (404, 405)
/// without reading a body that would not be used: the connection goes on to the next request
/// unless a body was announced (then it closes, lingering) or the client asked to close.
fn find_route(arrived: &Arrived) -> Result<api::Route, Exit> {
    let head = &arrived.head;
    if head.version != Version::Http11 && head.version != Version::Http10 {
        let rejection = Rejection::unsupported_version();
        return Err(Exit::Refuse(rejection, ReadOutcome::Linger));
    }
    api::route(head.method, head.path(&arrived.bytes)).map_err(|rejection| {
        if announces_body(head) {
            Exit::Answer(rejection.closing(), ReadOutcome::Linger)
        } else if !head.keep_alive {
            Exit::Answer(rejection.closing(), ReadOutcome::Stop)
        } else {
            Exit::Answer(rejection, ReadOutcome::Stop)
        }
    })
}

/// Step 3, once routed, when part of the body has yet to arrive (`buffered`: the bytes after
/// the head already read): checks the head's credentials before the body is read or the client
/// invited to send it, so a refused client costs no body buffer. Exits with the refusal,
/// closing. A request whose body is all in is not checked here: every request is authenticated
/// in full once its body is in (`api::serve`).
fn check_credentials(
    shard: &Shard,
    buffered: usize,
    arrived: &Arrived,
    route: api::Route,
) -> Result<(), Exit> {
    let head = &arrived.head;
    let body_pending = match head.framing {
        BodyFraming::None => false,
        BodyFraming::ContentLength(length) => (buffered as u64) < length,
        BodyFraming::Chunked => true,
    };
    if !body_pending {
        return Ok(());
    }
    let bytes = &arrived.bytes;
    let credentials = HeadCredentials {
        route,
        target: &bytes[arrived.target_range()],
        authorization: head.authorization.map(|span| span.get(bytes)),
        x_api_key: head.x_api_key.map(|span| span.get(bytes)),
    };
    authenticate::on_head(shard, credentials, now_unix_ms())
        .map_err(|rejection| Exit::Refuse(rejection, ReadOutcome::Linger))
}

/// Step 4, before the body is read: when the client waits for `Expect: 100-continue` and
/// announced a body, queues the interim answer, unless the declared length is over `limit`
/// (that body is refused in step 5 without inviting it). Exits only when the writer is gone.
async fn answer_continue(
    to_writer: &Sender<Inbound>,
    head: &RequestHead,
    limit: api::BodyLimit,
) -> Result<(), Exit> {
    let too_large = match head.framing {
        BodyFraming::ContentLength(length) => limit.exceeded_by(length),
        _ => false,
    };
    if head.expect_continue
        && announces_body(head)
        && !too_large
        && to_writer.send(Inbound::Continue).await.is_err()
    {
        return Err(Exit::End(ReadOutcome::Stop));
    }
    Ok(())
}

/// Step 5: reads the body `head` announces (empty when none) and returns it. Exits with a
/// closing 413 for a body over `limit`, a 400 for a malformed chunked one, a 503 when the
/// shard's body buffer is full, a 408 when a gap passes `--client-body-timeout` or `deadline`
/// passes, and no answer when the client leaves or the writer finished.
async fn read_body(
    shard: &Shard,
    reader: &mut Reader,
    head: &RequestHead,
    limit: api::BodyLimit,
    deadline: Instant,
) -> Result<Bytes, Exit> {
    let gap = shard.settings.client_body_timeout;
    let wait = || gap.min(deadline.saturating_duration_since(Instant::now()));
    let refuse = |rejection: Rejection| Exit::Refuse(rejection, ReadOutcome::Linger);
    match head.framing {
        BodyFraming::None => Ok(Bytes::new()),
        BodyFraming::ContentLength(length) => {
            if limit.exceeded_by(length) {
                return Err(refuse(limit.refusal()));
            }
            let length = length as usize;
            // The bytes still to come are counted against the shard's body buffer while they
            // arrive (what came with the head is in the connection's read buffer already): a
            // small request is never refused because others' large bodies fill the budget.
            let _lease = shard
                .clients
                .lease_body(length.saturating_sub(reader.buf.len()))
                .ok_or_else(|| refuse(Rejection::bodies_full()))?;
            if reader.buf.capacity() < length {
                reader.buf.reserve(length - reader.buf.len());
            }
            while reader.buf.len() < length {
                reader.fill(wait()).await?;
            }
            Ok(reader.buf.split_to(length).freeze())
        }
        BodyFraming::Chunked => {
            let mut decoder =
                ChunkedDecoder::new(limit.max_bytes.map_or(u64::MAX, |max| max as u64));
            let mut body = BytesMut::new();
            let mut lease = shard
                .clients
                .lease_body(reader.buf.len())
                .ok_or_else(|| refuse(Rejection::bodies_full()))?;
            loop {
                match decoder.decode(&reader.buf, &mut body) {
                    Ok(progress) => {
                        let _ = reader.buf.split_to(progress.consumed);
                        if decoder.is_done() {
                            return Ok(body.freeze());
                        }
                    }
                    Err(crate::wire::http::chunked::BodyError::TooLarge) => {
                        return Err(refuse(limit.refusal()));
                    }
                    Err(error) => {
                        return Err(refuse(Rejection::request_invalid(format!(
                            "malformed chunked body: {error}"
                        ))));
                    }
                }
                reader.fill(wait()).await?;
                if !lease.grow_to(body.len() + reader.buf.len()) {
                    return Err(refuse(Rejection::bodies_full()));
                }
            }
        }
    }
}

/// The request as the writer serves it, its header values sliced out of the head's bytes
/// (shared, not copied); built by [`hand_over`].
fn client_request(
    shard: &Shard,
    peer: Option<std::net::IpAddr>,
    arrived: &Arrived,
    route: api::Route,
    body: Bytes,
) -> ClientRequest {
    let (head, bytes) = (&arrived.head, &arrived.bytes);
    let span = |span: Option<crate::wire::http::request::Span>| {
        span.map(|span| bytes.slice_ref(span.get(bytes)))
    };
    ClientRequest {
        route,
        method: head.method,
        target: bytes.slice(arrived.target_range()),
        body,
        request_id: {
            let mut id = [0u8; 36];
            crate::router::audit::request_id(
                head.x_request_id.map(|span| span.get(bytes)),
                &mut id,
            );
            id
        },
        client_id: crate::logic::hold::ClientId::of_headers(
            head.x_client_request_id.map(|span| span.get(bytes)),
            head.x_request_id.map(|span| span.get(bytes)),
        ),
        anthropic_version: span(head.anthropic_version),
        anthropic_beta: span(head.anthropic_beta),
        authorization: span(head.authorization),
        x_api_key: span(head.x_api_key),
        received_at: arrived.received_at,
        peer,
        span: shard
            .accounting
            .start_span(|| head.header(bytes, "traceparent")),
    }
}

/// Step 6, last, once the body is in: queues the request for the writer (built here, in the
/// send's argument, so that it is not moved once more). `Ok` to read the next request; exits
/// after the last one the client sends (`connection: close`), to watch for the client leaving,
/// or when the writer is gone.
async fn hand_over(
    shard: &Shard,
    peer: Option<std::net::IpAddr>,
    to_writer: &Sender<Inbound>,
    arrived: &Arrived,
    route: api::Route,
    body: Bytes,
) -> Result<(), Exit> {
    let head = &arrived.head;
    let keep_alive = head.keep_alive;
    let sent = to_writer
        .send(Inbound::Request {
            request: client_request(shard, peer, arrived, route, body),
            keep_alive,
            head_only: head.method == Method::Head,
        })
        .await;
    if sent.is_err() {
        return Err(Exit::End(ReadOutcome::Stop));
    }
    if !keep_alive {
        return Err(Exit::End(ReadOutcome::WatchClose));
    }
    Ok(())
}

/// Reads and discards what the client is still sending after a refusal, for a bounded time and
/// amount, so it reads our answer instead of a connection reset.
async fn linger(reader: &mut Reader) {
    let until = Instant::now() + LINGER;
    let mut discarded = 0usize;
    while discarded < LINGER_BYTES_MAX {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        reader.buf.clear();
        // The writer finishing is expected here; only time, EOF or the byte cap end the linger.
        reader.stop_with_writer = false;
        match reader.fill(left).await {
            Ok(read) => discarded += read,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `serve` returns, from its type alone (nothing is constructed).
    fn future_size<F, Fut>(_: F) -> usize
    where
        F: FnOnce(&'static Rc<Shard>, &'static ClientRequest, &'static mut Http1Sink) -> Fut,
        Fut: std::future::Future,
    {
        std::mem::size_of::<Fut>()
    }

    /// Every connection holds its request path's future, in memory while idle and copied whole
    /// at each `.await` into it. To keep it small, a daily-budget settlement's wait on another
    /// shard's owner is boxed (`Shard::settle_buffered`) and the request is borrowed, not moved;
    /// this bound catches a change that widens it. (Running the admission steps in a future of
    /// their own made it 3,968 bytes, at about 150 more instructions a request: moving the quota
    /// charge out of it; `infer` takes them in place instead.) Test and release builds give the
    /// same size (`-Zprint-type-sizes` lists its parts).
    #[test]
    fn the_request_path_future_stays_small() {
        let size = future_size(api::serve::<Http1Sink>);
        assert!(
            size <= SERVE_FUTURE_BYTES_MAX,
            "api::serve's future: {size} bytes"
        );
    }

    const SERVE_FUTURE_BYTES_MAX: usize = 4224;
}
