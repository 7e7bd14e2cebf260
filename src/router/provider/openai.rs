//! The OpenAI adapter (reference, "OpenAI fallback"): the internal request re-encoded as a
//! non-streaming `POST /v1/chat/completions` with the provider model, and the provider's answer
//! checked and tagged `"processed_by": "provider:openai"`.
//!
//! Pure. Invariants: the body sent never carries `stream` (so the provider answers one JSON
//! body) and never the client's model; an answer is accepted only as a JSON object whose
//! `choices` is a non-empty array of objects each holding a `message` object.
//!
//! Dropped from the conversation, because the provider would refuse them without the tool
//! definitions fallback does not carry: `tool`/`function` role messages and messages with no
//! content (assistant turns that only called tools). Message-level `tool_calls`,
//! `tool_call_id` and assistant `audio` references are not carried either.

use serde::Serialize;
use serde_json::{Map, Value};

use super::ProviderError;
use super::chat::{ChatMessage, ChatRequest, Completion, Content, Finish};
use crate::logic::usage::Usage;

#[derive(Serialize)]
struct OpenAiRequest<'a> {
    model: &'a str,
    messages: Vec<&'a ChatMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    modalities: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    audio: Option<&'a Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'a str>,
}

fn carried(message: &ChatMessage) -> bool {
    let has_content = !matches!(&message.content, Content::Parts(parts) if parts.is_empty());
    has_content && !matches!(message.role.as_str(), "tool" | "function")
}

/// The provider request body for `model`.
pub fn encode_request(request: &ChatRequest, model: &str) -> Result<Vec<u8>, ProviderError> {
    let messages: Vec<&ChatMessage> = request.messages.iter().filter(|m| carried(m)).collect();
    if messages.is_empty() {
        return Err(ProviderError::Unsupported(
            "provider fallback needs at least one message with content",
        ));
    }
    let body = OpenAiRequest {
        model,
        messages,
        temperature: request.temperature,
        top_p: request.top_p,
        max_tokens: request.max_tokens,
        max_completion_tokens: request.max_completion_tokens,
        modalities: request.modalities.as_deref(),
        audio: request.audio.as_ref(),
        service_tier: request.service_tier.as_deref(),
    };
    Ok(serde_json::to_vec(&body).expect("the request holds only JSON-representable values"))
}

const NOT_A_COMPLETION: &str = "the provider's answer is not a chat completion";
const NO_CHOICE: &str = "the provider's answer has no choice";

/// A checked 200 answer: the object itself, for clients of `/v1/chat/completions`, plus its usage.
pub struct Answer {
    object: Map<String, Value>,
    pub usage: Option<Usage>,
}

/// Checks a 200 body has the chat-completion shape.
pub fn decode_response(body: &[u8]) -> Result<Answer, ProviderError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|_| ProviderError::BadResponse(NOT_A_COMPLETION))?;
    let Value::Object(object) = value else {
        return Err(ProviderError::BadResponse(NOT_A_COMPLETION));
    };
    let choices = match object.get("choices") {
        Some(Value::Array(choices)) => choices,
        _ => return Err(ProviderError::BadResponse(NOT_A_COMPLETION)),
    };
    if choices.is_empty() {
        return Err(ProviderError::BadResponse(NO_CHOICE));
    }
    let well_formed = choices
        .iter()
        .all(|choice| choice.get("message").is_some_and(Value::is_object));
    if !well_formed {
        return Err(ProviderError::BadResponse(NOT_A_COMPLETION));
    }
    let usage = object.get("usage").and_then(|usage| {
        Some(Usage {
            input_tokens: usage.get("prompt_tokens")?.as_u64()?,
            output_tokens: usage.get("completion_tokens")?.as_u64()?,
        })
    });
    Ok(Answer { object, usage })
}

impl Answer {
    /// The provider's object as is, plus `processed_by`: every field OpenAI sent survives.
    pub fn into_openai(mut self, processed_by: &str) -> Vec<u8> {
        self.object.insert(
            "processed_by".to_owned(),
            Value::String(processed_by.to_owned()),
        );
        serde_json::to_vec(&self.object).expect("a JSON object always serializes")
    }

