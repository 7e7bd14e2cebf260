//! The client API: which route a request takes and the phases it goes through.
//!
//! Phases, in order (see `docs/request-path.md` for each exit and its error code):
//! 1. `route` — method and path to a [`Route`] (404/405 otherwise);
//! 2. `authenticate` — the API key against the key registry (401), every route but `/health`;
//! 3. `fields` — body fields (`model`, `stream`, ...) in one JSON pass (400 on bad input), then
//!    the key's model authorisation (403 model_forbidden, 429 for a strict per-model quota);
//! 4. `resolve` — model name and capability to the routing snapshot's entry (404 model_not_found);
//! 5. `quota` — the key's per-minute and daily limits on the quota owner's shard (429);
//! 6. `acquire` — an agent slot from the model's owner shard, waiting in its capacity queue
//!    (503 no_capacity / no_agents_available, 504 request_timeout);
//! 7. `forward` — the request over this shard's tunnel to the agent, the response back to the
//!    client, usage read on the way (503 agent_disconnected, 502 backend_error);
//! 8. `settle` — the slot is released when the response has fully ended (never at the headers),
//!    and one usage event is emitted.

pub mod admin;
pub mod authenticate;
pub mod forward;
pub mod hold;
pub mod redirect;
pub mod sink;

use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;

use crate::admission::occupancy::Footprint;
use crate::admission::{self, PolicyOutcome, Reason};
use crate::auth::keys::KeyRecord;
use crate::error::{Rejection, Waking};
use crate::http::fields::{FieldsError, extract_fields};
use crate::http::request::Method;
use crate::limits::RejectionKind;
use crate::limits::{Estimate, ModelContext};
use crate::metrics::ShardMetrics;
use crate::routing::Ask as RouteAsk;
use crate::shard::guards::{Pending, QuotaHold};
use crate::shard::owner::quotas::{Charge, has_token_phase};
use crate::shard::state::{Admit, HoldEnd, PoolAsk, QuotaRefusal, RouteError, Shard};
use crate::shard::tenants::{KeyLabels, Phase, UNSET};
use crate::snapshot::{Capability, ModelId};
use hold::{HoldSink, Keepalive};
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

pub use crate::ids::Dialect;

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
    pub client_id: Option<crate::hold::ClientId>,
    /// `anthropic-version` / `anthropic-beta`, forwarded for `/v1/messages`.
    pub anthropic_version: Option<Bytes>,
    pub anthropic_beta: Option<Bytes>,
    /// Credentials, as sent: `authorization` and `x-api-key`.
    pub authorization: Option<Bytes>,
    pub x_api_key: Option<Bytes>,
    pub received_at: Instant,
    /// The client's address (the audit log's `source_ip`).
    pub peer: Option<std::net::IpAddr>,
}

impl ClientRequest {
    pub fn request_id_str(&self) -> &str {
        // Always ASCII hex digits and dashes (see `audit::request_id`).
        std::str::from_utf8(&self.request_id).unwrap_or("")
    }
}

/// What the audit record of one request needs from the phases it went through.
#[derive(Debug, Default)]
pub struct RequestFacts {
    /// The authenticated key.
    pub key: Option<crate::auth::keys::KeyId>,
    /// The top-level `model`, when the body could be read (a slice of the body unless it had
    /// escapes).
    pub model: Option<Bytes>,
    /// The model it resolved to: the request then counts in its key's tenant series.
    pub model_id: Option<ModelId>,
    /// The agent that served it, or the provider marker (`provider:openai`).
    pub agent: Option<crate::routing::AgentId>,
    pub provider: Option<&'static str>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The router's error code, when the router refused or failed the request.
    pub error_code: Option<&'static str>,
}

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
pub async fn serve<S: Sink>(
    shard: &Rc<Shard>,
    request: ClientRequest,
    sink: &mut S,
) -> Result<(), ClientGone> {
    ShardMetrics::add(&shard.metrics.requests_total, 1);
    sink.set_request_id(request.request_id);
    if request.route == Route::Health {
        // A draining router fails its health check so load balancers take it out.
        return if shard.lifecycle.is_draining() {
            sink.respond(503, "application/json", &[], b"{\"status\":\"draining\"}")
                .await
        } else {
            sink.respond(200, "application/json", &[], b"{\"status\":\"ok\"}")
                .await
        };
    }
    if shard.lifecycle.is_draining() {
        return sink.reject(&Rejection::shutting_down()).await;
    }
    let _open = RequestOpen::enter(&shard.metrics);
    let keys = shard.keys();
    let mut facts = RequestFacts::default();
    let mut sink = HoldSink::new(sink, &shard.metrics);
    let served = serve_audited(shard, &request, &keys, &mut facts, &mut sink).await;
    // A client that left got no complete answer: 499, as nginx records it.
    let status = if served.is_err() { 499 } else { sink.status() };
    shard.request_finished(&request, &keys, &facts, status);
    served
}

