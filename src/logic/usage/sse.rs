//! Server-sent events: a response body split into events, and an event's data.

use bytes::{Buf, Bytes, BytesMut};
use thiserror::Error;

use crate::wire::http::{blank_line_end as find_event_end, blank_line_end_and_lines};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SseError {
    /// An event grew past the buffering limit without a terminator; stop scanning this stream.
    #[error("server-sent event longer than the buffering limit")]
    EventTooLarge,
}

/// Splits a response body into server-sent events (WHATWG HTML §9.2.6).
///
/// An event ends at a blank line: a line ending (`\n` or `\r\n`) followed by another. Bare `\r`
/// line endings, which no inference engine emits, are not recognised.
///
/// Use: [`push`](SseSplitter::push) a chunk, then call [`next_event`](SseSplitter::next_event)
/// until it returns `Ok(None)`, then push the next chunk. At end of stream,
/// [`take_tail`](SseSplitter::take_tail) returns any unterminated bytes.
#[derive(Debug)]
pub struct SseSplitter {
    /// The unterminated start of an event that began in an earlier chunk. Never contains a
    /// complete terminator.
    tail: BytesMut,
    /// The unscanned rest of the chunk pushed last.
    pending: Bytes,
    /// Set when a push merged chunks into `tail`, which may then hold whole events and is
    /// drained before anything else; `pending` stays empty meanwhile.
    tail_has_events: bool,
    event_bytes_max: usize,
}

impl SseSplitter {
    /// `event_bytes_max`: longest event buffered across chunks, in bytes.
    pub fn new(event_bytes_max: usize) -> Self {
        SseSplitter {
            tail: BytesMut::new(),
            pending: Bytes::new(),
            tail_has_events: false,
            event_bytes_max,
        }
    }

    /// Queue `chunk` for splitting. Events not yet taken from an earlier chunk are kept; taking
    /// them first avoids a copy.
    pub fn push(&mut self, chunk: Bytes) {
        if self.pending.is_empty() && !self.tail_has_events {
            self.pending = chunk;
        } else {
            // The caller pushed before draining: merge into the tail (a copy) to keep order.
            self.tail.extend_from_slice(&self.pending);
            self.tail.extend_from_slice(&chunk);
            self.pending = Bytes::new();
            self.tail_has_events = true;
        }
    }

    /// The next complete event, terminator included, or `None` until more bytes are pushed.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        if self.tail_has_events {
            // Merged mode: everything is in the tail and `pending` is empty.
            if let Some((end, one_line)) = blank_line_end_and_lines(&self.tail) {
                let bytes = self.tail.split_to(end).freeze();
                return Ok(Some(SseEvent { bytes, one_line }));
            }
            self.tail_has_events = false;
            if self.tail.len() > self.event_bytes_max {
                return Err(SseError::EventTooLarge);
            }
            return Ok(None);
        }
        if self.pending.is_empty() {
            return Ok(None);
        }
        if self.tail.is_empty() {
            if let Some((end, one_line)) = blank_line_end_and_lines(&self.pending) {
                let bytes = self.pending.split_to(end);
                return Ok(Some(SseEvent { bytes, one_line }));
            }
        } else if let Some(end) = self.straddling_event_end() {
            self.tail.extend_from_slice(&self.pending[..end]);
            self.pending.advance(end);
            // Rare (an event cut by the network): its lines are not counted.
            let bytes = self.tail.split().freeze();
            return Ok(Some(SseEvent {
                bytes,
                one_line: false,
            }));
        }
        // No terminator in what we have: keep it all for the next chunk.
        if self.tail.len() + self.pending.len() > self.event_bytes_max {
            return Err(SseError::EventTooLarge);
        }
        self.tail.extend_from_slice(&self.pending);
        self.pending = Bytes::new();
        Ok(None)
    }

    /// Where in `pending` the event begun in `tail` ends. A terminator is at most 3 bytes, so one
    /// that starts in the tail starts in its last 2 bytes; check that seam, then the chunk alone.
    fn straddling_event_end(&self) -> Option<usize> {
        let seam_tail = &self.tail[self.tail.len().saturating_sub(2)..];
        let seam_chunk = &self.pending[..self.pending.len().min(3)];
        let mut seam = [0u8; 5];
        seam[..seam_tail.len()].copy_from_slice(seam_tail);
        seam[seam_tail.len()..seam_tail.len() + seam_chunk.len()].copy_from_slice(seam_chunk);
        let seam = &seam[..seam_tail.len() + seam_chunk.len()];
        // The tail holds no complete terminator, so any found here ends inside the chunk.
        if let Some(end) = find_event_end(seam) {
            return Some(end - seam_tail.len());
        }
        find_event_end(&self.pending)
    }

    /// Bytes not yet returned as events (normally an unterminated final event), for forwarding
    /// at end of stream. Call after draining [`next_event`](SseSplitter::next_event).
    pub fn take_tail(&mut self) -> Bytes {
        self.tail_has_events = false;
        self.tail.extend_from_slice(&self.pending);
        self.pending = Bytes::new();
        self.tail.split().freeze()
    }
}

