//! The writer half of an HTTP/1.1 connection: it answers what the reader hands it
//! ([`Inbound`]), strictly in order, through [`Http1Sink`], the connection's [`Sink`] for the
//! request phases. Its output buffer is lent from the shard's spare ones
//! (`base::spare_buffers`) only while it has something to write.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monoio::io::{AsyncWriteRent, AsyncWriteRentExt, OwnedWriteHalf};
use monoio::net::TcpStream;

use crate::base::latch::Latch;
use crate::base::spare_buffers;
use crate::net::telemetry::context::TRACEPARENT_LEN;
use crate::router::api::sink::{CORKED_BYTES_MAX, ClientGone, Sink, UntilGone};
use crate::router::api::{self, ClientRequest};
use crate::router::error::Rejection;
use crate::router::front::pipeline::Receiver;
use crate::router::shard::state::Shard;
use crate::wire::http::response::{LAST_CHUNK, ResponseFraming, ResponseHead, write_chunk};

/// What the reader hands the writer, in order. A request is nearly every message, so its
/// variant stays inline: boxing it to shrink the rare ones would allocate per request.
#[allow(clippy::large_enum_variant)]
pub(super) enum Inbound {
    Request {
        request: ClientRequest,
        keep_alive: bool,
        head_only: bool,
    },
    /// `Expect: 100-continue`: the writer sends the interim response in order.
    Continue,
    Reject(Rejection),
}

pub(super) async fn write_loop(
    shard: &Rc<Shard>,
    sink: &mut Http1Sink,
    mut inbound: Receiver<Inbound>,
) {
    loop {
        if inbound.is_empty() && sink.out.is_empty() {
            // Nothing to answer until the client sends again, which for a keep-alive connection
            // may be never: hold no output buffer meanwhile.
            spare_buffers::give_back(std::mem::take(&mut sink.out));
        }
        let Some(item) = inbound.recv().await else {
            return;
        };
        if sink.out.capacity() == 0 {
            sink.out = spare_buffers::take();
        }
        match item {
            Inbound::Request {
                request,
                keep_alive,
                head_only,
            } => {
                // A draining router answers this request and closes the connection.
                sink.close = !keep_alive || shard.lifecycle.is_draining();
                sink.head_only = head_only;
                sink.status = 0;
                sink.first_wait = None;
                sink.answers.begin();
                let served = api::serve(shard, &request, sink).await;
                sink.answers.finish();
                if served.is_err() || sink.close {
                    return;
                }
            }
            Inbound::Continue => {
                if sink
                    .write_raw(crate::wire::http::response::CONTINUE)
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Inbound::Reject(rejection) => {
                let close = rejection.close;
                sink.head_only = false;
                if sink.reject(&rejection).await.is_err() || close {
                    return;
                }
            }
        }
    }
}

/// How long an answer streams, from the first time it waits for its next part, before its
/// connection goes quiet: from then on the reader waits for each next request holding no read
/// buffer (`front::connection::Reader::fill`). Short streams (a benchmark's, a tool call's) end
/// well before and never pay the one more read a quiet connection's requests cost.
const QUIET_AFTER: Duration = Duration::from_millis(250);

/// What a connection's writer tells its reader (both tasks on one shard): how many answers it
/// began and finished (one is being written while they differ), and whether the connection is
/// quiet.
#[derive(Debug, Default)]
pub(super) struct Answers {
    begun: Cell<u64>,
    finished: Cell<u64>,
    quiet: Cell<bool>,
}

impl Answers {
    /// An answer is being written: the connection is not idle, however long it streams.
    pub(super) fn is_busy(&self) -> bool {
        self.begun.get() != self.finished.get()
    }

    /// How many answers have finished; a change means the connection was not idle meanwhile.
    pub(super) fn finished(&self) -> u64 {
        self.finished.get()
    }

    /// An answer has streamed for [`QUIET_AFTER`] on this connection: the reader waits for the
    /// next request holding no read buffer (`front::connection::Reader::fill`). For good.
    pub(super) fn is_quiet(&self) -> bool {
        self.quiet.get()
    }

    fn begin(&self) {
        self.begun.set(self.begun.get().wrapping_add(1));
    }

    fn finish(&self) {
        self.finished.set(self.finished.get().wrapping_add(1));
    }
}

pub struct Http1Sink {
    writer: OwnedWriteHalf<TcpStream>,
    out: Vec<u8>,
    gone: Rc<Latch>,
    /// Shared with the reader: this side writes it.
    answers: Rc<Answers>,
    /// When the answer streaming now first waited for its next part (`None`: it has not yet).
    first_wait: Option<Instant>,
    close: bool,
    /// The request was `HEAD`: send heads without bodies.
    head_only: bool,
    /// Where this connection's responses are counted.
    shard: Rc<Shard>,
    /// The status of the response head written last (0: none yet for this request).
    status: u16,
    /// The current request's ID, returned as `X-Request-ID`.
    request_id: Option<[u8; 36]>,
    /// The current request's trace context, returned as `traceparent` (tracing on only).
    traceparent: Option<[u8; TRACEPARENT_LEN]>,
}

impl Http1Sink {
    /// The writer of a connection whose reader sets `gone` when the client leaves, and reads
    /// `answers`.
    pub(super) fn new(
        writer: OwnedWriteHalf<TcpStream>,
        gone: Rc<Latch>,
        answers: Rc<Answers>,
        shard: Rc<Shard>,
    ) -> Http1Sink {
        Http1Sink {
            writer,
            out: Vec::new(),
            gone,
            answers,
            first_wait: None,
            close: false,
            head_only: false,
            shard,
            status: 0,
            request_id: None,
            traceparent: None,
        }
    }

    /// Closes the write side, whatever the client did.
    pub(super) async fn shutdown(&mut self) {
        let _ = self.writer.shutdown().await;
    }

    /// Writes out `out`, which is empty afterwards whatever the result: every write appends
    /// to it, and only corked writes (`Sink::*_corked`) leave bytes in it between calls.
    async fn write_out(&mut self) -> Result<(), ClientGone> {
        let out = std::mem::take(&mut self.out);
        let (result, mut out) = self.writer.write_all(out).await;
        out.clear();
        self.out = out;
        result.map(|_| ()).map_err(|_| ClientGone)
    }

    /// The output buffer, lent from the shard's spare ones when this holds none: a stream
    /// waiting for its next token gives it back ([`Sink::waiting`]).
    fn out(&mut self) -> &mut Vec<u8> {
        if self.out.capacity() == 0 {
            self.out = spare_buffers::take();
        }
        &mut self.out
    }

    async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), ClientGone> {
        self.out().extend_from_slice(bytes);
        self.write_out().await
    }

    /// Appends a whole response (head and body) to `out`; the caller counts the status and
    /// writes it out. Not part of `respond`: the header array would be held across its write,
    /// in every request's future (the request path's futures are copied whole at each await).
    fn whole_response(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
        body: &[u8],
    ) {
        self.status = status;
        let ids = (self.request_id, self.traceparent);
        let mut own: [(&str, &[u8]); OWN_HEADERS_MAX] = [("", b""); OWN_HEADERS_MAX];
        let count = with_ids(&mut own, &ids);
        ResponseHead {
            status,
            content_type: Some(content_type),
            framing: ResponseFraming::ContentLength(body.len() as u64),
            close: self.close,
            extra_headers: &own[..count],
            passed_headers: extra_headers,
        }
        .write(self.out());
        if !self.head_only {
            self.out().extend_from_slice(body);
        }
    }

    /// Appends a chunked response head (`start_stream`, `start_keepalive`) to `out`; the caller
    /// counts the status and writes it out.
    fn stream_head(&mut self, status: u16, content_type: &str, extra_headers: &[(&str, &[u8])]) {
        self.status = status;
        let ids = (self.request_id, self.traceparent);
        let mut own: [(&str, &[u8]); OWN_HEADERS_MAX] =
            [("cache-control", b"no-cache"); OWN_HEADERS_MAX];
        let count = 1 + with_ids(&mut own[1..], &ids);
        ResponseHead {
            status,
            content_type: Some(content_type),
            framing: ResponseFraming::Chunked,
            close: self.close,
            extra_headers: &own[..count],
            passed_headers: extra_headers,
        }
        .write(self.out());
    }
}

