//! The tenant families of the observability reference ("Tenant and quota metrics") and
//! `hivenet_routing_requests_routed_total`, built at scrape time from the shards' tenant reports
//! ([`crate::router::accounting::tenants`]) and summed over the shards. `deployment_id` is the serving
//! agent's `--deployment-id`, `unset` when none served it. Runs on the control core only.
//!
//! Size: a tenant's key that served one model through one deployment is about 25 lines (its
//! request-duration histogram is 18 of them). `--tenant-metrics-max-tenants` bounds the scrape of
//! a site with tens of thousands of keys ([`TenantCap`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::base::clock::Day;
use crate::router::accounting::tenants::RequestCounts;
use crate::router::control::registry::Registry;
use crate::router::metrics::Family;
use crate::router::metrics::histogram::DurationCounts;
use crate::router::shard::messages::ShardReport;

/// The `tenant_id` (and `key_id`, `deployment_id`) of the tenants a capped scrape folds together.
pub const OTHER: &str = "_other";

/// `--tenant-metrics-max-tenants` (`0`: no cap, the default): the scrape names at most this many
/// tenants, those with the most requests on this router (ties: by name), and folds every other
/// tenant's series into `tenant_id="_other"` with `key_id` and `deployment_id` `"_other"` as well:
/// counters and histograms are summed, so totals over tenants stay exact. The quota-limit gauges
/// of a folded tenant are left out (a sum of limits means nothing). The shards keep every series;
/// only what is exposed is bounded.
pub struct TenantCap<'a> {
    /// `None`: no cap.
    kept: Option<HashSet<&'a str>>,
}

impl<'a> TenantCap<'a> {
    pub fn new(reports: &'a [ShardReport], max_tenants: usize) -> TenantCap<'a> {
        if max_tenants == 0 {
            return TenantCap { kept: None };
        }
        let mut activity: HashMap<&'a str, u64> = HashMap::new();
        for report in reports {
            for (series, counts) in &report.tenants.requests {
                *activity.entry(&series.key.tenant_id).or_default() +=
                    counts.success + counts.failed;
            }
            for (labels, count) in &report.tenants.rate_limited {
                *activity.entry(&labels.tenant_id).or_default() += count;
            }
            for (labels, _, _, count) in &report.tenants.token_limited {
                *activity.entry(&labels.tenant_id).or_default() += count;
            }
        }
        let mut ranked: Vec<(&'a str, u64)> = activity.into_iter().collect();
        ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        ranked.truncate(max_tenants);
        TenantCap {
            kept: Some(ranked.into_iter().map(|(tenant, _)| tenant).collect()),
        }
    }

    /// No cap: every tenant named.
    pub fn none() -> TenantCap<'static> {
        TenantCap { kept: None }
    }

    fn keeps(&self, tenant: &str) -> bool {
        self.kept.as_ref().is_none_or(|kept| kept.contains(tenant))
    }

    /// The `tenant_id` a series of `tenant` is exposed under.
    fn tenant<'b>(&self, tenant: &'b str) -> &'b str {
        if self.keeps(tenant) { tenant } else { OTHER }
    }

    /// A label of a series of `tenant` that names one of its keys or deployments.
    fn within<'b>(&self, tenant: &str, label: &'b str) -> &'b str {
        if self.keeps(tenant) { label } else { OTHER }
    }
}

/// Adds every tenant family to `out`.
pub fn collect(
    registry: &Registry,
    reports: &[ShardReport],
    cap: &TenantCap<'_>,
    out: &mut Vec<Family>,
) {
    requests(registry, reports, cap, out);
    out.push(rate_limited(reports, cap));
    out.push(token_limited(reports, cap));
    out.push(routed(registry, reports, cap));
    out.push(routing_failed(registry, reports, cap));
    out.push(agent_durations(registry, reports, cap));
}

/// (tenant_id, key_id, deployment_id, model) of one request series.
type RequestLabels<'a> = (&'a str, &'a str, &'a str, &'a str);

