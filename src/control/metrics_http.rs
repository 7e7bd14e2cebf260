//! `GET /metrics` on `--metrics-port`: Prometheus text for every shard and the agent registry.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};

use crate::control::ControlShared;
use crate::control::registry::Registry;
use crate::metrics::{family, label, render_holds, render_shards};
use crate::shard::messages::ShardReport;

pub async fn run(listener: tokio::net::TcpListener, shared: Arc<ControlShared>) {
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let shared = shared.clone();
                    async move {
                        let reports = if request.uri().path() == "/metrics" {
                            shared.shard_reports(SHARD_REPORT_TIMEOUT).await
                        } else {
                            Vec::new()
                        };
                        Ok::<_, Infallible>(respond(&request, &shared, &reports))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                .await;
        });
    }
}

/// How long a scrape waits for each shard's report.
const SHARD_REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

fn respond(
    request: &Request<hyper::body::Incoming>,
    shared: &ControlShared,
    reports: &[ShardReport],
) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"not found\n")))
            .expect("static response");
    }
    let mut out = String::with_capacity(8192);
    render_shards(&mut out, &shared.shard_metrics);
    render_holds(&mut out, &shared.shard_metrics);
    let registry = shared.registry();
    family(
        &mut out,
        "hivenet_routing_agent_healthy",
        "gauge",
        "Whether the agent is in the routing pool (1) or not (0).",
    );
    for (peer_id, model, routable) in registry.agent_models() {
        let _ = writeln!(
            out,
            "hivenet_routing_agent_healthy{{peer_id=\"{}\",model=\"{}\"}} {}",
            label(&peer_id),
            label(&model),
            u8::from(routable)
        );
    }
    family(
        &mut out,
        "hivenet_routing_agents_routable",
        "gauge",
        "Agents in the routing pool.",
    );
    let _ = writeln!(
        out,
        "hivenet_routing_agents_routable {}",
        registry.routable_count()
    );
    family(
        &mut out,
        "hivenet_queue_depth",
        "gauge",
        "Requests waiting for a capacity slot, per model.",
    );
    let depths = reports
        .iter()
        .flat_map(|report| &report.queues)
        .map(|&(model, depth)| (model, (), u64::from(depth)));
    for (((), model), depth) in sum_by_model(&registry, depths) {
        let _ = writeln!(
            out,
            "hivenet_queue_depth{{model=\"{}\"}} {depth}",
            label(model)
        );
    }
    render_pending_demand(&mut out, &registry, reports);
    render_admission(&mut out, &registry, reports);
    render_tenants(&mut out, &registry, reports);
    render_routed(&mut out, &registry, reports);
    render_agents(&mut out, &registry);
    if let Some(provider) = &shared.provider_metrics {
        provider.render(&mut out);
    }
    drop(registry);
    family(
        &mut out,
        "hivenet_policy_reload_total",
        "counter",
        "Policy changes attempted, by trigger (sighup, file_change, api) and result.",
    );
    for (trigger, result, count) in shared.policies.reload_counts() {
        let _ = writeln!(
            out,
            "hivenet_policy_reload_total{{trigger=\"{trigger}\",result=\"{result}\"}} {count}"
        );
    }
    family(
        &mut out,
        "hivenet_quota_backend_errors_total",
        "counter",
        "Failed writes of daily token totals to the disk database (HIVENET_ROUTER_QUOTA_BACKEND=badger).",
    );
    let _ = writeln!(
        out,
        "hivenet_quota_backend_errors_total {}",
        shared
            .quota_backend_errors_total
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    shared.queue_full.render(&mut out);
    if let Some(sync) = shared.sync_metrics.get() {
        sync.render(&mut out);
    }
    Response::builder()
        .header("content-type", "text/plain; version=0.0.4")
        .body(Full::new(Bytes::from(out)))
        .expect("static response")
}

/// The `hivenet_agent_*` families (`control::agent_metrics`), through the family builder.
fn render_agents(out: &mut String, registry: &Registry) {
    use crate::metrics::Collect as _;
    let history = registry.agent_history();
    let live = registry.live_agents();
    let mut families = Vec::new();
    crate::control::agent_metrics::AgentFamilies {
        history: &history,
        live: &live,
    }
    .collect(&mut families);
    out.push_str(&crate::metrics::encode(families));
}

