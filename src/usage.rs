//! Exact token usage read from backend responses, whole bodies and SSE streams.
//!
//! Owns the reading of `usage` objects in OpenAI chat, embeddings/rerank and Anthropic message
//! responses, the splitting of a streamed body into SSE events, and the per-event classification
//! the router needs to settle a stream and to hide the usage-only chunk from clients that did not
//! ask for it. Pure: bytes in, numbers out; no runtime and no clock.
//!
//! # Key components
//! - [`Usage`] and the whole-body readers [`from_openai_chat`], [`from_openai_embeddings`],
//!   [`from_anthropic_message`].
//! - [`SseSplitter`]: chunks of a response body in, complete [`SseEvent`]s out (`Bytes` slices).
//! - [`OpenAiStreamScan`] and [`AnthropicStreamScan`]: per-event classification and accumulation.
//!
//! # Invariants
//! - An event is returned by [`SseSplitter`] exactly once and in order, terminator included, so
//!   forwarding every event (and the tail at end of stream) reproduces the body byte for byte.
//! - The splitter buffers at most `event_bytes_max` bytes of an unfinished event.
//!
//! # Performance
//! An event that lies inside one fed chunk is returned as a `Bytes` slice of that chunk (a
//! reference count, no copy); only events straddling chunks are copied, once. The splitter's one
//! scan of an event also tells whether it is one line, so its data needs no second scan. An
//! OpenAI chunk ending with `"usage": null` is settled from its end; any other is searched for
//! `"usage"`, and only a chunk with a usage object is read further, its usage object in one pass
//! when plainly shaped (`flat`). About 440 instructions an event in all (perf/README.md).

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::{Buf, Bytes, BytesMut};
use memchr::memmem;
use serde::Deserialize;
use serde::de::IgnoredAny;
use thiserror::Error;

use crate::http::{blank_line_end as find_event_end, blank_line_end_and_lines};

/// Tokens charged for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, including Anthropic cache writes and reads.
    pub input_tokens: u64,
    pub output_tokens: u64,
}

mod flat;

use flat::FlatValue;

/// A usage object's counts, read by name: what [`read_usage`] needs beyond serde.
trait UsageCounts: Default + serde::de::DeserializeOwned {
    /// The count named `key` and a bit of its own (serde refuses an object naming a field
    /// twice, and so must the fast read); `None` for a member this type ignores.
    fn count(&mut self, key: &[u8]) -> Option<(&mut Option<u64>, u8)>;
}

/// The usage object at the start of `object` and the bytes it took: read in one pass when it is
/// plainly shaped ([`flat`]), else by serde_json, whose answer this always is.
fn read_usage<U: UsageCounts>(object: &[u8]) -> Option<(U, usize)> {
    if let Some(read) = read_usage_flat(object) {
        return Some(read);
    }
    let mut values = serde_json::Deserializer::from_slice(object).into_iter::<U>();
    let usage = values.next()?.ok()?;
    Some((usage, values.byte_offset()))
}

/// [`read_usage`]'s one pass; `None` leaves the object to serde.
fn read_usage_flat<U: UsageCounts>(object: &[u8]) -> Option<(U, usize)> {
    let mut usage = U::default();
    let mut seen = 0u8;
    let taken = flat::read_object(object, &mut |key, value| {
        let Some((count, bit)) = usage.count(key) else {
            return true;
        };
        if seen & bit != 0 {
            return false;
        }
        seen |= bit;
        match value {
            FlatValue::Count(value) => *count = Some(value),
            FlatValue::Null => *count = None,
            FlatValue::Skipped => return false,
        }
        true
    })?;
    Some((usage, taken))
}

#[derive(Deserialize, Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
}

impl UsageCounts for OpenAiUsage {
    fn count(&mut self, key: &[u8]) -> Option<(&mut Option<u64>, u8)> {
        match key {
            b"prompt_tokens" => Some((&mut self.prompt_tokens, 1)),
            b"completion_tokens" => Some((&mut self.completion_tokens, 2)),
            b"total_tokens" => Some((&mut self.total_tokens, 4)),
            _ => None,
        }
    }
}

impl OpenAiUsage {
    fn chat(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.completion_tokens.unwrap_or(0),
        }
    }
}

#[derive(Deserialize, Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl UsageCounts for AnthropicUsage {
    fn count(&mut self, key: &[u8]) -> Option<(&mut Option<u64>, u8)> {
        match key {
            b"input_tokens" => Some((&mut self.input_tokens, 1)),
            b"output_tokens" => Some((&mut self.output_tokens, 2)),
            b"cache_creation_input_tokens" => Some((&mut self.cache_creation_input_tokens, 4)),
            b"cache_read_input_tokens" => Some((&mut self.cache_read_input_tokens, 8)),
            _ => None,
        }
    }
}

impl AnthropicUsage {
    /// Input tokens including both cache kinds, or `None` when the object has no input count.
    fn input_with_cache(&self) -> Option<u64> {
        let input = self.input_tokens?;
        Some(
            input
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(self.cache_read_input_tokens.unwrap_or(0)),
        )
    }
}

