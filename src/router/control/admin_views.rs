//! The operator's read-only views of the agent registry: `GET /admin/models`,
//! `GET /admin/models/{model}` and `GET /admin/routing-table` (admin reference, "Operator model
//! catalog" and "Routing table"). Pure: each view is built from [`AgentView`]s the caller read
//! from the registry, so it is tested without a control core.
//!
//! The catalog has the shapes of the models reference (`/v1/models`, `/v1/models/{model}`) but is
//! never filtered by a client key, and it counts every *registered* agent: `agents.total` and
//! `agents.total_capacity` include agents that are out of the routing pool, `agents.healthy`
//! only those in it (the public listing, built from the routing snapshot, shows only the pool).
//! A model is listed once per capability it is registered for.
//!
//! What this router does not know is left out rather than invented: `pretty_name` and `info`.
//! The routing table's `universal` section is the registry's per-agent lifetime history
//! (`registry::history`), without `rejected_requests_total` (not counted yet). Not built yet:
//! `hardware` (the registry holds the agents' host reports for `/metrics`). `engine` is present
//! only once the agent reported an engine metric, as the reference says.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::base::ids::Capability;
use crate::router::control::registry::AgentView;

/// Every model registered by any agent, in the `/v1/models` list shape, sorted by name then
/// capability.
pub fn models(agents: &[AgentView]) -> Value {
    let data: Vec<Value> = by_model(agents)
        .into_iter()
        .map(|((name, capability), serving)| model_entry(&name, capability, &serving, false))
        .collect();
    json!({ "object": "list", "data": data })
}

/// One model in the `/v1/models/{model}` shape, with `agents.list`; `None` when no agent
/// registered it. A name registered for several capabilities answers its first (`llm`, then
/// `embedding`, then `reranker`).
pub fn model(agents: &[AgentView], name: &str) -> Option<Value> {
    by_model(agents)
        .into_iter()
        .find(|((model, _), _)| model == name)
        .map(|((model, capability), serving)| model_entry(&model, capability, &serving, true))
}

/// Every registered agent with its metadata, pool status and engine signals.
pub fn routing_table(agents: &[AgentView]) -> Value {
    let rows: Vec<Value> = agents.iter().map(routing_row).collect();
    json!({ "total": rows.len(), "agents": rows })
}

type ModelKey = (String, Capability);

fn by_model(agents: &[AgentView]) -> BTreeMap<ModelKey, Vec<&AgentView>> {
    let mut models: BTreeMap<ModelKey, Vec<&AgentView>> = BTreeMap::new();
    for agent in agents {
        for name in &agent.registration.models {
            models
                .entry((name.clone(), agent.registration.capability))
                .or_default()
                .push(agent);
        }
    }
    models
}

fn model_entry(name: &str, capability: Capability, serving: &[&AgentView], detail: bool) -> Value {
    let engines: BTreeSet<&str> = serving
        .iter()
        .map(|agent| agent.registration.engine.as_str())
        .collect();
    let regions: BTreeSet<&str> = serving
        .iter()
        .map(|agent| agent.registration.region.as_str())
        .collect();
    let capacity: u64 = serving
        .iter()
        .map(|agent| u64::from(agent.registration.capacity))
        .sum();
    let mut summary = json!({
        "total": serving.len(),
        "healthy": serving.iter().filter(|agent| agent.routable).count(),
        "total_capacity": capacity,
        "engines": engines,
        "regions": regions,
    });
    if detail {
        let list: Vec<Value> = serving
            .iter()
            .map(|agent| {
                json!({
                    "peer_id": agent.peer_id,
                    "engine": agent.registration.engine,
                    "version": agent.registration.version,
                    "region": agent.registration.region,
                    "capacity": agent.registration.capacity,
                    "is_healthy": agent.routable,
                    "last_seen": agent.last_seen_unix_ms.div_euclid(1000),
                })
            })
            .collect();
        summary["list"] = Value::Array(list);
    }
    json!({
        "id": name,
        "object": "model",
        "owned_by": "hivenet-router",
        "capability": capability.as_str(),
        "agents": summary,
    })
}

