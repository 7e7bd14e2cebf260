//! Refusals: the one place that turns every typed refusal the request path receives into the
//! client's answer — a [`Rejection`] (status, `error.code`, message, source) and the headers
//! that go with it (`Retry-After`, `X-RateLimit-Remaining-*`, the bearer challenge).
//!
//! Owns: which answer each refusal gets — credentials that cannot pass ([`AuthOutcome`], a
//! redirect token's [`TokenError`]), a model outside the key's access ([`ModelAccess`]), a body
//! field the router cannot read
//! ([`FieldsError`]), a per-key limit (`limits::LimitExceeded`, [`QuotaRefusal`]), the model's hold
//! ending ([`HoldEnd`]), the model owner's pool and capacity decisions ([`RouteError`], also for
//! a request a wake released), the provider fallback's failure ([`ProviderError`]), and the
//! head of any rejection's answer ([`Headers`]). The status, code and message of the answers
//! themselves are `error::Rejection`'s catalogue; `docs/request-path.md` lists them by phase.
//!
//! Must not: count, log or wait. The phases count a refusal (rejection counters, tenant
//! series) where it happens and then ask this module for the answer.
//!
//! Cost: no allocation but for the messages that name a client-supplied value (the model name
//! of `model_waking`) or carry a parser's error text (malformed JSON).

use crate::logic::auth::config::ModelAccess;
use crate::logic::auth::keys::{AuthOutcome, KeyRecord};
use crate::logic::limits::RejectionKind;
use crate::logic::sibling::token::TokenError;
use crate::logic::snapshot::ModelId;
use crate::router::error::{Rejection, Source, Waking};
use crate::router::provider::ProviderError;
use crate::router::shard::guards::HoldEnd;
use crate::router::shard::visit::{QuotaRefusal, RouteError};
use crate::wire::http::fields::FieldsError;

/// The key the credentials name, or the 401 of why they cannot pass. Missing, unknown, expired
/// or disabled keys are all 401; the expired and disabled ones say so, because an operator
/// rotating keys needs to tell them apart from a typo.
pub fn credentials(outcome: AuthOutcome<'_>) -> Result<&KeyRecord, Rejection> {
    match outcome {
        AuthOutcome::Authenticated { key, .. } => Ok(key),
        AuthOutcome::Missing => Err(Rejection::unauthorized(
            "an API key is required: send Authorization: Bearer <key> or x-api-key",
        )),
        AuthOutcome::Unknown => Err(Rejection::unauthorized("invalid API key")),
        AuthOutcome::Expired { .. } => Err(Rejection::unauthorized("API key has expired")),
        AuthOutcome::Disabled { .. } => Err(Rejection::unauthorized("API key is disabled")),
    }
}

/// The key's access to the model the body names (phase 3): 403 `model_forbidden` outside its
/// allowlist, 429 `rate_limit_exceeded` for a model its per-model quota does not list.
pub fn model_access(access: ModelAccess, model: &str) -> Result<(), Rejection> {
    match access {
        ModelAccess::Allowed => Ok(()),
        ModelAccess::Forbidden => Err(Rejection::model_forbidden(model)),
        ModelAccess::NoQuotaDeclared => Err(Rejection::no_quota_declared(model)),
    }
}

/// An arriving redirect token that does not verify: 401, saying so when it only expired.
pub fn redirect_token(error: &TokenError) -> Rejection {
    Rejection::unauthorized(match error {
        TokenError::Expired => "redirect token has expired",
        _ => "redirect token is invalid",
    })
}

/// A body the fields phase cannot read: 400 `request_invalid`, the error's own message.
pub fn fields(error: FieldsError) -> Rejection {
    match error {
        FieldsError::EmptyBody => Rejection::request_invalid("request body is empty"),
        FieldsError::ModelMissing => Rejection::request_invalid("model field is required"),
        FieldsError::ModelEmpty => Rejection::request_invalid("model field is empty"),
        FieldsError::ModelTooLong => {
            Rejection::request_invalid("model field is longer than 256 characters")
        }
        FieldsError::NotAnObject => Rejection::request_invalid("request body is not a JSON object"),
        // The two that carry serde's text: the only allocating branch.
        other => Rejection::request_invalid(other.to_string()),
    }
}

