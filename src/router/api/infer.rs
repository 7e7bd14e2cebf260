//! An inference request's phases after authentication, one function each, in the order of
//! `docs/request-path.md`'s table: fields (3), resolve (4) and redirect (4b), quota RPM (5),
//! B1 request caps (5a), hold at zero (5h), pool gates (5b), token phase (5d), acquire (6),
//! provider fallback (6b), forward and settle (7, 8; `api::forward`).
//!
//! Which owners the admission phases visit is decided once, before the first of them, by the
//! request's [`VisitPlan`]; each phase does its part of the plan and nothing when the plan has
//! none for it. The phases from the quota visit on share one per-request context,
//! [`Inference`]; what one phase hands the next — the quota charge ([`QuotaCharge`]), the hold
//! book entry ([`Pending`]), the reservation (inside [`Admit`]) — is passed by value, so
//! dropping it on an early exit gives it back.
//!
//! Error handling: every refusal is answered through `api::refusal`; a phase counts it (the
//! rejection and tenant counters) where it happens. A client that leaves while a phase waits
//! ends the request with [`Outcome::Gone`], counted once in `client_disconnects_total`.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::logic::admission::occupancy::Footprint;
use crate::logic::admission::{self, PolicyOutcome, Reason};
use crate::logic::auth::keys::KeyRecord;
use crate::logic::limits::{Estimate, ModelContext, RejectionKind};
use crate::logic::routing::prefix::chain::Chain;
use crate::logic::sibling::token::RedirectClaims;
use crate::logic::snapshot::{ModelEntry, RoutingSnapshot};
use crate::router::accounting::RequestFacts;
use crate::router::accounting::tenants::{KeyLabels, Phase, UNSET};
use crate::router::api::attempts::{self, Attempts};
use crate::router::api::forward::Outcome;
use crate::router::api::hold::{HoldSink, Keepalive};
use crate::router::api::plan::{Place, RateCharge, SlotAdmit, Step, VisitPlan};
use crate::router::api::request::ClientRequest;
use crate::router::api::sink::Sink;
use crate::router::api::{authenticate, forward, plan, redirect, refusal};
use crate::router::error::Rejection;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::guards::HoldEnd;
use crate::router::shard::guards::{Pending, QuotaCharge, Reservation, Slot};
use crate::router::shard::owner::quotas::Charge;
use crate::router::shard::state::Shard;
use crate::router::shard::visit::{Admit, PoolAsk, QuotaRefusal, RouteError};
use crate::wire::http::fields::{RequestFields, extract_fields};
use crate::wire::http::prompt_parts::PromptParts;
use crate::wire::http::route::Route;

/// Phases 3 to 8 of one inference request; reads like the table of `docs/request-path.md`.
pub async fn infer<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    key: &KeyRecord,
    arrival: Option<&RedirectClaims>,
    facts: &mut RequestFacts,
    sink: &mut HoldSink<'_, S>,
) -> Result<u16, Outcome> {
    let fields = fields(request, key, arrival, facts)?;
    let snapshot = shard.snapshot();
    let model = match resolve(shard, &snapshot, request, key, &fields, arrival)? {
        Resolved::Here(model) => model,
        Resolved::Elsewhere(location) => return redirect::answer(sink, &location).await,
    };
    // From here the request counts in the key's tenant series (by `serve`, once it ends).
    facts.model_id = Some(model.id);
    let plan = VisitPlan::of(
        request.route,
        key,
        model,
        fields.stream,
        shard.settings.provider.is_some(),
    );
    let mut inference = Inference::new(shard, request, key, &fields, model, plan);
    // The admission phases take their steps from the plan (`VisitPlan::next_step`), in the
    // order of its places, each where the plan has it: an asynchronous phase's future is built
    // only when the plan has a visit for it (even one with nothing to do would cost the copy of
    // its future on every request). Written out in place order rather than as a loop, so the
    // charges and the hold entry stay where they are made. The plan is read from `inference`
    // from here on (a copy of it kept across the waits would widen them).
    let mut place = Place::START;
    let mut step = inference.plan.next_step(&mut place);
    let mut quota = match step {
        Some(Step::Quota(rate)) => {
            let charged = inference.quota_rate(rate, sink).await?;
            if rate == RateCharge::Ahead && !charged.charged_tokens() {
                // The key had no room for the token phase ahead: the rest in the gate order,
                // where the token phase is refused in its place.
                inference.plan = inference.plan.in_order();
            }
            step = inference.plan.next_step(&mut place);
            charged
        }
        _ => inference.unlimited(),
    };
    if step == Some(Step::RequestCaps) {
        inference.request_caps()?;
        step = inference.plan.next_step(&mut place);
    }
    if step == Some(Step::Tokens) {
        inference.tokens(&mut quota, sink).await?;
        step = inference.plan.next_step(&mut place);
    }
    let pending = match step {
        Some(Step::Hold) => {
            let pending = inference.hold(sink).await?;
            step = inference.plan.next_step(&mut place);
            pending
        }
        _ => None,
    };
    let reserved = match step {
        Some(Step::Reserve) => {
            let reservation = inference.reserve(sink).await?;
            step = inference.plan.next_step(&mut place);
            Some(reservation)
        }
        _ => None,
    };
    if step == Some(Step::Tokens) {
        inference.tokens(&mut quota, sink).await?;
        step = inference.plan.next_step(&mut place);
    }
    let admit = match (step, reserved) {
        (Some(Step::Slot(SlotAdmit::Reserved)), Some(reservation)) => Admit::Reserved(reservation),
        (Some(Step::Slot(slot)), None) => inference.admit_with_slot(slot),
        (step, _) => unreachable!("{step:?} where the plan's slot comes"),
    };
    inference.attempts(admit, quota, pending, facts, sink).await
}