fn routing_row(agent: &AgentView) -> Value {
    let registration = &agent.registration;
    let utilization = if registration.capacity == 0 {
        0.0
    } else {
        f64::from(agent.in_flight) / f64::from(registration.capacity)
    };
    let mut row = json!({
        "peer_id": agent.peer_id,
        "metadata": {
            "model": registration.models.first(),
            "models": registration.models,
            "engine": registration.engine,
            "region": registration.region,
            "organization": registration.organization,
            "machine": registration.machine,
            "capacity": registration.capacity,
            "tags": registration.tags,
            "capability": registration.capability.as_str(),
            "version": registration.version,
            "deployment_id": registration.deployment_id,
            "replica_id": registration.replica_id,
        },
        "status": {
            // In the routing pool: registered, every shard's tunnel up, heartbeat fresh, not
            // leaving.
            "healthy": agent.routable,
            // An agent registers only once its backend passed its health check; after that the
            // router's view of the backend is the agent's heartbeat.
            "backend_healthy": agent.heartbeat_fresh,
            "active_requests": agent.in_flight,
            "capacity_utilization": utilization,
            "last_seen": last_seen(agent),
        },
    });
    row["universal"] = universal(agent);
    if let Some(host) = &agent.host {
        row["hardware"] = hardware(host, &last_seen(agent));
    }
    let signals = agent.engine;
    let mut engine = Map::new();
    for (name, value) in [
        ("kv_cache_utilization", signals.kv_cache_utilization),
        ("running_requests", signals.running_requests),
        ("waiting_requests", signals.waiting_requests),
    ] {
        if let Some(value) = value {
            engine.insert(name.to_owned(), json!(value));
        }
    }
    if !engine.is_empty() {
        row["engine"] = Value::Object(engine);
    }
    row
}

/// The agent's last heartbeat, RFC 3339 with milliseconds.
fn last_seen(agent: &AgentView) -> String {
    crate::router::audit::Timestamp(
        std::time::SystemTime::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(agent.last_seen_unix_ms).unwrap_or(0)),
    )
    .to_string()
}

/// The routing table's `hardware` section (admin reference, "Response sections"): the host
/// snapshot of the agent's last heartbeat, which carries it, so `timestamp` is that heartbeat's.
/// A value the agent did not measure is left out; `gpu` is empty on a host without NVML.
fn hardware(host: &crate::wire::proto::HostStats, timestamp: &str) -> Value {
    fn put(object: &mut Map<String, Value>, name: &str, value: Option<Value>) {
        if let Some(value) = value {
            object.insert(name.to_owned(), value);
        }
    }
    let gpu: Vec<Value> = host
        .gpus
        .iter()
        .map(|gpu| {
            let mut object = Map::new();
            object.insert("index".into(), json!(gpu.index));
            put(
                &mut object,
                "util_percent",
                gpu.utilization_percent.map(|v| json!(v)),
            );
            put(
                &mut object,
                "vram_used_bytes",
                gpu.vram_used_bytes.map(|v| json!(v)),
            );
            put(
                &mut object,
                "vram_free_bytes",
                gpu.vram_free_bytes.map(|v| json!(v)),
            );
            put(
                &mut object,
                "vram_total_bytes",
                gpu.vram_total_bytes.map(|v| json!(v)),
            );
            put(
                &mut object,
                "temperature_c",
                gpu.temperature_celsius.map(|v| json!(v)),
            );
            put(
                &mut object,
                "power_watts",
                gpu.power_watts.map(|v| json!(v)),
            );
            Value::Object(object)
        })
        .collect();
    let mut cpu = Map::new();
    put(
        &mut cpu,
        "usage_percent",
        host.cpu_usage_percent.map(|v| json!(v)),
    );
    let mut memory = Map::new();
    put(
        &mut memory,
        "used_percent",
        host.memory_used_percent.map(|v| json!(v)),
    );
    put(
        &mut memory,
        "available_bytes",
        host.memory_available_bytes.map(|v| json!(v)),
    );
    put(
        &mut memory,
        "total_bytes",
        host.memory_total_bytes.map(|v| json!(v)),
    );
    json!({
        "gpu": gpu,
        "cpu": cpu,
        "memory": memory,
        "timestamp": timestamp,
    })
}

