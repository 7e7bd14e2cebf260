//! Rejections: the one type every phase returns when it refuses or fails a request, the
//! catalogue of answers (status, code, message), and the documented envelope
//! `{"error":{"code","message","source"}}`. Which answer a typed refusal of the request path
//! gets (a route error, a quota or limit refusal, a hold's end, a provider failure), and the
//! headers of the answer, is `api::refusal`'s one job.
//!
//! A rejection is data (status, code, source, retry-after, message). Messages on hot reject paths
//! are `'static`; only rejections that name a client-supplied value allocate.

use std::borrow::Cow;

use crate::wire::http::response::error_body;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Router,
    Backend,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Router => "router",
            Source::Backend => "backend",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub status: u16,
    pub code: &'static str,
    pub message: Cow<'static, str>,
    pub source: Source,
    /// Seconds for a `Retry-After` header.
    pub retry_after_seconds: Option<u32>,
    /// Close the client connection after answering (the request stream can no longer be trusted).
    pub close: bool,
    /// `X-RateLimit-Remaining-Requests` / `X-RateLimit-Remaining-Tokens`, on quota refusals.
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
    /// Repeat `retry_after_seconds` in the envelope as `retry_after` (`model_waking`).
    pub retry_after_in_body: bool,
}

/// Which `model_waking` case a rejection is (hold at zero): the code is the same, the message
/// says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waking {
    /// The hold budget ran out.
    Expired,
    /// A hold limit is reached.
    Full,
    /// A request released by a wake found no room in the admission gate before its hold budget
    /// ended.
    StillAtCapacity,
}

