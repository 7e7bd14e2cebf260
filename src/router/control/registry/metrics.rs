//! The routing families of the registry (observability reference, "Routing metrics"), built at
//! scrape time: which agents are registered (`hivenet_routing_agent_info`), in the pool
//! (`hivenet_routing_agent_healthy`, `hivenet_routing_agents_routable`), when each was last heard
//! from (`hivenet_routing_agent_last_seen_timestamp`, Unix milliseconds) and how often each
//! reported its backend unhealthy (`hivenet_model_backend_failure_total`). One series per
//! registered agent and model; an agent's series go when its session ends.

use std::time::Instant;

use super::Registry;
use crate::router::metrics::{Collect, Family};

/// The registry's families as of `now` (`now_unix_ms` is the same moment on the wall clock).
pub struct AgentFamilies<'a> {
    pub registry: &'a Registry,
    pub now: Instant,
    pub now_unix_ms: i64,
}

impl Collect for AgentFamilies<'_> {
    fn collect(&self, out: &mut Vec<Family>) {
        let mut info = Family::gauge(
            "hivenet_routing_agent_info",
            "1 while the agent is registered, with its registration metadata as labels.",
        );
        let mut healthy = Family::gauge(
            "hivenet_routing_agent_healthy",
            "Whether the agent is in the routing pool (1) or not (0).",
        );
        let mut last_seen = Family::gauge(
            "hivenet_routing_agent_last_seen_timestamp",
            "Unix time in milliseconds of the agent's last heartbeat.",
        );
        let mut backend_failures = Family::counter(
            "hivenet_model_backend_failure_total",
            "Heartbeats in which the agent reported its inference backend newly unhealthy.",
        );
        for view in self.registry.agent_views(self.now, self.now_unix_ms) {
            let registration = &view.registration;
            let capacity = registration.capacity.to_string();
            let failures = view.backend_failures as f64;
            for model in &registration.models {
                info.sample(
                    &[
                        ("peer_id", &view.peer_id),
                        ("region", &registration.region),
                        ("engine", &registration.engine),
                        ("model", model),
                        ("capacity", &capacity),
                        ("organization", &registration.organization),
                        ("machine", &registration.machine),
                    ],
                    1.0,
                );
                let agent = [("peer_id", view.peer_id.as_str()), ("model", model)];
                healthy.sample(&agent, f64::from(u8::from(view.routable)));
                last_seen.sample(&agent, view.last_seen_unix_ms as f64);
                backend_failures.sample(
                    &[
                        ("peer_id", &view.peer_id),
                        ("model", model),
                        ("engine", &registration.engine),
                        ("organization", &registration.organization),
                        ("machine", &registration.machine),
                    ],
                    failures,
                );
            }
        }
        let mut routable = Family::gauge(
            "hivenet_routing_agents_routable",
            "Agents in the routing pool.",
        );
        routable.sample(&[], self.registry.routable_count() as f64);
        let mut history_dropped = Family::counter(
            "hivenet_agent_history_dropped_total",
            "Per-agent history entries of agents no longer registered dropped to keep the history bounded, oldest registration first.",
        );
        history_dropped.sample(&[], self.registry.history_dropped() as f64);
        out.extend([
            info,
            healthy,
            routable,
            last_seen,
            backend_failures,
            history_dropped,
        ]);
    }
}