/// Phase 3: the body's fields in one JSON pass, an arriving redirect token's model, then the
/// key's model authorisation.
fn fields<'r>(
    request: &'r ClientRequest,
    key: &KeyRecord,
    arrival: Option<&RedirectClaims>,
    facts: &mut RequestFacts,
) -> Result<RequestFields<'r>, Outcome> {
    let fields = extract_fields(&request.body).map_err(refusal::fields)?;
    facts.model = Some(match &fields.model {
        std::borrow::Cow::Borrowed(model) => request.body.slice_ref(model.as_bytes()),
        std::borrow::Cow::Owned(model) => Bytes::copy_from_slice(model.as_bytes()),
    });
    if let Some(claims) = arrival {
        redirect::check_model(claims, &fields.model)?;
    }
    authenticate::authorize_model(key, &fields.model)?;
    Ok(fields)
}

/// Where phase 4 found the model.
enum Resolved<'s> {
    /// Served here (or held here at zero): its routing entry.
    Here(&'s ModelEntry),
    /// Not served here, served by a sibling site: the `Location` of the `307` (phase 4b).
    Elsewhere(String),
}

/// Phases 4 and 4b: the model name and the route's capability to the routing snapshot's entry;
/// a model with no healthy agent here that a sibling serves goes there.
fn resolve<'s>(
    shard: &Shard,
    snapshot: &'s RoutingSnapshot,
    request: &ClientRequest,
    key: &KeyRecord,
    fields: &RequestFields<'_>,
    arrival: Option<&RedirectClaims>,
) -> Result<Resolved<'s>, Outcome> {
    let found = snapshot.lookup(&fields.model, request.route.capability());
    // Hold at zero: a model asleep here resolves through its placement, with no agent.
    let holdable = found.and_then(|model| plan::hold_budget(request.route, model));
    if let Some(location) = redirect::elsewhere(
        shard,
        snapshot,
        found,
        holdable.is_some(),
        key,
        &fields.model,
        request.route,
        arrival,
    ) {
        return Ok(Resolved::Elsewhere(location));
    }
    let Some(model) = found else {
        return Err(Rejection::model_not_found(&fields.model).into());
    };
    if model.healthy_agents == 0 && model.hold_budget.is_some() && holdable.is_none() {
        // A count_tokens for a model asleep here fails as it did before the map placed the
        // model here.
        return Err(Rejection::model_not_found(&fields.model).into());
    }
    Ok(Resolved::Here(model))
}