async fn serve_audited<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    keys: &crate::auth::keys::KeyRegistry,
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
            let restricted = !matches!(key.settings.quota(), crate::auth::config::Quota::Flat(_))
                || !key.settings.allowed_models().is_empty();
            if restricted {
                let body = snapshot.models_body_for(|model| key.allows(model));
                sink.respond(200, "application/json", &[], &body).await
            } else {
                sink.respond(200, "application/json", &[], &snapshot.models_body)
                    .await
            }
        }
        _ => match infer(shard, request, key, arrival.as_ref(), facts, sink).await {
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

async fn infer<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    key: &KeyRecord,
    arrival: Option<&crate::sibling::token::RedirectClaims>,
    facts: &mut RequestFacts,
    sink: &mut HoldSink<'_, S>,
) -> Result<u16, Outcome> {
    // Phase 3: body fields, then the key's model authorisation.
    let fields = extract_fields(&request.body).map_err(fields_rejection)?;
    facts.model = Some(match &fields.model {
        std::borrow::Cow::Borrowed(model) => request.body.slice_ref(model.as_bytes()),
        std::borrow::Cow::Owned(model) => Bytes::copy_from_slice(model.as_bytes()),
    });
    if let Some(claims) = arrival {
        redirect::check_model(claims, &fields.model)?;
    }
    authenticate::authorize_model(key, &fields.model)?;
    // Phase 4: model and capability.
    let snapshot = shard.snapshot();
    let found = snapshot.lookup(&fields.model, request.route.capability());
    // Hold at zero: a model asleep here resolves through its placement, with no agent.
    // count_tokens is never held (it would count each prompt twice in the demand).
    let holdable = found
        .and_then(|model| model.hold_budget)
        .filter(|_| request.route != Route::CountTokens);
    // Cross-site redirect: a model not served here that a sibling serves goes there.
    if let Some(location) = redirect::elsewhere(
        shard,
        &snapshot,
        found,
        holdable.is_some(),
        key,
        &fields.model,
        request.route,
        arrival,
    ) {
        return redirect::answer(sink, &location).await;
    }
    let Some(model) = found else {
        return Err(Rejection::model_not_found(&fields.model).into());
    };
    if model.healthy_agents == 0 && model.hold_budget.is_some() && holdable.is_none() {
        // A count_tokens for a model asleep here fails as it did before the map placed the
        // model here.
        return Err(Rejection::model_not_found(&fields.model).into());
    }
    // From here the request counts in the key's tenant series (by `serve`, once it ends).
    facts.model_id = Some(model.id);
    let mut deadline = request.received_at + shard.settings.request_timeout;
    let estimate = estimate(shard, request, model.id, &fields);
    let images = u64::from(fields.prompt.images);
    let policy = &model.policy;
    // Admission control runs for generation only (seed: count_tokens, embeddings and rerank
    // are exempt).
    let generates = matches!(request.route, Route::ChatCompletions | Route::Messages);
    let context = ModelContext {
        model: model.id,
        // A request that may be held here is charged as if one replica served the model, so
        // a key cannot hold requests past its quota (seed, "Quota while held").
        healthy_replicas: if holdable.is_some() {
            model.healthy_agents.max(1)
        } else {
            model.healthy_agents
        },
        serverless: generates && admission::is_serverless(policy),
    };
    let share = match key.settings.max_occupancy_share() {
        Some(share) if context.serverless && policy.admit_budget_tokens > 0 => share,
        _ => 0.0,
    };
    let caps = generates && admission::caps_requests(policy);
    let pool_gates = generates && (admission::gates_pool(policy) || share > 0.0);
    // The gate order is RPM, B1, B3, B2, B4, daily. With no gate between the RPM and the token
    // phase, both run in one visit to the quota owner.
    let split = caps || pool_gates;
    // Phase 5: the key's request rate (and token phase when not split), on the quota owner.
    let first = match request.route {
        Route::ChatCompletions | Route::Messages if !split => Charge::RequestsAndTokens(estimate),
        // count_tokens, embeddings and rerank count against the request rate only.
        _ => Charge::RequestsOnly,
    };
    let mut quota = visit_quota(shard, key, context, first, deadline, sink).await?;
    quota.set_estimate(estimate.input_tokens);
    // B1: request caps.
    if caps && let Some(message) = admission::request_caps(policy, estimate.input_tokens, images) {
        shard.count_rejection(model.id, Reason::B1);
        return Err(Rejection::input_too_long(message).into());
    }
    // Hold at zero: the quota is charged; now wait for the model to wake.
    let mut hold_until = None;
    let mut pending: Option<Pending> = None;
    if let Some(budget) = holdable
        && model.healthy_agents == 0
    {
        let until = request.received_at + budget;
        pending = Some(hold(shard, request, key, model.id, &fields, until, sink).await?);
        hold_until = Some(until);
        // Released: the capacity wait is bounded by the request timeout from now.
        deadline = Instant::now() + shard.settings.request_timeout;
    }
    let released = hold_until.is_some();
    let token_phase = split && has_token_phase(key, context.serverless);
    let ask = pool_gates.then(|| PoolAsk {
        footprint: Footprint {
            input_tokens: estimate.input_tokens,
            declared_output_tokens: estimate.max_output_tokens.unwrap_or(0),
        },
        key: key.key_id,
        share,
        policy: policy.clone(),
        hold_until,
    });
    // B3, B2 and the B4 share on the model's owner; then B4's token buckets and the daily budget
    // on the quota owner; a refusal there drops the reservation, which releases it.
    // A released request reserves first, waiting up to its hold budget for room, so that its
    // capacity wait is bounded by the request timeout alone.
    let mut admit = match ask.clone() {
        None => Admit::Direct,
        Some(ask) if !token_phase && !released => Admit::Gated(ask),
        Some(ask) => {
            let wait_until = hold_until.map_or(deadline, |until| until.max(deadline));
            let reserved = sink
                .until_client_gone(shard.reserve(model, ask, wait_until))
                .await;
            match reserved {
                None => {
                    ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
                    return Err(Outcome::Gone);
                }
                Some(Ok(reservation)) => Admit::Reserved(reservation),
                Some(Err(RouteError::PoolFull)) if released => {
                    return Err(
                        Rejection::model_waking(&fields.model, Waking::StillAtCapacity).into(),
                    );
                }
                Some(Err(error)) => return Err(route_rejection(error).into()),
            }
        }
    };
    if released {
        deadline = Instant::now() + shard.settings.request_timeout;
    }
    if token_phase {
        let tokens = visit_quota(
            shard,
            key,
            context,
            Charge::TokensOnly(estimate),
            deadline,
            sink,
        )
        .await?;
        quota.absorb(tokens);
    }
    let provider = match (&policy.fallback_provider, &shard.settings.provider) {
        (Some(fallback), Some(pool)) if generates && !fields.stream => Some((fallback, pool)),
        _ => None,
    };
    // Phases 6 to 8, once per attempt: a slot from the policy's steps, the forward, the answer.
    // A refusal drops `quota`, which gives its token charges back.
    let mut attempts = Attempts::new(policy);
    // Released requests queue even beyond `--queue-depth` (the hold limits bound them).
    attempts.beyond_depth = released;
    loop {
        let acquired = sink
            .until_client_gone(shard.acquire(model, deadline, admit, attempts.ask()))
            .await;
        let slot = match acquired {
            None => {
                ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
                return Err(Outcome::Gone);
            }
            Some(Ok(slot)) => {
                // A request with a slot is no longer pending demand.
                drop(pending.take());
                shard.count_routed(key, model.id, slot.agent);
                slot
            }
            Some(Err(error)) => {
                // Local routing is exhausted: the provider, if the policy names one; else the
                // last backend failure, or why no slot was found.
                if matches!(error, RouteError::NoAgents | RouteError::QueueFull)
                    && let Some((fallback, pool)) = provider
                {
                    facts.provider = Some(fallback.engine.processed_by());
                    return by_provider(
                        shard, request, model.id, fallback, pool, quota, estimate, deadline, facts,
                        sink,
                    )
                    .await;
                }
                if generates && matches!(error, RouteError::NoAgents | RouteError::QueueFull) {
                    shard.count_policy_outcome(model.id, PolicyOutcome::Exhausted);
                }
                let rejection = attempts
                    .last_failure
                    .take()
                    .unwrap_or_else(|| route_rejection(error));
                return Err(rejection.into());
            }
        };
        let may_retry = attempts.may_retry(slot.step, provider.is_some());
        let routed = if slot.step == 0 {
            PolicyOutcome::PrimaryRouted
        } else {
            PolicyOutcome::FallbackRouted
        };
        facts.agent = Some(slot.agent);
        let forwarded = forward::forward(
            shard, request, &fields, slot, &mut quota, deadline, may_retry, facts, sink,
        )
        .await;
        match forwarded {
            Err(Outcome::Retry(failure)) => {
                ShardMetrics::add(&shard.metrics.forward_retries_total, 1);
                attempts.failed(failure);
                admit = match &ask {
                    None => Admit::Direct,
                    Some(ask) => Admit::Gated(ask.clone()),
                };
            }
            other => {
                if generates {
                    shard.count_policy_outcome(model.id, routed);
                }
                return other;
            }
        }
    }
}

