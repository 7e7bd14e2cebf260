//! The `hivenet_agent_*` families on the router's `/metrics` (observability reference,
//! "Per-agent metrics", "Engine metrics", "Engine histograms", "GPU metrics", "CPU and memory
//! metrics"), built at scrape time from what the registry holds: the router's lifetime counters
//! of every (agent, model) (`registry::history`), and each registered agent's current engine,
//! host and GPU reports. Agents expose no Prometheus port of their own.
//!
//! Labels, as the reference lists them: per-agent and engine series carry `peer_id`, `model`,
//! `engine`, `organization`, `machine`; CPU and memory add `region`; GPUs add `region`,
//! `gpu_index` and `gpu_id`. An agent serving several models has one series per model (the host
//! values repeat, as they do in the reference).
//!
//! Absent, not zero: a success rate before any finished request, SRTT before the first latency
//! sample, an engine value the engine never reported, a host reading the agent could not take
//! and every GPU series of a host without NVML are left out. Engine and host series of an agent
//! go when it is no longer registered; its lifetime counters stay until a reset.

use std::collections::BTreeMap;

use crate::logic::routing::counters::ResetReason;
use crate::router::control::registry::{AgentLabels, HistoryRow, LiveAgent};
use crate::router::metrics::{Collect, Family};
use crate::wire::proto::{EngineReport, GpuStats, HostStats};

/// One scrape's view of the agents.
pub struct AgentFamilies<'a> {
    /// Every (agent, model) with lifetime counters, and the model's name.
    pub history: &'a [(HistoryRow, &'a str)],
    /// Every registered agent now.
    pub live: &'a [LiveAgent],
}

impl Collect for AgentFamilies<'_> {
    fn collect(&self, out: &mut Vec<Family>) {
        collect_history(self.history, out);
        collect_capacity(self.live, out);
        collect_engine(self.live, out);
        collect_host(self.live, out);
        collect_gpus(self.live, out);
        collect_unproven(self.live, out);
    }
}

/// Routers each agent refused to send credentials to, because they could not prove they hold the
/// site's secret (`base::challenge`): a wrong address, or an impostor listed in the store.
fn collect_unproven(live: &[LiveAgent], out: &mut Vec<Family>) {
    let mut family = Family::counter(
        "hivenet_agent_unproven_routers_total",
        "Routers the agent dialled that failed to prove they belong to the site; it sent them no credential.",
    );
    for agent in live {
        family.sample(
            &[
                ("peer_id", agent.peer_id.as_str()),
                ("organization", agent.labels.organization.as_str()),
                ("machine", agent.labels.machine.as_str()),
            ],
            agent.unproven_routers as f64,
        );
    }
    out.push(family);
}

/// `peer_id`, `model`, `engine`, `organization`, `machine`.
fn agent_labels<'a>(
    peer_id: &'a str,
    model: &'a str,
    labels: &'a AgentLabels,
) -> [(&'static str, &'a str); 5] {
    [
        ("peer_id", peer_id),
        ("model", model),
        ("engine", &labels.engine),
        ("organization", &labels.organization),
        ("machine", &labels.machine),
    ]
}

/// `peer_id`, `region`, `model`, `engine`, `organization`, `machine`.
fn host_labels<'a>(
    peer_id: &'a str,
    model: &'a str,
    labels: &'a AgentLabels,
) -> [(&'static str, &'a str); 6] {
    [
        ("peer_id", peer_id),
        ("region", &labels.region),
        ("model", model),
        ("engine", &labels.engine),
        ("organization", &labels.organization),
        ("machine", &labels.machine),
    ]
}

