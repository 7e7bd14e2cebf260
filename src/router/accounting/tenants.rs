//! Per-tenant counters of one shard (observability reference, "Tenant and quota metrics"):
//! requests that succeeded or failed and the tokens they used, per key and model; RPM refusals
//! per key; daily-budget refusals per key and phase. Rendered by the control core with the
//! reference's labels (`tenant_id`, `key_id`, `deployment_id`, `model`, `phase`).
//!
//! Labels are resolved from the key once, when a series is first counted (the request path
//! only increments afterwards): `tenant_id` is the key's owner (`default` without keys),
//! `key_id` the dynamic entry's id, `anonymous` without keys, and `static:<id>` for a static
//! key — each static key has its own stable id here, where an older implementation labelled
//! them all `anonymous`. `deployment_id` is what the agent that served the request registered
//! (`--deployment-id`), and `unset` before routing, for a provider's answer, or when the agent
//! registered none.
//!
//! Also `hivenet_routing_requests_routed_total{model,tenant_id,engine,region}`: requests given a
//! slot on an agent, by the agent's engine and region (what autoscalers read to keep a model
//! awake, seed `hold-at-zero.md`).
//!
//! Memory: one series per (key, model, deployment) and per key ever counted on this shard;
//! counters are cumulative, so series are never dropped while the process runs. Request series
//! are found through a per-agent index (so the request path hashes ids, not strings), and routed
//! series, per (tenant, model, engine, region), the same way; an agent's index entries are
//! dropped when it leaves.

use std::sync::Arc;

use crate::base::clock::Day;
use crate::base::ids::PositionTable;
use crate::logic::auth::keys::{KeyId, KeyRecord, KeySource, TenantId};
use crate::logic::routing::AgentId;
use crate::logic::snapshot::ModelId;
use crate::router::metrics::histogram::DurationCounts;
use crate::router::shard::IdMap;

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
            tenant_id: key.owner.clone(),
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

/// The counters of one (key, model, deployment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub success: u64,
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `hivenet_tenant_request_duration_seconds`: arrival to last byte of each finished request.
    pub duration: DurationCounts,
    /// `hivenet_tenant_last_request_timestamp`: Unix seconds of the latest finished request's
    /// arrival (0: none finished yet).
    pub last_request_unix_s: i64,
    /// `hivenet_tenant_tokens_used_today`: input and output tokens counted on `today`, the UTC
    /// day of the latest count (an older day's are dropped when a newer day counts).
    pub today: Day,
    pub tokens_today: u64,
}

impl RequestCounts {
    /// Adds another shard's counts of the same series.
    pub fn merge(&mut self, other: &RequestCounts) {
        self.success += other.success;
        self.failed += other.failed;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.duration.merge(&other.duration);
        self.last_request_unix_s = self.last_request_unix_s.max(other.last_request_unix_s);
        self.count_today(other.today, other.tokens_today);
    }

    /// Adds `tokens` counted on `day`: a newer day starts the count again, an older one is
    /// dropped.
    fn count_today(&mut self, day: Day, tokens: u64) {
        if day > self.today {
            self.today = day;
            self.tokens_today = 0;
        }
        if day == self.today {
            self.tokens_today = self.tokens_today.saturating_add(tokens);
        }
    }

    /// Tokens counted on `day` (0 when the latest count was on another day).
    pub fn tokens_on(&self, day: Day) -> u64 {
        if self.today == day {
            self.tokens_today
        } else {
            0
        }
    }
}

/// When a finished request arrived and how long it took to its last byte.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub elapsed: std::time::Duration,
    pub arrived_unix_s: i64,
}

/// One `hivenet_request_duration_seconds` series: a request an agent served, by the key's
/// tenant, the agent, the model and the status the client got.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentDurationSeries {
    pub tenant_id: Arc<str>,
    pub peer_id: Arc<str>,
    pub model: ModelId,
    pub status: u16,
}

/// One `hivenet_routing_requests_failed_total` series: the key's tenant, the model, and the
/// router's error code for the request it could not forward.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailedSeries {
    pub tenant_id: Arc<str>,
    pub model: ModelId,
    pub reason: &'static str,
}

/// `deployment_id` of a request no agent served.
pub const UNSET: &str = "unset";