/// A request's forward attempts over its policy's steps (policy reference, "Forward-attempt
/// budgets"): a failed agent is excluded for the rest of its step; `max_tries` failures in a
/// step move the request to the next step, where every agent is eligible again.
struct Attempts<'p> {
    policy: &'p crate::policy::ModelPolicy,
    start_step: u8,
    excluded: Vec<crate::routing::AgentId>,
    failures_in_step: u32,
    last_failure: Option<Rejection>,
    /// Queue beyond `--queue-depth` (a request released by a wake).
    beyond_depth: bool,
}

impl<'p> Attempts<'p> {
    fn new(policy: &'p crate::policy::ModelPolicy) -> Self {
        Attempts {
            policy,
            start_step: 0,
            excluded: Vec::new(),
            failures_in_step: 0,
            last_failure: None,
            beyond_depth: false,
        }
    }

    fn max_tries(&self, step: u8) -> u32 {
        self.policy
            .step(usize::from(step))
            .map_or(1, |step| step.max_tries.max(1))
    }

    fn ask(&self) -> RouteAsk {
        RouteAsk {
            start_step: self.start_step,
            excluded: self.excluded.clone().into_boxed_slice(),
            beyond_depth: self.beyond_depth,
        }
    }

    /// Whether a failure on `step` could still be followed by another attempt.
    fn may_retry(&self, step: u8, provider: bool) -> bool {
        let failed_here = if step == self.start_step {
            self.failures_in_step
        } else {
            0
        };
        failed_here + 1 < self.max_tries(step)
            || usize::from(step) + 1 < 1 + self.policy.fallback_chain.len()
            || provider
    }

