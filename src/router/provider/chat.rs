//! The internal chat request both adapters start from, read from the client's body in either
//! dialect, and the internal completion both adapters end with, written back in the client's
//! dialect.
//!
//! Pure: bytes in, values out; no runtime, no clock (the `created` time is an argument).
//!
//! Invariants: a [`ChatRequest`] has at least one message; `stream: true` never gets this far
//! (the adapters answer one JSON body, reference "Streaming limitations"). A [`Completion`] is
//! rendered with `processed_by` in both dialects.
//!
//! What the internal request keeps, and so what survives the fallback (reference, "Request
//! handling"): messages (role, content, name), `temperature`, `top_p`, `max_tokens`,
//! `max_completion_tokens`, `modalities`, `audio`, `service_tier`. Everything else in the body
//! is dropped. From an Anthropic-shaped body (a client of `/v1/messages`) it keeps the system
//! prompt and the text of each message, `max_tokens`, `temperature` and `top_p`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProviderError;
use crate::logic::usage::Usage;

/// The fields of a chat request that provider fallback carries.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    /// OpenAI output modalities, e.g. `["text", "audio"]`.
    pub modalities: Option<Vec<String>>,
    /// OpenAI audio output configuration (`voice`, `format`), kept as sent.
    pub audio: Option<Map<String, Value>>,
    pub service_tier: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, `tool`, ... as sent.
    pub role: String,
    pub content: Content,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Message content: OpenAI's string or list of parts (text, image, audio, ...), or none (an
/// assistant turn that only called tools).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

impl Content {
    /// The text of this content: the string itself, or the `text` of every text part joined
    /// with a newline. Non-text parts (images, audio, files) are skipped.
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => {
                let mut joined = String::new();
                for part in parts {
                    let is_text = part
                        .get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|kind| kind == "text");
                    if let (true, Some(text)) = (is_text, part.get("text").and_then(Value::as_str))
                    {
                        if !joined.is_empty() {
                            joined.push('\n');
                        }
                        joined.push_str(text);
                    }
                }
                joined
            }
        }
    }
}

/// `POST /v1/chat/completions` as far as fallback reads it. Unknown fields are ignored.
#[derive(Deserialize)]
struct OpenAiChatBody {
    #[serde(default)]
    messages: Option<Vec<OpenAiMessage>>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    modalities: Option<Vec<String>>,
    #[serde(default)]
    audio: Option<Map<String, Value>>,
    #[serde(default)]
    service_tier: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct OpenAiMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    name: Option<String>,
}

/// `POST /v1/messages` as far as fallback reads it (text only).
#[derive(Deserialize)]
struct AnthropicBody {
    #[serde(default)]
    messages: Option<Vec<AnthropicMessage>>,
    #[serde(default)]
    system: Option<AnthropicContent>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    role: String,
    content: AnthropicContent,
}

/// Anthropic content: a string or a list of typed blocks; only `text` blocks are read.
#[derive(Deserialize)]
#[serde(untagged)]
enum AnthropicContent {
    Text(String),
    Blocks(Vec<Value>),
}

impl AnthropicContent {
    fn text(&self) -> String {
        match self {
            AnthropicContent::Text(text) => text.clone(),
            // Anthropic blocks always carry a type; same rule as OpenAI parts otherwise.
            AnthropicContent::Blocks(blocks) => Content::Parts(
                blocks
                    .iter()
                    .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
                    .cloned()
                    .collect(),
            )
            .text(),
        }
    }
}

const NOT_A_CHAT_REQUEST: &str =
    "the request body is not a chat request provider fallback can read";
const NO_MESSAGES: &str = "provider fallback needs at least one message";
const STREAMING: &str = "provider fallback answers only non-streaming requests; send stream: false";

/// Parses a JSON object body. Derived structs would also take a JSON array; refuse it.
fn object<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, ProviderError> {
    let first = body.iter().find(|byte| !byte.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ProviderError::Unsupported(NOT_A_CHAT_REQUEST));
    }
    serde_json::from_slice(body).map_err(|_| ProviderError::Unsupported(NOT_A_CHAT_REQUEST))
}