impl Rejection {
    fn router(status: u16, code: &'static str, message: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection {
            status,
            code,
            message: message.into(),
            source: Source::Router,
            retry_after_seconds: None,
            close: false,
            remaining_requests: None,
            remaining_tokens: None,
            retry_after_in_body: false,
        }
    }

    pub fn closing(mut self) -> Rejection {
        self.close = true;
        self
    }

    pub fn request_invalid(message: impl Into<Cow<'static, str>>) -> Rejection {
        Rejection::router(400, "request_invalid", message)
    }

    pub fn payload_too_large() -> Rejection {
        Rejection::router(
            413,
            "request_too_large",
            "request body exceeds HIVENET_ROUTER_MAX_REQUEST_BYTES",
        )
    }

    /// An admin body over the largest admin route limit (`max_bytes`); a body under it but over
    /// its own route's limit is refused by the admin handler.
    pub fn admin_payload_too_large(max_bytes: usize) -> Rejection {
        Rejection::router(
            413,
            "request_too_large",
            format!("request body exceeds the admin API's limit of {max_bytes} bytes"),
        )
    }

    pub fn headers_too_large() -> Rejection {
        Rejection::router(431, "request_invalid", "request header fields too large")
    }

    pub fn client_timeout() -> Rejection {
        Rejection::router(
            408,
            "request_timeout",
            "client did not send the complete request in time",
        )
    }

    pub fn not_found_path() -> Rejection {
        Rejection::router(404, "not_found", "no such route")
    }

    pub fn method_not_allowed() -> Rejection {
        Rejection::router(
            405,
            "method_not_allowed",
            "method not allowed for this route",
        )
    }

    pub fn unauthorized(message: &'static str) -> Rejection {
        Rejection::router(401, "unauthorized", message)
    }

    pub fn model_forbidden(model: &str) -> Rejection {
        Rejection::router(
            403,
            "model_forbidden",
            format!("model {model:?} is not allowed for this API key"),
        )
    }

    pub fn no_quota_declared(model: &str) -> Rejection {
        Rejection::router(
            429,
            "rate_limit_exceeded",
            format!("no quota declared for model {model:?} on this API key"),
        )
    }

    pub fn model_not_found(model: &str) -> Rejection {
        Rejection::router(
            404,
            "model_not_found",
            format!("model {model:?} is not served by any healthy agent"),
        )
    }

    pub fn no_agents_available() -> Rejection {
        Rejection::router(
            503,
            "no_agents_available",
            "all agents for this model are currently offline or unhealthy",
        )
    }

    pub fn no_capacity() -> Rejection {
        Rejection::router(
            503,
            "no_capacity",
            "every agent for this model is at capacity and its queue is full",
        )
    }

    /// The shard holds as many arriving request bodies as `--max-buffered-body-bytes` allows.
    pub fn bodies_full() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                503,
                "queue_full",
                "the router is receiving too many request bodies at once; retry",
            )
        }
    }

    /// The shard has `--max-client-connections` open.
    pub fn connections_full() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                503,
                "queue_full",
                "the router has too many open client connections; retry",
            )
        }
    }

    /// The client's address reset too many HTTP/2 streams lately.
    pub fn too_many_resets(penalty_seconds: u32) -> Rejection {
        Rejection {
            retry_after_seconds: Some(penalty_seconds),
            ..Rejection::router(
                429,
                "rate_limit_exceeded",
                "too many stream resets from this address; retry later",
            )
        }
    }

    /// The router is shutting down (SIGTERM): a request that arrives while it drains, or one
    /// still in flight at the end of the drain.
    pub fn shutting_down() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                503,
                "no_capacity",
                "the router is shutting down; retry on another router",
            )
        }
        .closing()
    }

    /// A redirect token the sync store could not claim in time while it answers: the token may
    /// not be accepted unchecked (another router may be accepting it too).
    pub fn redirect_token_unchecked() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                503,
                "queue_full",
                "redirect token could not be checked in the sync store in time; retry the request at its origin site",
            )
        }
    }

    pub fn queue_full() -> Rejection {
        Rejection::router(503, "queue_full", "the router's internal queue is full")
    }

    /// B1: the learned input estimate or the image count is over the model's policy cap.
    pub fn input_too_long(message: String) -> Rejection {
        Rejection::router(400, "input_too_long", message)
    }

    /// B2: the model's occupancy budget or request backstop stayed full for the park timeout.
    pub fn occupancy_full() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                429,
                "concurrency_limit_exceeded",
                "server at capacity for this model, please retry",
            )
        }
    }

    /// B3: the healthy pool's engine signals breach the policy's `shed_if`.
    pub fn pool_shed() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                429,
                "concurrency_limit_exceeded",
                "model is under high load, please retry",
            )
        }
    }

    /// B4: the key's occupancy share of a serverless model is in use.
    pub fn key_occupancy_share() -> Rejection {
        Rejection {
            retry_after_seconds: Some(1),
            ..Rejection::router(
                429,
                "rate_limit_exceeded",
                "the key's share of this model's capacity is in use, please retry",
            )
        }
    }

    /// Hold at zero: `503 model_waking` with `Retry-After` and `retry_after`.
    pub fn model_waking(model: &str, case: Waking) -> Rejection {
        let seconds = crate::logic::hold::RETRY_AFTER_SECONDS;
        let message = match case {
            Waking::Expired => format!("model {model} is waking up; retry in {seconds} seconds"),
            Waking::Full => format!(
                "model {model} is waking up and too many requests are already waiting for it; retry in {seconds} seconds"
            ),
            Waking::StillAtCapacity => format!(
                "model {model} woke up but is still at capacity; retry in {seconds} seconds"
            ),
        };
        Rejection {
            retry_after_seconds: Some(seconds),
            retry_after_in_body: true,
            ..Rejection::router(503, "model_waking", message)
        }
    }

    pub fn request_timeout() -> Rejection {
        Rejection::router(
            504,
            "request_timeout",
            "the router-side request deadline expired",
        )
    }

    pub fn agent_disconnected() -> Rejection {
        Rejection::router(
            503,
            "agent_disconnected",
            "the selected agent could not be reached",
        )
    }

    pub fn backend_error(message: &'static str) -> Rejection {
        Rejection {
            source: Source::Backend,
            ..Rejection::router(502, "backend_error", message)
        }
    }

    /// The agent said its backend's response broke off after the head (`tunnel::BACKEND_FAILED`):
    /// the engine crashed or reset the connection mid-response.
    pub fn backend_failed() -> Rejection {
        Rejection::backend_error("the backend failed mid-response")
    }

    /// The backend answered a retryable error status and no other attempt was left to make, as
    /// the error-code reference classifies it: 429 and 503 are 503 `backend_unavailable`, any
    /// other status 502 `backend_error`.
    pub fn backend_status(status: u16) -> Rejection {
        let (status_out, code) = match status {
            429 | 503 => (503, "backend_unavailable"),
            _ => (502, "backend_error"),
        };
        Rejection {
            source: Source::Backend,
            ..Rejection::router(status_out, code, format!("the backend answered {status}"))
        }
    }

    pub fn unsupported_version() -> Rejection {
        Rejection::router(
            505,
            "request_invalid",
            "only HTTP/1.0, HTTP/1.1 and h2c are served",
        )
    }

    /// The envelope body.
    pub fn body(&self) -> Vec<u8> {
        let mut body = error_body(self.code, &self.message, self.source.as_str());
        if self.retry_after_in_body
            && let Some(seconds) = self.retry_after_seconds
        {
            // `{"error":{...}}`: the field goes inside the error object.
            body.truncate(body.len() - 2);
            body.extend_from_slice(b",\"retry_after\":");
            body.extend_from_slice(itoa::Buffer::new().format(seconds).as_bytes());
            body.extend_from_slice(b"}}");
        }
        body
    }

    /// The error as the final event of an SSE stream whose `200` head is already sent: OpenAI
    /// endpoints get `data: {"error":{...}}`, `/v1/messages` an Anthropic `error` event whose
    /// message starts with the code.
    pub fn stream_event(&self, dialect: crate::base::ids::Dialect) -> Vec<u8> {
        match dialect {
            crate::base::ids::Dialect::OpenAi => {
                let mut event = b"data: ".to_vec();
                event.extend_from_slice(&self.body());
                event.extend_from_slice(b"\n\n");
                event
            }
            crate::base::ids::Dialect::Anthropic => {
                anthropic_error_event(self.status, self.code, &self.message)
            }
        }
    }
}

