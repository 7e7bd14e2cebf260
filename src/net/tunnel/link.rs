//! The lean tunnel's connection: [`super::mux::Mux`] driven over a socket, with stream handles
//! for the request paths. One implementation for both ends: anything `tokio::io::AsyncRead +
//! AsyncWrite` (the router's sockets through `monoio-compat`, as `h2` takes them; TLS streams
//! too).
//!
//! [`client`] gives the router an [`Opener`] and a [`Connection`] future to poll in its own
//! task; [`server`] gives the agent an [`Acceptor`] and the same. The connection future reads
//! frames into the mux, hands what they mean to the waiting handles, and writes whatever the
//! mux has for the peer; it ends when the peer closes or a protocol error or I/O failure ends
//! the tunnel, and every stream still open then fails with that reason.
//!
//! Dropping a handle before its stream ended resets the stream ([`super::mux::CANCEL`]): a
//! router whose client left tells the agent, which stops its engine request.
//!
//! The shared state is behind one `std::sync::Mutex`, taken for a few field updates per call:
//! the ends run each connection on one thread (the router's shard; the agent's runtime), so it
//! is never contended; it is there because the agent's request tasks must be `Send`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::header::HeaderMap;
use http::uri::PathAndQuery;
use http::{Method, StatusCode};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::mux::{CANCEL, Event, Mux, MuxError, Role, Windows};
use super::wire::StreamId;

