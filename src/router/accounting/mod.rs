//! What a shard counts about the requests it served, outside the data plane: the per-tenant
//! series (`tenants`) and the audit log record of each request. One [`Accounting`] per shard,
//! single-threaded like the shard that carries it; the request path (`api`) feeds it, the
//! control core reads it through the shard's report.

pub mod tenants;

use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::base::ids::{AgentId, KeyId, ModelId};
use crate::logic::auth::keys::{KeyRecord, KeyRegistry};
use crate::logic::routing::AgentProfile;
use crate::router::shard::IdMap;
use tenants::{
    AgentDurationSeries, KeyLabels, RoutedSeries, TenantCounters, TenantReport, Timing, UNSET,
};

/// Whether a request the router answered itself with `status` is one it could not forward
/// (`hivenet_routing_requests_failed_total`): no agent could take it (503), the forward failed
/// (502) or it ran out of time (504). Refusals by a limit (4xx) are not routing failures.
fn could_not_forward(status: u16) -> bool {
    matches!(status, 502..=504)
}

/// What the audit record of one request needs from the phases it went through.
#[derive(Debug, Default)]
pub struct RequestFacts {
    /// The authenticated key.
    pub key: Option<KeyId>,
    /// The top-level `model`, when the body could be read (a slice of the body unless it had
    /// escapes).
    pub model: Option<Bytes>,
    /// The model it resolved to: the request then counts in its key's tenant series.
    pub model_id: Option<ModelId>,
    /// The agent that served it, or the provider marker (`provider:openai`).
    pub agent: Option<AgentId>,
    pub provider: Option<&'static str>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The router's error code, when the router refused or failed the request.
    pub error_code: Option<&'static str>,
}

/// Who sent a request and when it arrived, for its audit record.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'r> {
    pub request_id: &'r str,
    pub peer: Option<IpAddr>,
    pub received_at: Instant,
    /// The request's trace, when tracing is on (the audit record's `trace_id`).
    pub trace: Option<crate::net::telemetry::TraceContext>,
}

pub struct Accounting {
    /// Per-tenant request and token counters (`hivenet_tenant_*`).
    pub tenants: RefCell<TenantCounters>,
    /// This shard's end of the audit log (`None` until start-up hands it over).
    audit: RefCell<Option<crate::router::audit::AuditSender>>,
    /// This shard's end of the span export: `None` when tracing is off.
    spans: RefCell<Option<crate::net::telemetry::SpanRing>>,
    /// Every pooled agent's profile: its peer ID for the audit log, its labels for the series
    /// (every shard hears every agent).
    agents: RefCell<IdMap<AgentId, Arc<AgentProfile>>>,
    /// Agents that left the pool lately, newest last (at most [`DEPARTED_MAX`]): requests they
    /// were serving still finish here and count in their lifetime counters.
    departed: RefCell<std::collections::VecDeque<(AgentId, Arc<AgentProfile>)>>,
    /// This shard's index: its slot in every agent's counters (`agents::AgentCounters`).
    shard: usize,
    /// The `unset` label, shared by every series that carries it.
    unset: Arc<str>,
}

/// Departed agents remembered per shard: enough for the requests of every agent a site drains
/// at once to finish; an older departure's late answers are not counted in its history.
const DEPARTED_MAX: usize = 64;

impl Accounting {
    /// The accounting of shard `shard`.
    pub fn for_shard(shard: usize) -> Accounting {
        Accounting {
            tenants: RefCell::default(),
            audit: RefCell::default(),
            spans: RefCell::default(),
            agents: RefCell::default(),
            departed: RefCell::default(),
            shard,
            unset: UNSET.into(),
        }
    }

    /// The router's lifetime counters of `agent` for `model`: while the agent is in the pool,
    /// and for a while after it left (its last requests finish after it leaves).
    fn with_agent_counters(
        &self,
        agent: AgentId,
        model: ModelId,
        count: impl FnOnce(&crate::logic::routing::counters::AgentCounters, usize),
    ) {
        let agents = self.agents.borrow();
        let departed = self.departed.borrow();
        let profile = agents.get(&agent).or_else(|| {
            departed
                .iter()
                .rev()
                .find(|(gone, _)| *gone == agent)
                .map(|(_, profile)| profile)
        });
        if let Some(counters) = profile.and_then(|profile| profile.counters.of(model)) {
            count(counters, self.shard);
        }
    }

