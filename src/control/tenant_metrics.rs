//! The tenant families of the observability reference ("Tenant and quota metrics") and
//! `hivenet_routing_requests_routed_total`, built at scrape time from the shards' tenant reports
//! ([`crate::accounting::tenants`]) and summed over the shards. `deployment_id` is the serving
//! agent's `--deployment-id`, `unset` when none served it. Runs on the control core only.

use std::collections::BTreeMap;

use crate::accounting::tenants::RequestCounts;
use crate::control::registry::Registry;
use crate::metrics::Family;
use crate::metrics::histogram::DurationCounts;
use crate::shard::messages::ShardReport;

/// Adds every tenant family to `out`.
pub fn collect(registry: &Registry, reports: &[ShardReport], out: &mut Vec<Family>) {
    requests(registry, reports, out);
    out.push(rate_limited(reports));
    out.push(token_limited(reports));
    out.push(routed(registry, reports));
    out.push(routing_failed(registry, reports));
    out.push(agent_durations(registry, reports));
}

/// (tenant_id, key_id, deployment_id, model) of one request series.
type RequestLabels<'a> = (&'a str, &'a str, &'a str, &'a str);

/// The request and token counters per (tenant, key, deployment, model), summed over shards.
fn sum_requests<'a>(
    registry: &'a Registry,
    reports: &'a [ShardReport],
) -> BTreeMap<RequestLabels<'a>, RequestCounts> {
    let mut requests: BTreeMap<RequestLabels<'a>, RequestCounts> = BTreeMap::new();
    for (series, counts) in reports.iter().flat_map(|report| &report.tenants.requests) {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        requests
            .entry((
                &series.key.tenant_id,
                &series.key.key_id,
                &series.deployment_id,
                model,
            ))
            .or_default()
            .merge(counts);
    }
    requests
}

fn requests(registry: &Registry, reports: &[ShardReport], out: &mut Vec<Family>) {
    let requests = sum_requests(registry, reports);
    type Count = fn(&RequestCounts) -> u64;
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
        let mut family = Family::counter(name, help);
        for ((tenant, key, deployment, model), counts) in &requests {
            family.sample(
                &[
                    ("tenant_id", tenant),
                    ("key_id", key),
                    ("deployment_id", deployment),
                    ("model", model),
                ],
                get(counts) as f64,
            );
        }
        out.push(family);
    }
    let mut durations = Family::histogram(
        "hivenet_tenant_request_duration_seconds",
        "Inference requests from arrival to last byte, per tenant, key, deployment and model.",
    );
    let mut last_request: BTreeMap<(&str, &str, &str), i64> = BTreeMap::new();
    for ((tenant, key, deployment, model), counts) in &requests {
        counts.duration.sample_into(
            &mut durations,
            &[
                ("tenant_id", tenant),
                ("key_id", key),
                ("deployment_id", deployment),
                ("model", model),
            ],
        );
        let latest = last_request.entry((tenant, key, deployment)).or_default();
        *latest = (*latest).max(counts.last_request_unix_s);
    }
    out.push(durations);
    let mut last = Family::gauge(
        "hivenet_tenant_last_request_timestamp",
        "Unix time in seconds of the arrival of the key's latest finished request.",
    );
    for ((tenant, key, deployment), unix_s) in last_request {
        last.sample(
            &[
                ("tenant_id", tenant),
                ("key_id", key),
                ("deployment_id", deployment),
            ],
            unix_s as f64,
        );
    }
    out.push(last);
}

fn rate_limited(reports: &[ShardReport]) -> Family {
    let mut family = Family::counter(
        "hivenet_tenant_rate_limited_total",
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
        family.sample(&[("tenant_id", tenant), ("key_id", key)], count as f64);
    }
    family
}

fn token_limited(reports: &[ShardReport]) -> Family {
    let mut family = Family::counter(
        "hivenet_tenant_token_limited_total",
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
        family.sample(
            &[
                ("tenant_id", tenant),
                ("key_id", key),
                ("deployment_id", deployment),
                ("phase", phase),
            ],
            count as f64,
        );
    }
    family
}

/// `hivenet_routing_requests_routed_total{region,engine,model,tenant_id}`: requests given a slot
/// on an agent, summed over shards.
fn routed(registry: &Registry, reports: &[ShardReport]) -> Family {
    let mut family = Family::counter(
        "hivenet_routing_requests_routed_total",
        "Inference requests given a slot on an agent, by the agent's region and engine.",
    );
    let mut routed: BTreeMap<(&str, &str, &str, &str), u64> = BTreeMap::new();
    for (series, count) in reports.iter().flat_map(|report| &report.tenants.routed) {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        *routed
            .entry((&series.region, &series.engine, model, &series.tenant_id))
            .or_default() += count;
    }
    for ((region, engine, model, tenant), count) in routed {
        family.sample(
            &[
                ("region", region),
                ("engine", engine),
                ("model", model),
                ("tenant_id", tenant),
            ],
            count as f64,
        );
    }
    family
}

/// `hivenet_routing_requests_failed_total{tenant_id,model,reason}`: inference requests the router
/// could not forward (`reason`: its error code), summed over shards.
fn routing_failed(registry: &Registry, reports: &[ShardReport]) -> Family {
    let mut family = Family::counter(
        "hivenet_routing_requests_failed_total",
        "Inference requests the router could not forward: no agent could take them, the forward failed, or they timed out.",
    );
    let mut failed: BTreeMap<(&str, &str, &str), u64> = BTreeMap::new();
    for (series, count) in reports
        .iter()
        .flat_map(|report| &report.tenants.routing_failed)
    {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        *failed
            .entry((&series.tenant_id, model, series.reason))
            .or_default() += count;
    }
    for ((tenant, model, reason), count) in failed {
        family.sample(
            &[("tenant_id", tenant), ("model", model), ("reason", reason)],
            count as f64,
        );
    }
    family
}

/// `hivenet_request_duration_seconds{tenant_id,peer_id,model,status_code}`: requests an agent
/// served, from arrival to last byte, summed over shards.
fn agent_durations(registry: &Registry, reports: &[ShardReport]) -> Family {
    let mut family = Family::histogram(
        "hivenet_request_duration_seconds",
        "Inference requests served by an agent, from arrival to last byte.",
    );
    let mut durations: BTreeMap<(&str, &str, &str, u16), DurationCounts> = BTreeMap::new();
    for (series, counts) in reports
        .iter()
        .flat_map(|report| &report.tenants.agent_durations)
    {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        durations
            .entry((&series.tenant_id, &series.peer_id, model, series.status))
            .or_default()
            .merge(counts);
    }
    for ((tenant, peer, model, status), counts) in durations {
        counts.sample_into(
            &mut family,
            &[
                ("tenant_id", tenant),
                ("peer_id", peer),
                ("model", model),
                ("status_code", &status.to_string()),
            ],
        );
    }
    family
}
