//! `GET /metrics` on `--metrics-port`: the Prometheus text of every area of the router, built at
//! scrape time on the control core from the shards' plain counters and reports, the registry and
//! the control core's own counters ([`Collect`] per area), encoded by the `prometheus` crate.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};

use crate::router::control::ControlShared;
use crate::router::control::registry::Registry;
use crate::router::control::tenant_metrics::TenantCap;
use crate::router::metrics::histogram::DurationCounts;
use crate::router::metrics::{Collect, Family, encode};
use crate::router::shard::messages::ShardReport;

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
    if request.uri().path() == "/ready" {
        // The same probe as the API port's (`router::readiness`), for probes that use this port.
        let (status, body) = match shared.readiness.check() {
            Ok(()) => (StatusCode::OK, crate::router::readiness::READY_BODY),
            Err(not_ready) => (StatusCode::SERVICE_UNAVAILABLE, not_ready.body()),
        };
        return Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body)))
            .expect("static response");
    }
    if request.uri().path() == "/ready/budgets" {
        // Whether models with an occupancy budget admit yet (`router::readiness`): what a first
        // deployment waits on, while `/ready` already steers traffic here.
        let (status, body) = match shared
            .readiness
            .check_budgets(crate::base::clock::now_unix_ms().max(0) as u64)
        {
            Ok(()) => (
                StatusCode::OK,
                crate::router::readiness::READY_BODY.to_vec(),
            ),
            Err((not_ready, seconds_left)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                not_ready.body_with_seconds_left(seconds_left),
            ),
        };
        return Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("static response");
    }
    if request.uri().path() != "/metrics" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"not found\n")))
            .expect("static response");
    }
    let text = encode(collect(shared, reports));
    Response::builder()
        .header("content-type", crate::router::metrics::family::CONTENT_TYPE)
        .body(Full::new(Bytes::from(text)))
        .expect("static response")
}

/// Every family of the router, in the order they are exposed.
fn collect(shared: &ControlShared, reports: &[ShardReport]) -> Vec<Family> {
    let mut out = Vec::with_capacity(96);
    let cap = TenantCap::new(reports, shared.settings.tenant_metrics_max_tenants);
    shared.shard_metrics[..].collect(&mut out);
    {
        let registry = shared.registry();
        crate::router::control::registry::metrics::AgentFamilies {
            registry: &registry,
            now: std::time::Instant::now(),
            now_unix_ms: crate::base::clock::now_unix_ms(),
        }
        .collect(&mut out);
        crate::router::control::agent_metrics::AgentFamilies {
            history: &registry.agent_history(),
            live: &registry.live_agents(),
        }
        .collect(&mut out);
        Reports {
            registry: &registry,
            reports,
            cap: &cap,
        }
        .collect(&mut out);
    }
    out.extend(quota_limits(shared, &cap));
    if let Some(provider) = &shared.provider_metrics {
        provider.collect(&mut out);
    }
    let mut reloads = Family::counter(
        "hivenet_policy_reload_total",
        "Policy changes attempted, by trigger (sighup, file_change, api) and result.",
    );
    for (trigger, result, count) in shared.policies.reload_counts() {
        reloads.sample(&[("trigger", trigger), ("result", result)], count as f64);
    }
    out.push(reloads);
    let mut backend_errors = Family::counter(
        "hivenet_quota_backend_errors_total",
        "Failed writes of daily token totals to the disk database (HIVENET_ROUTER_QUOTA_BACKEND=badger).",
    );
    backend_errors.sample(
        &[],
        shared
            .quota_backend_errors_total
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    out.push(backend_errors);
    let mut auth_refused = Family::counter(
        "hivenet_agent_auth_refused_total",
        "Agent authentications refused, by reason: token, unbound (an agent older than router-bound tokens), nonce (foreign, expired or replayed), identity (key or signature), request.",
    );
    let refusals = &shared.auth_refusals;
    for (reason, count) in [
        ("token", &refusals.token),
        ("unbound", &refusals.unbound),
        ("nonce", &refusals.nonce),
        ("identity", &refusals.identity),
        ("request", &refusals.request),
    ] {
        auth_refused.sample(
            &[("reason", reason)],
            count.load(std::sync::atomic::Ordering::Relaxed) as f64,
        );
    }
    out.push(auth_refused);
    shared.queue_full.collect(&mut out);
    if let Some(sync) = shared.sync_metrics.get() {
        sync.collect(&mut out);
    }
    out
}

/// The quota gauges of every key, static and dynamic; per-model RPM ceilings scale with the
/// model's agents in the routing pool.
fn quota_limits(shared: &ControlShared, cap: &TenantCap<'_>) -> [Family; 4] {
    let mut healthy: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let views = shared
        .registry()
        .agent_views(std::time::Instant::now(), crate::base::clock::now_unix_ms());
    for view in views.iter().filter(|view| view.routable) {
        for model in &view.registration.models {
            *healthy.entry(model.clone()).or_default() += 1;
        }
    }
    let dynamic = shared.dynamic_keys.as_ref().map(|keys| {
        keys.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .snapshot()
    });
    let static_keys = shared.policies.static_keys();
    let keys = static_keys
        .iter()
        .chain(dynamic.iter().flat_map(|registry| registry.iter()))
        .map(|key| (&*key.owner, key.settings.quota()));
    crate::router::control::tenant_metrics::quota_limits(
        keys,
        |model| healthy.get(model).copied().unwrap_or(0),
        cap,
    )
}

/// The families read from the shards' scrape reports, named through the registry.
struct Reports<'a> {
    registry: &'a Registry,
    reports: &'a [ShardReport],
    cap: &'a TenantCap<'a>,
}