fn collect_history(history: &[(HistoryRow, &str)], out: &mut Vec<Family>) {
    type Value = fn(&crate::logic::routing::counters::AgentTotals) -> Option<f64>;
    let families: [(Family, Value); 10] = [
        (
            Family::counter(
                "hivenet_agent_requests_success_total",
                "Requests the agent answered with a 2xx status, over the agent's lifetime.",
            ),
            |totals| Some(totals.success as f64),
        ),
        (
            Family::counter(
                "hivenet_agent_requests_failed_total",
                "Requests forwarded to the agent that failed (error status, transport failure, client gone).",
            ),
            |totals| Some(totals.failed as f64),
        ),
        (
            Family::gauge(
                "hivenet_agent_success_rate",
                "Successful over finished requests, 0.0 to 1.0; absent before the first.",
            ),
            |totals| totals.success_rate(),
        ),
        (
            Family::counter(
                "hivenet_agent_input_tokens_total",
                "Exact input tokens of the requests the agent served.",
            ),
            |totals| Some(totals.input_tokens as f64),
        ),
        (
            Family::counter(
                "hivenet_agent_output_tokens_total",
                "Exact output tokens of the requests the agent served.",
            ),
            |totals| Some(totals.output_tokens as f64),
        ),
        (
            Family::counter(
                "hivenet_agent_disconnections_total",
                "Sessions of the agent that ended.",
            ),
            |totals| Some(totals.disconnections as f64),
        ),
        (
            Family::counter(
                "hivenet_agent_failure_total",
                "Times the agent was marked unhealthy after missed heartbeats.",
            ),
            |totals| Some(totals.failures as f64),
        ),
        (
            Family::counter(
                "hivenet_agent_rejected_requests_total",
                "Attempts the agent or its engine refused for capacity or readiness (status 429 or 503).",
            ),
            |totals| Some(totals.rejected as f64),
        ),
        (
            Family::gauge(
                "hivenet_agent_srtt_ms",
                "Smoothed request round-trip time to response headers, in milliseconds.",
            ),
            |totals| totals.latency_ms.map(|(srtt, _)| srtt),
        ),
        (
            Family::gauge(
                "hivenet_agent_rttvar_ms",
                "Round-trip time variation, in milliseconds.",
            ),
            |totals| totals.latency_ms.map(|(_, rttvar)| rttvar),
        ),
    ];
    for (mut family, value) in families {
        for (row, model) in history {
            if let Some(value) = value(&row.totals) {
                family.sample(&agent_labels(&row.peer_id, model, &row.labels), value);
            }
        }
        out.push(family);
    }
    // The reference's labels, `model` and `reason`: summed over the model's agents (each
    // agent's own count is in the routing table's history).
    let mut resets = Family::counter(
        "hivenet_agent_connection_resets_total",
        "Requests cut before their answer ended because the router-agent tunnel (reason tunnel) or the agent's engine connection (reason engine) broke.",
    );
    let mut by_model: BTreeMap<&str, [u64; ResetReason::ALL.len()]> = BTreeMap::new();
    for (row, model) in history {
        let sums = by_model.entry(model).or_default();
        for (sum, count) in sums.iter_mut().zip(row.totals.resets) {
            *sum += count;
        }
    }
    for (model, counts) in by_model {
        for (reason, count) in ResetReason::ALL.into_iter().zip(counts) {
            resets.sample(
                &[("model", model), ("reason", reason.as_str())],
                count as f64,
            );
        }
    }
    out.push(resets);
}

fn collect_capacity(live: &[LiveAgent], out: &mut Vec<Family>) {
    let mut family = Family::gauge(
        "hivenet_agent_capacity_utilization",
        "Requests the agent reports serving over its declared capacity.",
    );
    for agent in live {
        for model in &agent.models {
            family.sample(
                &agent_labels(&agent.peer_id, model, &agent.labels),
                agent.capacity_utilization,
            );
        }
    }
    out.push(family);
}