/// An Anthropic `error` event (`event: error`) for an error of `status` with `code`: its
/// `error.type` is Anthropic's type for the status, its message starts with the code (seed
/// `hold-at-zero.md`, "Keepalive": "an Anthropic `error` event whose message starts with the
/// error code"), unless `message` already does.
pub fn anthropic_error_event(status: u16, code: &str, message: &str) -> Vec<u8> {
    let kind = match status {
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        _ => "api_error",
    };
    let mut event = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":".to_vec();
    crate::wire::http::response::put_json_string(&mut event, kind);
    event.extend_from_slice(b",\"message\":");
    let prefixed = message
        .strip_prefix(code)
        .is_some_and(|rest| rest.starts_with(':'));
    if prefixed {
        crate::wire::http::response::put_json_string(&mut event, message);
    } else {
        crate::wire::http::response::put_json_string(&mut event, &format!("{code}: {message}"));
    }
    event.extend_from_slice(b"}}\n\n");
    event
}

/// A backend's error answer (`status`, `body`) as the final event a streaming client gets once
/// its `200` head is committed (hold at zero's keepalives), in its dialect: OpenAI endpoints the
/// router's envelope (`data: {"error":{"code","message","source"}}`), `/v1/messages` an Anthropic
/// `error` event whose message starts with the code. The code is the body's own `error.code`
/// when it is text (the router's envelope, which the agent also answers, and OpenAI's); else the
/// error-code reference's for the status (`invalid_parameter` for 400 and 422,
/// `backend_unavailable` for 429, 503 and 529, `backend_error` otherwise): an engine's own error
/// type or numeric code is not one of the router's codes. The message is the body's
/// `error.message` or top-level `message`, else the body's text (at most 512 bytes), else the
/// status. The source is the body's `error.source` when it is the agent's, else `backend`.
pub fn backend_error_event(
    dialect: crate::base::ids::Dialect,
    status: u16,
    body: &[u8],
) -> Vec<u8> {
    /// Keeps an event from carrying a whole unexpected page.
    const TEXT_BYTES_MAX: usize = 512;
    let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let error = value.as_ref().and_then(|value| value.get("error"));
    let text_of = |value: Option<&serde_json::Value>, field: &str| {
        value
            .and_then(|value| value.get(field))
            .and_then(serde_json::Value::as_str)
            .filter(|text| !text.is_empty())
            .map(str::to_owned)
    };
    let code = text_of(error, "code").unwrap_or_else(|| {
        match status {
            400 | 422 => "invalid_parameter",
            429 | 503 | 529 => "backend_unavailable",
            _ => "backend_error",
        }
        .to_owned()
    });
    let message = text_of(error, "message")
        .or_else(|| text_of(value.as_ref(), "message"))
        .or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let mut end = text.len().min(TEXT_BYTES_MAX);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            (value.is_none() && !text.is_empty()).then(|| text[..end].to_owned())
        })
        .unwrap_or_else(|| format!("the backend answered {status}"));
    match dialect {
        crate::base::ids::Dialect::Anthropic => anthropic_error_event(status, &code, &message),
        crate::base::ids::Dialect::OpenAi => {
            let source = match text_of(error, "source").as_deref() {
                Some("agent") => "agent",
                _ => "backend",
            };
            let mut event = b"data: ".to_vec();
            event.extend_from_slice(&error_body(&code, &message, source));
            event.extend_from_slice(b"\n\n");
            event
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Dialect;

    #[test]
    fn backend_failures_use_the_reference_codes_and_statuses() {
        for (answered, status, code) in [
            (429, 503, "backend_unavailable"),
            (503, 503, "backend_unavailable"),
            (500, 502, "backend_error"),
            (502, 502, "backend_error"),
            (504, 502, "backend_error"),
        ] {
            let rejection = Rejection::backend_status(answered);
            assert_eq!(
                (rejection.status, rejection.code),
                (status, code),
                "{answered}"
            );
            assert_eq!(rejection.source, Source::Backend);
            assert_eq!(
                rejection.message,
                format!("the backend answered {answered}")
            );
        }
        let failed = Rejection::backend_failed();
        assert_eq!((failed.status, failed.code), (502, "backend_error"));
        assert_eq!(failed.source, Source::Backend);
        let lost = Rejection::agent_disconnected();
        assert_eq!((lost.status, lost.code), (503, "agent_disconnected"));
        assert_eq!(lost.source, Source::Router);
    }

    #[test]
    fn model_waking_carries_retry_after_in_header_and_body() {
        let waking = Rejection::model_waking("llama-3-70b", Waking::Expired);
        assert_eq!((waking.status, waking.code), (503, "model_waking"));
        assert_eq!(waking.retry_after_seconds, Some(30));
        let value: serde_json::Value = serde_json::from_slice(&waking.body()).unwrap();
        assert_eq!(
            value["error"]["message"],
            "model llama-3-70b is waking up; retry in 30 seconds"
        );
        assert_eq!(value["error"]["retry_after"], 30);
        assert_eq!(value["error"]["source"], "router");
        let full = Rejection::model_waking("m", Waking::Full);
        assert!(
            full.message
                .contains("too many requests are already waiting")
        );
        let capacity = Rejection::model_waking("m", Waking::StillAtCapacity);
        assert!(
            capacity
                .message
                .contains("woke up but is still at capacity")
        );
    }

    #[test]
    fn errors_after_a_committed_head_are_stream_events() {
        let waking = Rejection::model_waking("m", Waking::Expired);
        let openai = waking.stream_event(crate::base::ids::Dialect::OpenAi);
        let text = std::str::from_utf8(&openai).unwrap();
        assert!(text.starts_with("data: {\"error\":{\"code\":\"model_waking\""));
        assert!(text.ends_with("}}\n\n"));
        let value = anthropic_event(&waking.stream_event(crate::base::ids::Dialect::Anthropic));
        assert_eq!(value["error"]["type"], "overloaded_error");
        assert!(
            value["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("model_waking: ")
        );
    }

    /// The JSON of an Anthropic `error` event.
    fn anthropic_event(event: &[u8]) -> serde_json::Value {
        let text = std::str::from_utf8(event).unwrap();
        let data = text
            .strip_prefix("event: error\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(value["type"], "error");
        value
    }

    #[test]
    fn a_backend_error_body_becomes_an_anthropic_event_that_starts_with_its_code() {
        // The router's envelope, as the agent answers when the engine refuses the connection.
        let agent = backend_error_event(
            Dialect::Anthropic,
            503,
            br#"{"error":{"code":"backend_unavailable","message":"backend unreachable","source":"backend"}}"#,
        );
        let value = anthropic_event(&agent);
        assert_eq!(value["error"]["type"], "overloaded_error");
        assert_eq!(
            value["error"]["message"],
            "backend_unavailable: backend unreachable"
        );
        // An Anthropic backend's own error: its type is not a router code; the status's is.
        let anthropic = backend_error_event(
            Dialect::Anthropic,
            529,
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        );
        assert_eq!(
            anthropic_event(&anthropic)["error"]["message"],
            "backend_unavailable: Overloaded"
        );
        // An engine's error with a numeric code (vLLM): the code the status maps to.
        let engine = backend_error_event(
            Dialect::Anthropic,
            400,
            br#"{"object":"error","message":"max_tokens is too large","type":"BadRequestError","code":400}"#,
        );
        let value = anthropic_event(&engine);
        assert_eq!(value["error"]["type"], "invalid_request_error");
        assert_eq!(
            value["error"]["message"],
            "invalid_parameter: max_tokens is too large"
        );
        // Not JSON: the text, bounded; nothing at all: the status.
        let text = backend_error_event(
            Dialect::Anthropic,
            502,
            "bad gateway é".repeat(100).as_bytes(),
        );
        let message = anthropic_event(&text)["error"]["message"].clone();
        let message = message.as_str().unwrap();
        assert!(
            message.starts_with("backend_error: bad gateway"),
            "{message}"
        );
        assert!(message.len() <= 512 + "backend_error: ".len());
        let empty = backend_error_event(Dialect::Anthropic, 500, b"");
        assert_eq!(
            anthropic_event(&empty)["error"]["message"],
            "backend_error: the backend answered 500"
        );
        // A message that already starts with its code is not prefixed twice.
        let once = anthropic_error_event(502, "backend_error", "backend_error: it broke");
        assert_eq!(
            anthropic_event(&once)["error"]["message"],
            "backend_error: it broke"
        );
    }

    /// An OpenAI streaming client gets the router's envelope, its code from the reference
    /// (the issue: the backend's own body, `"code":null`, passed through).
    #[test]
    fn a_backend_error_body_becomes_an_openai_event_in_the_routers_envelope() {
        let event = |status, body: &[u8]| {
            let event = backend_error_event(Dialect::OpenAi, status, body);
            let text = String::from_utf8(event).unwrap();
            let data = text
                .strip_prefix("data: ")
                .and_then(|rest| rest.strip_suffix("\n\n"))
                .unwrap()
                .to_owned();
            serde_json::from_str::<serde_json::Value>(&data).unwrap()
        };
        assert_eq!(
            event(
                500,
                br#"{"error":{"message":"injected failure","type":"server_error","code":null}}"#
            ),
            serde_json::json!({"error": {
                "code": "backend_error",
                "message": "injected failure",
                "source": "backend",
            }})
        );
        // The agent's own envelope keeps its code and source.
        let agent = event(
            503,
            br#"{"error":{"code":"agent_unhealthy","message":"engine down","source":"agent"}}"#,
        );
        assert_eq!(agent["error"]["code"], "agent_unhealthy");
        assert_eq!(agent["error"]["source"], "agent");
        assert_eq!(event(429, b"")["error"]["code"], "backend_unavailable");
    }

    #[test]
    fn envelope_shape() {
        let body = Rejection::model_not_found("a\"b").body();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["error"]["code"], "model_not_found");
        assert_eq!(value["error"]["source"], "router");
        assert!(
            value["error"]["message"]
                .as_str()
                .unwrap()
                .contains("a\\\"b")
        );
    }
}