/// `hivenet_pending_demand{model}` (seed `hold-at-zero.md`, "Pending demand and the
/// autoscaler"): one series per model the sibling map places here with `scale_from_zero`, 0 when
/// nothing waits; no series without a map, or for a model the map no longer places here. The
/// owner shards count; a model placed for several kinds sums them.
fn render_pending_demand(out: &mut String, registry: &Registry, reports: &[ShardReport]) {
    let name = "hivenet_pending_demand";
    family(
        out,
        name,
        "gauge",
        "Distinct requests waiting for a model asleep here: held, or released by a wake and not yet given a slot.",
    );
    let held_here = registry.held_here();
    let mut demand: std::collections::BTreeMap<&str, u64> =
        held_here.iter().map(|(_, model)| (*model, 0)).collect();
    let names: std::collections::HashMap<_, _> = held_here.iter().copied().collect();
    for (model, waiting) in reports.iter().flat_map(|report| &report.pending_demand) {
        if let Some(total) = names.get(model).and_then(|model| demand.get_mut(model)) {
            *total += u64::from(*waiting);
        }
    }
    for (model, waiting) in demand {
        let _ = writeln!(out, "{name}{{model=\"{}\"}} {waiting}", label(model));
    }
}

/// The admission-control families of the reference (`observability-admission-control-metrics`):
/// gauges per model from the model's owner shard, refusals per gate and model summed over the
/// shards that decided them.
fn render_admission(out: &mut String, registry: &Registry, reports: &[ShardReport]) {
    type Gauge = fn(&crate::shard::owner::PoolReport) -> u64;
    let gauges: [(&str, &str, Gauge); 4] = [
        (
            "hivenet_admission_occupancy_tokens",
            "Current weighted in-flight token sum.",
            |pool| pool.occupancy_tokens,
        ),
        (
            "hivenet_admission_budget_tokens",
            "Effective global budget: admit fraction x admit_budget_tokens x healthy replicas.",
            |pool| pool.budget_tokens,
        ),
        (
            "hivenet_admission_inflight_requests",
            "Current in-flight request count.",
            |pool| pool.inflight,
        ),
        (
            "hivenet_admission_max_inflight",
            "Effective max_inflight x healthy replicas; 0 means no count backstop.",
            |pool| pool.max_inflight,
        ),
    ];
    for (name, help, get) in gauges {
        family(out, name, "gauge", help);
        for pool in reports.iter().flat_map(|report| &report.admission.pools) {
            if let Some(model) = registry.model_name(pool.model) {
                let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", label(model), get(pool));
            }
        }
    }
    let outcomes = sum_by_model(
        registry,
        reports
            .iter()
            .flat_map(|report| &report.admission.policy_outcomes)
            .copied(),
    );
    for outcome in crate::admission::PolicyOutcome::ALL {
        let name = outcome.metric();
        family(
            out,
            name,
            "counter",
            "Requests by how the routing policy handled them.",
        );
        for ((_, model), count) in outcomes
            .iter()
            .filter(|((counted, _), _)| *counted == outcome)
        {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {count}", label(model));
        }
    }
    let name = "hivenet_admission_rejections_total";
    family(
        out,
        name,
        "counter",
        "Requests rejected by an admission gate.",
    );
    let rejections = reports
        .iter()
        .flat_map(|report| &report.admission.rejections)
        .map(|&(model, reason, count)| (model, reason.as_str(), count));
    for ((reason, model), count) in sum_by_model(registry, rejections) {
        let _ = writeln!(
            out,
            "{name}{{reason=\"{reason}\",model=\"{}\"}} {count}",
            label(model)
        );
    }
}

/// Sums the shards' per-model counts by `kind` and model name (each model is owned by one shard,
/// but refusals and outcomes are counted wherever they were decided); models the registry no
/// longer names are left out.
fn sum_by_model<K: Ord>(
    registry: &Registry,
    counts: impl Iterator<Item = (crate::snapshot::ModelId, K, u64)>,
) -> std::collections::BTreeMap<(K, &str), u64> {
    let mut sums = std::collections::BTreeMap::new();
    for (model, kind, count) in counts {
        if let Some(name) = registry.model_name(model) {
            *sums.entry((kind, name)).or_default() += count;
        }
    }
    sums
}

