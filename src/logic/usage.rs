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
//! when plainly shaped (`flat`). About 440 instructions an event in all
//! (`perf/notes/2026-12-02-streamed-events-and-the-agents-request-task.md`).

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// Tokens charged for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, including Anthropic cache writes and reads.
    pub input_tokens: u64,
    pub output_tokens: u64,
}

mod flat;
mod sse;
#[cfg(test)]
mod tests;

use sse::event_data;
pub use sse::{SseError, SseEvent, SseSplitter};

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
/// finds nothing it can parse, the whole body is parsed.
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
