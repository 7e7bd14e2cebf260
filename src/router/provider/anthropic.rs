//! The Anthropic adapter (reference, "Anthropic fallback"): the internal OpenAI-style request
//! converted into a Messages request, and the Messages answer converted back into a completion.
//!
//! Pure. Request rules, as the reference states them: the configured model replaces the
//! client's; `system` (and OpenAI's newer `developer`) messages are joined, in order, with a
//! newline into the top-level `system` string; `user` and `assistant` messages are forwarded
//! with the text extracted from their content (text parts joined with a newline, other parts
//! ignored); `temperature` is forwarded; `max_tokens` is forwarded, 4096 when absent. At least
//! one non-system message is required.
//!
//! Where we do better than the reference, and why:
//! - a client that sets only `max_completion_tokens` (current OpenAI SDKs) gets that limit
//!   rather than 4096;
//! - `temperature` is clamped to Anthropic's range [0, 1], since an OpenAI client may send up
//!   to 2 and Anthropic refuses anything above 1;
//! - messages left with no text (an assistant turn that only called tools) are dropped, since
//!   Anthropic refuses empty text content.
//!
//! Not carried: images, audio, tools and tool results, structured output, `top_p`, stop
//! sequences, and every other field.
//!
//! Response rules: the first text block is the assistant message (none: provider failure);
//! `input_tokens` (plus cache reads and writes, as `crate::logic::usage` counts them) is
//! `prompt_tokens`, `output_tokens` is `completion_tokens`; stop reasons map through
//! [`Finish::from_anthropic`].

use serde::{Deserialize, Serialize};

use super::ProviderError;
use super::chat::{ChatRequest, Completion, Finish};
use crate::logic::usage::Usage;

/// The `anthropic-version` header value the adapter speaks.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` when the client set no limit (reference).
pub const MAX_TOKENS_DEFAULT: u64 = 4096;

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    messages: Vec<Message<'a>>,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'a str,
    content: String,
}

/// The provider request body for `model`.
pub fn encode_request(request: &ChatRequest, model: &str) -> Result<Vec<u8>, ProviderError> {
    let mut system: Option<String> = None;
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        match message.role.as_str() {
            "system" | "developer" => {
                let text = message.content.text();
                match &mut system {
                    None => system = Some(text),
                    Some(joined) => {
                        joined.push('\n');
                        joined.push_str(&text);
                    }
                }
            }
            role @ ("user" | "assistant") => {
                let text = message.content.text();
                if !text.is_empty() {
                    messages.push(Message {
                        role,
                        content: text,
                    });
                }
            }
            // Tool results and unknown roles have no Messages equivalent without tools.
            _ => {}
        }
    }
    if messages.is_empty() {
        return Err(ProviderError::Unsupported(
            "anthropic fallback needs at least one user or assistant message with text",
        ));
    }
    let body = MessagesRequest {
        model,
        system: system.filter(|text| !text.is_empty()),
        messages,
        max_tokens: request
            .max_tokens
            .or(request.max_completion_tokens)
            .unwrap_or(MAX_TOKENS_DEFAULT),
        temperature: request
            .temperature
            .filter(|value| value.is_finite())
            .map(|value| value.clamp(0.0, 1.0)),
    };
    Ok(serde_json::to_vec(&body).expect("the request holds only JSON-representable values"))
}