/// The labels of one request series: the key's, the model, and the serving deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSeries {
    pub key: KeyLabels,
    pub model: ModelId,
    pub deployment_id: Arc<str>,
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
    pub requests: Vec<(RequestSeries, RequestCounts)>,
    pub rate_limited: Vec<(KeyLabels, u64)>,
    /// Key labels, phase and `deployment_id` (`unset` for the input phase, before routing).
    pub token_limited: Vec<(KeyLabels, Phase, Arc<str>, u64)>,
    pub routed: Vec<(RoutedSeries, u64)>,
    pub agent_durations: Vec<(AgentDurationSeries, DurationCounts)>,
    pub routing_failed: Vec<(FailedSeries, u64)>,
}

/// The hash a [`PositionTable`] files a series under: seeded once per process, like `IdMap`'s (an
/// agent chooses its deployment and peer labels). Only a series' first count hashes it.
fn hash_of(labels: &impl std::hash::Hash) -> u64 {
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(Default::default).hash_one(labels)
}

#[derive(Debug, Default)]
pub struct TenantCounters {
    /// Request counts per series, which series a (key, model, deployment) counts in, and which
    /// a (key, model, serving agent) counts in (`None`: no agent served it).
    requests: Vec<(RequestSeries, RequestCounts)>,
    /// The key of each entry of `requests`, for `request_series` (the labels do not name it).
    request_keys: Vec<KeyId>,
    /// Positions in `requests` by (key, model, deployment).
    request_series: PositionTable,
    request_index: IdMap<(KeyId, ModelId, Option<AgentId>), usize>,
    rate_limited: IdMap<KeyId, (KeyLabels, u64)>,
    token_limited: IdMap<(KeyId, Phase, Arc<str>), (KeyLabels, u64)>,
    /// Routed requests per series, and which series a (tenant, model, agent) counts in.
    routed: Vec<(RoutedSeries, u64)>,
    /// Positions in `routed` by series.
    routed_series: PositionTable,
    routed_index: IdMap<(TenantId, ModelId, AgentId), usize>,
    /// Request durations per agent series, and which series a (tenant, model, agent, status)
    /// counts in.
    agent_durations: Vec<(AgentDurationSeries, DurationCounts)>,
    /// Positions in `agent_durations` by series.
    agent_duration_series: PositionTable,
    agent_duration_index: IdMap<(TenantId, ModelId, AgentId, u16), usize>,
    /// Requests the router could not forward (rare: hashed by error code, no index).
    routing_failed: IdMap<(TenantId, ModelId, &'static str), (FailedSeries, u64)>,
}

impl TenantCounters {
    /// The counters of (key, model) served by `agent`. `series` is called only the first time
    /// this (key, model, agent) is counted, for the key's labels and the agent's deployment;
    /// `None` from it (the key is gone) counts nothing.
    fn requests(
        &mut self,
        key: KeyId,
        model: ModelId,
        agent: Option<AgentId>,
        series: impl FnOnce() -> Option<(KeyLabels, Arc<str>)>,
    ) -> Option<&mut RequestCounts> {
        let index = match self.request_index.get(&(key, model, agent)) {
            Some(index) => *index,
            None => {
                let (labels, deployment_id) = series()?;
                let hash = hash_of(&(key, model, &*deployment_id));
                let (requests, request_keys) = (&self.requests, &self.request_keys);
                let found = self.request_series.find(hash, |at| {
                    request_keys[at] == key
                        && requests[at].0.model == model
                        && requests[at].0.deployment_id == deployment_id
                });
                let index = match found {
                    Some(index) => index,
                    None => {
                        self.requests.push((
                            RequestSeries {
                                key: labels,
                                model,
                                deployment_id,
                            },
                            RequestCounts::default(),
                        ));
                        self.request_keys.push(key);
                        let (requests, request_keys) = (&self.requests, &self.request_keys);
                        self.request_series.insert(hash, requests.len() - 1, |at| {
                            let (series, _) = &requests[at];
                            hash_of(&(request_keys[at], series.model, &*series.deployment_id))
                        })
                    }
                };
                self.request_index.insert((key, model, agent), index);
                index
            }
        };
        Some(&mut self.requests[index].1)
    }

    /// One finished request with the status its client got (`None`: it got no answer), served
    /// by `agent` (`None`: none was chosen).
    pub fn finished(
        &mut self,
        key: KeyId,
        model: ModelId,
        agent: Option<AgentId>,
        status: Option<u16>,
        timing: Timing,
        series: impl FnOnce() -> Option<(KeyLabels, Arc<str>)>,
    ) {
        let Some(counts) = self.requests(key, model, agent, series) else {
            return;
        };
        match status {
            Some(200..=299) => counts.success += 1,
            _ => counts.failed += 1,
        }
        counts.duration.observe(timing.elapsed);
        counts.last_request_unix_s = counts.last_request_unix_s.max(timing.arrived_unix_s);
    }