/// The one per-request context of the admission phases and the attempts after them.
struct Inference<'r> {
    shard: &'r Rc<Shard>,
    request: &'r ClientRequest,
    key: &'r KeyRecord,
    fields: &'r RequestFields<'r>,
    model: &'r ModelEntry,
    plan: VisitPlan,
    /// The request's one input estimate and declared output (seed, "One input estimate").
    estimate: Estimate,
    /// The model as the quota owner sees it.
    context: ModelContext,
    /// Every wait ends by then: the request timeout from arrival, restarted when a wake
    /// releases the request (phase 5h) and again once it has room in the pool (phase 5b).
    deadline: Instant,
    /// When the hold budget ends, once the request was held (phase 5h).
    hold_until: Option<Instant>,
}

impl<'r> Inference<'r> {
    fn new(
        shard: &'r Rc<Shard>,
        request: &'r ClientRequest,
        key: &'r KeyRecord,
        fields: &'r RequestFields<'r>,
        model: &'r ModelEntry,
        plan: VisitPlan,
    ) -> Self {
        let context = ModelContext {
            model: model.id,
            // A request held here is charged as if one replica served the model, so a key
            // cannot hold requests past its quota (seed, "Quota while held").
            healthy_replicas: if plan.holds() {
                1
            } else {
                model.healthy_agents
            },
            serverless: plan.serverless,
        };
        Inference {
            shard,
            request,
            key,
            fields,
            model,
            plan,
            estimate: estimate(request, model, fields),
            context,
            deadline: request.received_at + shard.settings.request_timeout,
            hold_until: None,
        }
    }