/// The request and token counters per (tenant, key, deployment, model), summed over shards.
fn sum_requests<'a>(
    registry: &'a Registry,
    reports: &'a [ShardReport],
    cap: &TenantCap<'_>,
) -> BTreeMap<RequestLabels<'a>, RequestCounts> {
    let mut requests: BTreeMap<RequestLabels<'a>, RequestCounts> = BTreeMap::new();
    for (series, counts) in reports.iter().flat_map(|report| &report.tenants.requests) {
        let Some(model) = registry.model_name(series.model) else {
            continue;
        };
        let tenant: &str = &series.key.tenant_id;
        requests
            .entry((
                cap.tenant(tenant),
                cap.within(tenant, &series.key.key_id),
                cap.within(tenant, &series.deployment_id),
                model,
            ))
            .or_default()
            .merge(counts);
    }
    requests
}

fn requests(
    registry: &Registry,
    reports: &[ShardReport],
    cap: &TenantCap<'_>,
    out: &mut Vec<Family>,
) {
    let requests = sum_requests(registry, reports, cap);
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
    out.push(tokens_used_today(&requests));
}

/// `hivenet_tenant_tokens_used_today{tenant_id}`: input and output tokens reported today (UTC)
/// for the tenant's requests; 0 once midnight passed until its next request.
fn tokens_used_today(requests: &BTreeMap<RequestLabels<'_>, RequestCounts>) -> Family {
    let today = Day::from_unix_seconds(crate::base::clock::now_unix_ms().max(0) as u64 / 1000);
    let mut used: BTreeMap<&str, u64> = BTreeMap::new();
    for ((tenant, ..), counts) in requests {
        *used.entry(tenant).or_default() += counts.tokens_on(today);
    }
    let mut family = Family::gauge(
        "hivenet_tenant_tokens_used_today",
        "Input and output tokens the tenant's requests used today (UTC), on this router.",
    );
    for (tenant, tokens) in used {
        family.sample(&[("tenant_id", tenant)], tokens as f64);
    }
    family
}

fn rate_limited(reports: &[ShardReport], cap: &TenantCap<'_>) -> Family {
    let mut family = Family::counter(
        "hivenet_tenant_rate_limited_total",
        "Requests refused by the key's requests-per-minute limit.",
    );
    let mut rate_limited: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for (labels, count) in reports
        .iter()
        .flat_map(|report| &report.tenants.rate_limited)
    {
        let tenant: &str = &labels.tenant_id;
        *rate_limited
            .entry((cap.tenant(tenant), cap.within(tenant, &labels.key_id)))
            .or_default() += count;
    }
    for ((tenant, key), count) in rate_limited {
        family.sample(&[("tenant_id", tenant), ("key_id", key)], count as f64);
    }
    family
}