impl Sink for Http1Sink {
    async fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), ClientGone> {
        self.shard.metrics.count_response(status);
        self.whole_response(status, content_type, extra_headers, body);
        self.write_out().await
    }

    async fn start_stream(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
    ) -> Result<(), ClientGone> {
        self.shard.metrics.count_response(status);
        self.stream_head(status, content_type, extra_headers);
        Ok(())
    }

    async fn start_keepalive(&mut self, content_type: &str) -> Result<(), ClientGone> {
        self.stream_head(200, content_type, &[]);
        self.write_out().await
    }

    async fn stream_data(&mut self, data: &[u8]) -> Result<(), ClientGone> {
        if !data.is_empty() {
            write_chunk(self.out(), data);
        }
        self.flush().await
    }

    async fn end_stream(&mut self) -> Result<(), ClientGone> {
        self.write_raw(LAST_CHUNK).await
    }

    async fn stream_data_corked(&mut self, data: &[u8]) -> Result<(), ClientGone> {
        if !data.is_empty() {
            write_chunk(self.out(), data);
        }
        if self.out.len() >= CORKED_BYTES_MAX {
            return self.write_out().await;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ClientGone> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.write_out().await
    }

    fn until_client_gone<F: std::future::Future>(
        &mut self,
        future: F,
    ) -> impl std::future::Future<Output = Option<F::Output>> {
        UntilGone::new(future, self.gone.wait())
    }

    fn close_after(&mut self) {
        self.close = true;
    }

    fn waiting(&mut self) {
        if self.out.is_empty() {
            spare_buffers::give_back(std::mem::take(&mut self.out));
        }
        if self.answers.is_quiet() {
            return;
        }
        match self.first_wait {
            None => self.first_wait = Some(Instant::now()),
            Some(since) if since.elapsed() >= QUIET_AFTER => self.answers.quiet.set(true),
            Some(_) => {}
        }
    }

    fn status(&self) -> u16 {
        self.status
    }

    fn set_request_id(&mut self, id: [u8; 36]) {
        self.request_id = Some(id);
    }

    fn set_traceparent(&mut self, traceparent: Option<[u8; TRACEPARENT_LEN]>) {
        self.traceparent = traceparent;
    }
}

/// The connection's own response headers: `cache-control` on a stream, `X-Request-ID` and
/// `traceparent`. The caller's (`extra_headers` of the `Sink` calls) are written after them, all
/// of them.
const OWN_HEADERS_MAX: usize = 3;

/// Fills `headers` with `X-Request-ID` and `traceparent`, each when known; returns how many.
fn with_ids<'a>(
    headers: &mut [(&'a str, &'a [u8])],
    (request_id, traceparent): &'a (Option<[u8; 36]>, Option<[u8; TRACEPARENT_LEN]>),
) -> usize {
    let mut count = 0;
    if let Some(id) = request_id {
        headers[count] = ("x-request-id", id.as_slice());
        count += 1;
    }
    if let Some(traceparent) = traceparent {
        headers[count] = ("traceparent", traceparent.as_slice());
        count += 1;
    }
    count
}