fn collect_engine(live: &[LiveAgent], out: &mut Vec<Family>) {
    type Value = fn(&LiveAgent, &EngineReport) -> Option<f64>;
    let gauges: [(&str, &str, Value); 13] = [
        (
            "hivenet_agent_engine_kv_cache_utilization",
            "The engine's KV-cache use, 0.0 to 1.0.",
            |agent, _| agent.engine.kv_cache_utilization,
        ),
        (
            "hivenet_agent_engine_running_requests",
            "Requests the engine is running.",
            |agent, _| agent.engine.running_requests,
        ),
        (
            "hivenet_agent_engine_waiting_requests",
            "Requests waiting in the engine's queue.",
            |agent, _| agent.engine.waiting_requests,
        ),
        (
            "hivenet_agent_engine_preemptions_total",
            "The engine's latest cumulative preemption count (a gauge: it may fall when the engine restarts).",
            |_, report| report.preemptions_total,
        ),
        (
            "hivenet_agent_engine_avg_ttft_seconds",
            "The engine's mean time to first token, in seconds.",
            |_, report| report.avg_ttft_seconds,
        ),
        (
            "hivenet_agent_engine_p90_ttft_seconds",
            "The engine's 90th-percentile time to first token, estimated from its histogram, in seconds.",
            |_, report| report.p90_ttft_seconds,
        ),
        (
            "hivenet_agent_engine_avg_itl_seconds",
            "The engine's mean inter-token latency, in seconds.",
            |_, report| report.avg_itl_seconds,
        ),
        (
            "hivenet_agent_engine_p90_itl_seconds",
            "The engine's 90th-percentile inter-token latency, estimated from its histogram, in seconds.",
            |_, report| report.p90_itl_seconds,
        ),
        (
            "hivenet_agent_engine_predicted_tps",
            "llama.cpp's latest generation throughput, tokens per second.",
            |_, report| report.predicted_tps,
        ),
        (
            "hivenet_agent_engine_prompt_tps",
            "llama.cpp's latest prompt-ingestion throughput, tokens per second.",
            |_, report| report.prompt_tps,
        ),
        (
            "hivenet_agent_engine_prefix_cache_queries_total",
            "Prompt tokens the engine looked up in its prefix cache, its latest cumulative count (a gauge: it may fall when the engine restarts).",
            |_, report| report.prefix_cache_queries_total,
        ),
        (
            "hivenet_agent_engine_prefix_cache_hits_total",
            "Prompt tokens the engine found in its prefix cache, its latest cumulative count (a gauge: it may fall when the engine restarts).",
            |_, report| report.prefix_cache_hits_total,
        ),
        (
            "hivenet_agent_engine_prefix_cache_hit_rate",
            "The engine's prefix-cache hits over lookups since it started (vLLM), or its own hit rate (SGLang), 0.0 to 1.0.",
            |_, report| report.prefix_cache_hit_rate,
        ),
    ];
    let none = EngineReport::default();
    for (name, help, value) in gauges {
        let mut family = Family::gauge(name, help);
        for agent in live {
            let report = agent.engine_report.as_ref().unwrap_or(&none);
            let Some(value) = value(agent, report) else {
                continue;
            };
            for model in &agent.models {
                family.sample(&agent_labels(&agent.peer_id, model, &agent.labels), value);
            }
        }
        out.push(family);
    }
    let mut finished = Family::counter(
        "hivenet_agent_engine_request_success_total",
        "Requests the engine finished, by finish reason, counted since the router began tracking the agent.",
    );
    for agent in live {
        for model in &agent.models {
            let [peer_id, model, engine, organization, machine] =
                agent_labels(&agent.peer_id, model, &agent.labels);
            for (reason, count) in agent.finished.counts() {
                finished.sample(
                    &[
                        peer_id,
                        model,
                        engine,
                        organization,
                        machine,
                        ("finished_reason", reason),
                    ],
                    count,
                );
            }
        }
    }
    out.push(finished);
    collect_engine_histograms(live, out);
}

/// vLLM's raw histograms, cumulative as the engine reported them (the `+Inf` bucket is the
/// encoder's, from the count).
fn collect_engine_histograms(live: &[LiveAgent], out: &mut Vec<Family>) {
    let families = [
        (
            "ttft_seconds",
            "hivenet_agent_engine_ttft_seconds",
            "The engine's time to first token, in seconds.",
        ),
        (
            "itl_seconds",
            "hivenet_agent_engine_itl_seconds",
            "The engine's inter-token latency, in seconds.",
        ),
        (
            "request_prompt_tokens",
            "hivenet_agent_engine_request_prompt_tokens",
            "Prompt length of the engine's requests, in tokens.",
        ),
        (
            "request_generation_tokens",
            "hivenet_agent_engine_request_generation_tokens",
            "Generated length of the engine's requests, in tokens.",
        ),
    ];
    for (reported, name, help) in families {
        let mut family = Family::histogram(name, help);
        for agent in live {
            let Some(histogram) = agent
                .engine_report
                .iter()
                .flat_map(|report| &report.histograms)
                .find(|histogram| histogram.name == reported)
            else {
                continue;
            };
            let buckets: Vec<(f64, u64)> = histogram
                .buckets
                .iter()
                .filter(|bucket| bucket.le.is_finite())
                .map(|bucket| (bucket.le, bucket.count))
                .collect();
            for model in &agent.models {
                family.histogram_sample(
                    &agent_labels(&agent.peer_id, model, &agent.labels),
                    &buckets,
                    histogram.sum,
                    histogram.count,
                );
            }
        }
        out.push(family);
    }
}

