//! A policy as the owner shard's router sees it: its steps (`routing_policy`, then each
//! `fallback_chain` entry) as a [`StepFilter`] over candidate agents — the step's static `match`
//! on what the agent registered, then its `exclude_if` gates on the agent's live signals.
//!
//! Signals the agents do not report yet (success rate, latency, hardware) are missing, and a
//! missing signal passes its gate (policy reference, "Missing metrics"). `match` reads the
//! organization and machine agents register; no GPU model is registered, so a condition on it
//! never holds.

use crate::logic::policy::{AgentFacts, ModelPolicy, Signals, Step};
use crate::logic::routing::{Candidate, EngineSignals, StepFilter, Strategy};

impl ModelPolicy {
    /// Step `index`: 0 is `routing_policy`, then the fallback chain in order.
    pub fn step(&self, index: usize) -> Option<&Step> {
        match index {
            0 => Some(&self.primary),
            _ => self.fallback_chain.get(index - 1),
        }
    }
}

impl Signals {
    /// The gate signals an agent's engine reports; every other signal is missing (and passes).
    pub fn of_engine(engine: &EngineSignals) -> Signals {
        Signals {
            kv_cache_utilization: engine.kv_cache_utilization,
            running_requests: engine.running_requests,
            waiting_requests: engine.waiting_requests,
            ..Signals::default()
        }
    }
}

impl StepFilter for ModelPolicy {
    fn step_count(&self) -> usize {
        1 + self.fallback_chain.len()
    }

    fn strategy(&self, step: usize) -> Strategy {
        self.step(step)
            .map_or(Strategy::LeastLoaded, |step| step.strategy)
    }

    fn allows(&self, step: usize, candidate: &Candidate<'_>) -> bool {
        let Some(step) = self.step(step) else {
            return false;
        };
        let facts = AgentFacts {
            region: &candidate.profile.region,
            engine: &candidate.profile.engine,
            tags: &candidate.profile.tags,
            organization: &candidate.profile.organization,
            machine: &candidate.profile.machine,
            gpu_model: "",
        };
        if !step.filter.matches(&facts) {
            return false;
        }
        if step.exclude_if.is_empty() {
            return true;
        }
        let signals = Signals {
            capacity_utilization: Some(candidate.capacity_utilization),
            ..Signals::of_engine(candidate.engine)
        };
        !step.exclude_if.fails(&signals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::policy::{PolicyContext, Role, compile_text};
    use crate::logic::routing::AgentProfile;

    fn policy(text: &str) -> ModelPolicy {
        let compiled = compile_text(
            "test.yaml",
            text,
            Role::Named("test"),
            &PolicyContext::default(),
        )
        .expect("valid policy");
        compiled.policy
    }

    fn candidate<'a>(profile: &'a AgentProfile, engine: &'a EngineSignals) -> Candidate<'a> {
        Candidate {
            profile,
            engine,
            capacity_utilization: 0.5,
        }
    }

    #[test]
    fn steps_match_statically_then_exclude_on_live_signals() {
        let policy = policy(
            "models: [m]\nrouting_policy:\n  match:\n    region: eu\n  exclude_if:\n    kv_cache_utilization:\n      gt: 0.9\n  strategy: least-loaded\nfallback_chain:\n  - name: anywhere\n    strategy: least-loaded\n",
        );
        assert_eq!(policy.step_count(), 2);
        let eu = AgentProfile {
            peer_id: "12D3KooWtest".into(),
            engine: "vllm".into(),
            region: "eu".into(),
            tags: Box::new([]),
            deployment_id: "".into(),
            organization: "ml-team".into(),
            machine: "gpu-1".into(),
            counters: Default::default(),
        };
        let us = AgentProfile {
            region: "us".into(),
            ..eu.clone()
        };
        let cool = EngineSignals {
            kv_cache_utilization: Some(0.2),
            ..EngineSignals::default()
        };
        let hot = EngineSignals {
            kv_cache_utilization: Some(0.95),
            ..EngineSignals::default()
        };
        let unknown = EngineSignals::default();
        assert!(policy.allows(0, &candidate(&eu, &cool)));
        assert!(
            policy.allows(0, &candidate(&eu, &unknown)),
            "missing signals pass"
        );
        assert!(!policy.allows(0, &candidate(&eu, &hot)));
        assert!(!policy.allows(0, &candidate(&us, &cool)));
        assert!(policy.allows(1, &candidate(&us, &hot)));
        assert!(!policy.allows(2, &candidate(&eu, &cool)), "no third step");
    }

    #[test]
    fn match_reads_the_registered_organization_and_machine() {
        let policy = policy(
            "models: [m]\nrouting_policy:\n  match:\n    organization: ml-team\n    machine: gpu-1\n  strategy: least-loaded\n",
        );
        let ours = AgentProfile {
            organization: "ml-team".into(),
            machine: "gpu-1".into(),
            ..AgentProfile::default()
        };
        let theirs = AgentProfile {
            machine: "gpu-2".into(),
            ..ours.clone()
        };
        let signals = EngineSignals::default();
        assert!(policy.allows(0, &candidate(&ours, &signals)));
        assert!(!policy.allows(0, &candidate(&theirs, &signals)));
    }
}