/// A per-key limit refused the request (`limits`): 429 with the kind's code and message, the
/// `X-RateLimit-*` values, and `Retry-After` only where the kind has one (B4 token buckets).
/// `X-RateLimit-Remaining-Tokens` is the daily budget's remainder, on daily refusals only.
pub fn limit(refusal: &crate::logic::limits::LimitExceeded) -> Rejection {
    let daily = matches!(
        refusal.kind,
        RejectionKind::DailyTokens | RejectionKind::DailyTokensForMaxOutput
    );
    Rejection {
        status: 429,
        code: refusal.kind.code(),
        message: refusal.kind.message().into(),
        source: Source::Router,
        retry_after_seconds: refusal.retry_after_seconds,
        close: false,
        remaining_requests: refusal.remaining_requests,
        remaining_tokens: daily.then_some(refusal.remaining),
        retry_after_in_body: false,
    }
}

/// The quota owner's answer to an admission (phases 5 and 5d).
pub fn quota(refusal: &QuotaRefusal) -> Rejection {
    match refusal {
        QuotaRefusal::Limit(refusal) => limit(refusal),
        QuotaRefusal::MeshFull => Rejection::queue_full(),
        QuotaRefusal::Timeout => Rejection::request_timeout(),
    }
}

/// A non-streamed answer whose exact output no longer fits the key's daily budget (phase 7b):
/// refused like a daily refusal with nothing left (`X-RateLimit-Remaining-Tokens: 0`).
pub fn daily_output(model: ModelId) -> Rejection {
    limit(&crate::logic::limits::LimitExceeded::daily_spent(model))
}

/// How a hold at zero ended without the model waking (phase 5h); `model` as the client named it.
pub fn hold(end: HoldEnd, model: &str) -> Rejection {
    match end {
        HoldEnd::Full => Rejection::model_waking(model, Waking::Full),
        HoldEnd::Expired => Rejection::model_waking(model, Waking::Expired),
        HoldEnd::MeshFull => Rejection::queue_full(),
        HoldEnd::ShuttingDown => Rejection::shutting_down(),
    }
}

/// The model owner refused a slot or a reservation (phases 5b and 6).
pub fn route(error: RouteError) -> Rejection {
    match error {
        RouteError::QueueFull => Rejection::no_capacity(),
        RouteError::NoAgents => Rejection::no_agents_available(),
        RouteError::Timeout => Rejection::request_timeout(),
        RouteError::MeshFull => Rejection::queue_full(),
        RouteError::Shed => Rejection::pool_shed(),
        RouteError::PoolFull | RouteError::PoolTooSmall => Rejection::occupancy_full(),
        RouteError::KeyShare => Rejection::key_occupancy_share(),
        // Not a refusal: the request asks again, parking (`api::infer`). Were one answered, it
        // would be the pool being full.
        RouteError::WouldPark => Rejection::occupancy_full(),
    }
}

/// The model owner refused the reservation of a request a wake released (phase 5b after 5h):
/// a pool that stayed full for the whole hold budget is still the model waking, to the client.
pub fn released(error: RouteError, model: &str) -> Rejection {
    match error {
        RouteError::PoolFull => Rejection::model_waking(model, Waking::StillAtCapacity),
        other => route(other),
    }
}

/// Provider fallback did not produce an answer (reference, "Provider fallback", "Failure
/// behavior"): 502 `backend_error` for every failure of the one provider call, including its
/// timeout; 503 `queue_full` when the provider queue refused the call; 504
/// `request_timeout` when the deadline had passed and no call was made.
pub fn provider(error: ProviderError) -> Rejection {
    match error {
        ProviderError::QueueFull => Rejection {
            status: 503,
            code: "queue_full",
            message: "the router's provider fallback queue is full".into(),
            source: Source::Router,
            retry_after_seconds: None,
            close: false,
            remaining_requests: None,
            remaining_tokens: None,
            retry_after_in_body: false,
        },
        ProviderError::Expired => Rejection::request_timeout(),
        other => Rejection::backend_error(other.message()),
    }
}

/// Most headers a rejection's answer carries: the bearer challenge, `Retry-After` and both
/// `X-RateLimit-Remaining-*`.
const HEADERS_MAX: usize = 4;

/// The headers of a rejection's answer, formatted in place (no allocation). Keep one on the
/// stack for as long as the headers are written.
#[derive(Default)]
pub struct Headers {
    retry_after: itoa::Buffer,
    requests: itoa::Buffer,
    tokens: itoa::Buffer,
}

