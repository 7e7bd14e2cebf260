//! Request bodies the simulator reads, and the two numbers it derives from them: how many prompt
//! tokens a request carries and how many tokens the simulated model will produce.
//!
//! Pure: no runtime, no clock, no I/O. Only the fields the simulator acts on are parsed; every other
//! field is skipped, so real client payloads (tools, temperature, metadata...) are accepted as-is.
//! Strings are borrowed from the request body where JSON escaping allows it.

use std::borrow::Cow;

use serde::Deserialize;

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
    /// Bytes of text this content carries (text blocks only; images and tool blocks count zero).
    pub fn text_bytes(&self) -> u64 {
        match self {
            Content::Text(text) => text.len() as u64,
            Content::Blocks(blocks) => blocks
                .iter()
                .filter(|block| block.kind.as_deref().is_none_or(|kind| kind == "text"))
                .filter_map(|block| block.text.as_deref())
                .map(|text| text.len() as u64)
                .sum(),
        }
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
