//! Proves per-key limits through the real router: one key hammered from many connections spread
//! over every shard never gets more than its requests per minute (429 rate_limit_exceeded with
//! X-RateLimit-Remaining-Requests: 0 and no Retry-After), and the daily token budget admits on the
//! input estimate, is corrected to each stream's exact usage afterwards, and then refuses with 429
//! token_limit_exceeded.

mod common;

use std::path::PathBuf;

use common::{Options, Site, chat, poll, request};
use sha2::{Digest, Sha256};

/// The harness's probes (`/v1/models`) present this key: no quota, its own owner.
const PROBE_KEY: &str = "sk-limits-probe";

fn auth_file(name: &str, raw_key: &str, quota: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-limits")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auth.yaml");
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...probe\"\n      metadata:\n        name: \"probe\"\n        owner: \"probe\"\n    - key_hash: \"{}\"\n      key_preview: \"sk-...test\"\n      metadata:\n        name: \"limited\"\n        owner: \"acme\"\n      quota:\n{quota}",
        hex::encode(Sha256::digest(PROBE_KEY.as_bytes())),
        hex::encode(Sha256::digest(raw_key.as_bytes()))
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn post(site: &Site, key: &str, body: &str) -> common::Response {
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

#[test]
fn one_key_over_every_shard_never_exceeds_its_rpm() {
    const RPM: usize = 20;
    let key = "sk-rpm-limited";
    let auth = auth_file("rpm", key, &format!("        requests_per_minute: {RPM}\n"));
    let site = Site::start(
        "limits-rpm",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "64", "--deployment-id", "deploy-42"])
            // The start waits for the model with a key of its own: the limited key's first
            // requests found no model on a loaded machine (404, CI), and waiting with it would
            // spend its minute.
            .api_key(PROBE_KEY)
            .router_args(&[
                "--auth-config-file",
                auth.to_str().unwrap(),
                "--shards",
                "2",
            ]),
    );
    let body = chat("sim-model", false).to_string();
    let http = site.http;
    let started = std::time::Instant::now();
    // 8 clients x 6 requests, each on a fresh connection: SO_REUSEPORT spreads them over shards.
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                for _ in 0..6 {
                    let raw = format!(
                        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let response = request(http, raw.as_bytes());
                    statuses.push((
                        response.status,
                        response.header("x-ratelimit-remaining-requests").map(str::to_owned),
                        response.header("retry-after").is_some(),
                        if response.status == 429 { response.error_code() } else { String::new() },
                    ));
                }
                statuses
            })
        })
        .collect();
    let statuses: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let elapsed = started.elapsed();
    let admitted = statuses
        .iter()
        .filter(|(status, ..)| *status == 200)
        .count();
    let refused: Vec<_> = statuses
        .iter()
        .filter(|(status, ..)| *status == 429)
        .collect();
    assert_eq!(admitted + refused.len(), 48, "{statuses:?}");
    // The bucket starts with a minute of burst and refills at RPM/60 per second while the
    // requests run: never more than that, however the requests spread over the shards.
    let refilled = (elapsed.as_secs_f64() * RPM as f64 / 60.0).ceil() as usize;
    assert!(
        (RPM..=RPM + refilled).contains(&admitted),
        "admitted {admitted} in {elapsed:?} (refill allows {refilled}): {statuses:?}"
    );
    for (_, remaining, ..) in statuses.iter().filter(|(status, ..)| *status == 200) {
        let remaining: usize = remaining
            .as_deref()
            .expect("X-RateLimit-Remaining-Requests on success")
            .parse()
            .unwrap();
        assert!(remaining < RPM, "{remaining}");
    }
    for (_, remaining, retry_after, code) in refused {
        assert_eq!(code, "rate_limit_exceeded");
        assert_eq!(remaining.as_deref(), Some("0"));
        assert!(!retry_after, "plain RPM refusals carry no Retry-After");
    }
    let served = site.sim_metric(0, "sim_requests_total");
    assert_eq!(
        served as usize, admitted,
        "refused requests never reach the engine"
    );
    // The tenant counters: every refusal once, under the key's owner and its own static id.
    let metrics = site.router_metrics();
    let tenant = [("tenant_id", "acme")];
    assert_eq!(
        common::metric_sum(&metrics, "hivenet_tenant_rate_limited_total", &tenant) as usize,
        48 - admitted,
        "{metrics}"
    );
    assert_eq!(
        common::metric_sum(&metrics, "hivenet_tenant_requests_success_total", &tenant) as usize,
        admitted
    );
    // Served requests carry the serving agent's deployment; refusals before routing `unset`.
    let served = [("tenant_id", "acme"), ("deployment_id", "deploy-42")];
    assert_eq!(
        common::metric_sum(&metrics, "hivenet_tenant_requests_success_total", &served) as usize,
        admitted,
        "{metrics}"
    );
    let unrouted = [("tenant_id", "acme"), ("deployment_id", "unset")];
    assert_eq!(
        common::metric_sum(&metrics, "hivenet_tenant_requests_failed_total", &unrouted) as usize,
        48 - admitted,
        "{metrics}"
    );
    assert!(metrics.contains("key_id=\"static:"), "{metrics}");
}

