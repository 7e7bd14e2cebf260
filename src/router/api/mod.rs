//! The client API: which route a request takes and the phases it goes through.
//!
//! Phases, in order (see `docs/request-path.md` for each exit and its error code):
//! 1. `route` — method and path to a [`Route`] (404/405 otherwise);
//! 2. `authenticate` — the API key against the key registry (401), every route but `/health`;
//!    a request redirected here by a sibling site by its redirect token (`redirect`);
//! 3. to 8. — an inference request's fields, model, admission, slot, forward and settlement,
//!    one function per phase in `infer`; the owners its admission visits are its
//!    [`plan::VisitPlan`], decided once.
//!
//! Every refusal of those phases is answered through `refusal` (status, code, message and
//! headers); the response goes out through a [`sink::Sink`].

pub mod admin;
pub mod authenticate;
pub mod forward;
pub mod hold;
mod infer;
pub mod plan;
pub mod redirect;
pub mod refusal;
pub mod sink;

use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;

use crate::logic::snapshot::Capability;
use crate::router::error::Rejection;
use crate::router::metrics::ShardMetrics;
use crate::router::metrics::http_server::Endpoint;
use crate::router::shard::state::Shard;
use crate::wire::http::request::Method;
use hold::HoldSink;
use sink::{ClientGone, Sink};

/// The routes the router serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    ChatCompletions,
    Messages,
    CountTokens,
    Embeddings,
    Rerank,
    Models,
    Health,
    /// `/admin/*`: served by the control core, behind admin authentication.
    Admin,
}

pub use crate::base::ids::Dialect;

impl Route {
    pub fn capability(self) -> Capability {
        match self {
            Route::Embeddings => Capability::Embedding,
            Route::Rerank => Capability::Reranker,
            _ => Capability::Llm,
        }
    }

    pub fn dialect(self) -> Dialect {
        match self {
            Route::Messages | Route::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    pub fn upstream_path(self) -> &'static str {
        match self {
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Messages => "/v1/messages",
            Route::CountTokens => "/v1/messages/count_tokens",
            Route::Embeddings => "/v1/embeddings",
            Route::Rerank => "/v1/rerank",
            Route::Models => "/v1/models",
            Route::Health => "/health",
            Route::Admin => "/admin",
        }
    }
}

/// The largest request body the front reads for a route, and how it refuses a larger one.
/// `HIVENET_ROUTER_MAX_REQUEST_BYTES` bounds the inference API; the admin API has route-specific
/// limits of its own, separate from it (admin reference, "Administration request-body limits"),
/// which its handlers enforce with their own answer. So an admin body is read up to the largest
/// of them, [`ADMIN_BODY_BYTES_MAX`], whatever `HIVENET_ROUTER_MAX_REQUEST_BYTES` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimit {
    /// `None`: no limit (`HIVENET_ROUTER_MAX_REQUEST_BYTES=0`, inference routes only).
    pub max_bytes: Option<usize>,
    admin: bool,
}

impl BodyLimit {
    /// The limit of `route`, given `HIVENET_ROUTER_MAX_REQUEST_BYTES` (`None`: unlimited).
    pub fn of(route: Route, max_request_bytes: Option<usize>) -> BodyLimit {
        match route {
            Route::Admin => BodyLimit {
                max_bytes: Some(ADMIN_BODY_BYTES_MAX),
                admin: true,
            },
            _ => BodyLimit {
                max_bytes: max_request_bytes,
                admin: false,
            },
        }
    }

    pub fn exceeded_by(self, bytes: u64) -> bool {
        self.max_bytes.is_some_and(|max| bytes > max as u64)
    }

    /// The 413 for a body over the limit, naming the limit it passed.
    pub fn refusal(self) -> Rejection {
        if self.admin {
            Rejection::admin_payload_too_large(ADMIN_BODY_BYTES_MAX)
        } else {
            Rejection::payload_too_large()
        }
    }
}

/// The largest admin body: `POST /admin/api-keys/replace`'s limit.
pub const ADMIN_BODY_BYTES_MAX: usize = crate::logic::auth::dynamic::REPLACE_BODY_BYTES_MAX;

