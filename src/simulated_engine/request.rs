//! Request bodies the simulator reads, and what it derives from them: how many prompt tokens a
//! request carries, the prefix-cache blocks those tokens make, and how many tokens the simulated
//! model will produce.
//!
//! Pure: no runtime, no clock, no I/O. Only the fields the simulator acts on are parsed; every other
//! field is skipped, so real client payloads (tools, temperature, metadata...) are accepted as-is.
//! Strings are borrowed from the request body where JSON escaping allows it.

use std::borrow::Cow;

use serde::Deserialize;

use crate::simulated_engine::prefix_cache::{BlockHasher, BlockKey};

/// Characters-per-token ratio of the prompt estimate: the common "about four bytes of English per
/// token" rule of thumb, good enough for a simulator whose numbers only need to be deterministic.
const PROMPT_BYTES_PER_TOKEN: u64 = 4;
/// Fixed per-message overhead of the estimate, standing in for the role and separator tokens a chat
/// template adds around each message.
const PROMPT_TOKENS_PER_MESSAGE: u64 = 4;

/// `POST /v1/chat/completions` (OpenAI).
#[derive(Debug, Deserialize)]
pub struct ChatRequest<'a> {
    #[serde(borrow)]
    pub model: Cow<'a, str>,
    #[serde(borrow)]
    pub messages: Vec<Message<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic). `max_tokens` is optional
/// here so that its absence becomes a typed Anthropic error instead of a parse failure.
#[derive(Debug, Deserialize)]
pub struct MessagesRequest<'a> {
    #[serde(borrow)]
    pub model: Cow<'a, str>,
    #[serde(borrow)]
    pub messages: Vec<Message<'a>>,
    #[serde(default, borrow)]
    pub system: Option<Content<'a>>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
}

/// One chat message; only its content matters to the simulator (the role is skipped).
#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    #[serde(default, borrow)]
    pub content: Option<Content<'a>>,
}

/// Message content in both APIs: a plain string or a list of typed blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Blocks(#[serde(borrow)] Vec<ContentBlock<'a>>),
}

/// A content block; only `{"type":"text","text":...}` blocks count towards the prompt.
#[derive(Debug, Deserialize)]
pub struct ContentBlock<'a> {
    #[serde(rename = "type", default, borrow)]
    pub kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub text: Option<Cow<'a, str>>,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest<'a> {
    #[serde(borrow)]
    pub model: Cow<'a, str>,
    #[serde(borrow)]
    pub input: EmbeddingInput<'a>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput<'a> {
    One(#[serde(borrow)] Cow<'a, str>),
    Many(#[serde(borrow)] Vec<Cow<'a, str>>),
}

impl<'a> EmbeddingInput<'a> {
    pub fn texts(&self) -> Vec<&str> {
        match self {
            EmbeddingInput::One(text) => vec![text.as_ref()],
            EmbeddingInput::Many(texts) => texts.iter().map(|text| text.as_ref()).collect(),
        }
    }
}

/// `POST /v1/rerank` (the Cohere/Jina shape vLLM serves).
#[derive(Debug, Deserialize)]
pub struct RerankRequest<'a> {
    #[serde(borrow)]
    pub model: Cow<'a, str>,
    #[serde(borrow)]
    pub query: Cow<'a, str>,
    #[serde(borrow)]
    pub documents: Vec<RerankDocument<'a>>,
    #[serde(default)]
    pub top_n: Option<usize>,
}

/// A document to rerank: a string, or an object with a `text` field.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RerankDocument<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Object {
        #[serde(borrow)]
        text: Cow<'a, str>,
    },
}

impl RerankDocument<'_> {
    pub fn text(&self) -> &str {
        match self {
            RerankDocument::Text(text) => text,
            RerankDocument::Object { text } => text,
        }
    }
}

impl Content<'_> {
    /// The pieces of text this content carries, in order: the string, or the text of each text
    /// block (images and tool blocks carry none).
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        let (text, blocks) = match self {
            Content::Text(text) => (Some(text.as_ref()), &[][..]),
            Content::Blocks(blocks) => (None, &blocks[..]),
        };
        text.into_iter().chain(
            blocks
                .iter()
                .filter(|block| block.kind.as_deref().is_none_or(|kind| kind == "text"))
                .filter_map(|block| block.text.as_deref()),
        )
    }

    /// Bytes of text this content carries (text blocks only; images and tool blocks count zero).
    pub fn text_bytes(&self) -> u64 {
        self.texts().map(|text| text.len() as u64).sum()
    }
}

/// Tokens for `text_bytes` bytes of text: `ceil(bytes / 4)`.
pub fn tokens_for_bytes(text_bytes: u64) -> u64 {
    text_bytes.div_ceil(PROMPT_BYTES_PER_TOKEN)
}