/// Bytes the connection reads at a time. A DATA frame's payload is a slice of the read it came
/// in, so a read stays allocated until every stream it carried has taken its bytes: with
/// thousands of streams open, each a token every few tens of milliseconds, each read brings a
/// few frames and a lagging stream holds the whole read. At 64 KiB, 1,000 open streams held
/// about 96 reads, 6.3 MB of the router's memory; the router reads through a 64 KiB socket
/// buffer anyway (`shard::tunnels`), so smaller reads cost copies, not system calls
/// (`perf/notes/2026-12-06-memory-per-open-stream.md`).
const READ_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LinkError {
    /// The stream was reset: by the peer (`remote`), or by this side.
    #[error("tunnel stream reset ({reason:#x}, {})", if *remote { "by the peer" } else { "here" })]
    Reset { reason: u32, remote: bool },
    #[error("the tunnel closed")]
    Closed,
    #[error(transparent)]
    Protocol(#[from] MuxError),
    #[error("tunnel I/O failed: {0}")]
    Io(String),
}

impl LinkError {
    /// Whether the peer reset the stream with `reason`.
    pub fn is_reset_by_peer(&self, reason: u32) -> bool {
        *self
            == LinkError::Reset {
                reason,
                remote: true,
            }
    }
}

/// A request as the agent receives it.
#[derive(Debug)]
pub struct Request {
    pub method: Method,
    pub target: PathAndQuery,
    pub fields: HeaderMap,
}

/// A response as the router receives it.
pub struct Response {
    pub status: StatusCode,
    pub fields: HeaderMap,
    pub body: RecvStream,
}

type Shared = Arc<Mutex<Inner>>;

struct Inner {
    mux: Mux,
    /// The streams open here. Bound: on the agent, the mux's `STREAMS_MAX` (it refuses more);
    /// on the router, the requests admission sent to this agent (its `--capacity`).
    streams: HashMap<StreamId, Slot, foldhash::fast::RandomState>,
    /// Server: requests not yet taken by [`Acceptor::accept`]. Bound: one per open stream.
    accepted: VecDeque<(StreamId, Request)>,
    accept_waker: Option<Waker>,
    /// The connection task, to write what a handle queued.
    connection: Option<Waker>,
    /// Why the connection ended, once it did.
    failed: Option<LinkError>,
    next_ping: u64,
    /// Pings awaiting their answer. Bound: one per live [`Ping`] future (the keepalive holds
    /// one at a time); a dropped one takes its entry out.
    pongs: HashMap<u64, Option<Waker>, foldhash::fast::RandomState>,
    /// Client: the [`Opener`]s alive. With none left and no stream open, the connection closes
    /// (the router let go of the tunnel).
    openers: usize,
}

/// A stream's local half: what arrived for its handles, and what waits for credit.
#[derive(Default)]
struct Slot {
    head: Option<(StatusCode, HeaderMap)>,
    /// Body pieces not yet read. Bound: the stream's receive window (the peer sends no more
    /// until the reader reports bytes consumed).
    data: VecDeque<Bytes>,
    ended: bool,
    reset: Option<LinkError>,
    /// Wakes whichever handle reads this stream (the response future, then the body).
    reader: Option<Waker>,
    /// Bytes the mux could not send yet, and whether the end goes with them.
    unsent: Bytes,
    unsent_end: bool,
    /// Wakes the sender waiting for `unsent` to go, or for a reset.
    writer: Option<Waker>,
    /// Server: the request body's reader let go; what still arrives is used up at once.
    discard: bool,
}

impl Inner {
    fn new(mux: Mux) -> Inner {
        Inner {
            mux,
            streams: HashMap::default(),
            accepted: VecDeque::new(),
            accept_waker: None,
            connection: None,
            failed: None,
            next_ping: 0,
            pongs: HashMap::default(),
            openers: 0,
        }
    }

    /// Client: nothing can use the connection any more.
    fn abandoned(&self) -> bool {
        self.mux.role() == Role::Client && self.openers == 0 && self.streams.is_empty()
    }

    /// Wakes the connection task when the mux has something for the peer.
    fn flush(&mut self) {
        if self.mux.has_output()
            && let Some(waker) = self.connection.take()
        {
            waker.wake();
        }
    }

    /// Takes in what the mux raised.
    fn dispatch(&mut self) {
        while let Some(event) = self.mux.poll_event() {
            match event {
                Event::Request {
                    stream,
                    method,
                    target,
                    fields,
                    end,
                } => {
                    let slot = Slot {
                        ended: end,
                        ..Slot::default()
                    };
                    self.streams.insert(stream, slot);
                    self.accepted.push_back((
                        stream,
                        Request {
                            method,
                            target,
                            fields,
                        },
                    ));
                    if let Some(waker) = self.accept_waker.take() {
                        waker.wake();
                    }
                }
                Event::Response {
                    stream,
                    status,
                    fields,
                    end,
                } => {
                    if let Some(slot) = self.streams.get_mut(&stream) {
                        slot.head = Some((status, fields));
                        slot.ended = end;
                        slot.wake_reader();
                    }
                }
                Event::Data { stream, data, end } => match self.streams.get_mut(&stream) {
                    Some(slot) if !slot.discard => {
                        slot.data.push_back(data);
                        slot.ended = end;
                        slot.wake_reader();
                    }
                    // Nobody reads it any more: its bytes are used up at once.
                    _ => self.mux.consumed(stream, data.len() as u32),
                },
                Event::Reset { stream, reason } => {
                    if let Some(slot) = self.streams.get_mut(&stream) {
                        slot.reset = Some(LinkError::Reset {
                            reason,
                            remote: true,
                        });
                        slot.unsent = Bytes::new();
                        slot.wake_reader();
                        slot.wake_writer();
                    }
                }
                Event::Writable { stream } => {
                    if let Some(slot) = self.streams.get_mut(&stream)
                        && !slot.unsent.is_empty()
                    {
                        let end = slot.unsent_end;
                        if self.mux.send_data(stream, &mut slot.unsent, end).is_err() {
                            slot.unsent = Bytes::new();
                        }
                        if slot.unsent.is_empty() {
                            slot.wake_writer();
                        }
                    }
                }
                Event::Pong { opaque } => {
                    if let Some(Some(waker)) = self.pongs.remove(&opaque) {
                        waker.wake();
                    }
                }
                // Streams already open finish; the router opens no more on this connection.
                Event::GoAway { .. } => {}
            }
        }
    }

    /// The connection ended: every handle learns why.
    fn fail(&mut self, error: LinkError) {
        if self.failed.is_none() {
            self.failed = Some(error);
        }
        for slot in self.streams.values_mut() {
            slot.wake_reader();
            slot.wake_writer();
        }
        if let Some(waker) = self.accept_waker.take() {
            waker.wake();
        }
        for waker in self.pongs.values_mut().filter_map(Option::take) {
            waker.wake();
        }
    }

    /// Sends `data` on `stream` as credit allows; the rest waits in the slot.
    fn send(&mut self, stream: StreamId, mut data: Bytes, end: bool) -> Result<(), LinkError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let slot = self.streams.get_mut(&stream).ok_or(LinkError::Closed)?;
        if let Some(error) = &slot.reset {
            return Err(error.clone());
        }
        debug_assert!(slot.unsent.is_empty(), "one send at a time per stream");
        self.mux
            .send_data(stream, &mut data, end)
            .map_err(|_| LinkError::Closed)?;
        slot.unsent = data;
        slot.unsent_end = end;
        self.flush();
        Ok(())
    }

    /// A handle let go of `stream`: reset it unless both directions ended.
    fn release(&mut self, stream: StreamId, finished: bool) {
        if let Some(slot) = self.streams.remove(&stream) {
            if !finished && slot.reset.is_none() {
                self.mux.reset(stream, CANCEL);
            }
            // Bytes that arrived and were never read are used up now.
            let unread: usize = slot.data.iter().map(Bytes::len).sum();
            if unread > 0 {
                self.mux.consumed(stream, unread as u32);
            }
            self.flush();
            if self.abandoned()
                && let Some(waker) = self.connection.take()
            {
                waker.wake();
            }
        }
    }
}