    fn failed(&mut self, failure: forward::Failure) {
        if failure.step != self.start_step {
            // The owner moved the request on to a later step (nothing eligible before it).
            self.start_step = failure.step;
            self.excluded.clear();
            self.failures_in_step = 0;
        }
        self.failures_in_step += 1;
        if self.failures_in_step >= self.max_tries(failure.step) {
            self.start_step = failure.step.saturating_add(1);
            self.excluded.clear();
            self.failures_in_step = 0;
        } else {
            self.excluded.push(failure.agent);
        }
        self.last_failure = Some(failure.rejection);
    }
}

/// Provider fallback (seed, "Provider fallback accounting"): the request's occupancy is already
/// released (the owner gave it back with the refused slot); the RPM, ITPM and daily input charges
/// stay, whatever the provider answers; no output is charged and the estimator does not learn.
/// The provider's usage is still counted in the shard's token counters.
#[allow(clippy::too_many_arguments)]
async fn by_provider<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    model: ModelId,
    fallback: &crate::policy::ProviderFallback,
    pool: &crate::provider::ProviderPool,
    mut quota: QuotaHold,
    estimate: Estimate,
    deadline: Instant,
    facts: &mut RequestFacts,
    sink: &mut S,
) -> Result<u16, Outcome> {
    use crate::provider::{ProviderConfig, ProviderRequest};
    quota.settle(
        crate::limits::UsedTokens {
            input_tokens: estimate.input_tokens,
            output_tokens: 0,
        },
        crate::limits::Delivery::Provider,
    );
    let config = ProviderConfig {
        engine: fallback.engine,
        model: fallback.model.to_string(),
    };
    let mut call = ProviderRequest::new(
        &config,
        request.route.dialect(),
        request.body.clone(),
        deadline,
    );
    call.request_id = Some(Bytes::copy_from_slice(&request.request_id));
    match sink.until_client_gone(pool.call(call)).await {
        None => {
            ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
            Err(Outcome::Gone)
        }
        Some(Err(error)) => {
            shard.count_policy_outcome(model, PolicyOutcome::Exhausted);
            Err(Rejection::provider(error).into())
        }
        Some(Ok(answer)) => {
            shard.count_policy_outcome(model, PolicyOutcome::ProviderFallback);
            if let Some(usage) = answer.usage {
                facts.input_tokens = usage.input_tokens;
                facts.output_tokens = usage.output_tokens;
                ShardMetrics::add(&shard.metrics.input_tokens_total, usage.input_tokens);
                ShardMetrics::add(&shard.metrics.output_tokens_total, usage.output_tokens);
                // Recorded under the model the client asked for (seed, "Provider fallback
                // accounting").
                shard.count_tenant_tokens(
                    quota.key,
                    model,
                    None,
                    usage.input_tokens,
                    usage.output_tokens,
                );
            }
            sink.respond(200, "application/json", &[], &answer.body)
                .await
                .map(|()| 200)
                .map_err(|_| Outcome::Gone)
        }
    }
}