impl Headers {
    /// The headers of `rejection`'s answer, in this order: `www-authenticate` on a 401 (the
    /// reference's bearer challenge), `retry-after`, `x-ratelimit-remaining-requests`,
    /// `x-ratelimit-remaining-tokens`, each only when the rejection has its value.
    pub fn of<'h>(&'h mut self, rejection: &Rejection) -> HeaderList<'h> {
        let mut list = HeaderList {
            entries: [("", b""); HEADERS_MAX],
            count: 0,
        };
        if rejection.status == 401 {
            list.push("www-authenticate", b"Bearer realm=\"hivenet-router\"");
        }
        if let Some(seconds) = rejection.retry_after_seconds {
            list.push("retry-after", self.retry_after.format(seconds).as_bytes());
        }
        if let Some(remaining) = rejection.remaining_requests {
            list.push(
                "x-ratelimit-remaining-requests",
                self.requests.format(remaining).as_bytes(),
            );
        }
        if let Some(remaining) = rejection.remaining_tokens {
            list.push(
                "x-ratelimit-remaining-tokens",
                self.tokens.format(remaining).as_bytes(),
            );
        }
        list
    }
}

/// Up to [`HEADERS_MAX`] headers, borrowed from a [`Headers`].
pub struct HeaderList<'h> {
    entries: [(&'static str, &'h [u8]); HEADERS_MAX],
    count: usize,
}

impl<'h> HeaderList<'h> {
    fn push(&mut self, name: &'static str, value: &'h [u8]) {
        self.entries[self.count] = (name, value);
        self.count += 1;
    }

