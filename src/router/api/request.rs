//! Phase 1 of a request, and what the front hands the API: the route of a method and path, the
//! body limit of a route, and the complete [`ClientRequest`] the phases read.

use std::time::Instant;

use bytes::Bytes;

use crate::router::error::Rejection;
use crate::wire::http::request::Method;
use crate::wire::http::route::Route;

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
        b"/ready" => (Route::Ready, Method::Get),
        _ => return Err(Rejection::not_found_path()),
    };
    if method == allowed || (allowed == Method::Get && method == Method::Head) {
        Ok(route)
    } else {
        Err(Rejection::method_not_allowed())
    }
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