    /// A request `agent` served ended with `status` after `elapsed`; `series` is called only the
    /// first time this (tenant, model, agent, status) is counted, and `None` from it counts
    /// nothing.
    pub fn agent_duration(
        &mut self,
        (tenant, model, agent, status): (TenantId, ModelId, AgentId, u16),
        elapsed: std::time::Duration,
        series: impl FnOnce() -> Option<AgentDurationSeries>,
    ) {
        let index = match self
            .agent_duration_index
            .get(&(tenant, model, agent, status))
        {
            Some(index) => *index,
            None => {
                let Some(series) = series() else {
                    return;
                };
                let hash = hash_of(&series);
                let durations = &self.agent_durations;
                let index = match self
                    .agent_duration_series
                    .find(hash, |at| durations[at].0 == series)
                {
                    Some(index) => index,
                    None => {
                        self.agent_durations
                            .push((series, DurationCounts::default()));
                        let durations = &self.agent_durations;
                        self.agent_duration_series
                            .insert(hash, durations.len() - 1, |at| hash_of(&durations[at].0))
                    }
                };
                self.agent_duration_index
                    .insert((tenant, model, agent, status), index);
                index
            }
        };
        self.agent_durations[index].1.observe(elapsed);
    }

    /// A request the router could not forward (no agent, the forward failed, or it timed out),
    /// with the router's error code; `tenant_id` is called the first time the series is counted.
    pub fn routing_failed(
        &mut self,
        tenant: TenantId,
        model: ModelId,
        reason: &'static str,
        tenant_id: impl FnOnce() -> Arc<str>,
    ) {
        self.routing_failed
            .entry((tenant, model, reason))
            .or_insert_with(|| {
                let series = FailedSeries {
                    tenant_id: tenant_id(),
                    model,
                    reason,
                };
                (series, 0)
            })
            .1 += 1;
    }