impl Slot {
    fn wake_reader(&mut self) {
        if let Some(waker) = self.reader.take() {
            waker.wake();
        }
    }

    fn wake_writer(&mut self) {
        if let Some(waker) = self.writer.take() {
            waker.wake();
        }
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The router's end: open streams with [`Opener::send_request`]; poll the [`Connection`].
pub fn client<IO>(io: IO) -> (Opener, Connection<IO>) {
    client_with_windows(io, Windows::TUNNEL)
}

pub fn client_with_windows<IO>(io: IO, windows: Windows) -> (Opener, Connection<IO>) {
    let mut inner = Inner::new(Mux::with_windows(Role::Client, windows));
    inner.openers = 1;
    let shared = Arc::new(Mutex::new(inner));
    (
        Opener {
            shared: shared.clone(),
        },
        Connection::new(io, shared),
    )
}

/// The agent's end: take streams with [`Acceptor::accept`]; poll the [`Connection`].
pub fn server<IO>(io: IO) -> (Acceptor, Connection<IO>) {
    server_with_windows(io, Windows::TUNNEL)
}

pub fn server_with_windows<IO>(io: IO, windows: Windows) -> (Acceptor, Connection<IO>) {
    let shared = Arc::new(Mutex::new(Inner::new(Mux::with_windows(
        Role::Server,
        windows,
    ))));
    (
        Acceptor {
            shared: shared.clone(),
        },
        Connection::new(io, shared),
    )
}

/// Opens streams on a client connection; cheap to clone. When the last one is dropped, the
/// connection closes as soon as its streams have ended.
pub struct Opener {
    shared: Shared,
}

impl Clone for Opener {
    fn clone(&self) -> Opener {
        lock(&self.shared).openers += 1;
        Opener {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Opener {
    fn drop(&mut self) {
        let mut inner = lock(&self.shared);
        inner.openers -= 1;
        if inner.abandoned()
            && let Some(waker) = inner.connection.take()
        {
            waker.wake();
        }
    }
}

impl Opener {
    /// Sends a request with its whole body (the router has it whole); the body waits in the
    /// stream for credit when it is larger than the windows.
    pub fn send_request(
        &self,
        method: Method,
        target: PathAndQuery,
        fields: HeaderMap,
        body: Bytes,
    ) -> Result<ResponseFuture, LinkError> {
        let mut inner = lock(&self.shared);
        if let Some(error) = &inner.failed {
            return Err(error.clone());
        }
        let stream = inner
            .mux
            .open(method, target, fields, body.is_empty())
            .ok_or(LinkError::Closed)?;
        inner.streams.insert(stream, Slot::default());
        if !body.is_empty() {
            inner.send(stream, body, true)?;
        }
        inner.flush();
        Ok(ResponseFuture {
            stream: Some(stream),
            shared: self.shared.clone(),
        })
    }

    /// A handle that pings the agent and, unlike an opener, does not keep the connection open.
    pub fn pinger(&self) -> Pinger {
        Pinger {
            shared: self.shared.clone(),
        }
    }
}

/// Pings the peer of a client connection (the router's keepalive).
pub struct Pinger {
    shared: Shared,
}

impl Pinger {
    /// Sends a ping; resolves when its answer comes back, or with the connection's end.
    pub fn ping(&self) -> Ping {
        let mut inner = lock(&self.shared);
        let opaque = inner.next_ping;
        inner.next_ping += 1;
        inner.mux.ping(opaque);
        inner.pongs.insert(opaque, None);
        inner.flush();
        Ping {
            opaque,
            shared: self.shared.clone(),
        }
    }
}

pub struct Ping {
    opaque: u64,
    shared: Shared,
}

impl Future for Ping {
    type Output = Result<(), LinkError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = lock(&self.shared);
        let failed = inner.failed.clone();
        match (inner.pongs.get_mut(&self.opaque), failed) {
            (None, _) => Poll::Ready(Ok(())),
            (Some(_), Some(error)) => Poll::Ready(Err(error)),
            (Some(waker), None) => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Ping {
    fn drop(&mut self) {
        lock(&self.shared).pongs.remove(&self.opaque);
    }
}

/// A request's answer; dropped before it came, the stream is reset.
pub struct ResponseFuture {
    /// `None` once the response was handed out (its body owns the stream then).
    stream: Option<StreamId>,
    shared: Shared,
}

impl Future for ResponseFuture {
    type Output = Result<Response, LinkError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let stream = self.stream.expect("polled after completion");
        let mut inner = lock(&self.shared);
        let failed = inner.failed.clone();
        let slot = inner.streams.get_mut(&stream).ok_or(LinkError::Closed)?;
        if let Some((status, fields)) = slot.head.take() {
            drop(inner);
            self.stream = None;
            return Poll::Ready(Ok(Response {
                status,
                fields,
                body: RecvStream {
                    stream,
                    shared: self.shared.clone(),
                    done: false,
                },
            }));
        }
        if let Some(error) = slot.reset.clone().or(failed) {
            return Poll::Ready(Err(error));
        }
        slot.reader = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        if let Some(stream) = self.stream {
            lock(&self.shared).release(stream, false);
        }
    }
}

/// A stream's incoming body. Dropped before its end, the stream is reset.
pub struct RecvStream {
    stream: StreamId,
    shared: Shared,
    /// The end was read.
    done: bool,
}

impl RecvStream {
    /// The next piece of the body; `None` at its end. Report what was used with
    /// [`RecvStream::release_capacity`], or the peer runs out of credit.
    pub fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, LinkError>>> {
        let mut inner = lock(&self.shared);
        let failed = inner.failed.clone();
        let Some(slot) = inner.streams.get_mut(&self.stream) else {
            return Poll::Ready(Some(Err(LinkError::Closed)));
        };
        if let Some(data) = slot.data.pop_front() {
            if slot.data.is_empty() && slot.ended {
                self.done = true;
            }
            return Poll::Ready(Some(Ok(data)));
        }
        if slot.ended {
            self.done = true;
            return Poll::Ready(None);
        }
        if let Some(error) = slot.reset.clone().or(failed) {
            return Poll::Ready(Some(Err(error)));
        }
        slot.reader = Some(cx.waker().clone());
        Poll::Pending
    }

    pub async fn data(&mut self) -> Option<Result<Bytes, LinkError>> {
        std::future::poll_fn(|cx| self.poll_data(cx)).await
    }

    /// Whether the body's end has been read.
    pub fn is_end_stream(&self) -> bool {
        self.done
    }

    pub fn release_capacity(&self, bytes: usize) {
        let mut inner = lock(&self.shared);
        inner.mux.consumed(self.stream, bytes as u32);
        inner.flush();
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let mut inner = lock(&self.shared);
        if inner.mux.role() == Role::Client {
            // The request went whole: the stream is finished once its answer was read.
            inner.release(self.stream, self.done);
            return;
        }
        // Server: the answer may still be going (its `Responder` holds the stream); the rest of
        // the request body is used up as it comes.
        let mut unread = 0;
        if let Some(slot) = inner.streams.get_mut(&self.stream) {
            slot.discard = true;
            unread = slot.data.drain(..).map(|data| data.len()).sum::<usize>();
        }
        if unread > 0 {
            inner.mux.consumed(self.stream, unread as u32);
            inner.flush();
        }
    }
}

/// Takes the router's requests on a server connection.
pub struct Acceptor {
    shared: Shared,
}

impl Acceptor {
    /// The next request, its body, and where its answer goes; `None` once the connection ended.
    pub fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<(Request, RecvStream, Responder)>> {
        let mut inner = lock(&self.shared);
        if let Some((stream, request)) = inner.accepted.pop_front() {
            let handles = (
                request,
                RecvStream {
                    stream,
                    shared: self.shared.clone(),
                    done: false,
                },
                Responder {
                    stream,
                    shared: self.shared.clone(),
                    finished: false,
                },
            );
            return Poll::Ready(Some(handles));
        }
        if inner.failed.is_some() {
            return Poll::Ready(None);
        }
        inner.accept_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    pub async fn accept(&mut self) -> Option<(Request, RecvStream, Responder)> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }
}

/// Where a request's answer goes: its head, then its body. Dropped before the body's end, the
/// stream is reset.
pub struct Responder {
    stream: StreamId,
    shared: Shared,
    /// The end was sent, or the stream reset.
    finished: bool,
}

impl Responder {
    pub fn send_response(
        &mut self,
        status: StatusCode,
        fields: HeaderMap,
        end: bool,
    ) -> Result<(), LinkError> {
        let mut inner = lock(&self.shared);
        if let Some(error) = self.stopped(&mut inner) {
            return Err(error);
        }
        inner
            .mux
            .respond(self.stream, status, fields, end)
            .map_err(|_| LinkError::Closed)?;
        self.finished = end;
        inner.flush();
        Ok(())
    }

    /// Sends a piece of the body; waits until the peer's credit has let all of it go.
    pub async fn send_data(&mut self, data: Bytes, end: bool) -> Result<(), LinkError> {
        lock(&self.shared).send(self.stream, data, end)?;
        std::future::poll_fn(|cx| {
            let mut inner = lock(&self.shared);
            if let Some(error) = self.stopped(&mut inner) {
                return Poll::Ready(Err(error));
            }
            let slot = inner
                .streams
                .get_mut(&self.stream)
                .ok_or(LinkError::Closed)?;
            if slot.unsent.is_empty() {
                return Poll::Ready(Ok(()));
            }
            slot.writer = Some(cx.waker().clone());
            Poll::Pending
        })
        .await?;
        self.finished = end;
        Ok(())
    }

    /// Resets the stream (the backend failed after the head, say).
    pub fn send_reset(&mut self, reason: u32) {
        let mut inner = lock(&self.shared);
        inner.mux.reset(self.stream, reason);
        inner.streams.remove(&self.stream);
        inner.flush();
        self.finished = true;
    }

    /// Resolves when the peer reset the stream or the connection ended: nobody wants the answer.
    pub fn poll_reset(&mut self, cx: &mut Context<'_>) -> Poll<LinkError> {
        let mut inner = lock(&self.shared);
        if let Some(error) = self.stopped(&mut inner) {
            return Poll::Ready(error);
        }
        if let Some(slot) = inner.streams.get_mut(&self.stream) {
            slot.writer = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    fn stopped(&self, inner: &mut Inner) -> Option<LinkError> {
        if let Some(error) = &inner.failed {
            return Some(error.clone());
        }
        match inner.streams.get(&self.stream) {
            Some(slot) => slot.reset.clone(),
            None if self.finished => None,
            None => Some(LinkError::Closed),
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        let mut inner = lock(&self.shared);
        let finished = self.finished;
        inner.release(self.stream, finished);
    }
}

/// Drives one tunnel connection: poll it in a task of its own until it ends.
pub struct Connection<IO> {
    io: IO,
    shared: Shared,
    /// Bytes read and not yet taken as frames. Bound: one frame (`wire::PAYLOAD_BYTES_MAX` plus
    /// its header) plus one read of `READ_BYTES`.
    read: BytesMut,
    /// Frames not yet written to the socket. Bound: DATA within the peer's credit (the
    /// connection window) plus heads, credit, resets and pings, one per stream event.
    write: BytesMut,
}

impl<IO> Connection<IO> {
    fn new(io: IO, shared: Shared) -> Connection<IO> {
        Connection {
            io,
            shared,
            read: BytesMut::new(),
            write: BytesMut::new(),
        }
    }
}

impl<IO> Drop for Connection<IO> {
    /// Dropped without having ended (the router's drain deadline, an aborted task): nothing will
    /// move on it again, so every stream still open fails now rather than waiting forever.
    fn drop(&mut self) {
        lock(&self.shared).fail(LinkError::Closed);
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Connection<IO> {
    fn end(&mut self, error: LinkError) -> Poll<Result<(), LinkError>> {
        lock(&self.shared).fail(error.clone());
        Poll::Ready(match error {
            LinkError::Closed => Ok(()),
            error => Err(error),
        })
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Future for Connection<IO> {
    /// `Ok` when the peer closed the connection; the error that ended it otherwise.
    type Output = Result<(), LinkError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            // Everything the socket has, into the mux.
            let mut progressed = false;
            loop {
                this.read.reserve(READ_BYTES);
                let mut buf = ReadBuf::uninit(this.read.spare_capacity_mut());
                match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) => {
                        let filled = buf.filled().len();
                        if filled == 0 {
                            return this.end(LinkError::Closed);
                        }
                        // SAFETY: `poll_read` initialised `filled` bytes of the spare capacity.
                        unsafe { this.read.set_len(this.read.len() + filled) };
                        let mut inner = lock(&this.shared);
                        if let Err(error) = inner.mux.receive(&mut this.read) {
                            drop(inner);
                            return this.end(error.into());
                        }
                        inner.dispatch();
                        progressed = true;
                    }
                    Poll::Ready(Err(error)) => return this.end(LinkError::Io(error.to_string())),
                    Poll::Pending => break,
                }
            }
            // Everything the mux has, onto the socket.
            let abandoned = {
                let mut inner = lock(&this.shared);
                inner.mux.move_output(&mut this.write);
                inner.connection = Some(cx.waker().clone());
                inner.abandoned()
            };
            while !this.write.is_empty() {
                match Pin::new(&mut this.io).poll_write(cx, &this.write) {
                    Poll::Ready(Ok(0)) => return this.end(LinkError::Closed),
                    Poll::Ready(Ok(written)) => {
                        // Advanced, not split: the buffer stays this one's alone, so the mux
                        // writes into it again once it is empty.
                        this.write.advance(written);
                        progressed = true;
                    }
                    Poll::Ready(Err(error)) => return this.end(LinkError::Io(error.to_string())),
                    Poll::Pending => break,
                }
            }
            if let Poll::Ready(Err(error)) = Pin::new(&mut this.io).poll_flush(cx) {
                return this.end(LinkError::Io(error.to_string()));
            }
            if abandoned && this.write.is_empty() {
                // The router let go of the tunnel and its last stream ended: close it, which the
                // agent reads as the router closing the tunnel.
                return match Pin::new(&mut this.io).poll_shutdown(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(_) => this.end(LinkError::Closed),
                };
            }
            if !progressed {
                // A handle that queued output since the waker was set woke it.
                return Poll::Pending;
            }
        }
    }
}

#[cfg(test)]
mod tests;