/// Phase 1: method and path to a route.
pub fn route(method: Method, path: &[u8]) -> Result<Route, Rejection> {
    if path.starts_with(b"/admin/") {
        return Ok(Route::Admin);
    }
    let (route, allowed) = match path {
        b"/v1/chat/completions" => (Route::ChatCompletions, Method::Post),
        b"/v1/messages" => (Route::Messages, Method::Post),
        b"/v1/messages/count_tokens" => (Route::CountTokens, Method::Post),
        b"/v1/embeddings" => (Route::Embeddings, Method::Post),
        b"/v1/rerank" => (Route::Rerank, Method::Post),
        b"/v1/models" => (Route::Models, Method::Get),
        b"/health" => (Route::Health, Method::Get),
        _ => return Err(Rejection::not_found_path()),
    };
    if method == allowed || (allowed == Method::Get && method == Method::Head) {
        Ok(route)
    } else {
        Err(Rejection::method_not_allowed())
    }
}

/// The `(method, route)` series of `http_server_*` a routed request counts in
/// ([`crate::router::metrics::http_server::ENDPOINTS`]).
fn endpoint(route: Route, method: Method) -> Endpoint {
    let index = match (route, method) {
        (Route::ChatCompletions, _) => 0,
        (Route::Messages, _) => 1,
        (Route::CountTokens, _) => 2,
        (Route::Embeddings, _) => 3,
        (Route::Rerank, _) => 4,
        (Route::Models, Method::Head) => 6,
        (Route::Models, _) => 5,
        (Route::Health, Method::Head) => 8,
        (Route::Health, _) => 7,
        (Route::Admin, Method::Get) => 9,
        (Route::Admin, Method::Post) => 10,
        (Route::Admin, Method::Put) => 11,
        (Route::Admin, Method::Delete) => 12,
        (Route::Admin, _) => 13,
    };
    Endpoint::at(index)
}

/// A complete client request, as the connection read it.
pub struct ClientRequest {
    pub route: Route,
    pub method: Method,
    /// The request target as sent (path and query), for routes that read them (`/admin/*`).
    pub target: Bytes,
    pub body: Bytes,
    /// The request's ID: the client's `X-Request-ID` when it is a UUID, else a new UUID v4
    /// (`audit::request_id`). Returned to the client, forwarded to the agent, audited.
    pub request_id: [u8; 36],
    /// The client's own request ID (`X-Client-Request-ID`, else `X-Request-ID`) when it is a
    /// UUID: hold at zero counts a request and its retries once.
    pub client_id: Option<crate::logic::hold::ClientId>,
    /// `anthropic-version` / `anthropic-beta`, forwarded for `/v1/messages`.
    pub anthropic_version: Option<Bytes>,
    pub anthropic_beta: Option<Bytes>,
    /// Credentials, as sent: `authorization` and `x-api-key`.
    pub authorization: Option<Bytes>,
    pub x_api_key: Option<Bytes>,
    pub received_at: Instant,
    /// The client's address (the audit log's `source_ip`).
    pub peer: Option<std::net::IpAddr>,
    /// The router's span for this request, continuing the client's `traceparent`; `None` when
    /// tracing is off. Its context goes to the agent, the response and the audit record. Boxed:
    /// a request moves between the connection's tasks, and tracing off keeps it one word.
    pub span: Option<Box<crate::net::telemetry::StartedSpan>>,
}

impl ClientRequest {
    pub fn request_id_str(&self) -> &str {
        // Always ASCII hex digits and dashes (see `audit::request_id`).
        std::str::from_utf8(&self.request_id).unwrap_or("")
    }
}

pub use crate::router::accounting::RequestFacts;

/// Counts a request from its head to its last byte (`requests_open`: what a drain waits for).
struct RequestOpen<'m>(&'m ShardMetrics);

impl<'m> RequestOpen<'m> {
    fn enter(metrics: &'m ShardMetrics) -> RequestOpen<'m> {
        ShardMetrics::gauge(&metrics.requests_open, 1);
        RequestOpen(metrics)
    }
}

impl Drop for RequestOpen<'_> {
    fn drop(&mut self) {
        ShardMetrics::gauge(&self.0.requests_open, -1);
    }
}