/// Prompt tokens of a chat: `ceil(total text bytes / 4) + 4 per message`. An Anthropic `system`
/// prompt counts as one more message, so an OpenAI request and its Anthropic translation (system
/// message moved to `system`) get the same estimate.
pub fn prompt_tokens(messages: &[Message<'_>], system: Option<&Content<'_>>) -> u64 {
    let mut text_bytes = 0;
    let mut message_count = messages.len() as u64;
    for message in messages {
        text_bytes += message.content.as_ref().map_or(0, Content::text_bytes);
    }
    if let Some(system) = system {
        text_bytes += system.text_bytes();
        message_count += 1;
    }
    tokens_for_bytes(text_bytes) + PROMPT_TOKENS_PER_MESSAGE * message_count
}

/// Stands in, in the prompt's cache stream, for the chat template's tokens around one message:
/// [`PROMPT_TOKENS_PER_MESSAGE`] tokens of [`PROMPT_BYTES_PER_TOKEN`] bytes each. 0xFF never occurs
/// in UTF-8, so no message text can imitate a message boundary.
const MESSAGE_MARKER: [u8; (PROMPT_TOKENS_PER_MESSAGE * PROMPT_BYTES_PER_TOKEN) as usize] =
    [0xFF; (PROMPT_TOKENS_PER_MESSAGE * PROMPT_BYTES_PER_TOKEN) as usize];

/// The keys of a chat prompt's full prefix-cache blocks of `block_tokens` tokens each.
///
/// The simulator has no tokenizer: [`prompt_tokens`] estimates tokens from bytes. The blocks are
/// cut from a byte stream that the same estimate counts exactly: for each message (an Anthropic
/// `system` prompt first, where a chat template puts it) a [`MESSAGE_MARKER`] for the template's
/// tokens, then the message's text. The stream is `16 × messages + text bytes` long, so
/// `ceil(stream bytes / 4)` is [`prompt_tokens`], and a block of `block_tokens` tokens is
/// `block_tokens × 4` bytes of it. An OpenAI request and its Anthropic translation make the same
/// stream. Message roles are not part of it: the simulator does not read them.
pub fn prompt_block_keys(
    messages: &[Message<'_>],
    system: Option<&Content<'_>>,
    block_tokens: u64,
) -> Vec<BlockKey> {
    let mut hasher = BlockHasher::new(block_tokens.saturating_mul(PROMPT_BYTES_PER_TOKEN));
    let contents = system
        .map(Some)
        .into_iter()
        .chain(messages.iter().map(|message| message.content.as_ref()));
    for content in contents {
        hasher.write(&MESSAGE_MARKER);
        for text in content.into_iter().flat_map(Content::texts) {
            hasher.write(text.as_bytes());
        }
    }
    hasher.finish()
}

/// Prompt tokens of embedding or rerank inputs: `ceil(total bytes / 4)`, no per-item overhead.
pub fn input_tokens<'t>(texts: impl IntoIterator<Item = &'t str>) -> u64 {
    tokens_for_bytes(texts.into_iter().map(|text| text.len() as u64).sum())
}

/// Why the simulated model stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model reached its natural length (`--output-tokens`): OpenAI `stop`, Anthropic
    /// `end_turn`.
    Natural,
    /// The request's token limit cut the output short: OpenAI `length`, Anthropic `max_tokens`.
    TokenLimit,
}

/// How long the simulated answer is and why it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputPlan {
    pub output_tokens: u64,
    pub stop_reason: StopReason,
}

/// Output length: every simulated answer is naturally `natural_tokens` long (`--output-tokens`);
/// a declared limit shorter than that cuts it and the stop reason says so.
pub fn plan_output(declared_max_tokens: Option<u64>, natural_tokens: u64) -> OutputPlan {
    match declared_max_tokens {
        Some(declared) if declared < natural_tokens => OutputPlan {
            output_tokens: declared,
            stop_reason: StopReason::TokenLimit,
        },
        _ => OutputPlan {
            output_tokens: natural_tokens,
            stop_reason: StopReason::Natural,
        },
    }
}