/// `{"usage": ...}` with every other member skipped unbuilt.
#[derive(Deserialize)]
struct WithUsage<U> {
    usage: Option<U>,
}

/// The body's top-level `usage` object.
///
/// Fast path: engines put `usage` last, so find the last `"usage"` key and parse only the object
/// after it (measured at 3 % of router CPU for a full parse of a small chat response). A key
/// inside a string value is escaped (`\"usage\"`) and so never matches. When the fast path
/// finds nothing it can parse, the whole body is parsed as before.
fn usage_object<U: UsageCounts>(body: &[u8]) -> Option<U> {
    if let Some(at) = USAGE_FINDER_REV.rfind(body)
        && (at == 0 || body[at - 1] != b'\\')
    {
        let rest = body[at + USAGE_KEY.len()..].trim_ascii_start();
        if let Some(value) = rest.strip_prefix(b":").map(<[u8]>::trim_ascii_start)
            && value.first() == Some(&b'{')
            && let Some((usage, _)) = read_usage::<U>(value)
        {
            return Some(usage);
        }
    }
    let parsed: WithUsage<U> = serde_json::from_slice(body).ok()?;
    parsed.usage
}

/// Usage of a non-streamed OpenAI chat or completions response: `usage.prompt_tokens` and
/// `usage.completion_tokens`. `None` if the body is not JSON or carries no `usage` object.
pub fn from_openai_chat(body: &[u8]) -> Option<Usage> {
    Some(usage_object::<OpenAiUsage>(body)?.chat())
}

/// Usage of an embeddings or rerank response: input is `usage.prompt_tokens`, or
/// `usage.total_tokens` when the engine reports only that; output is 0.
pub fn from_openai_embeddings(body: &[u8]) -> Option<Usage> {
    let usage = usage_object::<OpenAiUsage>(body)?;
    Some(Usage {
        input_tokens: usage.prompt_tokens.or(usage.total_tokens)?,
        output_tokens: 0,
    })
}

/// Usage of a non-streamed Anthropic message: `usage.input_tokens` plus both cache counts, and
/// `usage.output_tokens`.
pub fn from_anthropic_message(body: &[u8]) -> Option<Usage> {
    let usage = usage_object::<AnthropicUsage>(body)?;
    Some(Usage {
        input_tokens: usage.input_with_cache().unwrap_or(0),
        output_tokens: usage.output_tokens.unwrap_or(0),
    })
}

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
    one_line: bool,
}