#[derive(Deserialize)]
struct MessagesResponse {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    content: Vec<Block>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<ResponseUsage>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct ResponseUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// A checked 200 answer as a completion, and whether the provider reported usage.
pub fn decode_response(body: &[u8]) -> Result<(Completion, Option<Usage>), ProviderError> {
    let response: MessagesResponse = serde_json::from_slice(body).map_err(|_| {
        ProviderError::BadResponse("the provider's answer is not an anthropic message")
    })?;
    let text = response
        .content
        .into_iter()
        .find(|block| block.kind == "text")
        .and_then(|block| block.text)
        .ok_or(ProviderError::BadResponse(
            "the provider's answer has no text content block",
        ))?;
    let usage = response.usage.map(|usage| Usage {
        input_tokens: usage
            .input_tokens
            .saturating_add(usage.cache_creation_input_tokens.unwrap_or(0))
            .saturating_add(usage.cache_read_input_tokens.unwrap_or(0)),
        output_tokens: usage.output_tokens,
    });
    let completion = Completion {
        id: response.id.unwrap_or_default(),
        model: response.model.unwrap_or_default(),
        text: Some(text),
        finish: Finish::from_anthropic(response.stop_reason.as_deref()),
        usage: usage.unwrap_or_default(),
    };
    Ok((completion, usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn encoded(body: Value) -> Result<Value, ProviderError> {
        let request = ChatRequest::from_openai(&serde_json::to_vec(&body).unwrap())?;
        encode_request(&request, "claude-x").map(|bytes| serde_json::from_slice(&bytes).unwrap())
    }

    #[test]
    fn converts_a_chat_request_as_the_reference_says() {
        let sent = encoded(json!({
            "model": "local",
            "messages": [
                {"role": "system", "content": "one"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "there"}]},
                {"role": "system", "content": [{"type": "text", "text": "two"}]},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"},
            ],
            "temperature": 0.4, "top_p": 0.9, "max_tokens": 100, "stop": ["x"],
        }))
        .unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "claude-x",
                "system": "one\ntwo",
                "messages": [
                    {"role": "user", "content": "hi\nthere"},
                    {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "again"},
                ],
                "max_tokens": 100,
                "temperature": 0.4,
            })
        );
    }

    #[test]
    fn max_tokens_defaults_to_4096_and_falls_back_to_max_completion_tokens() {
        let plain = encoded(json!({"messages": [{"role": "user", "content": "x"}]})).unwrap();
        assert_eq!(plain["max_tokens"], 4096);
        assert!(plain.get("system").is_none());
        assert!(plain.get("temperature").is_none());
        let newer = encoded(
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 77}),
        )
        .unwrap();
        assert_eq!(newer["max_tokens"], 77);
        let both = encoded(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "max_completion_tokens": 77})).unwrap();
        assert_eq!(both["max_tokens"], 5);
    }

    #[test]
    fn temperature_is_clamped_to_anthropics_range() {
        let hot =
            encoded(json!({"messages": [{"role": "user", "content": "x"}], "temperature": 1.7}))
                .unwrap();
        assert_eq!(hot["temperature"], 1.0);
        let cold =
            encoded(json!({"messages": [{"role": "user", "content": "x"}], "temperature": 0}))
                .unwrap();
        assert_eq!(cold["temperature"], 0.0);
    }

    #[test]
    fn system_only_or_textless_conversations_are_refused() {
        for body in [
            json!({"messages": [{"role": "system", "content": "only"}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
            json!({"messages": [{"role": "tool", "content": "x"}]}),
        ] {
            assert!(matches!(encoded(body), Err(ProviderError::Unsupported(_))));
        }
        // Textless turns among others are dropped.
        let sent = encoded(json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "content": "r"},
        ]}))
        .unwrap();
        assert_eq!(sent["messages"], json!([{"role": "user", "content": "q"}]));
    }

    fn message(content: Value, stop_reason: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 2},
        }))
        .unwrap()
    }

    #[test]
    fn response_uses_the_first_text_block_and_maps_usage() {
        let body = message(
            json!([
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "first"},
                {"type": "text", "text": "second"},
            ]),
            "end_turn",
        );
        let (completion, usage) = decode_response(&body).unwrap();
        assert_eq!(completion.text.as_deref(), Some("first"));
        assert_eq!(completion.finish, Finish::Stop);
        assert_eq!(completion.id, "msg_1");
        assert_eq!(
            usage,
            Some(Usage {
                input_tokens: 12,
                output_tokens: 4
            })
        );
        let openai: Value =
            serde_json::from_slice(&completion.to_openai("provider:anthropic", 5)).unwrap();
        assert_eq!(openai["usage"]["total_tokens"], 16);
        assert_eq!(openai["choices"][0]["message"]["content"], "first");
    }

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        let text = json!([{"type": "text", "text": "x"}]);
        for (stop, finish) in [
            ("max_tokens", Finish::Length),
            ("tool_use", Finish::ToolCalls),
            ("stop_sequence", Finish::Stop),
            ("refusal", Finish::Stop),
        ] {
            let (completion, _) = decode_response(&message(text.clone(), stop)).unwrap();
            assert_eq!(completion.finish, finish, "{stop}");
        }
    }

    #[test]
    fn tool_only_and_malformed_answers_are_provider_failures() {
        let tool_only = message(
            json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]),
            "tool_use",
        );
        assert_eq!(
            decode_response(&tool_only).unwrap_err(),
            ProviderError::BadResponse("the provider's answer has no text content block")
        );
        assert!(matches!(
            decode_response(&message(json!([]), "end_turn")),
            Err(ProviderError::BadResponse(_))
        ));
        for bad in [&b"not json"[..], b"{}", b"{\"content\": \"text\"}", b"[]"] {
            assert!(
                matches!(decode_response(bad), Err(ProviderError::BadResponse(_))),
                "{bad:?}"
            );
        }
    }
}