    /// One attempt on `agent` is over: the status its client got from it, `None` when the
    /// attempt failed without an answer (transport failure, a retryable status tried elsewhere,
    /// the client gone).
    pub fn agent_attempt(&self, agent: AgentId, model: ModelId, status: Option<u16>) {
        self.with_agent_counters(agent, model, |counters, shard| {
            counters.finished(shard, status.unwrap_or(0))
        });
    }

    /// `agent` or its engine refused an attempt for capacity or readiness (429, 503).
    pub fn agent_rejected(&self, agent: AgentId, model: ModelId) {
        self.with_agent_counters(agent, model, |counters, shard| counters.rejected(shard));
    }

    /// A request `agent` had was cut because `reason` broke.
    pub fn agent_reset(
        &self,
        agent: AgentId,
        model: ModelId,
        reason: crate::logic::routing::counters::ResetReason,
    ) {
        self.with_agent_counters(agent, model, |counters, shard| {
            counters.reset_under(shard, reason)
        });
    }

    /// A latency sample of `agent` (request sent to response headers), in milliseconds.
    pub fn agent_latency(&self, agent: AgentId, model: ModelId, sample_ms: f64) {
        self.with_agent_counters(agent, model, |counters, _| {
            counters.latency_sample(sample_ms)
        });
    }

    /// Hands this shard its end of the audit log (start-up, before it accepts).
    pub fn set_audit(&self, sender: crate::router::audit::AuditSender) {
        *self.audit.borrow_mut() = Some(sender);
    }

    /// Hands this shard its end of the span export (start-up, before it accepts): tracing on.
    pub fn set_spans(&self, ring: crate::net::telemetry::SpanRing) {
        *self.spans.borrow_mut() = Some(ring);
    }