impl ChatRequest {
    /// Reads an OpenAI chat completions body.
    pub fn from_openai(body: &[u8]) -> Result<ChatRequest, ProviderError> {
        let body: OpenAiChatBody = object(body)?;
        if body.stream == Some(true) {
            return Err(ProviderError::Unsupported(STREAMING));
        }
        let messages: Vec<ChatMessage> = body
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|message| ChatMessage {
                role: message.role,
                content: message.content.unwrap_or(Content::Parts(Vec::new())),
                name: message.name,
            })
            .collect();
        if messages.is_empty() {
            return Err(ProviderError::Unsupported(NO_MESSAGES));
        }
        Ok(ChatRequest {
            messages,
            temperature: body.temperature,
            top_p: body.top_p,
            max_tokens: body.max_tokens,
            max_completion_tokens: body.max_completion_tokens,
            modalities: body.modalities,
            audio: body.audio,
            service_tier: body.service_tier,
        })
    }

    /// Reads an Anthropic Messages body into the OpenAI-shaped internal request: the system
    /// prompt becomes a leading system message, each message keeps its role and the text of its
    /// text blocks; messages with no text (tool results, images alone) are dropped.
    pub fn from_anthropic(body: &[u8]) -> Result<ChatRequest, ProviderError> {
        let body: AnthropicBody = object(body)?;
        if body.stream == Some(true) {
            return Err(ProviderError::Unsupported(STREAMING));
        }
        let mut messages = Vec::new();
        if let Some(system) = body.system.map(|system| system.text())
            && !system.is_empty()
        {
            messages.push(ChatMessage {
                role: "system".to_owned(),
                content: Content::Text(system),
                name: None,
            });
        }
        for message in body.messages.unwrap_or_default() {
            let text = message.content.text();
            if !text.is_empty() {
                messages.push(ChatMessage {
                    role: message.role,
                    content: Content::Text(text),
                    name: None,
                });
            }
        }
        if messages.is_empty() {
            return Err(ProviderError::Unsupported(NO_MESSAGES));
        }
        Ok(ChatRequest {
            messages,
            temperature: body.temperature,
            top_p: body.top_p,
            max_tokens: body.max_tokens,
            max_completion_tokens: None,
            modalities: None,
            audio: None,
            service_tier: None,
        })
    }
}

/// Why generation stopped, in OpenAI's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
}

impl Finish {
    pub fn openai(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
            Finish::ContentFilter => "content_filter",
        }
    }

    /// OpenAI's `finish_reason`; unknown or missing reasons count as `stop`.
    pub fn from_openai(reason: Option<&str>) -> Finish {
        match reason {
            Some("length") => Finish::Length,
            Some("tool_calls" | "function_call") => Finish::ToolCalls,
            Some("content_filter") => Finish::ContentFilter,
            _ => Finish::Stop,
        }
    }

    /// Anthropic's `stop_reason` (reference, "Response translation"): `max_tokens` is `length`,
    /// `tool_use` is `tool_calls`, every other reason is `stop`.
    pub fn from_anthropic(reason: Option<&str>) -> Finish {
        match reason {
            Some("max_tokens") => Finish::Length,
            Some("tool_use") => Finish::ToolCalls,
            _ => Finish::Stop,
        }
    }

    fn anthropic(self) -> &'static str {
        match self {
            Finish::Stop => "end_turn",
            Finish::Length => "max_tokens",
            Finish::ToolCalls => "tool_use",
            Finish::ContentFilter => "refusal",
        }
    }
}

/// One provider answer, reduced to what both dialects can express.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub id: String,
    pub model: String,
    /// The assistant's text; `None` when the provider answered without text (OpenAI tool calls
    /// or a refusal).
    pub text: Option<String>,
    pub finish: Finish,
    pub usage: Usage,
}