fn token_limited(reports: &[ShardReport], cap: &TenantCap<'_>) -> Family {
    let mut family = Family::counter(
        "hivenet_tenant_token_limited_total",
        "Requests refused by the daily token budget, by phase.",
    );
    let mut token_limited: BTreeMap<(&str, &str, &str, &str), u64> = BTreeMap::new();
    for (labels, phase, deployment, count) in reports
        .iter()
        .flat_map(|report| &report.tenants.token_limited)
    {
        let tenant: &str = &labels.tenant_id;
        *token_limited
            .entry((
                cap.tenant(tenant),
                cap.within(tenant, &labels.key_id),
                cap.within(tenant, deployment),
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
fn routed(registry: &Registry, reports: &[ShardReport], cap: &TenantCap<'_>) -> Family {
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
            .entry((
                &series.region,
                &series.engine,
                model,
                cap.tenant(&series.tenant_id),
            ))
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
fn routing_failed(registry: &Registry, reports: &[ShardReport], cap: &TenantCap<'_>) -> Family {
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
            .entry((cap.tenant(&series.tenant_id), model, series.reason))
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
fn agent_durations(registry: &Registry, reports: &[ShardReport], cap: &TenantCap<'_>) -> Family {
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
            .entry((
                cap.tenant(&series.tenant_id),
                &series.peer_id,
                model,
                series.status,
            ))
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

/// The quota gauges of the reference ("Flat quota limits", "Per-model quota limits") from every
/// key's owner and quota: `hivenet_tenant_quota_{rpm,tpd}_limit{tenant_id}` for keys of the flat
/// shape, `hivenet_tenant_per_model_quota_{rpm,tpd}_limit{tenant_id,model}` for keys of the
/// per-model shape, the RPM ceiling being the per-replica value times `healthy_replicas(model)`.
/// `0` is unlimited; several keys of one tenant give the largest limit, `0` when any of them is
/// unlimited (what the tenant can reach with its keys).
pub fn quota_limits<'a>(
    keys: impl Iterator<Item = (&'a str, &'a crate::logic::auth::config::Quota)>,
    healthy_replicas: impl Fn(&str) -> u64,
    cap: &TenantCap<'_>,
) -> [Family; 4] {
    use crate::logic::auth::config::Quota;
    let mut flat: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut per_model: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
    for (owner, quota) in keys.filter(|(owner, _)| cap.keeps(owner)) {
        match quota {
            Quota::Flat(quota) => {
                let entry = flat
                    .entry(owner)
                    .or_insert((quota.requests_per_minute, quota.tokens_per_day));
                *entry = (
                    loosest(entry.0, quota.requests_per_minute),
                    loosest(entry.1, quota.tokens_per_day),
                );
            }
            Quota::PerModel(models) => {
                for (model, quota) in models {
                    let rpm = quota.requests_per_minute_per_replica * healthy_replicas(model);
                    let entry = per_model
                        .entry((owner, model))
                        .or_insert((rpm, quota.tokens_per_day));
                    *entry = (
                        loosest(entry.0, rpm),
                        loosest(entry.1, quota.tokens_per_day),
                    );
                }
            }
        }
    }
    let mut rpm = Family::gauge(
        "hivenet_tenant_quota_rpm_limit",
        "Requests per minute the tenant's flat-quota keys allow (0: unlimited).",
    );
    let mut tpd = Family::gauge(
        "hivenet_tenant_quota_tpd_limit",
        "Tokens per day the tenant's flat-quota keys allow (0: unlimited).",
    );
    for (tenant, (requests, tokens)) in flat {
        rpm.sample(&[("tenant_id", tenant)], requests as f64);
        tpd.sample(&[("tenant_id", tenant)], tokens as f64);
    }
    let mut model_rpm = Family::gauge(
        "hivenet_tenant_per_model_quota_rpm_limit",
        "Requests per minute the tenant may send a model: per replica x healthy replicas (0: unlimited).",
    );
    let mut model_tpd = Family::gauge(
        "hivenet_tenant_per_model_quota_tpd_limit",
        "Tokens per day the tenant may use on a model (0: unlimited).",
    );
    for ((tenant, model), (requests, tokens)) in per_model {
        let labels = [("tenant_id", tenant), ("model", model)];
        model_rpm.sample(&labels, requests as f64);
        model_tpd.sample(&labels, tokens as f64);
    }
    [rpm, tpd, model_rpm, model_tpd]
}

/// The looser of two limits where `0` is unlimited.
fn loosest(a: u64, b: u64) -> u64 {
    if a == 0 || b == 0 { 0 } else { a.max(b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::auth::config::{FlatQuota, PerModelQuota, Quota};

    #[test]
    fn quota_gauges_take_the_loosest_key_and_scale_per_model_rpm() {
        let flat = |rpm, tpd| {
            Quota::Flat(FlatQuota {
                requests_per_minute: rpm,
                tokens_per_day: tpd,
                ..FlatQuota::default()
            })
        };
        let per_model = Quota::PerModel(
            [(
                "m".to_owned(),
                PerModelQuota {
                    requests_per_minute_per_replica: 10,
                    tokens_per_day: 500,
                },
            )]
            .into(),
        );
        let keys = [
            ("acme", flat(60, 1000)),
            ("acme", flat(120, 0)),
            ("beta", per_model),
        ];
        let families = quota_limits(
            keys.iter().map(|(o, s)| (*o, s)),
            |model| {
                assert_eq!(model, "m");
                3
            },
            &TenantCap::none(),
        );
        let text = crate::router::metrics::encode(families.into());
        assert!(
            text.contains("hivenet_tenant_quota_rpm_limit{tenant_id=\"acme\"} 120\n"),
            "{text}"
        );
        assert!(
            text.contains("hivenet_tenant_quota_tpd_limit{tenant_id=\"acme\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "hivenet_tenant_per_model_quota_rpm_limit{tenant_id=\"beta\",model=\"m\"} 30\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "hivenet_tenant_per_model_quota_tpd_limit{tenant_id=\"beta\",model=\"m\"} 500\n"
            ),
            "{text}"
        );
    }
}