/// One visit to the key's quota owner, answered in the error envelope when refused.
async fn visit_quota<S: Sink>(
    shard: &Rc<Shard>,
    key: &KeyRecord,
    context: ModelContext,
    charge: Charge,
    deadline: Instant,
    sink: &mut S,
) -> Result<QuotaHold, Outcome> {
    let admitted = sink
        .until_client_gone(shard.admit_quota(key, context, charge, deadline))
        .await;
    match admitted {
        None => {
            ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
            Err(Outcome::Gone)
        }
        Some(Ok(hold)) => Ok(hold),
        Some(Err(QuotaRefusal::Limit(refusal))) => {
            if let Some(reason) = Reason::of_quota(refusal.kind) {
                shard.count_rejection(context.model, reason);
            }
            let labels = || Some(KeyLabels::of(key));
            match refusal.kind {
                RejectionKind::RequestRate => {
                    shard.tenants.borrow_mut().rate_limited(key.key_id, labels);
                }
                RejectionKind::DailyTokens | RejectionKind::DailyTokensForMaxOutput => {
                    shard.tenants.borrow_mut().token_limited(
                        key.key_id,
                        Phase::Input,
                        UNSET.into(),
                        labels,
                    );
                }
                _ => {}
            }
            Err(Rejection::quota(&refusal).into())
        }
        Some(Err(QuotaRefusal::MeshFull)) => Err(Rejection::queue_full().into()),
        Some(Err(QuotaRefusal::Timeout)) => Err(Rejection::request_timeout().into()),
    }
}

fn route_rejection(error: RouteError) -> Rejection {
    match error {
        RouteError::QueueFull => Rejection::no_capacity(),
        RouteError::NoAgents => Rejection::no_agents_available(),
        RouteError::Timeout => Rejection::request_timeout(),
        RouteError::MeshFull => Rejection::queue_full(),
        RouteError::Shed => Rejection::pool_shed(),
        RouteError::PoolFull => Rejection::occupancy_full(),
        RouteError::KeyShare => Rejection::key_occupancy_share(),
        RouteError::PoolTooSmall => Rejection::occupancy_full(),
    }
}