impl Completion {
    /// An OpenAI `chat.completion` with `processed_by`.
    pub fn to_openai(&self, processed_by: &str, created_unix_seconds: u64) -> Vec<u8> {
        let usage = self.usage;
        let value = serde_json::json!({
            "id": self.id,
            "object": "chat.completion",
            "created": created_unix_seconds,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": self.text},
                "finish_reason": self.finish.openai(),
            }],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens.saturating_add(usage.output_tokens),
            },
            "processed_by": processed_by,
        });
        serde_json::to_vec(&value).expect("a JSON value always serializes")
    }

    /// An Anthropic `message` with `processed_by`, for clients of `/v1/messages`.
    pub fn to_anthropic(&self, processed_by: &str) -> Vec<u8> {
        let content: Vec<Value> = self
            .text
            .iter()
            .map(|text| serde_json::json!({"type": "text", "text": text}))
            .collect();
        let value = serde_json::json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.finish.anthropic(),
            "stop_sequence": null,
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            },
            "processed_by": processed_by,
        });
        serde_json::to_vec(&value).expect("a JSON value always serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bytes(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn openai_body_keeps_the_supported_subset_only() {
        let request = ChatRequest::from_openai(&bytes(json!({
            "model": "local",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
            ],
            "temperature": 0.5, "top_p": 0.9, "max_tokens": 10, "max_completion_tokens": 20,
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"},
            "service_tier": "flex", "tools": [{"type": "function"}], "stop": ["x"],
            "stream": false,
        })))
        .unwrap();
        assert_eq!(request.messages.len(), 2);
        assert_eq!(request.messages[1].name.as_deref(), Some("ann"));
        assert_eq!(request.temperature, Some(0.5));
        assert_eq!(request.top_p, Some(0.9));
        assert_eq!(request.max_tokens, Some(10));
        assert_eq!(request.max_completion_tokens, Some(20));
        assert_eq!(
            request.modalities,
            Some(vec!["text".into(), "audio".into()])
        );
        assert_eq!(request.audio.unwrap()["voice"], "alloy");
        assert_eq!(request.service_tier.as_deref(), Some("flex"));
    }

    #[test]
    fn streaming_empty_and_malformed_bodies_are_refused() {
        let refuse = |body: &[u8]| ChatRequest::from_openai(body).unwrap_err();
        assert_eq!(
            refuse(&bytes(
                json!({"messages": [{"role": "user", "content": "x"}], "stream": true})
            )),
            ProviderError::Unsupported(STREAMING)
        );
        assert_eq!(
            refuse(&bytes(json!({"messages": []}))),
            ProviderError::Unsupported(NO_MESSAGES)
        );
        assert_eq!(
            refuse(&bytes(json!({"model": "m"}))),
            ProviderError::Unsupported(NO_MESSAGES)
        );
        for bad in [
            &b""[..],
            b"[]",
            b"{",
            b"{\"messages\": 3}",
            b"{\"temperature\": \"hot\", \"messages\": []}",
            b"{\"max_tokens\": -1}",
        ] {
            assert_eq!(
                refuse(bad),
                ProviderError::Unsupported(NOT_A_CHAT_REQUEST),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn text_joins_text_parts_and_skips_the_rest() {
        let content = Content::Parts(vec![
            json!({"type": "text", "text": "a"}),
            json!({"type": "image_url", "image_url": {"url": "data:,"}}),
            json!({"type": "text", "text": "b"}),
            json!({"type": "input_audio", "input_audio": {}}),
        ]);
        assert_eq!(content.text(), "a\nb");
        assert_eq!(Content::Parts(vec![]).text(), "");
    }

    #[test]
    fn anthropic_body_becomes_system_plus_text_messages() {
        let request = ChatRequest::from_anthropic(&bytes(json!({
            "model": "local", "max_tokens": 64, "temperature": 0.2, "top_k": 5,
            "system": [{"type": "text", "text": "rule one"}, {"type": "text", "text": "rule two"}],
            "messages": [
                {"role": "user", "content": "question"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "image", "source": {}},
                    {"type": "text", "text": "look"},
                ]},
            ],
        })))
        .unwrap();
        let roles: Vec<&str> = request.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "user"]);
        assert_eq!(
            request.messages[0].content,
            Content::Text("rule one\nrule two".into())
        );
        assert_eq!(request.messages[2].content, Content::Text("look".into()));
        assert_eq!(request.max_tokens, Some(64));
        assert_eq!(request.temperature, Some(0.2));
    }

    #[test]
    fn anthropic_body_without_text_or_streaming_is_refused() {
        let tool_only = bytes(
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}),
        );
        assert_eq!(
            ChatRequest::from_anthropic(&tool_only).unwrap_err(),
            ProviderError::Unsupported(NO_MESSAGES)
        );
        let stream = bytes(json!({"messages": [{"role": "user", "content": "x"}], "stream": true}));
        assert_eq!(
            ChatRequest::from_anthropic(&stream).unwrap_err(),
            ProviderError::Unsupported(STREAMING)
        );
    }

    #[test]
    fn completion_renders_both_dialects_with_processed_by() {
        let completion = Completion {
            id: "msg_1".into(),
            model: "m".into(),
            text: Some("hello \"world\"".into()),
            finish: Finish::Length,
            usage: Usage {
                input_tokens: 7,
                output_tokens: 3,
            },
        };
        let openai: Value =
            serde_json::from_slice(&completion.to_openai("provider:anthropic", 42)).unwrap();
        assert_eq!(openai["object"], "chat.completion");
        assert_eq!(openai["created"], 42);
        assert_eq!(
            openai["choices"][0]["message"]["content"],
            "hello \"world\""
        );
        assert_eq!(openai["choices"][0]["finish_reason"], "length");
        assert_eq!(
            openai["usage"],
            json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        );
        assert_eq!(openai["processed_by"], "provider:anthropic");
        let anthropic: Value =
            serde_json::from_slice(&completion.to_anthropic("provider:openai")).unwrap();
        assert_eq!(anthropic["type"], "message");
        assert_eq!(anthropic["content"][0]["text"], "hello \"world\"");
        assert_eq!(anthropic["stop_reason"], "max_tokens");
        assert_eq!(
            anthropic["usage"],
            json!({"input_tokens": 7, "output_tokens": 3})
        );
        assert_eq!(anthropic["processed_by"], "provider:openai");
    }

    #[test]
    fn stop_reasons_map_as_the_reference_says() {
        assert_eq!(Finish::from_anthropic(Some("max_tokens")), Finish::Length);
        assert_eq!(Finish::from_anthropic(Some("tool_use")), Finish::ToolCalls);
        assert_eq!(Finish::from_anthropic(Some("end_turn")), Finish::Stop);
        assert_eq!(Finish::from_anthropic(Some("stop_sequence")), Finish::Stop);
        assert_eq!(Finish::from_anthropic(Some("pause_turn")), Finish::Stop);
        assert_eq!(Finish::from_anthropic(None), Finish::Stop);
        assert_eq!(Finish::from_openai(Some("length")), Finish::Length);
        assert_eq!(Finish::from_openai(None), Finish::Stop);
    }
}