    pub fn as_slice(&self) -> &[(&'static str, &'h [u8])] {
        &self.entries[..self.count]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a client sees of an answer: status, code, message, and the headers as written.
    fn answer(rejection: &Rejection) -> (u16, &'static str, String, Vec<(String, String)>) {
        let mut headers = Headers::default();
        let list = headers
            .of(rejection)
            .as_slice()
            .iter()
            .map(|(name, value)| (name.to_string(), String::from_utf8(value.to_vec()).unwrap()))
            .collect();
        (
            rejection.status,
            rejection.code,
            rejection.message.to_string(),
            list,
        )
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    }

    fn limit_refusal(
        kind: RejectionKind,
        remaining: u64,
        retry_after_seconds: Option<u32>,
        remaining_requests: Option<u64>,
    ) -> crate::logic::limits::LimitExceeded {
        crate::logic::limits::LimitExceeded {
            kind,
            model: ModelId(3),
            limit: 100,
            remaining,
            reset_seconds: Some(7),
            retry_after_seconds,
            remaining_requests,
        }
    }

    #[test]
    fn credentials_that_cannot_pass_are_401_with_the_bearer_challenge() {
        let challenge = headers(&[("www-authenticate", "Bearer realm=\"hivenet-router\"")]);
        let refused = |outcome| answer(&credentials(outcome).unwrap_err());
        assert_eq!(
            refused(AuthOutcome::Missing),
            (
                401,
                "unauthorized",
                "an API key is required: send Authorization: Bearer <key> or x-api-key".into(),
                challenge.clone()
            )
        );
        assert_eq!(
            refused(AuthOutcome::Unknown),
            (
                401,
                "unauthorized",
                "invalid API key".into(),
                challenge.clone()
            )
        );
        let registry = crate::logic::auth::keys::KeyRegistry::open();
        let key = match registry.authenticate(None, 0) {
            AuthOutcome::Authenticated { key, .. } => key,
            _ => panic!("the open registry refuses no one"),
        };
        assert_eq!(
            refused(AuthOutcome::Expired { key }),
            (
                401,
                "unauthorized",
                "API key has expired".into(),
                challenge.clone()
            )
        );
        assert_eq!(
            refused(AuthOutcome::Disabled { key }),
            (
                401,
                "unauthorized",
                "API key is disabled".into(),
                challenge.clone()
            )
        );
        let passed = credentials(AuthOutcome::Authenticated {
            key_id: key.key_id,
            key,
        });
        assert!(std::ptr::eq(passed.unwrap(), key));
        assert_eq!(
            answer(&redirect_token(&TokenError::Expired)),
            (
                401,
                "unauthorized",
                "redirect token has expired".into(),
                challenge.clone()
            )
        );
        for error in [
            TokenError::BadMac,
            TokenError::TooLong,
            TokenError::Malformed("x"),
        ] {
            assert_eq!(
                answer(&redirect_token(&error)),
                (
                    401,
                    "unauthorized",
                    "redirect token is invalid".into(),
                    challenge.clone()
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn a_model_outside_the_key_access_is_403_or_429() {
        assert_eq!(model_access(ModelAccess::Allowed, "m"), Ok(()));
        assert_eq!(
            answer(&model_access(ModelAccess::Forbidden, "gpt-4").unwrap_err()),
            (
                403,
                "model_forbidden",
                "model \"gpt-4\" is not allowed for this API key".into(),
                headers(&[])
            )
        );
        assert_eq!(
            answer(&model_access(ModelAccess::NoQuotaDeclared, "gpt-4").unwrap_err()),
            (
                429,
                "rate_limit_exceeded",
                "no quota declared for model \"gpt-4\" on this API key".into(),
                headers(&[])
            )
        );
    }

    #[test]
    fn every_limit_kind_is_a_429_with_its_headers() {
        let cases = [
            (
                limit_refusal(RejectionKind::RequestRate, 0, None, Some(0)),
                "rate_limit_exceeded",
                "rate limit exceeded",
                headers(&[("x-ratelimit-remaining-requests", "0")]),
            ),
            (
                limit_refusal(RejectionKind::ModelNotInQuota, 0, None, None),
                "rate_limit_exceeded",
                "no quota declared for this model on this API key",
                headers(&[]),
            ),
            (
                limit_refusal(RejectionKind::InputTokenRate, 12, Some(1), Some(4)),
                "rate_limit_exceeded",
                "input token rate exceeded, please retry",
                headers(&[
                    ("retry-after", "1"),
                    ("x-ratelimit-remaining-requests", "4"),
                ]),
            ),
            (
                limit_refusal(RejectionKind::OutputTokenRate, 0, Some(1), None),
                "rate_limit_exceeded",
                "output token rate exceeded, please retry",
                headers(&[("retry-after", "1")]),
            ),
            (
                limit_refusal(RejectionKind::DailyTokens, 25, None, Some(9)),
                "token_limit_exceeded",
                "daily token budget exhausted",
                headers(&[
                    ("x-ratelimit-remaining-requests", "9"),
                    ("x-ratelimit-remaining-tokens", "25"),
                ]),
            ),
            (
                limit_refusal(RejectionKind::DailyTokensForMaxOutput, 40, None, None),
                "token_limit_exceeded",
                "insufficient daily token budget for requested max_tokens",
                headers(&[("x-ratelimit-remaining-tokens", "40")]),
            ),
        ];
        for (refusal, code, message, expected) in cases {
            let rejection = limit(&refusal);
            assert_eq!(
                answer(&rejection),
                (429, code, message.to_string(), expected),
                "{:?}",
                refusal.kind
            );
            assert_eq!(rejection.source, Source::Router);
            assert!(!rejection.close && !rejection.retry_after_in_body);
            // Through the quota owner's answer, the same.
            assert_eq!(quota(&QuotaRefusal::Limit(refusal)), rejection);
        }
    }

    #[test]
    fn the_quota_owner_failing_to_answer_is_a_router_failure() {
        assert_eq!(
            answer(&quota(&QuotaRefusal::MeshFull)),
            (
                503,
                "queue_full",
                "the router's internal queue is full".into(),
                headers(&[])
            )
        );
        assert_eq!(
            answer(&quota(&QuotaRefusal::Timeout)),
            (
                504,
                "request_timeout",
                "the router-side request deadline expired".into(),
                headers(&[])
            )
        );
    }

    #[test]
    fn an_output_over_the_daily_budget_has_no_tokens_left() {
        assert_eq!(
            answer(&daily_output(ModelId(1))),
            (
                429,
                "token_limit_exceeded",
                "daily token budget exhausted".into(),
                headers(&[("x-ratelimit-remaining-tokens", "0")])
            )
        );
    }

    #[test]
    fn every_route_error_has_its_answer() {
        let capacity = "server at capacity for this model, please retry";
        let cases = [
            (
                RouteError::QueueFull,
                503,
                "no_capacity",
                "every agent for this model is at capacity and its queue is full",
                headers(&[]),
            ),
            (
                RouteError::NoAgents,
                503,
                "no_agents_available",
                "all agents for this model are currently offline or unhealthy",
                headers(&[]),
            ),
            (
                RouteError::Timeout,
                504,
                "request_timeout",
                "the router-side request deadline expired",
                headers(&[]),
            ),
            (
                RouteError::MeshFull,
                503,
                "queue_full",
                "the router's internal queue is full",
                headers(&[]),
            ),
            (
                RouteError::Shed,
                429,
                "concurrency_limit_exceeded",
                "model is under high load, please retry",
                headers(&[("retry-after", "1")]),
            ),
            (
                RouteError::PoolFull,
                429,
                "concurrency_limit_exceeded",
                capacity,
                headers(&[("retry-after", "1")]),
            ),
            (
                RouteError::PoolTooSmall,
                429,
                "concurrency_limit_exceeded",
                capacity,
                headers(&[("retry-after", "1")]),
            ),
            (
                RouteError::KeyShare,
                429,
                "rate_limit_exceeded",
                "the key's share of this model's capacity is in use, please retry",
                headers(&[("retry-after", "1")]),
            ),
        ];
        for (error, status, code, message, expected) in cases {
            assert_eq!(
                answer(&route(error)),
                (status, code, message.to_string(), expected.clone()),
                "{error:?}"
            );
            if error != RouteError::PoolFull {
                // A released request is refused like any other, but for a full pool.
                assert_eq!(released(error, "m"), route(error), "{error:?}");
            }
        }
    }

    #[test]
    fn a_released_request_finding_the_pool_full_is_still_waking() {
        let rejection = released(RouteError::PoolFull, "llama");
        assert_eq!(
            answer(&rejection),
            (
                503,
                "model_waking",
                "model llama woke up but is still at capacity; retry in 30 seconds".into(),
                headers(&[("retry-after", "30")])
            )
        );
        assert!(rejection.retry_after_in_body);
    }

    #[test]
    fn every_hold_end_has_its_answer() {
        let expired = hold(HoldEnd::Expired, "llama");
        assert_eq!(
            answer(&expired),
            (
                503,
                "model_waking",
                "model llama is waking up; retry in 30 seconds".into(),
                headers(&[("retry-after", "30")])
            )
        );
        assert!(expired.retry_after_in_body);
        assert_eq!(
            answer(&hold(HoldEnd::Full, "llama")),
            (
                503,
                "model_waking",
                "model llama is waking up and too many requests are already waiting for it; retry in 30 seconds".into(),
                headers(&[("retry-after", "30")])
            )
        );
        assert_eq!(
            answer(&hold(HoldEnd::MeshFull, "llama")),
            (
                503,
                "queue_full",
                "the router's internal queue is full".into(),
                headers(&[])
            )
        );
        let ending = hold(HoldEnd::ShuttingDown, "llama");
        assert_eq!(
            answer(&ending),
            (
                503,
                "no_capacity",
                "the router is shutting down; retry on another router".into(),
                headers(&[("retry-after", "1")])
            )
        );
        assert!(ending.close);
    }

    #[test]
    fn unreadable_fields_are_request_invalid() {
        let json_error = || serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let cases = [
            (FieldsError::EmptyBody, "request body is empty".to_string()),
            (FieldsError::ModelMissing, "model field is required".into()),
            (FieldsError::ModelEmpty, "model field is empty".into()),
            (
                FieldsError::ModelTooLong,
                "model field is longer than 256 characters".into(),
            ),
            (
                FieldsError::NotAnObject,
                "request body is not a JSON object".into(),
            ),
            (
                FieldsError::MalformedJson(json_error()),
                format!("request body is not valid JSON: {}", json_error()),
            ),
            (
                FieldsError::InvalidField(json_error()),
                format!("request body has an invalid field: {}", json_error()),
            ),
        ];
        for (error, message) in cases {
            assert_eq!(
                answer(&fields(error)),
                (400, "request_invalid", message, headers(&[]))
            );
        }
    }

    #[test]
    fn provider_failures_are_backend_errors() {
        let timeout = provider(ProviderError::Timeout);
        assert_eq!(
            answer(&timeout),
            (
                502,
                "backend_error",
                "the provider did not answer before the request deadline".into(),
                headers(&[])
            )
        );
        assert_eq!(timeout.source, Source::Backend);
        let status = provider(ProviderError::Status(401));
        assert_eq!(
            (status.status, status.message.as_ref()),
            (502, "the provider refused the credentials")
        );
        let queue = provider(ProviderError::QueueFull);
        assert_eq!(
            answer(&queue),
            (
                503,
                "queue_full",
                "the router's provider fallback queue is full".into(),
                headers(&[])
            )
        );
        assert_eq!(queue.source, Source::Router);
        assert_eq!(
            answer(&provider(ProviderError::Expired)),
            (
                504,
                "request_timeout",
                "the router-side request deadline expired".into(),
                headers(&[])
            )
        );
    }

    #[test]
    fn a_401_carries_the_bearer_challenge_first() {
        let mut unauthorized = Rejection::unauthorized("invalid API key");
        unauthorized.retry_after_seconds = Some(5);
        assert_eq!(
            answer(&unauthorized).3,
            headers(&[
                ("www-authenticate", "Bearer realm=\"hivenet-router\""),
                ("retry-after", "5"),
            ])
        );
        // Every header at once fits.
        unauthorized.remaining_requests = Some(1);
        unauthorized.remaining_tokens = Some(2);
        assert_eq!(answer(&unauthorized).3.len(), HEADERS_MAX);
    }
}