/// Holds a request for a model asleep on this site until an agent for it registers (seed
/// `hold-at-zero.md`, steps 5 to 7), sending keepalives meanwhile. `Ok`: the model woke; the
/// request continues, still counted in the pending demand until it gets a slot.
async fn hold<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    key: &KeyRecord,
    model: ModelId,
    fields: &crate::http::fields::RequestFields<'_>,
    until: Instant,
    sink: &mut HoldSink<'_, S>,
) -> Result<Pending, Outcome> {
    use crate::hold::Outcome as Held;
    let settings = &shard.settings.hold;
    sink.arm(Keepalive {
        interval: settings.keepalive,
        stream: fields.stream,
        dialect: request.route.dialect(),
    });
    // Requests without an API key have only the per-model and total limits.
    let keyed = !matches!(key.source, crate::auth::keys::KeySource::Anonymous);
    let started = Instant::now();
    let held = sink
        .until_client_gone(shard.hold(model, keyed.then_some(key.key_id), request.client_id, until))
        .await;
    let holds = &shard.metrics.holds;
    match held {
        None => {
            holds.ended(Held::Cancelled, Some(started.elapsed()));
            ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
            Err(Outcome::Gone)
        }
        Some(Ok(pending)) => {
            holds.ended(Held::Released, Some(started.elapsed()));
            Ok(pending)
        }
        Some(Err(HoldEnd::Full)) => {
            holds.ended(Held::Full, None);
            Err(Rejection::model_waking(&fields.model, Waking::Full).into())
        }
        Some(Err(HoldEnd::Expired)) => {
            holds.ended(Held::Expired, Some(started.elapsed()));
            Err(Rejection::model_waking(&fields.model, Waking::Expired).into())
        }
        Some(Err(HoldEnd::MeshFull)) => Err(Rejection::queue_full().into()),
        Some(Err(HoldEnd::ShuttingDown)) => Err(Rejection::shutting_down().into()),
    }
}

/// The request's one input estimate (seed, "One input estimate") and its declared maximum output
/// (`max_completion_tokens` before `max_tokens`; negative values count as undeclared). Chat and
/// messages use this shard's learned ratio for the model over the prompt's text, system, tools
/// and per-message overhead; the other routes, which charge no tokens, the starting ratio over
/// the body.
fn estimate(
    shard: &Shard,
    request: &ClientRequest,
    model: ModelId,
    fields: &crate::http::fields::RequestFields<'_>,
) -> Estimate {
    let declared = fields.max_completion_tokens.or(fields.max_tokens);
    let input_tokens = match request.route {
        Route::ChatCompletions | Route::Messages => {
            shard.estimator.borrow().estimate(model, &fields.prompt)
        }
        _ => (request.body.len() as u64 * 10).div_ceil(32),
    };
    Estimate {
        input_tokens,
        max_output_tokens: declared.and_then(|tokens| u64::try_from(tokens).ok()),
    }
}

fn fields_rejection(error: FieldsError) -> Rejection {
    match error {
        FieldsError::EmptyBody => Rejection::request_invalid("request body is empty"),
        FieldsError::ModelMissing => Rejection::request_invalid("model field is required"),
        FieldsError::ModelEmpty => Rejection::request_invalid("model field is empty"),
        FieldsError::ModelTooLong => {
            Rejection::request_invalid("model field is longer than 256 characters")
        }
        FieldsError::NotAnObject => Rejection::request_invalid("request body is not a JSON object"),
        other => Rejection::request_invalid(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(agent: u32, step: u8) -> forward::Failure {
        forward::Failure {
            agent: crate::routing::AgentId(agent),
            step,
            rejection: Rejection::agent_disconnected(),
        }
    }

    #[test]
    fn attempts_exclude_failed_agents_then_advance_steps() {
        let compiled = crate::policy::compile_text(
            "test.yaml",
            "models: [m]\nrouting_policy:\n  strategy: least-loaded\n  max_tries: 2\nfallback_chain:\n  - strategy: least-loaded\n    max_tries: 1\n",
            crate::policy::Role::Named("test"),
            &crate::policy::PolicyContext::default(),
        )
        .unwrap();
        let mut attempts = Attempts::new(&compiled.policy);
        assert!(attempts.may_retry(0, false));
        attempts.failed(failure(7, 0));
        assert_eq!(attempts.ask().start_step, 0);
        assert_eq!(&*attempts.ask().excluded, &[crate::routing::AgentId(7)]);
        attempts.failed(failure(8, 0));
        // Two failures used step 0's budget: step 1, every agent eligible again.
        assert_eq!(attempts.ask().start_step, 1);
        assert!(attempts.ask().excluded.is_empty());
        // Step 1 allows one try and is the last step: no retry unless a provider follows.
        assert!(!attempts.may_retry(1, false));
        assert!(attempts.may_retry(1, true));
        attempts.failed(failure(7, 1));
        assert_eq!(attempts.ask().start_step, 2);
        assert!(attempts.last_failure.is_some());
    }

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
