//! Provider fallback: the client that sends an eligible chat request to OpenAI or Anthropic once
//! every local routing step is exhausted (reference `routing/provider-fallback`), and turns the
//! answer into the client's dialect with `"processed_by": "provider:<engine>"`.
//!
//! This module owns the provider credentials, the request and response translation, and the
//! outbound HTTP. It does not decide *when* fallback runs (the request path does, after local
//! routing), does not touch quotas or occupancy (the caller applies the seed's "Provider fallback
//! accounting": see `docs/provider-fallback.md`), and never retries (one outbound call).
//!
//! # Key components
//! - [`settings`]: [`ProviderSettings`] (keys and base URLs from the environment, read once),
//!   [`ProviderConfig`] (a policy's `fallback_provider`) and its validation, and what the client
//!   needs of a [`ProviderEngine`] (defined by `logic::policy`, re-exported here).
//! - [`chat`]: the internal chat request read from either client dialect, and the internal
//!   completion written back in either dialect. Pure.
//! - [`openai`], [`anthropic`]: the two adapters, request encoding and answer decoding. Pure.
//! - [`encode_request`] / [`decode_response`]: the adapters chosen by engine and dialect.
//! - [`pool`]: [`ProviderPool`], the one thread that makes provider HTTP calls, and its metric.
//! - [`error`]: [`ProviderError`], every way a call ends without an answer.
//!
//! # Architecture
//! Shards never make provider calls: they hand a [`ProviderRequest`] to the [`ProviderPool`]
//! (a non-blocking send on a bounded queue) and await a `tokio::sync::oneshot`, which works on
//! the monoio shard runtimes. A dedicated thread runs a tokio current-thread runtime with a
//! hyper 1 client (HTTP/1.1; rustls with the webpki roots and the `ring` provider for https,
//! plain http for tests), translates the request, calls the provider and translates the answer.
//!
//! # Error handling
//! Every failure is a [`ProviderError`]; `crate::router::api::refusal::provider` turns it into the
//! documented 502 `backend_error` (or 503 `queue_full` / 504 `request_timeout` when no call was
//! made). Provider error bodies are logged at debug level, never returned to the client.
//!
//! # Invariants
//! - At most `concurrency_max` calls in flight and `queue_max` waiting; a call past both fails
//!   at once with [`ProviderError::QueueFull`].
//! - A call ends by min(request deadline, start + 120 s): the pool answers
//!   [`ProviderError::Timeout`] then, whatever the provider does.
//! - API keys never reach logs, `Debug` output or error messages.
//!
//! # Performance
//! Not on the hot path: fallback runs only when local capacity is exhausted. Translation is a
//! JSON parse and re-encode of the request and answer on the provider thread; connections to
//! each provider are pooled and kept alive.

pub mod anthropic;
pub mod chat;
pub mod error;
pub mod openai;
pub mod pool;
pub mod settings;

use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::base::ids::Dialect;
pub use crate::logic::policy::ProviderEngine;
use crate::logic::usage::Usage;
use chat::ChatRequest;
pub use error::ProviderError;
pub use pool::{PoolSettings, ProviderCall, ProviderMetrics, ProviderPool};
pub use settings::{ConfigError, ProviderConfig, ProviderSettings, SettingsError};

/// One provider call, as the request path hands it over.
#[derive(Debug, Clone)]
pub struct ProviderRequest {
    pub engine: ProviderEngine,
    /// The provider model from the policy; replaces the client's model.
    pub model: String,
    /// The route's dialect: the shape of `body`, and the shape of the answer.
    pub dialect: Dialect,
    /// The client's body as received: an OpenAI chat request, or an Anthropic Messages request
    /// when `dialect` is `Anthropic`.
    pub body: Bytes,
    /// The request's deadline (`received_at + --request-timeout`); the call ends by then.
    pub deadline: Instant,
    /// The client's `x-request-id`, for the log line of the call.
    pub request_id: Option<Bytes>,
}

impl ProviderRequest {
    pub fn new(
        provider: &ProviderConfig,
        dialect: Dialect,
        body: Bytes,
        deadline: Instant,
    ) -> ProviderRequest {
        ProviderRequest {
            engine: provider.engine,
            model: provider.model.clone(),
            dialect,
            body,
            deadline,
            request_id: None,
        }
    }
}