/// `hivenet_routing_requests_routed_total{region,engine,model,tenant_id}`: requests given a slot
/// on an agent, summed over shards.
fn render_routed(out: &mut String, registry: &Registry, reports: &[ShardReport]) {
    let name = "hivenet_routing_requests_routed_total";
    family(
        out,
        name,
        "counter",
        "Inference requests given a slot on an agent, by the agent's region and engine.",
    );
    let mut routed: std::collections::BTreeMap<(&str, &str, &str, &str), u64> =
        std::collections::BTreeMap::new();
    for (series, count) in reports.iter().flat_map(|report| &report.tenants.routed) {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        *routed
            .entry((&series.region, &series.engine, model, &series.tenant_id))
            .or_default() += count;
    }
    for ((region, engine, model, tenant), count) in routed {
        let _ = writeln!(
            out,
            "{name}{{region=\"{}\",engine=\"{}\",model=\"{}\",tenant_id=\"{}\"}} {count}",
            label(region),
            label(engine),
            label(model),
            label(tenant)
        );
    }
}

/// The tenant families of the reference ("Tenant and quota metrics"), summed over shards.
/// `deployment_id` is the serving agent's `--deployment-id`, `unset` when none served it.
fn render_tenants(out: &mut String, registry: &Registry, reports: &[ShardReport]) {
    use std::collections::BTreeMap;
    let mut requests: BTreeMap<
        (&str, &str, &str, &str),
        crate::accounting::tenants::RequestCounts,
    > = BTreeMap::new();
    for (series, counts) in reports.iter().flat_map(|report| &report.tenants.requests) {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        let total = requests
            .entry((
                &series.key.tenant_id,
                &series.key.key_id,
                &series.deployment_id,
                model,
            ))
            .or_default();
        total.success += counts.success;
        total.failed += counts.failed;
        total.input_tokens += counts.input_tokens;
        total.output_tokens += counts.output_tokens;
    }
    type Count = fn(&crate::accounting::tenants::RequestCounts) -> u64;
    let families: [(&str, &str, Count); 4] = [
        (
            "hivenet_tenant_requests_success_total",
            "Inference requests answered with a 2xx status.",
            |counts| counts.success,
        ),
        (
            "hivenet_tenant_requests_failed_total",
            "Inference requests answered with an error, or whose client left.",
            |counts| counts.failed,
        ),
        (
            "hivenet_tenant_input_tokens_total",
            "Exact input tokens reported for the tenant's requests.",
            |counts| counts.input_tokens,
        ),
        (
            "hivenet_tenant_output_tokens_total",
            "Exact output tokens reported for the tenant's requests.",
            |counts| counts.output_tokens,
        ),
    ];
    for (name, help, get) in families {
        family(out, name, "counter", help);
        for ((tenant, key, deployment, model), counts) in &requests {
            let _ = writeln!(
                out,
                "{name}{{tenant_id=\"{}\",key_id=\"{}\",deployment_id=\"{}\",model=\"{}\"}} {}",
                label(tenant),
                label(key),
                label(deployment),
                label(model),
                get(counts)
            );
        }
    }
    let name = "hivenet_tenant_rate_limited_total";
    family(
        out,
        name,
        "counter",
        "Requests refused by the key's requests-per-minute limit.",
    );
    let mut rate_limited: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for (labels, count) in reports
        .iter()
        .flat_map(|report| &report.tenants.rate_limited)
    {
        *rate_limited
            .entry((&labels.tenant_id, &labels.key_id))
            .or_default() += count;
    }
    for ((tenant, key), count) in rate_limited {
        let _ = writeln!(
            out,
            "{name}{{tenant_id=\"{}\",key_id=\"{}\"}} {count}",
            label(tenant),
            label(key)
        );
    }
    let name = "hivenet_tenant_token_limited_total";
    family(
        out,
        name,
        "counter",
        "Requests refused by the daily token budget, by phase.",
    );
    let mut token_limited: BTreeMap<(&str, &str, &str, &str), u64> = BTreeMap::new();
    for (labels, phase, deployment, count) in reports
        .iter()
        .flat_map(|report| &report.tenants.token_limited)
    {
        *token_limited
            .entry((
                &labels.tenant_id,
                &labels.key_id,
                deployment,
                phase.as_str(),
            ))
            .or_default() += count;
    }
    for ((tenant, key, deployment, phase), count) in token_limited {
        let _ = writeln!(
            out,
            "{name}{{tenant_id=\"{}\",key_id=\"{}\",deployment_id=\"{}\",phase=\"{phase}\"}} {count}",
            label(tenant),
            label(key),
            label(deployment)
        );
    }
}