    /// The first choice as an internal completion (for clients of `/v1/messages`). Usage the
    /// provider did not report counts as zero.
    pub fn into_completion(self) -> Completion {
        let text_of = |key: &str| {
            self.object
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let choice = self
            .object
            .get("choices")
            .and_then(|choices| choices.get(0))
            .unwrap_or(&Value::Null);
        Completion {
            id: text_of("id"),
            model: text_of("model"),
            text: choice["message"]["content"].as_str().map(str::to_owned),
            finish: Finish::from_openai(choice["finish_reason"].as_str()),
            usage: self.usage.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: Value) -> ChatRequest {
        ChatRequest::from_openai(&serde_json::to_vec(&body).unwrap()).unwrap()
    }

    fn encoded(body: Value, model: &str) -> Value {
        serde_json::from_slice(&encode_request(&request(body), model).unwrap()).unwrap()
    }

    #[test]
    fn re_encodes_the_subset_with_the_provider_model() {
        let sent = encoded(
            json!({
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "messages": [
                    {"role": "developer", "content": "d"},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}], "name": "ann"},
                ],
                "temperature": 0.3, "top_p": 0.8, "max_tokens": 5, "max_completion_tokens": 6,
                "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"},
                "service_tier": "default",
                "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
                "response_format": {"type": "json_object"}, "stop": ["\n"], "logprobs": true,
                "stream": false, "stream_options": {"include_usage": true}, "x_vendor": 1,
            }),
            "gpt-4o-mini",
        );
        assert_eq!(
            sent,
            json!({
                "model": "gpt-4o-mini",
                "messages": [
                    {"role": "developer", "content": "d"},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}], "name": "ann"},
                ],
                "temperature": 0.3, "top_p": 0.8, "max_tokens": 5, "max_completion_tokens": 6,
                "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"},
                "service_tier": "default",
            })
        );
    }

    #[test]
    fn absent_options_stay_absent() {
        let sent = encoded(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            "p",
        );
        assert_eq!(
            sent,
            json!({"model": "p", "messages": [{"role": "user", "content": "x"}]})
        );
    }

    #[test]
    fn tool_turns_are_dropped_and_nothing_left_is_refused() {
        let sent = encoded(
            json!({"messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]},
                {"role": "tool", "tool_call_id": "c", "content": "sunny"},
                {"role": "assistant", "content": ""},
            ]}),
            "p",
        );
        assert_eq!(
            sent["messages"],
            json!([{"role": "user", "content": "weather?"}, {"role": "assistant", "content": ""}])
        );
        let only_tool = request(json!({"messages": [{"role": "tool", "content": "x"}]}));
        assert!(matches!(
            encode_request(&only_tool, "p"),
            Err(ProviderError::Unsupported(_))
        ));
    }

    fn completion_body() -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "refusal": null}, "finish_reason": "stop", "logprobs": null}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11, "prompt_tokens_details": {"cached_tokens": 0}},
            "system_fingerprint": "fp",
        })
    }

    #[test]
    fn answer_keeps_every_field_and_adds_processed_by() {
        let body = serde_json::to_vec(&completion_body()).unwrap();
        let answer = decode_response(&body).unwrap();
        assert_eq!(
            answer.usage,
            Some(Usage {
                input_tokens: 9,
                output_tokens: 2
            })
        );
        let out: Value = serde_json::from_slice(&answer.into_openai("provider:openai")).unwrap();
        let mut expected = completion_body();
        expected["processed_by"] = json!("provider:openai");
        assert_eq!(out, expected);
    }

    #[test]
    fn answer_converts_to_a_completion_for_messages_clients() {
        let body = serde_json::to_vec(&completion_body()).unwrap();
        let completion = decode_response(&body).unwrap().into_completion();
        assert_eq!(completion.text.as_deref(), Some("hi"));
        assert_eq!(completion.finish, Finish::Stop);
        assert_eq!(completion.model, "gpt-4o-mini");
        assert_eq!(completion.usage.input_tokens, 9);
    }

    #[test]
    fn unusable_answers_are_provider_failures() {
        let bad = [
            json!([]),
            json!({"id": "x"}),
            json!({"choices": {}}),
            json!({"choices": []}),
            json!({"choices": [{"index": 0}]}),
            json!({"choices": [{"message": "hi"}]}),
        ];
        for body in bad {
            let bytes = serde_json::to_vec(&body).unwrap();
            assert!(
                matches!(decode_response(&bytes), Err(ProviderError::BadResponse(_))),
                "{body}"
            );
        }
        assert!(matches!(
            decode_response(b"data: {}\n\n"),
            Err(ProviderError::BadResponse(_))
        ));
        // No usage is not a failure; the caller records none.
        let no_usage = json!({"choices": [{"message": {"content": "x"}}]});
        let answer = decode_response(&serde_json::to_vec(&no_usage).unwrap()).unwrap();
        assert_eq!(answer.usage, None);
    }
}