/// One complete event from [`SseSplitter`], terminator included; derefs to its bytes. Two events
/// are equal when their bytes are.
#[derive(Debug, Clone)]
pub struct SseEvent {
    bytes: Bytes,
    /// The splitter's scan met no line end before the blank line that ends the event: it is
    /// one line, and reading its data needs no second scan.
    pub(super) one_line: bool,
}

impl SseEvent {
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The event's data, as [`event_data`] reads it.
    pub(super) fn data<'e>(&'e self, scratch: &'e mut Vec<u8>) -> Option<&'e [u8]> {
        if !self.one_line {
            return event_data(&self.bytes, scratch);
        }
        // One line, then `\n` or `\r\n`: the blank line.
        let terminator = if self.bytes.ends_with(b"\n\r\n") {
            3
        } else {
            2
        };
        let line = &self.bytes[..self.bytes.len() - terminator];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let value = line.strip_prefix(b"data:")?;
        Some(value.strip_prefix(b" ").unwrap_or(value))
    }
}

impl PartialEq for SseEvent {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for SseEvent {}

impl std::ops::Deref for SseEvent {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The event's data: its `data:` line values joined with `\n` (WHATWG's rule). Returns a slice of
/// `event` when there is one data line, as in every inference stream; otherwise joins into
/// `scratch`.
pub(super) fn event_data<'e>(event: &'e [u8], scratch: &'e mut Vec<u8>) -> Option<&'e [u8]> {
    // The shape of nearly every streamed event: one `data:` line, then the blank line that ends
    // the event. One `memchr` finds both; anything else takes the general loop below.
    if let Some(value) = event.strip_prefix(b"data:")
        && let Some(end) = memchr::memchr(b'\n', value)
        && matches!(&value[end + 1..], b"" | b"\n" | b"\r\n")
    {
        let line = &value[..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        return Some(line.strip_prefix(b" ").unwrap_or(line));
    }
    let mut single: Option<&'e [u8]> = None;
    let mut lines_count = 0;
    // Lines found with `memchr` rather than `split` on a closure, which tests one byte at a
    // time: every streamed event passes here, and such a loop costs 5 % of the router's CPU per
    // streamed request (`perf/notes/2026-12-01-where-requests-wait-and-the-stream-cork.md`).
    let mut rest = Some(event);
    while let Some(text) = rest {
        let (line, after) = match memchr::memchr(b'\n', text) {
            Some(end) => (&text[..end], Some(&text[end + 1..])),
            None => (text, None),
        };
        rest = after;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(value) = line.strip_prefix(b"data:") else {
            continue;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        lines_count += 1;
        if lines_count == 1 {
            single = Some(value);
        } else {
            if lines_count == 2 {
                scratch.clear();
                scratch.extend_from_slice(single.unwrap_or_default());
            }
            scratch.push(b'\n');
            scratch.extend_from_slice(value);
        }
    }
    if lines_count > 1 {
        Some(scratch.as_slice())
    } else {
        single
    }
}