fn collect_host(live: &[LiveAgent], out: &mut Vec<Family>) {
    type Value = fn(&HostStats) -> Option<f64>;
    let gauges: [(&str, &str, Value); 4] = [
        (
            "hivenet_agent_cpu_usage_percent",
            "Busy share of the agent host's CPUs, 0 to 100.",
            |host| host.cpu_usage_percent,
        ),
        (
            "hivenet_agent_memory_used_percent",
            "The agent host's memory in use, 0 to 100.",
            |host| host.memory_used_percent,
        ),
        (
            "hivenet_agent_memory_available_bytes",
            "The agent host's available memory, in bytes.",
            |host| host.memory_available_bytes.map(|bytes| bytes as f64),
        ),
        (
            "hivenet_agent_memory_total_bytes",
            "The agent host's total memory, in bytes.",
            |host| host.memory_total_bytes.map(|bytes| bytes as f64),
        ),
    ];
    for (name, help, value) in gauges {
        let mut family = Family::gauge(name, help);
        for agent in live {
            let Some(value) = agent.host.as_ref().and_then(value) else {
                continue;
            };
            for model in &agent.models {
                family.sample(&host_labels(&agent.peer_id, model, &agent.labels), value);
            }
        }
        out.push(family);
    }
}

fn collect_gpus(live: &[LiveAgent], out: &mut Vec<Family>) {
    type Value = fn(&GpuStats) -> Option<f64>;
    let gauges: [(&str, &str, Value); 6] = [
        (
            "hivenet_agent_gpu_utilization_percent",
            "GPU utilization, 0 to 100.",
            |gpu| gpu.utilization_percent,
        ),
        (
            "hivenet_agent_gpu_vram_used_bytes",
            "GPU memory in use, in bytes.",
            |gpu| gpu.vram_used_bytes.map(|bytes| bytes as f64),
        ),
        (
            "hivenet_agent_gpu_vram_free_bytes",
            "GPU memory free, in bytes.",
            |gpu| gpu.vram_free_bytes.map(|bytes| bytes as f64),
        ),
        (
            "hivenet_agent_gpu_vram_total_bytes",
            "GPU memory in total, in bytes.",
            |gpu| gpu.vram_total_bytes.map(|bytes| bytes as f64),
        ),
        (
            "hivenet_agent_gpu_temperature_celsius",
            "GPU temperature, in degrees Celsius.",
            |gpu| gpu.temperature_celsius,
        ),
        (
            "hivenet_agent_gpu_power_watts",
            "GPU power draw, in watts.",
            |gpu| gpu.power_watts,
        ),
    ];
    for (name, help, value) in gauges {
        let mut family = Family::gauge(name, help);
        for agent in live {
            for gpu in agent.host.iter().flat_map(|host| &host.gpus) {
                let Some(value) = value(gpu) else {
                    continue;
                };
                let index = gpu.index.to_string();
                for model in &agent.models {
                    let labels = &agent.labels;
                    family.sample(
                        &[
                            ("peer_id", &agent.peer_id),
                            ("region", &labels.region),
                            ("model", model),
                            ("engine", &labels.engine),
                            ("gpu_index", &index),
                            ("gpu_id", &gpu.uuid),
                            ("organization", &labels.organization),
                            ("machine", &labels.machine),
                        ],
                        value,
                    );
                }
            }
        }
        out.push(family);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::{Capability, ModelId, ModelNameId};
    use crate::logic::routing::EngineSignals;
    use crate::logic::routing::counters::AgentTotals;
    use crate::router::metrics::encode;
    use crate::wire::proto::{EngineHistogram, HistogramBucket};

    fn labels() -> AgentLabels {
        AgentLabels {
            engine: "vllm".into(),
            region: "eu".into(),
            organization: "ml-team".into(),
            machine: "gpu-1".into(),
        }
    }

    fn live(host: Option<HostStats>, report: Option<EngineReport>) -> LiveAgent {
        LiveAgent {
            peer_id: "12D3KooWpeer".into(),
            models: vec!["m".into()],
            labels: labels(),
            capacity_utilization: 0.25,
            engine: EngineSignals {
                kv_cache_utilization: Some(0.5),
                ..EngineSignals::default()
            },
            engine_report: report,
            finished: Default::default(),
            host,
            unproven_routers: 0,
        }
    }

    fn render(history: &[(HistoryRow, &str)], live: &[LiveAgent]) -> String {
        let mut families = Vec::new();
        AgentFamilies { history, live }.collect(&mut families);
        encode(families)
    }

    #[test]
    fn lifetime_counters_carry_the_catalog_labels_and_absent_rates_stay_absent() {
        let row = HistoryRow {
            peer_id: "12D3KooWpeer".into(),
            model: ModelId::new(ModelNameId(0), Capability::Llm),
            labels: labels(),
            totals: AgentTotals {
                success: 3,
                failed: 1,
                ..AgentTotals::default()
            },
        };
        let text = render(&[(row.clone(), "m")], &[]);
        let series = r#"{peer_id="12D3KooWpeer",model="m",engine="vllm",organization="ml-team",machine="gpu-1"}"#;
        assert!(
            text.contains(&format!("hivenet_agent_requests_success_total{series} 3")),
            "{text}"
        );
        assert!(text.contains(&format!("hivenet_agent_success_rate{series} 0.75")));
        assert!(!text.contains("hivenet_agent_srtt_ms"));
        let fresh = HistoryRow {
            totals: AgentTotals::default(),
            ..row
        };
        assert!(!render(&[(fresh, "m")], &[]).contains("hivenet_agent_success_rate"));
    }

    #[test]
    fn hosts_without_gpus_print_no_gpu_series() {
        let host = HostStats {
            cpu_usage_percent: Some(12.5),
            memory_total_bytes: Some(1024),
            ..HostStats::default()
        };
        let text = render(&[], &[live(Some(host.clone()), None)]);
        assert!(text.contains(r#"hivenet_agent_cpu_usage_percent{peer_id="12D3KooWpeer",region="eu",model="m",engine="vllm",organization="ml-team",machine="gpu-1"} 12.5"#), "{text}");
        assert!(!text.contains("hivenet_agent_memory_used_percent"));
        assert!(!text.contains("hivenet_agent_gpu_"));
        let with_gpu = HostStats {
            gpus: vec![GpuStats {
                index: 0,
                uuid: "GPU-1".into(),
                power_watts: Some(250.0),
                ..GpuStats::default()
            }],
            ..host
        };
        let text = render(&[], &[live(Some(with_gpu), None)]);
        assert!(text.contains(r#"hivenet_agent_gpu_power_watts{peer_id="12D3KooWpeer",region="eu",model="m",engine="vllm",gpu_index="0",gpu_id="GPU-1",organization="ml-team",machine="gpu-1"} 250"#), "{text}");
        assert!(!text.contains("hivenet_agent_gpu_temperature_celsius"));
    }

    #[test]
    fn engine_histograms_are_forwarded_and_missing_values_absent() {
        let report = EngineReport {
            p90_ttft_seconds: Some(0.2),
            histograms: vec![EngineHistogram {
                name: "ttft_seconds".into(),
                buckets: vec![
                    HistogramBucket { le: 0.1, count: 2 },
                    HistogramBucket {
                        le: f64::INFINITY,
                        count: 5,
                    },
                ],
                sum: 1.5,
                count: 5,
            }],
            ..EngineReport::default()
        };
        let text = render(&[], &[live(None, Some(report))]);
        assert!(
            text.contains("hivenet_agent_engine_p90_ttft_seconds{"),
            "{text}"
        );
        assert!(text.contains("hivenet_agent_engine_kv_cache_utilization{"));
        assert!(!text.contains("hivenet_agent_engine_running_requests"));
        assert!(text.contains(r#"hivenet_agent_engine_ttft_seconds_bucket{peer_id="12D3KooWpeer",model="m",engine="vllm",organization="ml-team",machine="gpu-1",le="0.1"} 2"#), "{text}");
        assert!(text.contains(r#"le="+Inf"} 5"#));
        assert!(!text.contains("hivenet_agent_engine_itl_seconds"));
    }
}
