//! Per-tenant counters of one shard (observability reference, "Tenant and quota metrics"):
//! requests that succeeded or failed and the tokens they used, per key and model; RPM refusals
//! per key; daily-budget refusals per key and phase. Rendered by the control core with the
//! reference's labels (`tenant_id`, `key_id`, `deployment_id`, `model`, `phase`).
//!
//! Labels are resolved from the key once, when a series is first counted (the request path
//! only increments afterwards): `tenant_id` is the key's owner (`default` without keys),
//! `key_id` the dynamic entry's id, `anonymous` without keys, and `static:<id>` for a static
//! key — each static key has its own stable id here, where an older implementation labelled
//! them all `anonymous`. `deployment_id` is `unset`: agents do not register a deployment.
//!
//! Also `hivenet_routing_requests_routed_total{model,tenant_id,engine,region}`: requests given a
//! slot on an agent, by the agent's engine and region (what autoscalers read to keep a model
//! awake, seed `hold-at-zero.md`).
//!
//! Memory: one entry per (key, model) and per key ever counted on this shard; counters are
//! cumulative, so entries are never dropped while the process runs. Routed series are per
//! (tenant, model, engine, region); their per-agent index is dropped when the agent leaves.

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::keys::{KeyId, KeyRecord, KeySource, TenantId};
use crate::routing::AgentId;
use crate::shard::snapshot::ModelId;

/// `tenant_id` and `key_id` of one key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyLabels {
    pub tenant_id: Arc<str>,
    pub key_id: Arc<str>,
}

impl KeyLabels {
    pub fn of(key: &KeyRecord) -> KeyLabels {
        let key_id: Arc<str> = match &key.source {
            KeySource::Anonymous => "anonymous".into(),
            KeySource::Static { .. } => format!("static:{}", key.key_id).into(),
            KeySource::Dynamic { id } => id.as_str().into(),
        };
        KeyLabels {
            tenant_id: key.owner.as_str().into(),
            key_id,
        }
    }
}

/// Which part of a request the daily budget refused: its input (at admission) or the output of
/// a non-streamed answer (before delivery).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Input,
    Output,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Input => "input",
            Phase::Output => "output",
        }
    }
}

/// The counters of one (key, model).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub success: u64,
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One `hivenet_routing_requests_routed_total` series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoutedSeries {
    pub tenant_id: Arc<str>,
    pub model: ModelId,
    pub engine: Arc<str>,
    pub region: Arc<str>,
}

/// What `/metrics` reads of one shard's tenant counters.
#[derive(Debug, Default)]
pub struct TenantReport {
    pub requests: Vec<(KeyLabels, ModelId, RequestCounts)>,
    pub rate_limited: Vec<(KeyLabels, u64)>,
    pub token_limited: Vec<(KeyLabels, Phase, u64)>,
    pub routed: Vec<(RoutedSeries, u64)>,
}

#[derive(Debug, Default)]
pub struct TenantCounters {
    requests: HashMap<(KeyId, ModelId), (KeyLabels, RequestCounts)>,
    rate_limited: HashMap<KeyId, (KeyLabels, u64)>,
    token_limited: HashMap<(KeyId, Phase), (KeyLabels, u64)>,
    /// Routed requests per series, and which series a (tenant, model, agent) counts in.
    routed: Vec<(RoutedSeries, u64)>,
    routed_series: HashMap<RoutedSeries, usize>,
    routed_index: HashMap<(TenantId, ModelId, AgentId), usize>,
}