#[test]
fn daily_budget_is_corrected_to_exact_stream_usage_then_refuses() {
    const BUDGET: u64 = 240;
    let key = "sk-daily-limited";
    let auth = auth_file("daily", key, &format!("        tokens_per_day: {BUDGET}\n"));
    let site = Site::start(
        "limits-daily",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "8"])
            .agent(0, &["--capacity", "4"])
            .api_key(key)
            .router_args(&["--auth-config-file", auth.to_str().unwrap()]),
    );
    // A stream that does not ask for usage: the router asks the engine and settles on it.
    let body = chat("sim-model", true).to_string();
    let estimate = (body.len() as u64 * 10).div_ceil(32);
    let mut admitted = 0u64;
    let refusal = loop {
        let response = post(&site, key, &body);
        match response.status {
            200 => {
                admitted += 1;
                let remaining: u64 = response
                    .header("x-ratelimit-remaining-tokens")
                    .expect("X-RateLimit-Remaining-Tokens on success")
                    .parse()
                    .unwrap();
                assert!(remaining < BUDGET);
            }
            429 => break response,
            other => panic!("unexpected {other}: {}", response.text()),
        }
        assert!(admitted < 100, "the daily budget never refused");
    };
    assert_eq!(
        refusal.error_code(),
        "token_limit_exceeded",
        "{}",
        refusal.text()
    );
    let remaining: u64 = refusal
        .header("x-ratelimit-remaining-tokens")
        .expect("remaining tokens header")
        .parse()
        .unwrap();
    assert!(
        remaining < estimate,
        "refused with {remaining} left for an estimate of {estimate}"
    );
    // Charged at the estimate, no more than BUDGET / (estimate + 8) requests would have fit; each
    // was corrected down to its exact (smaller) prompt, so more did.
    let at_estimate = BUDGET / (estimate + 8);
    assert!(
        admitted > at_estimate,
        "admitted {admitted}, the estimate alone would allow {at_estimate} (estimate {estimate})"
    );
    // The last answer's exact usage is settled once its last byte went out, which may be after
    // the refused request was admitted: wait until a refusal counts it. A correction may leave
    // room for one more answer; it is counted too.
    let exact = || {
        site.router_metric("hivenet_shard_input_tokens_total") as u64
            + site.router_metric("hivenet_shard_output_tokens_total") as u64
    };
    let settled = poll(common::WAIT, || {
        let response = post(&site, key, &body);
        if response.status == 200 {
            admitted += 1;
            return None;
        }
        let remaining: u64 = response
            .header("x-ratelimit-remaining-tokens")?
            .parse()
            .ok()?;
        (BUDGET - remaining == exact()).then_some(remaining)
    });
    let exact_output = site.router_metric("hivenet_shard_output_tokens_total") as u64;
    assert_eq!(exact_output, admitted * 8);
    assert!(
        settled.is_some(),
        "daily total = exact usage: refused with {remaining} left ({} used), exact usage {}",
        BUDGET - remaining,
        exact()
    );
}

#[test]
fn non_streamed_answer_over_the_daily_budget_is_refused_after_the_fact() {
    // Each answer costs its exact prompt (a few tokens) plus 16 output tokens.
    const BUDGET: u64 = 60;
    let key = "sk-daily-buffered";
    let auth = auth_file(
        "daily-buffered",
        key,
        &format!("        tokens_per_day: {BUDGET}\n"),
    );
    let site = Site::start(
        "limits-daily-buffered",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "16"])
            .agent(0, &["--deployment-id", "deploy-7"])
            .api_key(key)
            .router_args(&["--auth-config-file", auth.to_str().unwrap()]),
    );
    let body = chat("sim-model", false).to_string();
    let mut statuses = Vec::new();
    let refusal = loop {
        let response = post(&site, key, &body);
        statuses.push(response.status);
        if response.status != 200 {
            break response;
        }
        assert!(statuses.len() < 10, "never refused: {statuses:?}");
    };
    assert!(statuses.len() >= 2, "{statuses:?}");
    assert_eq!(refusal.status, 429, "{}", refusal.text());
    assert_eq!(refusal.error_code(), "token_limit_exceeded");
    assert_eq!(refusal.header("x-ratelimit-remaining-tokens"), Some("0"));
    // The refused answer was generated (the engine did the work) but not delivered.
    assert_eq!(
        site.sim_metric(0, "sim_requests_total") as usize,
        statuses.len()
    );
    let metrics = site.router_metrics();
    // Refused after an agent answered: the phase is output and the deployment is that agent's.
    let output_phase = [
        ("tenant_id", "acme"),
        ("phase", "output"),
        ("deployment_id", "deploy-7"),
    ];
    assert_eq!(
        common::metric_sum(
            &metrics,
            "hivenet_tenant_token_limited_total",
            &output_phase
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        common::metric_sum(
            &metrics,
            "hivenet_tenant_requests_failed_total",
            &[("model", "sim-model")]
        ),
        1.0
    );
    // Every answer's exact output is counted, the refused one's too.
    assert_eq!(
        common::metric_sum(&metrics, "hivenet_tenant_output_tokens_total", &[]) as usize,
        16 * statuses.len()
    );
}