impl SseEvent {
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The event's data, as [`event_data`] reads it.
    fn data<'e>(&'e self, scratch: &'e mut Vec<u8>) -> Option<&'e [u8]> {
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
fn event_data<'e>(event: &'e [u8], scratch: &'e mut Vec<u8>) -> Option<&'e [u8]> {
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
    // time: every streamed event passes here, and that loop was 5 % of the router's CPU per
    // streamed request (perf/README.md, issue 14).
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

/// What one OpenAI-style stream event is, for forwarding and settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAiEvent {
    /// `data: [DONE]`.
    Done,
    /// A chunk with empty `choices` and a `usage` object: the chunk `include_usage` adds, which
    /// the router drops when the client did not ask for usage itself.
    UsageOnly(Usage),
    /// An ordinary chunk, with usage when the engine attaches it to content chunks. A chunk
    /// without a usage object is `Data(None)` unparsed, whether its JSON is valid or not.
    Data(Option<Usage>),
    /// Comments, keep-alives, events without data, unparseable chunks naming a usage object.
    Other,
}

#[derive(Deserialize)]
struct OpenAiChunk {
    /// `Vec` of a zero-sized type: counts elements without allocating.
    #[serde(default)]
    choices: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

/// Classifies OpenAI chat/completions stream events and remembers the latest usage.
#[derive(Debug)]
pub struct OpenAiStreamScan {
    usage: Option<Usage>,
    scratch: Vec<u8>,
}

impl Default for OpenAiStreamScan {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenAiStreamScan {
    pub fn new() -> Self {
        OpenAiStreamScan {
            usage: None,
            scratch: Vec::new(),
        }
    }

    /// Classify one complete event.
    pub fn scan(&mut self, event: &[u8]) -> OpenAiEvent {
        let data = event_data(event, &mut self.scratch);
        Self::classify(&mut self.usage, data)
    }

    /// [`scan`](Self::scan) an event from [`SseSplitter`], using what its scan already found.
    pub fn scan_event(&mut self, event: &SseEvent) -> OpenAiEvent {
        let data = event.data(&mut self.scratch);
        Self::classify(&mut self.usage, data)
    }

    fn classify(latest: &mut Option<Usage>, data: Option<&[u8]>) -> OpenAiEvent {
        let Some(data) = data else {
            return OpenAiEvent::Other;
        };
        if data.trim_ascii() == b"[DONE]" {
            return OpenAiEvent::Done;
        }
        // Only a chunk that carries a usage *object* is worth a JSON parse. With include_usage on,
        // engines following OpenAI put `"usage":null` in every other chunk, as the object's last
        // member: that settles it without a search.
        if ends_with_null_usage(data) {
            return OpenAiEvent::Data(None);
        }
        let Some(usage_at) = first_usage_object(data) else {
            return OpenAiEvent::Data(None);
        };
        if let Some((usage, choices)) = usage_chunk_fast(data, usage_at) {
            let usage = usage.chat();
            *latest = Some(usage);
            return match choices {
                Choices::NoneOrEmpty => OpenAiEvent::UsageOnly(usage),
                Choices::Some => OpenAiEvent::Data(Some(usage)),
            };
        }
        let Ok(chunk) = serde_json::from_slice::<OpenAiChunk>(data) else {
            return OpenAiEvent::Other;
        };
        let Some(usage) = chunk.usage.as_ref().map(OpenAiUsage::chat) else {
            return OpenAiEvent::Data(None);
        };
        *latest = Some(usage);
        if chunk.choices.is_none_or(|choices| choices.is_empty()) {
            OpenAiEvent::UsageOnly(usage)
        } else {
            OpenAiEvent::Data(Some(usage))
        }
    }

    /// The latest usage seen in the stream; engines report it cumulatively.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

/// Where the first `"usage"` key in `data` that is not followed by `: null` starts, or `None`
/// when every one is (or there is none): with `include_usage` on, engines following OpenAI put
/// `"usage":null` in every chunk but the last. Searches with `find` from each match on:
/// `find_iter` would copy the whole finder into its iterator, once per event.
fn first_usage_object(data: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = USAGE_FINDER.find(&data[from..]) {
        let key_at = from + at;
        from = key_at + USAGE_KEY.len();
        if !is_null_member(&data[from..]) {
            return Some(key_at);
        }
    }
    None
}

/// Whether the object in `data` ends with a `"usage": null` member (JSON whitespace allowed).
/// Then its top-level `usage` is null: in valid JSON that member, right before the closing
/// brace and after a `,` or the opening `{`, can only be a top-level member (a nested one would
/// be followed by another brace, one inside a string by a quote). A duplicate top-level `usage`
/// makes the chunk invalid for the full parse, which then also finds no usage in it.
fn ends_with_null_usage(data: &[u8]) -> bool {
    let member = data
        .trim_ascii_end()
        .strip_suffix(b"}")
        .and_then(|rest| rest.trim_ascii_end().strip_suffix(b"null"))
        .and_then(|rest| rest.trim_ascii_end().strip_suffix(b":"))
        .and_then(|rest| rest.trim_ascii_end().strip_suffix(USAGE_KEY));
    matches!(
        member.and_then(|rest| rest.trim_ascii_end().last()),
        Some(b',' | b'{')
    )
}

/// What a usage chunk's `choices` member holds, as far as classification cares.
enum Choices {
    /// Absent, `null` or `[]`: the usage-only chunk `include_usage` adds.
    NoneOrEmpty,
    Some,
}

/// The usage chunk read without a full parse (which costs about 4,400 instructions a stream):
/// only when `data` is plainly shaped, `None` otherwise (the caller then parses it all).
///
/// Plainly shaped means: the `"usage"` key at `key_at` is not inside a string (not escaped), its
/// value is an object and it is the last member of the top-level object (only `}` follows it,
/// as every engine serialises it), and `"choices"` occurs at most once, as a key. One
/// occurrence of a key that is also a member can only be that member, so the answer is the
/// full parse's.
fn usage_chunk_fast(data: &[u8], key_at: usize) -> Option<(OpenAiUsage, Choices)> {
    if key_at > 0 && data[key_at - 1] == b'\\' {
        return None;
    }
    let value = data[key_at + USAGE_KEY.len()..]
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    if value.first() != Some(&b'{') {
        return None;
    }
    let (usage, taken) = read_usage::<OpenAiUsage>(value)?;
    if value[taken..].trim_ascii() != b"}" {
        return None;
    }
    let choices = match CHOICES_FINDER.find(data) {
        None => Choices::NoneOrEmpty,
        Some(at) => {
            let after = at + CHOICES_KEY.len();
            if (at > 0 && data[at - 1] == b'\\') || CHOICES_FINDER.find(&data[after..]).is_some() {
                return None;
            }
            let member = data[after..]
                .trim_ascii_start()
                .strip_prefix(b":")?
                .trim_ascii_start();
            if member.starts_with(b"null") {
                Choices::NoneOrEmpty
            } else if let Some(array) = member.strip_prefix(b"[") {
                if array.trim_ascii_start().starts_with(b"]") {
                    Choices::NoneOrEmpty
                } else {
                    Choices::Some
                }
            } else {
                return None;
            }
        }
    };
    Some((usage, choices))
}

const USAGE_KEY: &[u8] = b"\"usage\"";
const CHOICES_KEY: &[u8] = b"\"choices\"";

/// Built once per process: a finder costs about 300 instructions to build, once per stream
/// when each scanner built its own.
static USAGE_FINDER: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(USAGE_KEY));
static USAGE_FINDER_REV: LazyLock<memmem::FinderRev<'static>> =
    LazyLock::new(|| memmem::FinderRev::new(USAGE_KEY));
static CHOICES_FINDER: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(CHOICES_KEY));

/// Whether `rest` (the bytes after a `"usage"` key) is `: null`, with JSON whitespace allowed.
fn is_null_member(rest: &[u8]) -> bool {
    let rest = rest.trim_ascii_start();
    match rest.strip_prefix(b":") {
        Some(value) => value.trim_ascii_start().starts_with(b"null"),
        None => false,
    }
}

#[derive(Deserialize)]
struct AnthropicStreamEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    message: Option<WithUsage<AnthropicUsage>>,
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

/// Accumulates usage over an Anthropic Messages stream.
///
/// `message_start` carries input tokens (plus cache counts) and an initial output count;
/// `message_delta` carries cumulative counts, so the latest wins. A delta that also reports input
/// tokens (newer API versions do) replaces the input count too.
#[derive(Debug)]
pub struct AnthropicStreamScan {
    usage: Option<Usage>,
    scratch: Vec<u8>,
}

impl Default for AnthropicStreamScan {
    fn default() -> Self {
        Self::new()
    }
}

impl AnthropicStreamScan {
    pub fn new() -> Self {
        AnthropicStreamScan {
            usage: None,
            scratch: Vec::new(),
        }
    }

    /// Fold one complete event into the running usage.
    pub fn scan(&mut self, event: &[u8]) {
        let data = event_data(event, &mut self.scratch);
        Self::fold(&mut self.usage, data);
    }

    /// [`scan`](Self::scan) an event from [`SseSplitter`], using what its scan already found.
    pub fn scan_event(&mut self, event: &SseEvent) {
        let data = event.data(&mut self.scratch);
        Self::fold(&mut self.usage, data);
    }

    fn fold(latest: &mut Option<Usage>, data: Option<&[u8]>) {
        let Some(data) = data else {
            return;
        };
        if USAGE_FINDER.find(data).is_none() {
            return;
        }
        let Ok(parsed) = serde_json::from_slice::<AnthropicStreamEvent>(data) else {
            return;
        };
        let usage_object = match parsed.kind.as_deref() {
            Some("message_start") => parsed.message.and_then(|message| message.usage),
            Some("message_delta") => parsed.usage,
            _ => None,
        };
        let Some(reported) = usage_object else {
            return;
        };
        let mut usage = latest.unwrap_or_default();
        if let Some(input_tokens) = reported.input_with_cache() {
            usage.input_tokens = input_tokens;
        }
        if let Some(output_tokens) = reported.output_tokens {
            usage.output_tokens = output_tokens;
        }
        *latest = Some(usage);
    }

    /// Usage so far; `None` until a `message_start` or `message_delta` with usage was seen.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

#[cfg(test)]
mod tests {
    //! Proves usage is read exactly from realistic bodies and streams, whatever the chunking.
    use super::*;

    #[test]
    fn whole_body_openai_chat() {
        let body = br#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"usage"}}],
            "usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(
            from_openai_chat(body),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 34
            })
        );
        assert_eq!(from_openai_chat(br#"{"choices":[]}"#), None);
        assert_eq!(from_openai_chat(br#"{"usage":null}"#), None);
        assert_eq!(from_openai_chat(b"not json"), None);
        assert_eq!(
            from_openai_chat(br#"{"usage":{"prompt_tokens":3}}"#),
            Some(Usage {
                input_tokens: 3,
                output_tokens: 0
            })
        );
    }

    #[test]
    fn whole_body_embeddings_and_rerank() {
        let embeddings = br#"{"object":"list","data":[{"embedding":[0.1,-0.2]}],"usage":{"prompt_tokens":8,"total_tokens":8}}"#;
        assert_eq!(
            from_openai_embeddings(embeddings),
            Some(Usage {
                input_tokens: 8,
                output_tokens: 0
            })
        );
        let rerank =
            br#"{"results":[{"index":0,"relevance_score":0.9}],"usage":{"total_tokens":21}}"#;
        assert_eq!(
            from_openai_embeddings(rerank),
            Some(Usage {
                input_tokens: 21,
                output_tokens: 0
            })
        );
        assert_eq!(from_openai_embeddings(br#"{"usage":{}}"#), None);
    }

    #[test]
    fn whole_body_anthropic_counts_cache_as_input() {
        let body = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],
            "usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":7}}"#;
        assert_eq!(
            from_anthropic_message(body),
            Some(Usage {
                input_tokens: 1110,
                output_tokens: 7
            })
        );
        assert_eq!(
            from_anthropic_message(
                br#"{"usage":{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":null}}"#
            ),
            Some(Usage {
                input_tokens: 5,
                output_tokens: 2
            })
        );
    }

    fn openai_stream(crlf: bool) -> Vec<u8> {
        let newline = if crlf { "\r\n" } else { "\n" };
        let mut events = vec![
            r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}"#.to_owned(),
            ": keep-alive".to_owned(),
        ];
        for word in ["Hello", " wor", "ld", "\\n\\n", "\\\"usage\\\""] {
            events.push(format!(
                r#"data: {{"id":"c1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"{word}"}}}}]}}"#
            ));
        }
        events.push(
            r#"data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
                .to_owned(),
        );
        events.push(r#"data: {"id":"c1","choices":[],"usage":{"prompt_tokens":17,"completion_tokens":6,"total_tokens":23}}"#.to_owned());
        events.push("data: [DONE]".to_owned());
        let mut stream = Vec::new();
        for event in events {
            stream.extend_from_slice(event.as_bytes());
            stream.extend_from_slice(newline.as_bytes());
            stream.extend_from_slice(newline.as_bytes());
        }
        stream
    }

    /// Split `stream` at `cuts`, returning events and the final tail.
    fn split_at(stream: &[u8], cuts: &[usize]) -> (Vec<SseEvent>, Bytes) {
        let mut splitter = SseSplitter::new(1 << 20);
        let mut events = Vec::new();
        let mut previous = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
            let cut = cut.clamp(previous, stream.len());
            splitter.push(Bytes::copy_from_slice(&stream[previous..cut]));
            previous = cut;
            while let Some(event) = splitter.next_event().unwrap() {
                events.push(event);
            }
        }
        (events, splitter.take_tail())
    }

    /// Classifies with what the splitter found and, alongside, from the bytes alone: both must
    /// agree on every event.
    fn classify(events: &[SseEvent]) -> (Vec<OpenAiEvent>, Option<Usage>) {
        let mut scan = OpenAiStreamScan::new();
        let mut from_bytes = OpenAiStreamScan::new();
        let kinds = events
            .iter()
            .map(|event| {
                let kind = scan.scan_event(event);
                assert_eq!(from_bytes.scan(event), kind, "{event:?}");
                kind
            })
            .collect();
        assert_eq!(from_bytes.usage(), scan.usage());
        (kinds, scan.usage())
    }

    #[test]
    fn openai_stream_at_every_split_point() {
        for crlf in [false, true] {
            let stream = openai_stream(crlf);
            let (whole, tail) = split_at(&stream, &[]);
            assert!(tail.is_empty());
            assert_eq!(whole.len(), 10);
            let (kinds, usage) = classify(&whole);
            let usage_expected = Usage {
                input_tokens: 17,
                output_tokens: 6,
            };
            assert_eq!(kinds[0], OpenAiEvent::Data(None));
            assert_eq!(kinds[1], OpenAiEvent::Other);
            assert_eq!(
                kinds[6],
                OpenAiEvent::Data(None),
                "escaped \"usage\" in content"
            );
            assert_eq!(kinds[8], OpenAiEvent::UsageOnly(usage_expected));
            assert_eq!(kinds[9], OpenAiEvent::Done);
            assert_eq!(usage, Some(usage_expected));
            // One cut anywhere, and two cuts close together around CR/LF seams.
            for cut in 0..=stream.len() {
                for gap in [0, 1, 2, 3] {
                    let (events, tail) = split_at(&stream, &[cut, cut + gap]);
                    assert_eq!(events, whole, "cut {cut} gap {gap} crlf {crlf}");
                    assert!(tail.is_empty());
                }
            }
            // Byte at a time.
            let cuts: Vec<usize> = (0..stream.len()).collect();
            assert_eq!(split_at(&stream, &cuts).0, whole);
        }
    }

    #[test]
    fn events_inside_a_chunk_are_not_copied() {
        let chunk = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: c");
        let mut splitter = SseSplitter::new(1024);
        splitter.push(chunk.clone());
        let first = splitter.next_event().unwrap().unwrap();
        let second = splitter.next_event().unwrap().unwrap();
        assert_eq!(first.as_ptr(), chunk.as_ptr());
        assert_eq!(&second[..], b"data: b\n\n");
        assert_eq!(second.as_ptr(), chunk[9..].as_ptr());
        assert_eq!(splitter.next_event().unwrap(), None);
        splitter.push(Bytes::from_static(b"\n\ndata: d\n\n"));
        assert_eq!(&splitter.next_event().unwrap().unwrap()[..], b"data: c\n\n");
        assert_eq!(&splitter.next_event().unwrap().unwrap()[..], b"data: d\n\n");
        assert_eq!(splitter.next_event().unwrap(), None);
    }

    /// The splitter says an event is one line only when it is, in every mode (fresh chunk,
    /// merged tail, straddling), and then the data read from the hint is the data read from the
    /// bytes.
    #[test]
    fn one_line_hint_is_only_given_to_one_line_events() {
        let stream: &[u8] =
            b"data: a\n\nevent: e\ndata: b\n\ndata: c\r\n\r\n: note\n\ndata: d\ndata: e\n\r\n";
        for cut in 0..=stream.len() {
            let (events, tail) = split_at(stream, &[cut]);
            assert!(tail.is_empty());
            assert_eq!(events.len(), 5);
            for event in &events {
                let lines = memchr::memchr_iter(b'\n', event).count();
                assert!(!event.one_line || lines == 2, "cut {cut}: {event:?}");
                let (mut hinted, mut plain) = (Vec::new(), Vec::new());
                assert_eq!(
                    event.data(&mut hinted),
                    event_data(event, &mut plain),
                    "cut {cut}: {event:?}"
                );
            }
            let (first, third) = (&events[0], &events[2]);
            if cut == 0 || cut >= 9 {
                assert!(first.one_line, "cut {cut}");
            }
            if cut <= 27 || cut >= 38 {
                assert!(third.one_line, "cut {cut}");
            }
        }
        // Two chunks pushed before draining: the merged tail gives the hint too.
        let mut splitter = SseSplitter::new(1024);
        splitter.push(Bytes::from_static(b"data: a\n\ndata:"));
        splitter.push(Bytes::from_static(b" b\n\n"));
        let merged = splitter.next_event().unwrap().unwrap();
        assert!(merged.one_line);
        assert_eq!(merged.data(&mut Vec::new()), Some(&b"a"[..]));
    }

    #[test]
    fn push_without_draining_keeps_order() {
        let mut splitter = SseSplitter::new(1024);
        splitter.push(Bytes::from_static(b"data: a\n\ndata: b"));
        splitter.push(Bytes::from_static(b"\n\ndata: c\n\n"));
        let mut events = Vec::new();
        while let Some(event) = splitter.next_event().unwrap() {
            events.push(event.into_bytes());
        }
        assert_eq!(events, ["data: a\n\n", "data: b\n\n", "data: c\n\n"]);
    }

    #[test]
    fn oversized_events_are_refused() {
        let mut splitter = SseSplitter::new(16);
        splitter.push(Bytes::from_static(b"data: 0123456789"));
        assert_eq!(splitter.next_event(), Ok(None));
        splitter.push(Bytes::from_static(b"abcdef"));
        assert_eq!(splitter.next_event(), Err(SseError::EventTooLarge));
    }

    #[test]
    fn event_data_reads_every_line_form() {
        let mut scratch = Vec::new();
        let cases: [(&[u8], Option<&[u8]>); 7] = [
            (b"data: {\"a\":1}\n\n", Some(b"{\"a\":1}")),
            (b"data:x", Some(b"x")),
            (
                b"event: e\r\ndata: one\r\ndata: two\r\n\r\n",
                Some(b"one\ntwo"),
            ),
            (b"id: 1\ndata: [DONE]\n", Some(b"[DONE]")),
            (b": comment\n\n", None),
            (b"", None),
            (b"data:\n\n", Some(b"")),
        ];
        for (event, data) in cases {
            assert_eq!(
                event_data(event, &mut scratch),
                data,
                "{:?}",
                String::from_utf8_lossy(event)
            );
        }
    }

    #[test]
    fn usage_on_content_chunks_and_multi_line_data() {
        let mut scan = OpenAiStreamScan::new();
        let event = br#"data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}

"#;
        assert_eq!(
            scan.scan(event),
            OpenAiEvent::Data(Some(Usage {
                input_tokens: 1,
                output_tokens: 1
            }))
        );
        let split_data = b"event: chunk\ndata: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n";
        assert_eq!(
            scan.scan(split_data),
            OpenAiEvent::UsageOnly(Usage {
                input_tokens: 4,
                output_tokens: 2
            })
        );
        assert_eq!(
            scan.usage(),
            Some(Usage {
                input_tokens: 4,
                output_tokens: 2
            })
        );
        assert_eq!(
            scan.scan(b"data: {\"usage\": broken\n\n"),
            OpenAiEvent::Other
        );
        assert_eq!(scan.scan(b"event: ping\n\n"), OpenAiEvent::Other);
        assert_eq!(scan.scan(b"data:[DONE]\r\n\r\n"), OpenAiEvent::Done);
    }

    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":3,"cache_read_input_tokens":100,"output_tokens":1}}}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        "event: ping\n",
        r#"data: {"type": "ping"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the \"usage\" is"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":0}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{},"usage":{"output_tokens":15}}"#,
        "\n\n",
        "event: message_stop\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n",
    );

    #[test]
    fn anthropic_stream_at_every_split_point() {
        let stream = ANTHROPIC_STREAM.as_bytes();
        let expected = Usage {
            input_tokens: 128,
            output_tokens: 15,
        };
        for cut in 0..=stream.len() {
            let (events, tail) = split_at(stream, &[cut, cut + 1]);
            assert_eq!(events.len(), 8, "cut {cut}");
            assert!(tail.is_empty());
            let mut scan = AnthropicStreamScan::new();
            for event in &events {
                scan.scan(event);
            }
            assert_eq!(scan.usage(), Some(expected), "cut {cut}");
        }
    }

    #[test]
    fn anthropic_delta_with_input_replaces_input() {
        let mut scan = AnthropicStreamScan::new();
        assert_eq!(scan.usage(), None);
        scan.scan(br#"data: {"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}"#);
        scan.scan(br#"data: {"type":"message_delta","usage":{"input_tokens":6,"cache_read_input_tokens":4,"output_tokens":3}}"#);
        assert_eq!(
            scan.usage(),
            Some(Usage {
                input_tokens: 10,
                output_tokens: 3
            })
        );
    }

    #[test]
    fn unterminated_tail_is_returned() {
        let (events, tail) = split_at(b"data: a\n\ndata: partial", &[3]);
        assert_eq!(events.len(), 1);
        assert_eq!(&events[0][..], b"data: a\n\n");
        assert_eq!(&tail[..], b"data: partial");
    }
}

#[cfg(test)]
mod null_usage_tests {
    use super::*;

    #[test]
    fn null_usage_members_are_not_parsed_as_usage() {
        let mut scan = OpenAiStreamScan::new();
        let chunk = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\" : null}\n\n";
        assert_eq!(scan.scan(chunk), OpenAiEvent::Data(None));
        let last = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\n";
        assert!(matches!(scan.scan(last), OpenAiEvent::UsageOnly(_)));
        assert_eq!(scan.usage().unwrap().output_tokens, 4);
        assert!(is_null_member(b":null}"));
        assert!(!is_null_member(b":{\"prompt_tokens\":1}"));
        assert!(!is_null_member(b"}"));
    }

    #[test]
    fn a_trailing_null_usage_member_is_read_from_the_end() {
        for data in [
            &br#"{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}"#[..],
            br#"{"choices": [], "usage" : null }"#,
            br#"{"usage":null}"#,
        ] {
            assert!(
                ends_with_null_usage(data),
                "{}",
                String::from_utf8_lossy(data)
            );
            assert_eq!(classified_by_parse(data), OpenAiEvent::Data(None));
        }
        for data in [
            // Nested, not the top-level member.
            &br#"{"choices":[],"x":{"usage":null}}"#[..],
            // A key that ends in an escaped quote and `usage`: not `usage`.
            br#"{"usage":{"prompt_tokens":1},"k"usage":null}"#,
            br#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            br#"{"choices":[],"usage":null"#,
            br#"usage":null}"#,
        ] {
            assert!(
                !ends_with_null_usage(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        // Usage named twice at the top level: the full parse refuses the chunk (no usage either
        // way), and the trailing null settles it as an ordinary chunk; both are forwarded.
        let twice = br#"{"usage":{"prompt_tokens":5},"choices":[],"usage":null}"#;
        assert_eq!(classified_by_parse(twice), OpenAiEvent::Other);
        let mut scan = OpenAiStreamScan::new();
        let event = [&b"data: "[..], twice, b"\n\n"].concat();
        assert_eq!(scan.scan(&event), OpenAiEvent::Data(None));
        assert_eq!(scan.usage(), None);
    }

    /// What the full parse makes of one chunk's data: the reference the fast path must match.
    fn classified_by_parse(data: &[u8]) -> OpenAiEvent {
        let Ok(chunk) = serde_json::from_slice::<OpenAiChunk>(data) else {
            return OpenAiEvent::Other;
        };
        match chunk.usage.as_ref().map(OpenAiUsage::chat) {
            None => OpenAiEvent::Data(None),
            Some(usage) if chunk.choices.is_none_or(|choices| choices.is_empty()) => {
                OpenAiEvent::UsageOnly(usage)
            }
            Some(usage) => OpenAiEvent::Data(Some(usage)),
        }
    }

    #[test]
    fn usage_chunks_read_without_a_full_parse_match_the_full_parse() {
        const USAGE: &str = r#"{"prompt_tokens":5,"completion_tokens":18,"total_tokens":23}"#;
        // (data, whether the fast path must take it)
        let cases = [
            (
                format!(r#"{{"id":"c","choices":[],"usage":{USAGE}}}"#),
                true,
            ),
            (
                format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"content":"x"}}}}],"usage":{USAGE}}}"#
                ),
                true,
            ),
            (format!(r#"{{"id":"c","usage":{USAGE}}}"#), true),
            (format!(r#"{{"choices":null,"usage":{USAGE}}}"#), true),
            (format!(r#"{{"choices" : [ ] , "usage" : {USAGE} }}"#), true),
            (
                format!(r#"{{"choices":[ {{"index":0}} ],"usage":{USAGE}}}"#),
                true,
            ),
            // Not plainly shaped: the full parse decides.
            (format!(r#"{{"usage":{USAGE},"choices":[]}}"#), false),
            (
                format!(r#"{{"choices":[{{"delta":{{"content":"choices"}}}}],"usage":{USAGE}}}"#),
                false,
            ),
            (
                format!(r#"{{"choices":[{{"delta":{{"usage":{USAGE}}}}}],"usage":null}}"#),
                false,
            ),
            (
                format!(r#"{{"choices":[{{"delta":{{"usage":{USAGE}}}}}]}}"#),
                false,
            ),
            (format!(r#"{{"choices":"none","usage":{USAGE}}}"#), false),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":"five"}}"#.to_owned(),
                false,
            ),
            (r#"{"choices":[],"usage":[1]}"#.to_owned(), false),
            // Escaped keys inside a string are not keys.
            (
                format!(
                    r#"{{"choices":[{{"delta":{{"content":"\"choices\":[]"}}}}],"usage":{USAGE}}}"#
                ),
                true,
            ),
        ];
        for (data, fast) in &cases {
            let data = data.as_bytes();
            let taken = first_usage_object(data).and_then(|at| usage_chunk_fast(data, at));
            assert_eq!(taken.is_some(), *fast, "{}", String::from_utf8_lossy(data));
            let event = format!("data: {}\n\n", String::from_utf8_lossy(data));
            assert_eq!(
                OpenAiStreamScan::new().scan(event.as_bytes()),
                classified_by_parse(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }

    /// Every line form `event_data` reads, against a plain reference of WHATWG's rule: the fast
    /// path for one-line events must not change what any event's data is.
    #[test]
    fn event_data_matches_the_line_by_line_rule() {
        fn reference(event: &[u8]) -> Option<Vec<u8>> {
            let mut lines = Vec::new();
            for line in event.split(|&byte| byte == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(value) = line.strip_prefix(b"data:") {
                    lines.push(value.strip_prefix(b" ").unwrap_or(value).to_vec());
                }
            }
            (!lines.is_empty()).then(|| lines.join(&b'\n'))
        }
        let events: [&[u8]; 14] = [
            b"data: x\n\n",
            b"data:x\n\n",
            b"data:  x\n\n",
            b"data: x\r\n\r\n",
            b"data: x\n\r\n",
            b"data: x\r\n",
            b"data: x\n",
            b"data: x",
            b"data:\n\n",
            b"data: a\ndata: b\n\n",
            b"data: a\n: comment\n\n",
            b"event: e\ndata: a\n\n",
            b": only a comment\n\n",
            b"data: a\r\ndata: b\r\n\r\n",
        ];
        for event in events {
            let mut scratch = Vec::new();
            assert_eq!(
                event_data(event, &mut scratch).map(<[u8]>::to_vec),
                reference(event),
                "{}",
                String::from_utf8_lossy(event)
            );
        }
    }
}

#[cfg(test)]
mod usage_object_tests {
    use super::*;

    /// serde_json's reading of a usage object and the bytes it took: the reference.
    fn by_serde<U: UsageCounts>(object: &[u8]) -> Option<(U, usize)> {
        let mut values = serde_json::Deserializer::from_slice(object).into_iter::<U>();
        let usage = values.next()?.ok()?;
        Some((usage, values.byte_offset()))
    }

    #[test]
    fn usage_objects_read_in_one_pass_are_read_as_serde_reads_them() {
        // (object, whether the one-pass read must take it rather than leave it to serde)
        let cases: [(&[u8], bool); 16] = [
            (br#"{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}"#, true),
            (br#"{ "prompt_tokens" : 5 , "total_tokens" : 21 }"#, true),
            (br#"{"prompt_tokens":5,"completion_tokens":null}"#, true),
            (br#"{}"#, true),
            (br#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens":2}"#, true),
            (br#"{"input_tokens":3,"service_tier":"standard","output_tokens":4}"#, true),
            (br#"{"prompt_tokens":5}}"#, true),
            // Left to serde, which accepts or refuses each as it always did.
            (br#"{"prompt_tokens":5,"prompt_tokens":6}"#, false),
            (br#"{"prompt_tokens":5.0}"#, false),
            (br#"{"prompt_tokens":-1}"#, false),
            (br#"{"prompt_tokens":"5"}"#, false),
            (br#"{"prompt_tokens":99999999999999999999}"#, false),
            (br#"{"prompt_tokens":5,"extra":[1,2]}"#, false),
            (br#"{"prompt_tokens":5,"extra":true}"#, false),
            (br#"{"prompt\u005ftokens":5}"#, false),
            (br#"{"prompt_tokens":5"#, false),
        ];
        for (object, plain) in cases {
            let text = String::from_utf8_lossy(object);
            let flat = read_usage_flat::<OpenAiUsage>(object).is_some();
            assert_eq!(flat, plain, "{text}");
            assert_eq!(
                read_usage::<OpenAiUsage>(object),
                by_serde::<OpenAiUsage>(object),
                "{text}"
            );
            assert_eq!(
                read_usage::<AnthropicUsage>(object),
                by_serde::<AnthropicUsage>(object),
                "{text}"
            );
        }
    }

    #[test]
    fn fast_path_ignores_usage_inside_strings_and_falls_back() {
        let body = br#"{"choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\":99}"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        let usage = from_openai_chat(body).unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (3, 4));
        // Usage not last, and a trailing member after it.
        let body = br#"{"usage":{"prompt_tokens":5,"completion_tokens":6},"id":"x"}"#;
        let usage = from_openai_chat(body).unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (5, 6));
        // The last "usage" is a string value: the full parse still finds the object.
        let body = br#"{"usage":{"prompt_tokens":1,"completion_tokens":2},"note":"usage"}"#;
        assert_eq!(from_openai_chat(body).unwrap().output_tokens, 2);
        assert_eq!(from_openai_chat(br#"{"usage":null}"#), None);
        assert_eq!(from_openai_chat(b"not json"), None);
    }
}