impl TenantCounters {
    /// The counters of (key, model); `labels` is called only for a new series, and `None` from
    /// it (the key is gone) counts nothing.
    fn requests(
        &mut self,
        key: KeyId,
        model: ModelId,
        labels: impl FnOnce() -> Option<KeyLabels>,
    ) -> Option<&mut RequestCounts> {
        let entry = match self.requests.entry((key, model)) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert((labels()?, RequestCounts::default()))
            }
        };
        Some(&mut entry.1)
    }

    /// One finished request with the status its client got (`None`: it got no answer).
    pub fn finished(
        &mut self,
        key: KeyId,
        model: ModelId,
        status: Option<u16>,
        labels: impl FnOnce() -> Option<KeyLabels>,
    ) {
        let Some(counts) = self.requests(key, model, labels) else {
            return;
        };
        match status {
            Some(200..=299) => counts.success += 1,
            _ => counts.failed += 1,
        }
    }

    pub fn tokens(
        &mut self,
        key: KeyId,
        model: ModelId,
        input: u64,
        output: u64,
        labels: impl FnOnce() -> Option<KeyLabels>,
    ) {
        let Some(counts) = self.requests(key, model, labels) else {
            return;
        };
        counts.input_tokens += input;
        counts.output_tokens += output;
    }

    pub fn rate_limited(&mut self, key: KeyId, labels: impl FnOnce() -> Option<KeyLabels>) {
        let entry = match self.rate_limited.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => match labels() {
                Some(labels) => entry.insert((labels, 0)),
                None => return,
            },
        };
        entry.1 += 1;
    }

    pub fn token_limited(
        &mut self,
        key: KeyId,
        phase: Phase,
        labels: impl FnOnce() -> Option<KeyLabels>,
    ) {
        let entry = match self.token_limited.entry((key, phase)) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => match labels() {
                Some(labels) => entry.insert((labels, 0)),
                None => return,
            },
        };
        entry.1 += 1;
    }

    /// One request given a slot on `agent`; `series` is called only the first time this
    /// (tenant, model, agent) is counted, and `None` from it (the agent is gone) counts nothing.
    pub fn routed(
        &mut self,
        tenant: TenantId,
        model: ModelId,
        agent: AgentId,
        series: impl FnOnce() -> Option<RoutedSeries>,
    ) {
        let index = match self.routed_index.get(&(tenant, model, agent)) {
            Some(index) => *index,
            None => {
                let Some(series) = series() else {
                    return;
                };
                let index = match self.routed_series.get(&series) {
                    Some(index) => *index,
                    None => {
                        self.routed.push((series.clone(), 0));
                        self.routed_series.insert(series, self.routed.len() - 1);
                        self.routed.len() - 1
                    }
                };
                self.routed_index.insert((tenant, model, agent), index);
                index
            }
        };
        self.routed[index].1 += 1;
    }

    /// The agent left: its index entries go (its series and counts stay).
    pub fn forget_agent(&mut self, agent: AgentId) {
        self.routed_index
            .retain(|&(_, _, indexed), _| indexed != agent);
    }

    pub fn report(&self) -> TenantReport {
        TenantReport {
            requests: self
                .requests
                .iter()
                .map(|(&(_, model), (labels, counts))| (labels.clone(), model, *counts))
                .collect(),
            rate_limited: self
                .rate_limited
                .values()
                .map(|(labels, count)| (labels.clone(), *count))
                .collect(),
            token_limited: self
                .token_limited
                .iter()
                .map(|(&(_, phase), (labels, count))| (labels.clone(), phase, *count))
                .collect(),
            routed: self.routed.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> KeyLabels {
        KeyLabels {
            tenant_id: "acme".into(),
            key_id: "k1".into(),
        }
    }

    fn some_labels() -> Option<KeyLabels> {
        Some(labels())
    }

    #[test]
    fn counts_by_key_model_and_phase() {
        let mut counters = TenantCounters::default();
        let (key, model) = (KeyId(1), ModelId(3));
        counters.finished(key, model, Some(200), some_labels);
        counters.finished(key, model, Some(503), || {
            unreachable!("labels resolved once")
        });
        counters.finished(key, model, None, some_labels);
        counters.tokens(key, model, 10, 20, some_labels);
        // A key gone before its first count is not counted.
        counters.tokens(KeyId(9), model, 1, 1, || None);
        counters.rate_limited(key, some_labels);
        counters.token_limited(key, Phase::Output, some_labels);
        let report = counters.report();
        assert_eq!(
            report.requests,
            vec![(
                labels(),
                model,
                RequestCounts {
                    success: 1,
                    failed: 2,
                    input_tokens: 10,
                    output_tokens: 20,
                }
            )]
        );
        assert_eq!(report.rate_limited, vec![(labels(), 1)]);
        assert_eq!(report.token_limited, vec![(labels(), Phase::Output, 1)]);
    }

    #[test]
    fn routed_requests_count_per_engine_and_region_across_agents() {
        let mut counters = TenantCounters::default();
        let series = |region: &str| RoutedSeries {
            tenant_id: "acme".into(),
            model: ModelId(1),
            engine: "vllm".into(),
            region: region.into(),
        };
        let (tenant, model) = (TenantId(4), ModelId(1));
        counters.routed(tenant, model, AgentId(1), || Some(series("eu")));
        counters.routed(tenant, model, AgentId(1), || unreachable!("resolved once"));
        // Another agent of the same engine and region counts in the same series.
        counters.routed(tenant, model, AgentId(2), || Some(series("eu")));
        counters.routed(tenant, model, AgentId(3), || Some(series("us")));
        counters.forget_agent(AgentId(1));
        counters.routed(tenant, model, AgentId(9), || None);
        let report = counters.report();
        assert_eq!(report.routed, vec![(series("eu"), 3), (series("us"), 1)]);
        assert_eq!(counters.routed_index.len(), 2);
    }
}