/// A successful provider call.
#[derive(Debug, Clone)]
pub struct ProviderAnswer {
    pub engine: ProviderEngine,
    /// The JSON body for the client (status 200, `application/json`), in the client's dialect,
    /// with `processed_by`: an OpenAI chat completion for `/v1/chat/completions`, an Anthropic
    /// message for `/v1/messages`.
    pub body: Bytes,
    /// Input and output tokens as the provider reported them; `None` when it reported none.
    /// Record them (tenant counters, audit log) under the client's model; never charge OTPM
    /// or train the estimator with them.
    pub usage: Option<Usage>,
    /// From the start of the HTTP call to the end of the answer body.
    pub elapsed: Duration,
}

/// Translates the client's body into the provider's request body (pure).
pub fn encode_request(
    engine: ProviderEngine,
    model: &str,
    dialect: Dialect,
    body: &[u8],
) -> Result<Vec<u8>, ProviderError> {
    let request = match dialect {
        Dialect::OpenAi => ChatRequest::from_openai(body)?,
        Dialect::Anthropic => ChatRequest::from_anthropic(body)?,
    };
    match engine {
        ProviderEngine::OpenAi => openai::encode_request(&request, model),
        ProviderEngine::Anthropic => anthropic::encode_request(&request, model),
    }
}

/// Translates the provider's 200 body into the client's answer and the provider's usage (pure;
/// `created_unix_seconds` stamps answers built from an Anthropic message).
pub fn decode_response(
    engine: ProviderEngine,
    dialect: Dialect,
    body: &[u8],
    created_unix_seconds: u64,
) -> Result<(Vec<u8>, Option<Usage>), ProviderError> {
    let processed_by = engine.processed_by();
    match engine {
        ProviderEngine::OpenAi => {
            let answer = openai::decode_response(body)?;
            let usage = answer.usage;
            let out = match dialect {
                Dialect::OpenAi => answer.into_openai(processed_by),
                Dialect::Anthropic => answer.into_completion().to_anthropic(processed_by),
            };
            Ok((out, usage))
        }
        ProviderEngine::Anthropic => {
            let (completion, usage) = anthropic::decode_response(body)?;
            let out = match dialect {
                Dialect::OpenAi => completion.to_openai(processed_by, created_unix_seconds),
                Dialect::Anthropic => completion.to_anthropic(processed_by),
            };
            Ok((out, usage))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn to_bytes(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn messages_client_through_openai_gets_an_anthropic_message() {
        let sent = encode_request(
            ProviderEngine::OpenAi,
            "gpt-x",
            Dialect::Anthropic,
            &to_bytes(json!({
                "model": "local", "max_tokens": 20, "system": "sys",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            })),
        )
        .unwrap();
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(
            sent,
            json!({
                "model": "gpt-x",
                "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
                "max_tokens": 20,
            })
        );
        let answer = to_bytes(json!({
            "id": "c1", "model": "gpt-x",
            "choices": [{"message": {"role": "assistant", "content": "yo"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        }));
        let (out, usage) =
            decode_response(ProviderEngine::OpenAi, Dialect::Anthropic, &answer, 1).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["type"], "message");
        assert_eq!(out["content"], json!([{"type": "text", "text": "yo"}]));
        assert_eq!(out["stop_reason"], "max_tokens");
        assert_eq!(out["processed_by"], "provider:openai");
        assert_eq!(
            usage,
            Some(Usage {
                input_tokens: 3,
                output_tokens: 1
            })
        );
    }

    #[test]
    fn chat_client_through_anthropic_gets_a_chat_completion() {
        let sent = encode_request(
            ProviderEngine::Anthropic,
            "claude-x",
            Dialect::OpenAi,
            &to_bytes(json!({"model": "local", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .unwrap();
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent["model"], "claude-x");
        assert_eq!(sent["max_tokens"], 4096);
        let answer = to_bytes(json!({
            "id": "msg_1", "type": "message", "model": "claude-x",
            "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 2},
        }));
        let (out, usage) =
            decode_response(ProviderEngine::Anthropic, Dialect::OpenAi, &answer, 9).unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["object"], "chat.completion");
        assert_eq!(out["model"], "claude-x");
        assert_eq!(out["processed_by"], "provider:anthropic");
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        assert_eq!(usage.unwrap().output_tokens, 2);
    }
}