    /// Phase 5: the key's request rate on its quota owner, with the token phase in the same
    /// visit when the plan has no gate between them.
    async fn quota_rate<S: Sink>(
        &self,
        rate: RateCharge,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<QuotaCharge, Outcome> {
        let charge = match rate {
            RateCharge::Requests => Charge::RequestsOnly,
            RateCharge::RequestsAndTokens => Charge::RequestsAndTokens(self.estimate),
            RateCharge::Ahead => Charge::Ahead(self.estimate),
        };
        let mut quota = self.visit_quota(charge, sink).await?;
        quota.set_estimate(self.estimate.input_tokens);
        Ok(quota)
    }

    /// Phase 5 for a key with no limit at all (the plan has no quota visit): nothing to charge
    /// or settle.
    fn unlimited(&self) -> QuotaCharge {
        let mut quota = self.shard.unlimited_quota(self.key);
        quota.set_estimate(self.estimate.input_tokens);
        quota
    }

    /// Phase 5a: B1, the policy's caps on the input estimate and the image count, on this
    /// shard.
    fn request_caps(&self) -> Result<(), Outcome> {
        let images = u64::from(self.fields.prompt.images);
        match admission::request_caps(&self.model.policy, self.estimate.input_tokens, images) {
            None => Ok(()),
            Some(message) => {
                self.shard.count_rejection(self.model.id, Reason::B1);
                Err(Rejection::input_too_long(message).into())
            }
        }
    }

    /// Phase 5h: holds a request for a model asleep on this site until an agent for it
    /// registers (seed `hold-at-zero.md`, steps 5 to 7), sending keepalives meanwhile. The whole
    /// quota (rate, token buckets, daily budget) is already charged (step 4). `Some`: the model
    /// woke; the request continues, still counted in the pending demand until it gets a slot.
    async fn hold<S: Sink>(
        &mut self,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<Option<Pending>, Outcome> {
        use crate::logic::hold::HoldEnded as Held;
        let Some(budget) = self.plan.hold_budget else {
            return Ok(None);
        };
        let until = self.request.received_at + budget;
        let shard = self.shard;
        sink.arm(Keepalive {
            interval: shard.settings.hold.keepalive,
            stream: self.fields.stream,
            dialect: self.request.route.dialect(),
        });
        // Requests without an API key have only the per-model and total limits.
        let keyed = !matches!(
            self.key.source,
            crate::logic::auth::keys::KeySource::Anonymous
        );
        let started = Instant::now();
        let held = sink
            .until_client_gone(shard.hold(
                self.model.id,
                keyed.then_some(self.key.key_id),
                self.request.client_id,
                until,
            ))
            .await;
        let holds = &shard.metrics.holds;
        let pending = match held {
            None => {
                holds.ended(Held::Cancelled, Some(started.elapsed()));
                return Err(self.client_left());
            }
            Some(Ok(pending)) => {
                holds.ended(Held::Released, Some(started.elapsed()));
                pending
            }
            Some(Err(end)) => {
                match end {
                    HoldEnd::Full => holds.ended(Held::Full, None),
                    HoldEnd::Expired => {
                        holds.ended(Held::Expired, Some(started.elapsed()));
                    }
                    _ => {}
                }
                return Err(refusal::hold(end, &self.fields.model).into());
            }
        };
        self.hold_until = Some(until);
        // Released: the capacity wait is bounded by the request timeout from now.
        self.restart_deadline();
        Ok(Some(pending))
    }

    /// Phase 5b when the gates run with the slot (or there is none): how the slot visit is
    /// admitted. (A plan that reserves goes through [`Inference::reserve`]; were it asked here,
    /// its gates would run with the slot, as on a retry.)
    fn admit_with_slot(&mut self, slot: SlotAdmit) -> Admit {
        let admit = match slot {
            SlotAdmit::Direct => Admit::Direct,
            SlotAdmit::Gated | SlotAdmit::Reserved => Admit::Gated(self.pool_ask(false)),
            SlotAdmit::Ahead => Admit::Gated(self.pool_ask(true)),
        };
        if self.plan.holds() {
            self.restart_deadline();
        }
        admit
    }

    /// Phase 5b with a visit of its own: B3, B2 and the B4 share on the model's owner reserve
    /// occupancy now (a request a wake released waits for room up to its hold budget, so that
    /// its capacity wait is bounded by the request timeout alone).
    async fn reserve<S: Sink>(
        &mut self,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<Reservation, Outcome> {
        let wait_until = self
            .hold_until
            .map_or(self.deadline, |until| until.max(self.deadline));
        let reserved = sink
            .until_client_gone(
                self.shard
                    .reserve(self.model, self.pool_ask(false), wait_until),
            )
            .await;
        let reservation = match reserved {
            None => return Err(self.client_left()),
            Some(Ok(reservation)) => reservation,
            Some(Err(error)) if self.plan.holds() => {
                return Err(refusal::released(error, &self.fields.model).into());
            }
            Some(Err(error)) => return Err(refusal::route(error).into()),
        };
        if self.plan.holds() {
            self.restart_deadline();
        }
        Ok(reservation)
    }

    /// Phase 5d: B4's token buckets and the daily budget on the quota owner, when the plan
    /// split them from the request rate: after the reservation, or before the hold for a
    /// request that may be held. A refusal drops the reservation, which releases it.
    async fn tokens<S: Sink>(
        &self,
        quota: &mut QuotaCharge,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<(), Outcome> {
        let tokens = self
            .visit_quota(Charge::TokensOnly(self.estimate), sink)
            .await?;
        quota.absorb(tokens);
        Ok(())
    }

    /// Phases 6 to 8, once per attempt: a slot from the policy's steps, the forward, the
    /// answer; 6b when local routing is exhausted. A refusal drops `quota`, which gives its
    /// token charges back.
    async fn attempts<S: Sink>(
        &mut self,
        first: Admit,
        mut quota: QuotaCharge,
        mut pending: Option<Pending>,
        facts: &mut RequestFacts,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<u16, Outcome> {
        // Released requests queue even beyond `--queue-depth` (the hold limits bound them).
        let mut attempts =
            Attempts::new(&self.model.policy, self.prefix_chain(), self.plan.holds());
        let mut admit = first;
        loop {
            let step_deadline = self.step_deadline(&attempts);
            let acquired = self
                .acquire(admit, &attempts, step_deadline, &mut pending, sink)
                .await?;
            let slot = match acquired {
                Ok(slot) => slot,
                Err(RouteError::WouldPark) => {
                    admit = self.park_in_order(&mut quota, sink).await?;
                    continue;
                }
                // A request a wake released waited its `--request-timeout` in the capacity
                // queue: it moves on to the next fallback step with a wait of its own, and
                // gets `504` only after the last (seed `hold-at-zero.md`, "After the wake").
                Err(RouteError::Timeout) if self.plan.holds() && attempts.move_on() => {
                    self.restart_deadline();
                    admit = self.retry_admit();
                    continue;
                }
                // Any other request waited its step's share of its time: the next step gets
                // the rest (`step_deadline`).
                Err(RouteError::Timeout) if step_deadline < self.deadline && attempts.move_on() => {
                    admit = self.retry_admit();
                    continue;
                }
                Err(error) => {
                    return self
                        .no_slot(error, &mut attempts, quota, pending, facts, sink)
                        .await;
                }
            };
            let may_retry = attempts.may_retry(slot.step, self.plan.provider_fallback);
            if !may_retry {
                // The owner recorded the prompt on the agent granted, and no attempt follows
                // this one: an open stream holds no chain.
                attempts.give_back_chain();
            }
            match self.forward(slot, &mut quota, may_retry, facts, sink).await {
                Err(Outcome::Retry(failure)) => {
                    ShardMetrics::add(&self.shard.metrics.forward_retries_total, 1);
                    attempts.failed(failure);
                    admit = self.retry_admit();
                }
                other => return other,
            }
        }
    }

    /// B2 would park the request, whose token phase was charged ahead: the tokens go back, and
    /// the request takes the gate order's way from the gates ([`Place::GATES`]), parking for
    /// its reservation before the token phase runs in its place. The reservation goes with the
    /// next slot visit.
    async fn park_in_order<S: Sink>(
        &mut self,
        quota: &mut QuotaCharge,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<Admit, Outcome> {
        quota.give_back_tokens();
        self.plan = self.plan.in_order();
        let mut place = Place::GATES;
        let mut reserved = None;
        loop {
            match self.plan.next_step(&mut place) {
                Some(Step::Reserve) => reserved = Some(self.reserve(sink).await?),
                Some(Step::Tokens) => self.tokens(quota, sink).await?,
                Some(Step::Slot(_)) | None => break,
                Some(step) => unreachable!("{step:?} is a step before the gates"),
            }
        }
        let reservation = reserved.expect("the gate order reserves before its slot");
        Ok(Admit::Reserved(reservation))
    }

    /// How a slot visit after the first is admitted: the failed or abandoned attempt gave its
    /// reservation back, so the gates run again with the slot.
    fn retry_admit(&self) -> Admit {
        match self.plan.retry_slot() {
            SlotAdmit::Direct => Admit::Direct,
            SlotAdmit::Gated | SlotAdmit::Reserved | SlotAdmit::Ahead => {
                Admit::Gated(self.pool_ask(false))
            }
        }
    }

    /// How long a slot visit from the request's step may wait (policy reference: when a step's
    /// queue is full or its wait expires, the routing session advances to the next step). With
    /// steps left after this one, an equal share of the time the request has left: a step whose
    /// agents are all busy cannot take the whole `--request-timeout` and leave the next step
    /// none. The last step, and a request a wake released (each step gets a whole timeout of its
    /// own: `hold-at-zero.md`), wait to the request's deadline.
    fn step_deadline(&self, attempts: &Attempts<'_>) -> Instant {
        let steps_left = attempts.steps_left();
        if self.plan.holds() || steps_left <= 1 {
            return self.deadline;
        }
        let now = Instant::now();
        now + self.deadline.saturating_duration_since(now) / steps_left
    }

    /// Phase 6: a slot from the model's owner, over the policy's steps, waiting until
    /// `deadline` at most. Outer `Err`: the client left; inner `Err`: the owner found no slot.
    async fn acquire<S: Sink>(
        &self,
        admit: Admit,
        attempts: &Attempts<'_>,
        deadline: Instant,
        pending: &mut Option<Pending>,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<Result<Slot, RouteError>, Outcome> {
        let acquired = sink
            .until_client_gone(
                self.shard
                    .acquire(self.model, deadline, admit, attempts.ask()),
            )
            .await;
        match acquired {
            None => Err(self.client_left()),
            Some(Ok(slot)) => {
                // A request with a slot is no longer pending demand.
                drop(pending.take());
                self.shard
                    .accounting
                    .routed(self.key, self.model.id, slot.agent);
                Ok(Ok(slot))
            }
            Some(Err(error)) => Ok(Err(error)),
        }
    }

    /// Phase 6 found no slot. Local routing exhausted: phase 6b when the plan has a provider
    /// fallback; else the last forward failure, or why no slot was found. `pending`, a request
    /// a wake released, leaves the pending demand before the provider is called: the provider's
    /// answer is its slot (seed `hold-at-zero.md`: "a request being generated is never
    /// counted").
    async fn no_slot<S: Sink>(
        &self,
        error: RouteError,
        attempts: &mut Attempts<'_>,
        quota: QuotaCharge,
        pending: Option<Pending>,
        facts: &mut RequestFacts,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<u16, Outcome> {
        let exhausted = matches!(error, RouteError::NoAgents | RouteError::QueueFull);
        if exhausted
            && self.plan.provider_fallback
            && let (Some(fallback), Some(pool)) = (
                &self.model.policy.fallback_provider,
                &self.shard.settings.provider,
            )
        {
            facts.provider = Some(fallback.engine.processed_by());
            drop(pending);
            return self.by_provider(fallback, pool, quota, facts, sink).await;
        }
        if self.plan.generates && exhausted {
            self.shard
                .count_policy_outcome(self.model.id, PolicyOutcome::Exhausted);
        }
        let rejection = attempts
            .take_last_failure()
            .unwrap_or_else(|| refusal::route(error));
        Err(rejection.into())
    }

    /// Phase 6b, provider fallback (seed, "Provider fallback accounting"): the request's
    /// occupancy is already released (the owner gave it back with the refused slot); the RPM,
    /// ITPM and daily input charges stay, whatever the provider answers; no output is charged and
    /// the estimator does not learn. The provider's usage is still counted in the shard's token
    /// counters.
    async fn by_provider<S: Sink>(
        &self,
        fallback: &crate::logic::policy::ProviderFallback,
        pool: &crate::router::provider::ProviderPool,
        mut quota: QuotaCharge,
        facts: &mut RequestFacts,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<u16, Outcome> {
        use crate::router::provider::{ProviderConfig, ProviderRequest};
        let (shard, request, model) = (self.shard, self.request, self.model.id);
        quota.settle(
            crate::logic::limits::UsedTokens {
                input_tokens: self.estimate.input_tokens,
                output_tokens: 0,
            },
            crate::logic::limits::Delivery::Provider,
        );
        let config = ProviderConfig {
            engine: fallback.engine,
            model: fallback.model.to_string(),
        };
        let mut call = ProviderRequest::new(
            &config,
            request.route.dialect(),
            request.body.clone(),
            self.deadline,
        );
        call.request_id = Some(Bytes::copy_from_slice(&request.request_id));
        // The provider call as a client span under the request's (tracing on).
        let call_span = request.span.as_ref().map(|span| span.client());
        let answered = sink.until_client_gone(pool.call(call)).await;
        if let Some(span) = &call_span {
            let (status, error_code) = match &answered {
                Some(Ok(_)) => (200, None),
                Some(Err(error)) => (0, Some(refusal::provider(*error).code)),
                // The client left: the call was cancelled.
                None => (0, Some("cancelled")),
            };
            shard.accounting.finish_client_span(
                span,
                PROVIDER_CALL_SPAN,
                &request.request_id,
                status,
                error_code,
            );
        }
        match answered {
            None => Err(self.client_left()),
            Some(Err(error)) => {
                shard.count_policy_outcome(model, PolicyOutcome::Exhausted);
                Err(refusal::provider(error).into())
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
                    shard.accounting.tokens(
                        quota.key,
                        model,
                        None,
                        (usage.input_tokens, usage.output_tokens),
                        |key| shard.keys().get(key).map(KeyLabels::of),
                    );
                }
                sink.respond(200, "application/json", &[], &answer.body)
                    .await
                    .map(|()| 200)
                    .map_err(|_| Outcome::Gone)
            }
        }
    }

    /// Phases 7 and 8 on the slot (`api::forward`), and the policy counter of how it was
    /// routed once the attempt is final. `may_retry`: another attempt may follow a failure.
    async fn forward<S: Sink>(
        &self,
        slot: Slot,
        quota: &mut QuotaCharge,
        may_retry: bool,
        facts: &mut RequestFacts,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<u16, Outcome> {
        let routed = if slot.step == 0 {
            PolicyOutcome::PrimaryRouted
        } else {
            PolicyOutcome::FallbackRouted
        };
        facts.agent = Some(slot.agent);
        let (agent, model) = (slot.agent, slot.model);
        let forwarded = forward::forward(
            self.shard,
            self.request,
            self.fields,
            slot,
            quota,
            self.deadline,
            may_retry,
            facts,
            sink,
        )
        .await;
        let answered = forwarded.as_ref().ok().copied();
        self.shard.accounting.agent_attempt(agent, model, answered);
        if self.plan.generates && !matches!(forwarded, Err(Outcome::Retry(_))) {
            self.shard.count_policy_outcome(self.model.id, routed);
        }
        forwarded
    }

    /// One visit to the key's quota owner; a refusal is counted here and answered by
    /// `api::refusal`.
    async fn visit_quota<S: Sink>(
        &self,
        charge: Charge,
        sink: &mut HoldSink<'_, S>,
    ) -> Result<QuotaCharge, Outcome> {
        let (shard, key) = (self.shard, self.key);
        let admitted = sink
            .until_client_gone(shard.admit_quota(key, self.context, charge, self.deadline))
            .await;
        match admitted {
            None => Err(self.client_left()),
            Some(Ok(charge)) => Ok(charge),
            Some(Err(refusal)) => {
                if let QuotaRefusal::Limit(limit) = &refusal {
                    if let Some(reason) = Reason::of_quota(limit.kind) {
                        shard.count_rejection(self.context.model, reason);
                    }
                    let labels = || Some(KeyLabels::of(key));
                    match limit.kind {
                        RejectionKind::RequestRate => {
                            shard
                                .accounting
                                .tenants
                                .borrow_mut()
                                .rate_limited(key.key_id, labels);
                        }
                        RejectionKind::DailyTokens | RejectionKind::DailyTokensForMaxOutput => {
                            shard.accounting.tenants.borrow_mut().token_limited(
                                key.key_id,
                                Phase::Input,
                                UNSET.into(),
                                labels,
                            );
                        }
                        _ => {}
                    }
                }
                Err(refusal::quota(&refusal).into())
            }
        }
    }

    /// The pool admission this request asks the model's owner for; `bounce_park` after a token
    /// phase charged ahead.
    fn pool_ask(&self, bounce_park: bool) -> PoolAsk {
        PoolAsk {
            footprint: Footprint {
                input_tokens: self.estimate.input_tokens,
                declared_output_tokens: self.estimate.max_output_tokens.unwrap_or(0),
            },
            key: self.key.key_id,
            share: self.plan.share,
            policy: self.model.policy.clone(),
            hold_until: self.hold_until,
            bounce_park,
        }
    }

    fn restart_deadline(&mut self) {
        self.deadline = Instant::now() + self.shard.settings.request_timeout;
    }

    /// The prompt's chain of block hashes, when a step of the model's policy ranks
    /// `prefix-aware`: one hash pass over the prompt's bytes, into a chain from the shard's pool
    /// that the owner shares while the request waits, given back when the request is done
    /// ([`Attempts`]'s drop).
    fn prefix_chain(&self) -> Option<Arc<Chain>> {
        if !self.model.policy.ranks_by_prefix() {
            return None;
        }
        let parts = PromptParts::of(&self.request.body);
        attempts::chain_of(&parts.bytes())
    }

    /// The client left while a phase waited.
    fn client_left(&self) -> Outcome {
        ShardMetrics::add(&self.shard.metrics.client_disconnects_total, 1);
        Outcome::Gone
    }
}

/// The request's one input estimate (seed, "One input estimate") and its declared maximum output
/// (`max_completion_tokens` before `max_tokens`; negative values count as undeclared). Chat and
/// messages use the model's learned ratio (the router's one, published by the model's owner)
/// over the prompt's text, system, tools and per-message overhead; the other routes, which
/// charge no tokens, the starting ratio over the body.
fn estimate(request: &ClientRequest, model: &ModelEntry, fields: &RequestFields<'_>) -> Estimate {
    let declared = fields.max_completion_tokens.or(fields.max_tokens);
    let input_tokens = match request.route {
        Route::ChatCompletions | Route::Messages => model.tokens_per_byte.estimate(&fields.prompt),
        _ => (request.body.len() as u64 * 10).div_ceil(32),
    };
    Estimate {
        input_tokens,
        max_output_tokens: declared.and_then(|tokens| u64::try_from(tokens).ok()),
    }
}

/// The provider call's client span (HTTP semantic conventions: the method when the route is
/// the provider's own).
const PROVIDER_CALL_SPAN: &str = "POST";