    /// Starts the router's span for a request, continuing the `traceparent` that `incoming`
    /// finds; `None` without a look at the headers when tracing is off.
    pub fn start_span<'h>(
        &self,
        incoming: impl FnOnce() -> Option<&'h [u8]>,
    ) -> Option<Box<crate::net::telemetry::StartedSpan>> {
        let sampler = self.spans.borrow().as_ref()?.sampler();
        Some(Box::new(crate::net::telemetry::StartedSpan::start(
            incoming(),
            sampler,
        )))
    }

    /// Ends a request's span and hands it to the exporter (never waits: a full ring drops it).
    pub fn finish_span(
        &self,
        span: &crate::net::telemetry::StartedSpan,
        route: crate::wire::http::route::Route,
        request_id: &[u8; 36],
        facts: &RequestFacts,
        status: u16,
    ) {
        let mut spans = self.spans.borrow_mut();
        let Some(ring) = spans.as_mut() else {
            return;
        };
        let outcome = crate::net::telemetry::SpanOutcome {
            status,
            request_id: Some(*request_id),
            model: facts.model.clone(),
            error_code: facts.error_code.filter(|_| status >= 400),
        };
        ring.push(span.finish(
            crate::net::telemetry::span_name(route.upstream_path()),
            outcome,
        ));
    }

    /// Ends a client span of the request (a call the router made for it: the provider call)
    /// with the callee's `status` (0: no answer, then `error_code` says why).
    pub fn finish_client_span(
        &self,
        span: &crate::net::telemetry::StartedSpan,
        name: &'static str,
        request_id: &[u8; 36],
        status: u16,
        error_code: Option<&'static str>,
    ) {
        let mut spans = self.spans.borrow_mut();
        let Some(ring) = spans.as_mut() else {
            return;
        };
        ring.push(span.finish(
            name,
            crate::net::telemetry::SpanOutcome {
                status,
                request_id: Some(*request_id),
                model: None,
                error_code,
            },
        ));
    }

    pub fn agent_up(&self, agent: AgentId, profile: Arc<AgentProfile>) {
        self.agents.borrow_mut().insert(agent, profile);
    }

    pub fn agent_down(&self, agent: AgentId) {
        if let Some(profile) = self.agents.borrow_mut().remove(&agent) {
            let mut departed = self.departed.borrow_mut();
            departed.retain(|(gone, _)| *gone != agent);
            if departed.len() == DEPARTED_MAX {
                departed.pop_front();
            }
            departed.push_back((agent, profile));
        }
        self.tenants.borrow_mut().forget_agent(agent);
    }

    pub fn report(&self) -> TenantReport {
        self.tenants.borrow().report()
    }

    /// A request is over: it counts in its key's tenant series (success for a 2xx answer, failure
    /// for anything else) and leaves its audit record.
    pub fn request_finished(
        &self,
        arrival: Arrival<'_>,
        keys: &KeyRegistry,
        facts: &RequestFacts,
        status: u16,
    ) {
        if let (Some(key), Some(model)) = (facts.key.and_then(|key| keys.get(key)), facts.model_id)
        {
            let elapsed = arrival.received_at.elapsed();
            let timing = Timing {
                elapsed,
                arrived_unix_s: (crate::base::clock::now_unix_ms()
                    - i64::try_from(elapsed.as_millis()).unwrap_or(0))
                    / 1000,
            };
            let mut tenants = self.tenants.borrow_mut();
            tenants.finished(key.key_id, model, facts.agent, Some(status), timing, || {
                Some((KeyLabels::of(key), self.deployment_of(facts.agent)))
            });
            if let Some(agent) = facts.agent {
                tenants.agent_duration((key.tenant_id, model, agent, status), elapsed, || {
                    let agents = self.agents.borrow();
                    Some(AgentDurationSeries {
                        tenant_id: key.owner.clone(),
                        peer_id: agents.get(&agent)?.peer_id.clone(),
                        model,
                        status,
                    })
                });
            }
            if let Some(reason) = facts.error_code.filter(|_| could_not_forward(status)) {
                tenants.routing_failed(key.tenant_id, model, reason, || key.owner.clone());
            }
        }
        self.audit(arrival, keys, facts, status);
    }

    /// Writes the request's audit record (observability reference, "Audit record format").
    fn audit(&self, arrival: Arrival<'_>, keys: &KeyRegistry, facts: &RequestFacts, status: u16) {
        use crate::router::audit::{
            AuditKey, AuditRecord, Shown, SourceIp, Timestamp, error_code_for_status,
        };
        let mut audit = self.audit.borrow_mut();
        let Some(sender) = audit.as_mut() else {
            return;
        };
        let key = facts.key.and_then(|key| keys.get(key));
        let latency = arrival.received_at.elapsed();
        let agents = self.agents.borrow();
        let agent_id = match (facts.provider, facts.agent) {
            (Some(provider), _) => provider,
            (None, Some(agent)) => agents.get(&agent).map_or("", |profile| &profile.peer_id),
            (None, None) => "",
        };
        let error_code = match facts.error_code {
            Some(code) if status >= 400 => code,
            _ => error_code_for_status(status),
        };
        let trace_id = arrival.trace.map(|trace| trace.trace_id_hex());
        let trace_id = trace_id
            .as_ref()
            .map_or("", |hex| std::str::from_utf8(hex).unwrap_or(""));
        sender.record(&AuditRecord {
            log_type: "audit",
            level: AuditRecord::level_of(status),
            trace_id,
            request_id: arrival.request_id,
            tenant_id: key.map_or("", |key| &key.owner),
            key_id: Shown(AuditKey::of(key)),
            model: facts
                .model
                .as_deref()
                .and_then(|model| std::str::from_utf8(model).ok())
                .unwrap_or(""),
            status_code: status,
            latency_ms: latency.as_millis() as u64,
            input_tokens: facts.input_tokens,
            output_tokens: facts.output_tokens,
            agent_id,
            error_code,
            source_ip: SourceIp(arrival.peer),
            ts: Timestamp(std::time::SystemTime::now() - latency),
        });
    }

    /// The `deployment_id` label of a request served by `agent`: what the agent registered;
    /// `unset` when no agent served it (refused before routing, answered by a provider) or the
    /// agent registered none.
    pub fn deployment_of(&self, agent: Option<AgentId>) -> Arc<str> {
        let agents = self.agents.borrow();
        match agent.and_then(|agent| agents.get(&agent)) {
            Some(profile) if !profile.deployment_id.is_empty() => profile.deployment_id.clone(),
            _ => self.unset.clone(),
        }
    }

    /// `hivenet_routing_requests_routed_total`: the request got a slot on `agent`.
    pub fn routed(&self, key: &KeyRecord, model: ModelId, agent: AgentId) {
        self.tenants
            .borrow_mut()
            .routed(key.tenant_id, model, agent, || {
                let agents = self.agents.borrow();
                let profile = agents.get(&agent)?;
                Some(RoutedSeries {
                    tenant_id: key.owner.clone(),
                    model,
                    engine: profile.engine.clone(),
                    region: profile.region.clone(),
                })
            });
    }

    /// Counts tokens a request used against its key's tenant series (resolving the key's labels
    /// only when the series is new, with `labels_of`; a key gone in a reload is not counted).
    /// `agent`: the one that served it, `None` for a provider's answer.
    pub fn tokens(
        &self,
        key: KeyId,
        model: ModelId,
        agent: Option<AgentId>,
        (input, output): (u64, u64),
        labels_of: impl FnOnce(KeyId) -> Option<KeyLabels>,
    ) {
        let today = crate::base::clock::Day::from_unix_seconds(
            crate::base::clock::now_unix_ms().max(0) as u64 / 1000,
        );
        if let Some(agent) = agent {
            self.with_agent_counters(agent, model, |counters, shard| {
                counters.tokens(shard, input, output)
            });
        }
        self.tenants
            .borrow_mut()
            .tokens(key, model, agent, input, output, today, || {
                Some((labels_of(key)?, self.deployment_of(agent)))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::{Capability, ModelNameId};
    use crate::logic::routing::counters::{AgentCounters, CountersByModel};

    fn profile(model: ModelId, counters: &Arc<AgentCounters>) -> Arc<AgentProfile> {
        Arc::new(AgentProfile {
            peer_id: "peer".into(),
            counters: CountersByModel(Box::new([(model, counters.clone())])),
            ..AgentProfile::default()
        })
    }

    #[test]
    fn requests_finishing_after_their_agent_left_still_count() {
        let model = ModelId::new(ModelNameId(0), Capability::Llm);
        let counters = Arc::new(AgentCounters::new(2));
        let accounting = Accounting::for_shard(1);
        accounting.agent_up(AgentId(7), profile(model, &counters));
        accounting.agent_attempt(AgentId(7), model, Some(200));
        accounting.agent_down(AgentId(7));
        accounting.agent_attempt(AgentId(7), model, Some(500));
        accounting.tokens(KeyId(1), model, Some(AgentId(7)), (3, 4), |_| None);
        let totals = counters.totals();
        assert_eq!((totals.success, totals.failed), (1, 1));
        assert_eq!((totals.input_tokens, totals.output_tokens), (3, 4));
        // An agent never seen counts nowhere.
        accounting.agent_attempt(AgentId(8), model, Some(200));
        assert_eq!(counters.totals().success, 1);
    }

    #[test]
    fn departed_agents_are_bounded() {
        let model = ModelId::new(ModelNameId(0), Capability::Llm);
        let counters = Arc::new(AgentCounters::new(1));
        let accounting = Accounting::for_shard(0);
        for agent in 0..(DEPARTED_MAX as u32 + 1) {
            accounting.agent_up(AgentId(agent), profile(model, &counters));
            accounting.agent_down(AgentId(agent));
        }
        assert_eq!(accounting.departed.borrow().len(), DEPARTED_MAX);
        // The oldest departure is forgotten.
        accounting.agent_attempt(AgentId(0), model, Some(200));
        assert_eq!(counters.totals().success, 0);
        accounting.agent_attempt(AgentId(DEPARTED_MAX as u32), model, Some(200));
        assert_eq!(counters.totals().success, 1);
    }
}