    /// Tokens a request used, counted on `day` (the UTC day they were reported) too.
    #[allow(clippy::too_many_arguments)]
    pub fn tokens(
        &mut self,
        key: KeyId,
        model: ModelId,
        agent: Option<AgentId>,
        input: u64,
        output: u64,
        day: Day,
        series: impl FnOnce() -> Option<(KeyLabels, Arc<str>)>,
    ) {
        let Some(counts) = self.requests(key, model, agent, series) else {
            return;
        };
        counts.input_tokens += input;
        counts.output_tokens += output;
        counts.count_today(day, input.saturating_add(output));
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

    /// A daily-budget refusal; `deployment_id` is the serving agent's for the output phase
    /// (refusals are rare: the string is hashed here, no index).
    pub fn token_limited(
        &mut self,
        key: KeyId,
        phase: Phase,
        deployment_id: Arc<str>,
        labels: impl FnOnce() -> Option<KeyLabels>,
    ) {
        let entry = match self.token_limited.entry((key, phase, deployment_id)) {
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
                let hash = hash_of(&series);
                let routed = &self.routed;
                let index = match self.routed_series.find(hash, |at| routed[at].0 == series) {
                    Some(index) => index,
                    None => {
                        self.routed.push((series, 0));
                        let routed = &self.routed;
                        self.routed_series
                            .insert(hash, routed.len() - 1, |at| hash_of(&routed[at].0))
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
        self.request_index
            .retain(|&(_, _, indexed), _| indexed != Some(agent));
        self.agent_duration_index
            .retain(|&(_, _, indexed, _), _| indexed != agent);
    }

    pub fn report(&self) -> TenantReport {
        TenantReport {
            requests: self.requests.clone(),
            rate_limited: self
                .rate_limited
                .values()
                .map(|(labels, count)| (labels.clone(), *count))
                .collect(),
            token_limited: self
                .token_limited
                .iter()
                .map(|((_, phase, deployment_id), (labels, count))| {
                    (labels.clone(), *phase, deployment_id.clone(), *count)
                })
                .collect(),
            routed: self.routed.clone(),
            agent_durations: self.agent_durations.clone(),
            routing_failed: self.routing_failed.values().cloned().collect(),
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

    fn timing() -> Timing {
        Timing {
            elapsed: std::time::Duration::from_millis(30),
            arrived_unix_s: 1_700_000_000,
        }
    }

    fn some_labels() -> Option<KeyLabels> {
        Some(labels())
    }

    fn series(deployment_id: &str) -> Option<(KeyLabels, Arc<str>)> {
        Some((labels(), deployment_id.into()))
    }

    fn request_series(deployment_id: &str) -> RequestSeries {
        RequestSeries {
            key: labels(),
            model: ModelId(3),
            deployment_id: deployment_id.into(),
        }
    }

    #[test]
    fn counts_by_key_model_deployment_and_phase() {
        let mut counters = TenantCounters::default();
        let (key, model) = (KeyId(1), ModelId(3));
        counters.finished(key, model, Some(AgentId(1)), Some(200), timing(), || {
            series("deploy-42")
        });
        counters.finished(key, model, Some(AgentId(1)), Some(503), timing(), || {
            unreachable!("labels resolved once per agent")
        });
        // Another agent of the same deployment counts in the same series.
        counters.finished(key, model, Some(AgentId(2)), Some(200), timing(), || {
            series("deploy-42")
        });
        // Refused before routing: no agent, `unset`.
        counters.finished(key, model, None, None, timing(), || series(UNSET));
        counters.tokens(key, model, Some(AgentId(2)), 10, 20, Day(7), || {
            unreachable!("resolved")
        });
        // A key gone before its first count is not counted.
        counters.tokens(KeyId(9), model, None, 1, 1, Day(7), || None);
        counters.rate_limited(key, some_labels);
        counters.token_limited(key, Phase::Input, UNSET.into(), some_labels);
        counters.token_limited(key, Phase::Output, "deploy-42".into(), some_labels);
        counters.token_limited(key, Phase::Output, "deploy-42".into(), some_labels);
        let report = counters.report();
        let mut three = DurationCounts::default();
        let mut one = DurationCounts::default();
        for _ in 0..3 {
            three.observe(timing().elapsed);
        }
        one.observe(timing().elapsed);
        assert_eq!(
            report.requests,
            vec![
                (
                    request_series("deploy-42"),
                    RequestCounts {
                        success: 2,
                        failed: 1,
                        input_tokens: 10,
                        output_tokens: 20,
                        duration: three,
                        last_request_unix_s: 1_700_000_000,
                        today: Day(7),
                        tokens_today: 30,
                    }
                ),
                (
                    request_series(UNSET),
                    RequestCounts {
                        failed: 1,
                        duration: one,
                        last_request_unix_s: 1_700_000_000,
                        ..RequestCounts::default()
                    }
                ),
            ]
        );
        assert_eq!(report.rate_limited, vec![(labels(), 1)]);
        let mut token_limited = report.token_limited;
        token_limited.sort();
        assert_eq!(
            token_limited,
            vec![
                (labels(), Phase::Input, UNSET.into(), 1),
                (labels(), Phase::Output, "deploy-42".into(), 2),
            ]
        );
    }

    #[test]
    fn tokens_used_today_start_again_on_a_new_day_and_merge_by_day() {
        let mut counters = TenantCounters::default();
        let (key, model) = (KeyId(1), ModelId(3));
        counters.tokens(key, model, None, 10, 5, Day(7), || series(UNSET));
        counters.tokens(key, model, None, 1, 2, Day(7), || unreachable!("resolved"));
        let before_midnight = counters.report().requests[0].1;
        assert_eq!(before_midnight.tokens_on(Day(7)), 18);
        counters.tokens(key, model, None, 4, 0, Day(8), || unreachable!("resolved"));
        let after_midnight = counters.report().requests[0].1;
        assert_eq!(after_midnight.tokens_on(Day(8)), 4);
        assert_eq!(after_midnight.tokens_on(Day(7)), 0);
        assert_eq!(
            after_midnight.input_tokens, 15,
            "the lifetime counters go on"
        );
        // Another shard still on yesterday adds nothing to today, whichever merges into which.
        let mut merged = before_midnight;
        merged.merge(&after_midnight);
        assert_eq!(merged.tokens_on(Day(8)), 4);
        let mut merged = after_midnight;
        merged.merge(&before_midnight);
        assert_eq!(merged.tokens_on(Day(8)), 4);
        merged.merge(&after_midnight);
        assert_eq!(merged.tokens_on(Day(8)), 8);
    }

    #[test]
    fn a_departed_agent_leaves_its_series_and_counts() {
        let mut counters = TenantCounters::default();
        let (key, model) = (KeyId(1), ModelId(3));
        counters.finished(key, model, Some(AgentId(1)), Some(200), timing(), || {
            series("deploy-42")
        });
        counters.forget_agent(AgentId(1));
        assert!(counters.request_index.is_empty());
        // The same agent id seen again resolves afresh, into the series that exists.
        counters.finished(key, model, Some(AgentId(1)), Some(200), timing(), || {
            series("deploy-42")
        });
        assert_eq!(counters.report().requests.len(), 1);
        assert_eq!(counters.report().requests[0].1.success, 2);
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

    #[test]
    fn agent_durations_and_routing_failures_count_per_series() {
        let mut counters = TenantCounters::default();
        let series = |peer: &str, status| AgentDurationSeries {
            tenant_id: "acme".into(),
            peer_id: peer.into(),
            model: ModelId(1),
            status,
        };
        let seconds = std::time::Duration::from_millis(20);
        let (tenant, model) = (TenantId(4), ModelId(1));
        counters.agent_duration((tenant, model, AgentId(1), 200), seconds, || {
            Some(series("p1", 200))
        });
        counters.agent_duration((tenant, model, AgentId(1), 200), seconds, || {
            unreachable!("resolved once")
        });
        counters.agent_duration((tenant, model, AgentId(1), 502), seconds, || {
            Some(series("p1", 502))
        });
        counters.forget_agent(AgentId(1));
        assert!(counters.agent_duration_index.is_empty());
        counters.routing_failed(tenant, model, "no_healthy_agents", || "acme".into());
        counters.routing_failed(tenant, model, "no_healthy_agents", || unreachable!());
        let report = counters.report();
        let counts: Vec<_> = report
            .agent_durations
            .iter()
            .map(|(series, durations)| (series.status, durations.count()))
            .collect();
        assert_eq!(counts, vec![(200, 2), (502, 1)]);
        assert_eq!(report.routing_failed.len(), 1);
        assert_eq!(report.routing_failed[0].1, 2);
    }

    /// Thousands of series through the position tables (which grow and rehash from the series
    /// vectors): each is found again from a new agent, none is counted twice.
    #[test]
    fn many_series_are_each_found_again_from_another_agent() {
        let mut counters = TenantCounters::default();
        let keys = 3_000u32;
        let key_series = |index: u32| {
            Some((
                KeyLabels {
                    tenant_id: format!("t{index}").into(),
                    key_id: format!("k{index}").into(),
                },
                Arc::<str>::from("deploy"),
            ))
        };
        let routed = |index: u32| RoutedSeries {
            tenant_id: format!("t{index}").into(),
            model: ModelId(1),
            engine: "vllm".into(),
            region: "eu".into(),
        };
        let duration = |index: u32| AgentDurationSeries {
            tenant_id: format!("t{index}").into(),
            peer_id: "p".into(),
            model: ModelId(1),
            status: 200,
        };
        let seconds = std::time::Duration::from_millis(5);
        // Agents 1 and 2 share their labels (one deployment, engine, region and peer label), so
        // the second agent's first request of a key counts in the series the first one made.
        for agent in [AgentId(1), AgentId(2)] {
            for index in 0..keys {
                let (key, tenant) = (KeyId(index), TenantId(index));
                counters.finished(key, ModelId(1), Some(agent), Some(200), timing(), || {
                    key_series(index)
                });
                counters.routed(tenant, ModelId(1), agent, || Some(routed(index)));
                counters.agent_duration((tenant, ModelId(1), agent, 200), seconds, || {
                    Some(duration(index))
                });
            }
        }
        let report = counters.report();
        assert_eq!(report.requests.len(), keys as usize);
        assert!(
            report
                .requests
                .iter()
                .all(|(_, counts)| counts.success == 2)
        );
        assert_eq!(report.routed.len(), keys as usize);
        assert!(report.routed.iter().all(|(_, count)| *count == 2));
        assert_eq!(report.agent_durations.len(), keys as usize);
        assert!(
            report
                .agent_durations
                .iter()
                .all(|(_, durations)| durations.count() == 2)
        );
        // Another deployment of one key is a series of its own.
        counters.finished(
            KeyId(7),
            ModelId(1),
            Some(AgentId(3)),
            Some(200),
            timing(),
            || Some((key_series(7).unwrap().0, "other".into())),
        );
        assert_eq!(counters.report().requests.len(), keys as usize + 1);
    }
}