impl Collect for Reports<'_> {
    fn collect(&self, out: &mut Vec<Family>) {
        out.push(self.quota_holders());
        out.push(self.queue_depth());
        out.push(self.queue_wait());
        out.push(self.pending_demand());
        self.prefix(out);
        self.admission(out);
        crate::router::control::tenant_metrics::collect(self.registry, self.reports, self.cap, out);
    }
}

impl Reports<'_> {
    /// `hivenet_shard_quota_holders{shard,kind}`: what a shard keeps per key, the memory that
    /// grows with the site's keys.
    fn quota_holders(&self) -> Family {
        let mut family = Family::gauge(
            "hivenet_shard_quota_holders",
            "Quota holders a shard keeps: kind=owner (requests per minute, daily budgets), key (token rates), remote_only (tenants only other routers used, waiting compact).",
        );
        for report in self.reports {
            let holders = report.quota_holders;
            let shard = holders.shard.to_string();
            for (kind, count) in [
                ("owner", holders.owners),
                ("key", holders.key_rates),
                ("remote_only", holders.remote_only),
            ] {
                family.sample(&[("shard", &shard), ("kind", kind)], count as f64);
            }
        }
        family
    }

    /// `hivenet_queue_depth{model}`: requests waiting in a model's capacity queue.
    fn queue_depth(&self) -> Family {
        let mut family = Family::gauge(
            "hivenet_queue_depth",
            "Requests waiting for a capacity slot, per model.",
        );
        let depths = self
            .reports
            .iter()
            .flat_map(|report| &report.queues)
            .map(|&(model, depth)| (model, (), u64::from(depth)));
        for (((), model), depth) in sum_by_model(self.registry, depths) {
            family.sample(&[("model", model)], depth as f64);
        }
        family
    }

    /// `hivenet_queue_wait_seconds{model}`: time in the capacity queue of every ticket that
    /// left it (granted, timed out, client gone, the model's agents gone), summed over shards.
    fn queue_wait(&self) -> Family {
        let mut family = Family::histogram(
            "hivenet_queue_wait_seconds",
            "Time requests waited in a model's capacity queue for an agent slot.",
        );
        let mut waits: std::collections::BTreeMap<&str, DurationCounts> = Default::default();
        for (model, counts) in self.reports.iter().flat_map(|report| &report.queue_waits) {
            if let Some(name) = self.registry.model_name(*model) {
                waits.entry(name).or_default().merge(counts);
            }
        }
        for (model, counts) in waits {
            counts.sample_into(&mut family, &[("model", model)]);
        }
        family
    }

    /// `hivenet_pending_demand{model}` (seed `hold-at-zero.md`, "Pending demand and the
    /// autoscaler"): one series per model the sibling map places here with `scale_from_zero`, 0
    /// when nothing waits; no series without a map, or for a model the map no longer places here.
    /// The owner shards count; a model placed for several kinds sums them.
    fn pending_demand(&self) -> Family {
        let mut family = Family::gauge(
            "hivenet_pending_demand",
            "Distinct requests waiting for a model asleep here: held, or released by a wake and not yet given a slot.",
        );
        let held_here = self.registry.held_here();
        let mut demand: std::collections::BTreeMap<&str, u64> =
            held_here.iter().map(|(_, model)| (*model, 0)).collect();
        let names: std::collections::HashMap<_, _> = held_here.iter().copied().collect();
        for (model, waiting) in self
            .reports
            .iter()
            .flat_map(|report| &report.pending_demand)
        {
            if let Some(total) = names.get(model).and_then(|model| demand.get_mut(model)) {
                *total += u64::from(*waiting);
            }
        }
        for (model, waiting) in demand {
            family.sample(&[("model", model)], waiting as f64);
        }
        family
    }

    /// `prefix-aware` routing per model, summed over the shards that own it: prompts sent
    /// where this router had sent some of their leading blocks (hits) or not (misses), the
    /// fraction of their blocks the chosen agent held, and the blocks indexed.
    fn prefix(&self, out: &mut Vec<Family>) {
        use crate::logic::routing::prefix::{MATCHED_RATIO_BUCKETS, PrefixStats};
        let mut by_model: std::collections::BTreeMap<&str, PrefixStats> = Default::default();
        for (model, stats) in self.reports.iter().flat_map(|report| &report.prefix) {
            if let Some(name) = self.registry.model_name(*model) {
                by_model.entry(name).or_default().merge(stats);
            }
        }
        let mut hits = Family::counter(
            "hivenet_prefix_index_hits_total",
            "Prompts a prefix-aware step sent to an agent this router had sent some of their leading blocks to.",
        );
        let mut misses = Family::counter(
            "hivenet_prefix_index_misses_total",
            "Prompts a prefix-aware step sent to an agent holding none of their blocks in this router's index.",
        );
        let mut ratio = Family::histogram(
            "hivenet_prefix_matched_ratio",
            "Fraction of a prompt's blocks the agent a prefix-aware step chose held in this router's index.",
        );
        let mut blocks = Family::gauge(
            "hivenet_prefix_index_blocks",
            "Prompt blocks the prefix index holds, every agent's together.",
        );
        for (model, stats) in by_model {
            let labels = [("model", model)];
            hits.sample(&labels, stats.hits as f64);
            misses.sample(&labels, stats.misses as f64);
            let (buckets, count) = crate::router::metrics::histogram::cumulative(
                &MATCHED_RATIO_BUCKETS,
                &stats.ratio_counts,
            );
            ratio.histogram_sample(&labels, &buckets, stats.ratio_sum, count);
            blocks.sample(&labels, stats.blocks as f64);
        }
        out.extend([hits, misses, ratio, blocks]);
    }

    /// The admission-control families of the reference (`observability-admission-control-metrics`):
    /// gauges per model from the model's owner shard, refusals per gate and model summed over the
    /// shards that decided them.
    fn admission(&self, out: &mut Vec<Family>) {
        type Gauge = fn(&crate::router::shard::owner::PoolReport) -> u64;
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
            let mut family = Family::gauge(name, help);
            for pool in self
                .reports
                .iter()
                .flat_map(|report| &report.admission.pools)
            {
                if let Some(model) = self.registry.model_name(pool.model) {
                    family.sample(&[("model", model)], get(pool) as f64);
                }
            }
            out.push(family);
        }
        let outcomes = sum_by_model(
            self.registry,
            self.reports
                .iter()
                .flat_map(|report| &report.admission.policy_outcomes)
                .copied(),
        );
        for outcome in crate::logic::admission::PolicyOutcome::ALL {
            let mut family = Family::counter(
                outcome.metric(),
                "Requests by how the routing policy handled them.",
            );
            for ((_, model), count) in outcomes
                .iter()
                .filter(|((counted, _), _)| *counted == outcome)
            {
                family.sample(&[("model", model)], *count as f64);
            }
            out.push(family);
        }
        let mut family = Family::counter(
            "hivenet_admission_rejections_total",
            "Requests rejected by an admission gate.",
        );
        let rejections = self
            .reports
            .iter()
            .flat_map(|report| &report.admission.rejections)
            .map(|&(model, reason, count)| (model, reason.as_str(), count));
        for ((reason, model), count) in sum_by_model(self.registry, rejections) {
            family.sample(&[("reason", reason), ("model", model)], count as f64);
        }
        out.push(family);
    }
}

/// Sums the shards' per-model counts by `kind` and model name (each model is owned by one shard,
/// but refusals and outcomes are counted wherever they were decided); models the registry no
/// longer names are left out.
pub fn sum_by_model<K: Ord>(
    registry: &Registry,
    counts: impl Iterator<Item = (crate::logic::snapshot::ModelId, K, u64)>,
) -> std::collections::BTreeMap<(K, &str), u64> {
    let mut sums = std::collections::BTreeMap::new();
    for (model, kind, count) in counts {
        if let Some(name) = registry.model_name(model) {
            *sums.entry((kind, name)).or_default() += count;
        }
    }
    sums
}