impl ChatRequest<'_> {
    /// `max_completion_tokens` (the current OpenAI name) wins over the legacy `max_tokens`.
    pub fn declared_max_tokens(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|options| options.include_usage)
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prompt_counts_bytes_and_messages() {
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"12345678"},
            {"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"x"}}]}
        ]}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        // 8 + 3 = 11 bytes -> 3 tokens, plus 4 per message.
        assert_eq!(prompt_tokens(&request.messages, None), 3 + 8);
    }

    #[test]
    fn anthropic_system_counts_as_a_message() {
        let body = br#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"12345678"}],
            "messages":[{"role":"user","content":"abc"}]}"#;
        let request: MessagesRequest = serde_json::from_slice(body).unwrap();
        assert_eq!(
            prompt_tokens(&request.messages, request.system.as_ref()),
            3 + 8
        );
    }

    #[test]
    fn empty_and_missing_content_count_only_overhead() {
        let body = br#"{"model":"m","messages":[{"role":"assistant","content":null},{"role":"user","content":""}]}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        assert_eq!(prompt_tokens(&request.messages, None), 8);
        assert_eq!(prompt_tokens(&[], None), 0);
    }

    #[test]
    fn escaped_strings_count_decoded_bytes() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"a\"b\n"}]}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        assert_eq!(prompt_tokens(&request.messages, None), 1 + 4);
    }

    #[test]
    fn cache_stream_is_as_long_as_the_prompt_token_count() {
        // With one-token blocks, every whole token of the stream is a block: a prompt whose text
        // is a multiple of 4 bytes has as many blocks as prompt tokens, one tail token less
        // otherwise.
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"12345678"},
            {"role":"user","content":[{"type":"text","text":"abcd"},{"type":"image_url","image_url":{"url":"x"}}]}
        ]}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        let tokens = prompt_tokens(&request.messages, None);
        assert_eq!(
            prompt_block_keys(&request.messages, None, 1).len() as u64,
            tokens
        );
        let body = br#"{"model":"m","messages":[{"role":"user","content":"abcde"}]}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        let tokens = prompt_tokens(&request.messages, None);
        assert_eq!(
            prompt_block_keys(&request.messages, None, 1).len() as u64,
            tokens - 1
        );
        // A block of 4 tokens is 16 bytes: the 21-byte stream makes one whole block.
        assert_eq!(prompt_block_keys(&request.messages, None, 4).len(), 1);
    }

    #[test]
    fn anthropic_translation_makes_the_same_blocks() {
        let openai = br#"{"model":"m","messages":[
            {"role":"system","content":"be brief, be brief"},
            {"role":"user","content":"hello there, how are you"}
        ]}"#;
        let anthropic = br#"{"model":"m","max_tokens":5,"system":"be brief, be brief",
            "messages":[{"role":"user","content":[{"type":"text","text":"hello there, how are you"}]}]}"#;
        let openai: ChatRequest = serde_json::from_slice(openai).unwrap();
        let anthropic: MessagesRequest = serde_json::from_slice(anthropic).unwrap();
        // 16 + 18 + 16 + 24 = 74 stream bytes: nine whole blocks of 2 tokens (8 bytes).
        let openai_keys = prompt_block_keys(&openai.messages, None, 2);
        assert_eq!(openai_keys.len(), 9);
        assert_eq!(
            prompt_block_keys(&anthropic.messages, anthropic.system.as_ref(), 2),
            openai_keys
        );
    }

    #[test]
    fn message_boundaries_change_the_blocks() {
        let split_early = br#"{"model":"m","messages":[{"content":"ab"},{"content":"cdef"}]}"#;
        let split_late = br#"{"model":"m","messages":[{"content":"abcd"},{"content":"ef"}]}"#;
        let split_early: ChatRequest = serde_json::from_slice(split_early).unwrap();
        let split_late: ChatRequest = serde_json::from_slice(split_late).unwrap();
        let early = prompt_block_keys(&split_early.messages, None, 1);
        let late = prompt_block_keys(&split_late.messages, None, 1);
        assert_eq!(early.len(), late.len());
        // The first message's marker is shared; the blocks after it differ.
        assert_eq!(early[..4], late[..4]);
        assert_ne!(early[4], late[4]);
    }

    #[test]
    fn token_rounding_is_ceiling() {
        assert_eq!(tokens_for_bytes(0), 0);
        assert_eq!(tokens_for_bytes(1), 1);
        assert_eq!(tokens_for_bytes(4), 1);
        assert_eq!(tokens_for_bytes(5), 2);
        assert_eq!(input_tokens(["abcd", "e"]), 2);
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let body = br#"{"model":"m","messages":[],"max_tokens":9,"max_completion_tokens":3}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        assert_eq!(request.declared_max_tokens(), Some(3));
    }

    #[test]
    fn output_plan_boundaries() {
        assert_eq!(
            plan_output(None, 16),
            OutputPlan {
                output_tokens: 16,
                stop_reason: StopReason::Natural
            }
        );
        assert_eq!(
            plan_output(Some(3), 16),
            OutputPlan {
                output_tokens: 3,
                stop_reason: StopReason::TokenLimit
            }
        );
        // A limit equal to the natural length does not cut anything.
        assert_eq!(plan_output(Some(16), 16).stop_reason, StopReason::Natural);
        assert_eq!(plan_output(Some(100), 16).output_tokens, 16);
        assert_eq!(plan_output(Some(0), 16).output_tokens, 0);
    }

    #[test]
    fn stream_flags_default_off() {
        let body =
            br#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        assert!(request.is_stream() && request.include_usage());
        let body = br#"{"model":"m","messages":[],"stream":null}"#;
        let request: ChatRequest = serde_json::from_slice(body).unwrap();
        assert!(!request.is_stream() && !request.include_usage());
    }

    #[test]
    fn missing_messages_is_an_error() {
        assert!(serde_json::from_slice::<ChatRequest>(br#"{"model":"m"}"#).is_err());
    }
}
