//! The writing half of an HTTP/1.1 connection: [`Http1Sink`], the request path's [`Sink`] for
//! it, which writes response heads, bodies and chunks in order on the connection's write half,
//! and the shard's spare output buffers it borrows while it has something to write.

use std::rc::Rc;

use monoio::io::{AsyncWriteRentExt, OwnedWriteHalf};
use monoio::net::TcpStream;

use super::OUT_BYTES;
use crate::api::sink::{CORKED_BYTES_MAX, ClientGone, Sink, UntilGone};
use crate::http::response::{LAST_CHUNK, ResponseFraming, ResponseHead, write_chunk};
use crate::shard::latch::Latch;
use crate::shard::state::Shard;
use crate::telemetry::context::TRACEPARENT_LEN;

/// Output buffers of this shard's connections that wait for a request, lent to the next one that
/// has a response to write. A keep-alive connection used to keep its own 4 KiB buffer while idle;
/// allocating one per request instead cost about 300 instructions per request (a 4 KiB block is
/// past the allocator's small-object fast path), the spare list about 30.
///
/// Per shard (a thread-local, on a thread-per-core runtime) and bounded: at most
/// [`SPARE_MAX`](spare_out::SPARE_MAX) buffers, none grown past
/// [`KEPT_BYTES_MAX`](spare_out::KEPT_BYTES_MAX) (a buffer a long response grew is freed).
pub(super) mod spare_out {
    use std::cell::RefCell;

    use super::OUT_BYTES;

    pub(in crate::front::connection) const SPARE_MAX: usize = 256;
    pub(in crate::front::connection) const KEPT_BYTES_MAX: usize = 4 * OUT_BYTES;

    thread_local! {
        static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    /// An empty buffer with room for at least [`OUT_BYTES`].
    pub(in crate::front::connection) fn take() -> Vec<u8> {
        SPARE
            .with_borrow_mut(Vec::pop)
            .unwrap_or_else(|| Vec::with_capacity(OUT_BYTES))
    }

    /// Keeps `out` for [`take`] unless the list is full or `out` grew past [`KEPT_BYTES_MAX`].
    pub(in crate::front::connection) fn give_back(mut out: Vec<u8>) {
        if out.capacity() < OUT_BYTES || out.capacity() > KEPT_BYTES_MAX {
            return;
        }
        out.clear();
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_MAX {
                spare.push(out);
            }
        });
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn buffers_are_lent_again_within_bounds() {
            let lent = take();
            assert!(lent.capacity() >= OUT_BYTES);
            let address = lent.as_ptr();
            give_back(lent);
            let again = take();
            assert_eq!(again.as_ptr(), address, "the spare buffer is lent again");
            assert!(again.is_empty());

            // A buffer a long response grew is not kept, nor an empty one.
            give_back(Vec::with_capacity(KEPT_BYTES_MAX + 1));
            give_back(Vec::new());
            assert_eq!(SPARE.with_borrow(Vec::len), 0);

            // At most SPARE_MAX are kept.
            for _ in 0..SPARE_MAX + 10 {
                give_back(Vec::with_capacity(OUT_BYTES));
            }
            assert_eq!(SPARE.with_borrow(Vec::len), SPARE_MAX);
            drop(again);
        }
    }
}

pub(super) struct Http1Sink {
    pub(super) writer: OwnedWriteHalf<TcpStream>,
    pub(super) out: Vec<u8>,
    gone: Rc<Latch>,
    pub(super) close: bool,
    /// The request was `HEAD`: send heads without bodies.
    pub(super) head_only: bool,
    /// Where this connection's responses are counted.
    shard: Rc<Shard>,
    /// The status of the response head written last (0: none yet for this request).
    pub(super) status: u16,
    /// The current request's ID, returned as `X-Request-ID`.
    request_id: Option<[u8; 36]>,
    /// The current request's trace context, returned as `traceparent` (tracing on only).
    traceparent: Option<[u8; TRACEPARENT_LEN]>,
}

impl Http1Sink {
    /// A sink on `writer`; `gone` is set when the reader sees the client leave.
    pub(super) fn new(
        writer: OwnedWriteHalf<TcpStream>,
        gone: Rc<Latch>,
        shard: Rc<Shard>,
    ) -> Self {
        Http1Sink {
            writer,
            out: Vec::new(),
            gone,
            close: false,
            head_only: false,
            shard,
            status: 0,
            request_id: None,
            traceparent: None,
        }
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

    pub(super) async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), ClientGone> {
        self.out.extend_from_slice(bytes);
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
        let mut headers: [(&str, &[u8]); RESPONSE_HEADERS_MAX] = [("", b""); RESPONSE_HEADERS_MAX];
        let count = with_ids(&mut headers, &ids, extra_headers);
        ResponseHead {
            status,
            content_type: Some(content_type),
            framing: ResponseFraming::ContentLength(body.len() as u64),
            close: self.close,
            extra_headers: &headers[..count],
        }
        .write(&mut self.out);
        if !self.head_only {
            self.out.extend_from_slice(body);
        }
    }

    /// Appends a chunked response head (`start_stream`, `start_keepalive`) to `out`; the caller
    /// counts the status and writes it out.
    fn stream_head(&mut self, status: u16, content_type: &str, extra_headers: &[(&str, &[u8])]) {
        self.status = status;
        let ids = (self.request_id, self.traceparent);
        let mut headers: [(&str, &[u8]); RESPONSE_HEADERS_MAX] =
            [("cache-control", b"no-cache"); RESPONSE_HEADERS_MAX];
        let count = 1 + with_ids(&mut headers[1..], &ids, extra_headers);
        ResponseHead {
            status,
            content_type: Some(content_type),
            framing: ResponseFraming::Chunked,
            close: self.close,
            extra_headers: &headers[..count],
        }
        .write(&mut self.out);
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
            write_chunk(&mut self.out, data);
        }
        self.flush().await
    }

    async fn end_stream(&mut self) -> Result<(), ClientGone> {
        self.write_raw(LAST_CHUNK).await
    }

    async fn stream_data_corked(&mut self, data: &[u8]) -> Result<(), ClientGone> {
        if !data.is_empty() {
            write_chunk(&mut self.out, data);
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

/// Response headers a head may carry besides the framing ones.
const RESPONSE_HEADERS_MAX: usize = 9;

/// Fills `headers` with `X-Request-ID` and `traceparent` (each when known) and then `extra`, as
/// many as fit; returns how many.
fn with_ids<'a>(
    headers: &mut [(&'a str, &'a [u8])],
    (request_id, traceparent): &'a (Option<[u8; 36]>, Option<[u8; TRACEPARENT_LEN]>),
    extra: &[(&'a str, &'a [u8])],
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
    for header in extra.iter().take(headers.len() - count) {
        headers[count] = *header;
        count += 1;
    }
    count
}