/// Serves one request to completion. `Err(ClientGone)` means the client connection is unusable
/// and must be closed. Every request but `/health` leaves one audit record.
/// `request` is borrowed, not moved: an `async fn` keeps a moved argument twice in its future
/// (as argument and as local), and this future is held by every connection.
pub async fn serve<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    sink: &mut S,
) -> Result<(), ClientGone> {
    ShardMetrics::add(&shard.metrics.requests_total, 1);
    sink.set_request_id(request.request_id);
    let mut exchange = shard
        .metrics
        .http_server
        .begin(endpoint(request.route, request.method), request.received_at);
    if request.route == Route::Health {
        // A draining router fails its health check so load balancers take it out.
        let (status, body): (u16, &[u8]) = if shard.lifecycle.is_draining() {
            (503, b"{\"status\":\"draining\"}")
        } else {
            (200, b"{\"status\":\"ok\"}")
        };
        let answered = sink.respond(status, "application/json", &[], body).await;
        exchange.status = status;
        return answered;
    }
    if shard.lifecycle.is_draining() {
        let rejection = Rejection::shutting_down();
        let answered = sink.reject(&rejection).await;
        exchange.status = rejection.status;
        return answered;
    }
    let _open = RequestOpen::enter(&shard.metrics);
    // `/health` is not traced: the response names the request's span only when there is one.
    if let Some(span) = &request.span {
        sink.set_traceparent(Some(span.context.traceparent()));
    }
    let keys = shard.keys();
    let mut facts = RequestFacts::default();
    let mut sink = HoldSink::new(sink, &shard.metrics);
    let served = serve_audited(shard, request, &keys, &mut facts, &mut sink).await;
    // A client that left got no complete answer: 499, as nginx records it.
    let status = if served.is_err() { 499 } else { sink.status() };
    exchange.status = status;
    let arrival = crate::router::accounting::Arrival {
        request_id: request.request_id_str(),
        peer: request.peer,
        received_at: request.received_at,
        trace: request.span.as_ref().map(|span| span.context),
    };
    shard
        .accounting
        .request_finished(arrival, &keys, &facts, status);
    if let Some(span) = &request.span {
        shard
            .accounting
            .finish_span(span, request.route, &request.request_id, &facts, status);
    }
    served
}

async fn serve_audited<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    keys: &crate::logic::auth::keys::KeyRegistry,
    facts: &mut RequestFacts,
    sink: &mut HoldSink<'_, S>,
) -> Result<(), ClientGone> {
    if request.route == Route::Admin {
        return admin::serve(shard, request, sink).await;
    }
    let now_unix_ms = authenticate::now_unix_ms();
    // A request redirected here by a sibling site is authenticated by its redirect token.
    let authenticated = match (
        redirect::arriving_token(shard, request),
        &shard.settings.site,
    ) {
        (Some(token), Some(site)) => {
            let spent = sink
                .until_client_gone(redirect::authenticate(
                    shard,
                    site,
                    keys,
                    token,
                    now_unix_ms,
                ))
                .await;
            match spent {
                None => return Err(ClientGone),
                Some(result) => result.map(|(key, claims)| (key, Some(claims))),
            }
        }
        _ => authenticate::authenticate(keys, request, now_unix_ms).map(|key| (key, None)),
    };
    let (key, arrival) = match authenticated {
        Ok(authenticated) => authenticated,
        Err(rejection) => {
            facts.error_code = Some(rejection.code);
            return sink.reject(&rejection).await;
        }
    };
    facts.key = Some(key.key_id);
    match request.route {
        Route::Models => {
            let snapshot = shard.snapshot();
            let restricted = !matches!(
                key.settings.quota(),
                crate::logic::auth::config::Quota::Flat(_)
            ) || !key.settings.allowed_models().is_empty();
            if restricted {
                let body = snapshot.models_body_for(|model| key.allows(model));
                sink.respond(200, "application/json", &[], &body).await
            } else {
                sink.respond(200, "application/json", &[], &snapshot.models_body)
                    .await
            }
        }
        _ => match infer::infer(shard, request, key, arrival.as_ref(), facts, sink).await {
            Ok(_status) => Ok(()),
            Err(Outcome::Gone) => Err(ClientGone),
            Err(Outcome::Rejected(rejection))
            | Err(Outcome::Retry(forward::Failure { rejection, .. })) => {
                facts.error_code = Some(rejection.code);
                sink.reject(&rejection).await
            }
        },
    }
}

/// How an inference request ended when it did not end well.
pub enum Outcome {
    /// Nothing has been sent to the client yet: answer with this.
    Rejected(Rejection),
    /// A forward failed before anything was sent to the client, and another attempt may serve
    /// it (the caller decides; without one, the failure's rejection is the answer).
    Retry(forward::Failure),
    /// The client is gone (or its connection broke mid-response).
    Gone,
}

impl From<Rejection> for Outcome {
    fn from(rejection: Rejection) -> Outcome {
        Outcome::Rejected(rejection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_methods() {
        assert_eq!(
            route(Method::Post, b"/v1/chat/completions"),
            Ok(Route::ChatCompletions)
        );
        assert_eq!(route(Method::Get, b"/v1/models"), Ok(Route::Models));
        assert_eq!(
            route(Method::Get, b"/v1/chat/completions")
                .unwrap_err()
                .status,
            405
        );
        assert_eq!(
            route(Method::Post, b"/v1/responses").unwrap_err().status,
            404
        );
    }
}