/// The routing table's `universal` section (admin reference, "Response sections"): the router's
/// lifetime counters of the agent, summed over the models it serves, since the router started or
/// the last `POST /admin/metrics/reset`. A rate or latency with no observation yet is `null`
/// (and `latency_state` `UNKNOWN`).
fn universal(agent: &AgentView) -> Value {
    let totals = &agent.totals;
    let (srtt, rttvar) = match totals.latency_ms {
        Some((srtt, rttvar)) => (json!(srtt), json!(rttvar)),
        None => (Value::Null, Value::Null),
    };
    json!({
        "successful_requests_total": totals.success,
        "failed_requests_total": totals.failed,
        "success_rate": totals.success_rate(),
        "input_tokens_total": totals.input_tokens,
        "output_tokens_total": totals.output_tokens,
        "disconnections_total": totals.disconnections,
        "agent_failures_total": totals.failures,
        "backend_failures_total": agent.backend_failures,
        "rejected_requests_total": totals.rejected,
        "srtt_ms": srtt,
        "rttvar_ms": rttvar,
        "latency_state": if totals.latency_ms.is_some() { "KNOWN" } else { "UNKNOWN" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::routing::EngineSignals;
    use crate::router::control::registry::Registration;

    fn agent(peer: &str, models: &[&str], capacity: u32, routable: bool) -> AgentView {
        AgentView {
            peer_id: peer.into(),
            registration: Registration {
                models: models.iter().map(|m| m.to_string()).collect(),
                capability: Capability::Llm,
                capacity,
                engine: "vllm".into(),
                region: format!("region-{peer}"),
                tags: vec!["production".into()],
                version: "dev".into(),
                deployment_id: "deploy-42".into(),
                replica_id: format!("replica-{peer}"),
                organization: "Unknown".into(),
                machine: "Unknown".into(),
            },
            routable,
            heartbeat_fresh: routable,
            in_flight: 2,
            engine: EngineSignals::default(),
            last_seen_unix_ms: 1_776_870_991_500,
            backend_failures: 0,
            totals: Default::default(),
            host: None,
        }
    }

    #[test]
    fn the_catalog_counts_every_registered_agent_and_the_pool_apart() {
        let agents = [
            agent("a", &["m", "n"], 4, true),
            agent("b", &["m"], 6, false),
        ];
        let listed = models(&agents);
        assert_eq!(listed["object"], "list");
        let data = listed["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[0]["id"], "m");
        assert_eq!(data[0]["object"], "model");
        assert_eq!(data[0]["capability"], "llm");
        assert_eq!(
            data[0]["agents"],
            json!({
                "total": 2,
                "healthy": 1,
                "total_capacity": 10,
                "engines": ["vllm"],
                "regions": ["region-a", "region-b"],
            })
        );
        assert_eq!(data[1]["id"], "n");
        assert_eq!(data[1]["agents"]["total"], 1);
        assert!(data[0]["agents"].get("list").is_none(), "the list has none");
    }

    #[test]
    fn one_model_adds_its_agent_list_and_an_unknown_one_is_none() {
        let agents = [
            agent("a", &["org/m"], 4, true),
            agent("b", &["x"], 6, false),
        ];
        let found = model(&agents, "org/m").expect("registered");
        assert_eq!(found["id"], "org/m");
        assert_eq!(
            found["agents"]["list"],
            json!([{
                "peer_id": "a",
                "engine": "vllm",
                "version": "dev",
                "region": "region-a",
                "capacity": 4,
                "is_healthy": true,
                "last_seen": 1_776_870_991,
            }])
        );
        assert!(model(&agents, "org").is_none());
        assert!(model(&[], "org/m").is_none());
    }

    #[test]
    fn the_routing_table_has_engine_only_once_reported() {
        let mut reported = agent("b", &["m"], 4, true);
        reported.engine.kv_cache_utilization = Some(0.5);
        let table = routing_table(&[agent("a", &["m"], 4, false), reported]);
        assert_eq!(table["total"], 2);
        let rows = table["agents"].as_array().unwrap();
        assert_eq!(rows[0]["peer_id"], "a");
        assert_eq!(rows[0]["metadata"]["model"], "m");
        assert_eq!(rows[0]["metadata"]["organization"], "Unknown");
        assert_eq!(rows[0]["metadata"]["tags"], json!(["production"]));
        assert_eq!(rows[0]["status"]["healthy"], false);
        assert_eq!(rows[0]["status"]["active_requests"], 2);
        assert_eq!(rows[0]["status"]["capacity_utilization"], 0.5);
        assert_eq!(rows[0]["status"]["last_seen"], "2026-04-22T15:16:31.500Z");
        assert!(rows[0].get("engine").is_none());
        assert_eq!(rows[1]["engine"], json!({"kv_cache_utilization": 0.5}));
    }

    /// `hardware`: the last heartbeat's host snapshot in the reference's shape, what was not
    /// measured left out; no section before a snapshot.
    #[test]
    fn the_routing_table_carries_the_hosts_hardware() {
        use crate::wire::proto::{GpuStats, HostStats};
        let bare = agent("a", &["m"], 4, true);
        let mut gpu_host = agent("b", &["m"], 4, true);
        gpu_host.host = Some(HostStats {
            cpu_usage_percent: Some(2.5),
            memory_used_percent: Some(7.25),
            memory_available_bytes: Some(92_613_185_536),
            memory_total_bytes: Some(101_247_455_232),
            gpus: vec![GpuStats {
                index: 0,
                uuid: "GPU-1".into(),
                utilization_percent: Some(0.0),
                vram_used_bytes: Some(24_251_727_872),
                vram_free_bytes: Some(1_505_492_992),
                vram_total_bytes: Some(25_757_220_864),
                temperature_celsius: Some(23.0),
                power_watts: None,
            }],
        });
        let table = routing_table(&[bare, gpu_host]);
        let rows = table["agents"].as_array().unwrap();
        assert!(rows[0].get("hardware").is_none(), "{}", rows[0]);
        assert_eq!(
            rows[1]["hardware"],
            json!({
                "gpu": [{
                    "index": 0,
                    "util_percent": 0.0,
                    "vram_used_bytes": 24_251_727_872u64,
                    "vram_free_bytes": 1_505_492_992u64,
                    "vram_total_bytes": 25_757_220_864u64,
                    "temperature_c": 23.0,
                }],
                "cpu": {"usage_percent": 2.5},
                "memory": {
                    "used_percent": 7.25,
                    "available_bytes": 92_613_185_536u64,
                    "total_bytes": 101_247_455_232u64,
                },
                "timestamp": "2026-04-22T15:16:31.500Z",
            })
        );
    }

    /// `universal`: the lifetime counters; what has no observation yet is `null`, the latency
    /// `UNKNOWN` until its first sample.
    #[test]
    fn the_routing_table_carries_each_agents_history() {
        let fresh = agent("a", &["m"], 4, true);
        let mut served = agent("b", &["m"], 4, true);
        served.backend_failures = 1;
        served.totals = crate::logic::routing::counters::AgentTotals {
            success: 3,
            failed: 1,
            input_tokens: 120,
            output_tokens: 40,
            disconnections: 2,
            failures: 1,
            rejected: 1,
            resets: [1, 0],
            latency_ms: Some((80.5, 12.25)),
        };
        let table = routing_table(&[fresh, served]);
        let rows = table["agents"].as_array().unwrap();
        assert_eq!(
            rows[0]["universal"],
            json!({
                "successful_requests_total": 0,
                "failed_requests_total": 0,
                "success_rate": null,
                "input_tokens_total": 0,
                "output_tokens_total": 0,
                "disconnections_total": 0,
                "agent_failures_total": 0,
                "backend_failures_total": 0,
                "rejected_requests_total": 0,
                "srtt_ms": null,
                "rttvar_ms": null,
                "latency_state": "UNKNOWN",
            })
        );
        assert_eq!(
            rows[1]["universal"],
            json!({
                "successful_requests_total": 3,
                "failed_requests_total": 1,
                "success_rate": 0.75,
                "input_tokens_total": 120,
                "output_tokens_total": 40,
                "disconnections_total": 2,
                "agent_failures_total": 1,
                "backend_failures_total": 1,
                "rejected_requests_total": 1,
                "srtt_ms": 80.5,
                "rttvar_ms": 12.25,
                "latency_state": "KNOWN",
            })
        );
    }
}
