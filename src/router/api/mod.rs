//! The client API: which route a request takes and the phases it goes through.
//!
//! Phases, in order (see `docs/request-path.md` for each exit and its error code):
//! 1. `route` — method and path to a [`Route`] (404/405 otherwise);
//! 2. `authenticate` — the API key against the key registry (401), every route but `/health` and `/ready`;
//!    a request redirected here by a sibling site by its redirect token (`redirect`);
//! 3. to 8. — an inference request's fields, model, admission, slot, forward and settlement,
//!    one function per phase in `infer`; its admission takes the steps of its
//!    [`plan::VisitPlan`] in order (`VisitPlan::next_step`).
//!
//! Every refusal of those phases is answered through `refusal` (status, code, message and
//! headers); the response goes out through a [`sink::Sink`].

pub mod admin;
mod attempts;
pub mod authenticate;
pub mod forward;
pub mod hold;
mod infer;
pub mod plan;
pub mod redirect;
pub mod refusal;
pub mod request;
pub mod sink;

use std::rc::Rc;

use crate::router::error::Rejection;
use crate::router::metrics::ShardMetrics;
use crate::router::metrics::http_server::Endpoint;
use crate::router::shard::state::Shard;
use crate::wire::http::request::Method;
use forward::Outcome;

pub use crate::wire::http::route::Route;
use hold::HoldSink;
pub use request::{BodyLimit, ClientRequest, route};
use sink::{ClientGone, Sink};

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
        (Route::Ready, Method::Head) => 10,
        (Route::Ready, _) => 9,
        (Route::Admin, Method::Get) => 11,
        (Route::Admin, Method::Post) => 12,
        (Route::Admin, Method::Put) => 13,
        (Route::Admin, Method::Delete) => 14,
        (Route::Admin, _) => 15,
    };
    Endpoint::at(index)
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
/// and must be closed. Every request but `/health` and `/ready` leaves one audit record.
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
        // Liveness. A draining router fails it too, so load balancers take it out.
        let (status, body): (u16, &[u8]) = if shard.lifecycle.is_draining() {
            (503, b"{\"status\":\"draining\"}")
        } else {
            (200, b"{\"status\":\"ok\"}")
        };
        let answered = sink.respond(status, "application/json", &[], body).await;
        exchange.status = status;
        return answered;
    }
    if request.route == Route::Ready {
        // Readiness (`router::readiness`): the shard knows it drains before the control core's
        // flag is set, so both are asked.
        let ready = match shard.settings.readiness.check() {
            Ok(()) if shard.lifecycle.is_draining() => {
                Err(crate::router::readiness::NotReady::Draining)
            }
            checked => checked,
        };
        let (status, body) = match ready {
            Ok(()) => (200, crate::router::readiness::READY_BODY),
            Err(not_ready) => (503, not_ready.body()),
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
