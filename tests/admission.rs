//! Proves the admission gates through the real router, agents and simulated engines (seed
//! `admission-control.md`): B1 request caps (and `count_tokens` exempt), B2 parking that either
//! fits when capacity frees or answers 429 with `Retry-After: 1`, B3 shedding on pool KV-cache
//! pressure (and passing when signals are missing), a B4 share refusal after B2 that leaves
//! occupancy where it was, B4 input tokens per minute, and a stream without declared output
//! growing its reservation, and the occupancy reaper running within a test while sparing a live
//! stream. Every test ends with occupancy at zero and, after a reaper pass, nothing reaped.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Conn, Options, Site, metric_absent, metric_sum, poll, request};
use serde_json::json;
use sha2::{Digest, Sha256};

const MODEL: &str = "sim-model";

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-admission")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A policy directory with one named policy for [`MODEL`] (with a plain least-loaded
/// `routing_policy` unless `policy` has its own).
fn policy_dir(name: &str, policy: &str) -> PathBuf {
    let dir = scratch(&format!("{name}-policies"));
    std::fs::create_dir_all(&dir).unwrap();
    let routing = if policy.contains("routing_policy:") {
        ""
    } else {
        "routing_policy:\n  strategy: least-loaded\n"
    };
    std::fs::write(
        dir.join("sim.yaml"),
        format!("models:\n  - {MODEL}\n{routing}{policy}"),
    )
    .unwrap();
    dir
}

/// An auth.yaml with one key whose extra settings are `settings` (indented by six spaces).
fn auth_file(name: &str, raw_key: &str, settings: &str) -> PathBuf {
    let path = scratch(name).join("auth.yaml");
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...test\"\n      metadata:\n        name: \"tenant\"\n        owner: \"acme\"\n{settings}",
        hex::encode(Sha256::digest(raw_key.as_bytes()))
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn chat_body(content: &str, max_tokens: Option<u64>, stream: bool) -> String {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    });
    if let Some(max_tokens) = max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    body.to_string()
}

fn raw_post(path: &str, key: Option<&str>, body: &str) -> Vec<u8> {
    let auth = key.map_or(String::new(), |key| {
        format!("authorization: Bearer {key}\r\n")
    });
    format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn admission_metric(site: &Site, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&site.router_metrics(), name, labels)
}

/// The reaper of every site here: a pass every second, reaping reservations untouched for 5 s.
/// The longest a live reservation goes untouched in these tests is a non-streamed answer of 20
/// tokens 40 ms apart (0.8 s; streams refresh theirs every 16 events, at most 0.64 s apart here),
/// so 5 s leaves room for a loaded machine and reaps nothing live. A lost release, on the other
/// hand, is reaped within 6 s, well inside the 30 s `assert_settled` waits for the in-flight
/// gauge: the leak then shows as `hivenet_admission_reaped_total` 1 instead of a timeout.
const REAP_INTERVAL: &str = "1s";
const REAP_AFTER: &str = "5s";

/// Whether the test's model has an occupancy pool (a policy with `admit_budget_tokens` or
/// `max_inflight`): only then does the router expose its per-model admission gauges.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pool {
    Gated,
    None,
}

/// Occupancy back at zero once nothing runs (or, for a model without a pool, no occupancy series
/// at all: nothing was ever reserved), and, after a reaper pass, no reservation ever reaped.
fn assert_settled(site: &Site, pool: Pool) {
    match pool {
        Pool::Gated => {
            site.wait_metric("hivenet_admission_inflight_requests", |value| value == 0.0);
            assert_eq!(
                admission_metric(
                    site,
                    "hivenet_admission_occupancy_tokens",
                    &[("model", MODEL)]
                ),
                0.0
            );
        }
        Pool::None => {
            let metrics = site.router_metrics();
            for name in [
                "hivenet_admission_inflight_requests",
                "hivenet_admission_occupancy_tokens",
            ] {
                assert!(
                    metric_absent(&metrics, name, &[("model", MODEL)]),
                    "{MODEL} has no pool gate, yet {name} is exposed:\n{metrics}"
                );
            }
        }
    }
    site.wait_reaper_pass();
    assert_eq!(
        admission_metric(site, "hivenet_admission_reaped_total", &[]),
        0.0
    );
}

/// Opens a streaming chat and reads its head; the stream stays open until the caller drains it.
fn open_stream(site: &Site, key: Option<&str>, body: &str) -> Conn {
    let mut conn = Conn::connect(site.http);
    conn.send(&raw_post("/v1/chat/completions", key, body))
        .unwrap();
    let head = conn.read_head().unwrap();
    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&head.raw));
    conn
}

fn drain(mut conn: Conn) {
    while let Ok(Some(_)) = conn.read_chunk() {}
}

#[test]
fn b1_caps_the_input_estimate_and_count_tokens_is_exempt() {
    let policies = policy_dir("b1", "max_input_tokens: 100\n");
    let site = Site::start(
        "admission-b1",
        Options::new()
            .reaper(REAP_INTERVAL, REAP_AFTER)
            .sim(&["--models", MODEL])
            .agent(0, &[])
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    );
    let long = "lorem ipsum ".repeat(200);
    let refused = request(
        site.http,
        &raw_post("/v1/chat/completions", None, &chat_body(&long, None, false)),
    );
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(refused.error_code(), "input_too_long");
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.starts_with("input is ")
            && message.ends_with(" tokens, over the model limit of 100"),
        "{message}"
    );
    // Reducing max_tokens does not help: the cap is on input.
    let still = request(
        site.http,
        &raw_post(
            "/v1/chat/completions",
            None,
            &chat_body(&long, Some(1), false),
        ),
    );
    assert_eq!(still.status, 400);
    // A short prompt passes.
    let short = request(
        site.http,
        &raw_post("/v1/chat/completions", None, &chat_body("hi", None, false)),
    );
    assert_eq!(short.status, 200, "{}", short.text());
    // count_tokens skips every admission gate.
    let count =
        json!({"model": MODEL, "messages": [{"role": "user", "content": long}]}).to_string();
    let counted = request(
        site.http,
        &raw_post("/v1/messages/count_tokens", None, &count),
    );
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_rejections_total",
            &[("reason", "b1"), ("model", MODEL)]
        ),
        2.0
    );
    assert_settled(&site, Pool::None);
}

/// A site whose pool admits 1000 tokens (admit fraction 1.0, one replica) and whose engine
/// streams 20 tokens 40 ms apart, so one request holds the budget for about 0.8 s.
fn b2_site(name: &str, park_timeout: &str) -> Site {
    let policies = policy_dir(name, "admit_budget_tokens: 1000\n");
    Site::start(
        name,
        Options::new()
            .reaper(REAP_INTERVAL, REAP_AFTER)
            .sim(&["--models", MODEL, "--itl", "40ms", "--output-tokens", "20"])
            .agent(0, &["--capacity", "8"])
            .router_env("HIVENET_ROUTER_ADMIT_FRACTION", "1.0")
            .router_env("HIVENET_ROUTER_ADMIT_PARK_TIMEOUT", park_timeout)
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    )
}

#[test]
fn b2_parks_a_request_until_the_budget_frees() {
    let site = b2_site("admission-b2-fits", "5s");
    let holder = open_stream(&site, None, &chat_body("hold", Some(900), true));
    site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| {
        tokens >= 900.0
    });
    let started = Instant::now();
    let parked = request(
        site.http,
        &raw_post(
            "/v1/chat/completions",
            None,
            &chat_body("wait", Some(900), false),
        ),
    );
    assert_eq!(parked.status, 200, "{}", parked.text());
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "the second request must have waited for the first to finish"
    );
    assert!(admission_metric(&site, "hivenet_admission_parked_total", &[]) >= 1.0);
    drain(holder);
    assert_settled(&site, Pool::Gated);
}

#[test]
fn b2_refuses_with_retry_after_when_the_park_times_out() {
    let site = b2_site("admission-b2-full", "100ms");
    let holder = open_stream(&site, None, &chat_body("hold", Some(900), true));
    site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| {
        tokens >= 900.0
    });
    let refused = request(
        site.http,
        &raw_post(
            "/v1/chat/completions",
            None,
            &chat_body("wait", Some(900), false),
        ),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "concurrency_limit_exceeded");
    assert_eq!(
        refused.json()["error"]["message"],
        "server at capacity for this model, please retry"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    // A request that fits beside the holder is not blocked.
    let small = request(
        site.http,
        &raw_post(
            "/v1/chat/completions",
            None,
            &chat_body("s", Some(10), false),
        ),
    );
    assert_eq!(small.status, 200, "{}", small.text());
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_rejections_total",
            &[("reason", "b2"), ("model", MODEL)]
        ),
        1.0
    );
    drain(holder);
    assert_settled(&site, Pool::Gated);
}

#[test]
fn b2_reservation_grows_while_undeclared_output_streams() {
    let policies = policy_dir("b2-grow", "admit_budget_tokens: 100000\n");
    let site = Site::start(
        "admission-b2-grow",
        Options::new()
            .reaper(REAP_INTERVAL, REAP_AFTER)
            .sim(&["--models", MODEL, "--itl", "20ms", "--output-tokens", "80"])
            .agent(0, &[])
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    );
    let stream = open_stream(&site, None, &chat_body("grow", None, true));
    let first = site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| tokens > 0.0);
    let grown = poll(Duration::from_secs(5), || {
        let tokens = admission_metric(&site, "hivenet_admission_occupancy_tokens", &[]);
        (tokens >= first + 32.0).then_some(tokens)
    });
    assert!(grown.is_some(), "occupancy never grew past {first}");
    drain(stream);
    assert_settled(&site, Pool::Gated);
}

/// The reaper runs within a test's lifetime when the harness asks it to, and it spares a live
/// stream older than its age because the stream refreshes its reservation every 16 events. With
/// the defaults no pass ever happens in a test, so `reaped == 0` could not fail; here a pass
/// happens while the stream's reservation is older than `--admission-reap-after`, so a stream
/// that stopped refreshing would be reaped and counted. (A reservation whose release is lost is
/// reaped and counted in `admission::occupancy`'s unit test: no production path loses one.)
#[test]
fn the_reaper_passes_in_test_time_and_spares_a_refreshing_stream() {
    const AGE: Duration = Duration::from_secs(2);
    let policies = policy_dir("reaper", "admit_budget_tokens: 100000\n");
    // 100 tokens 40 ms apart: a 4 s stream, refreshed every 16 events (0.64 s).
    let site = Site::start(
        "admission-reaper",
        Options::new()
            .reaper("500ms", "2s")
            .sim(&["--models", MODEL, "--itl", "40ms", "--output-tokens", "100"])
            .agent(0, &[])
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    );
    let stream = open_stream(&site, None, &chat_body("live", None, true));
    site.wait_metric("hivenet_admission_inflight_requests", |count| count == 1.0);
    let reserved = Instant::now();
    std::thread::sleep(AGE + Duration::from_millis(500));
    site.wait_reaper_pass();
    let elapsed = reserved.elapsed();
    assert_eq!(
        admission_metric(&site, "hivenet_admission_reaped_total", &[]),
        0.0,
        "a live stream older than the reaper's age was reaped"
    );
    // The pass must have found the reservation still held, and older than the age.
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_inflight_requests",
            &[("model", MODEL)]
        ),
        1.0,
        "the stream ended before the reaper pass ({elapsed:?}); the test proves nothing"
    );
    drain(stream);
    assert_settled(&site, Pool::Gated);
}

#[test]
fn b3_sheds_on_pool_kv_pressure_and_passes_without_signals() {
    let policies = policy_dir("b3", "shed_if:\n  kv_cache_utilization:\n    gt: 0.5\n");
    let site = Site::start(
        "admission-b3",
        Options::new()
            .sim(&["--models", MODEL])
            .agent(0, &[])
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    );
    let body = chat_body("hi", None, false);
    let ok = request(site.http, &raw_post("/v1/chat/completions", None, &body));
    assert_eq!(ok.status, 200, "{}", ok.text());
    let control = "POST /sim/control HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: 22\r\nconnection: close\r\n\r\n{\"kv_cache_usage\":0.9}";
    assert_eq!(request(site.sim_addrs[0], control.as_bytes()).status, 200);
    let shed = poll(Duration::from_secs(10), || {
        let response = request(site.http, &raw_post("/v1/chat/completions", None, &body));
        (response.status == 429).then_some(response)
    })
    .expect("the router never shed under KV pressure");
    assert_eq!(shed.error_code(), "concurrency_limit_exceeded");
    assert_eq!(
        shed.json()["error"]["message"],
        "model is under high load, please retry"
    );
    assert_eq!(shed.header("retry-after"), Some("1"));
    assert!(
        admission_metric(
            &site,
            "hivenet_admission_rejections_total",
            &[("reason", "b3"), ("model", MODEL)]
        ) >= 1.0
    );
    drop(site);

    // The same pressure behind an engine that reports no metrics: the gate passes.
    let mut site = Site::start(
        "admission-b3-missing",
        Options::new()
            .sim(&["--models", MODEL])
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    );
    let health_url = format!("http://{}/health", site.sim_addrs[0]);
    site.spawn_agent(
        0,
        &[
            "--engine",
            "custom",
            "--model",
            MODEL,
            "--health-url",
            &health_url,
        ],
    );
    site.wait_models(&[MODEL]);
    assert_eq!(request(site.sim_addrs[0], control.as_bytes()).status, 200);
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..5 {
        let response = request(site.http, &raw_post("/v1/chat/completions", None, &body));
        assert_eq!(response.status, 200, "{}", response.text());
    }
}

/// A site whose one key (`key`, with `key_settings` in auth.yaml) calls [`MODEL`] under a
/// serverless policy with `policy` fields, the engine started with `sim_args`.
fn serverless_site(
    name: &str,
    key: &str,
    key_settings: &str,
    policy: &str,
    sim_args: &[&str],
) -> Site {
    let auth = auth_file(name, key, key_settings);
    let policies = policy_dir(name, &format!("mode: serverless\n{policy}"));
    let mut sim = vec!["--models", MODEL];
    sim.extend_from_slice(sim_args);
    Site::start(
        &format!("admission-{name}"),
        Options::new()
            .reaper(REAP_INTERVAL, REAP_AFTER)
            .sim(&sim)
            .agent(0, &["--capacity", "8"])
            .api_key(key)
            .router_args(&[
                "--policy-model-dir",
                policies.to_str().unwrap(),
                "--auth-config-file",
                auth.to_str().unwrap(),
            ]),
    )
}

#[test]
fn b4_share_refusal_after_b2_leaves_occupancy_unchanged() {
    let key = "sk-serverless-share";
    let site = serverless_site(
        "b4-share",
        key,
        "      max_occupancy_share: 0.3\n",
        "admit_budget_tokens: 1000\n",
        &["--itl", "40ms", "--output-tokens", "20"],
    );
    // The key's share is floor(0.3 × 1000) = 300 tokens; B2's budget is 900.
    let holder = open_stream(&site, Some(key), &chat_body("hold", Some(200), true));
    let held = site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| {
        tokens >= 200.0
    });
    let refused = request(
        site.http,
        &raw_post(
            "/v1/chat/completions",
            Some(key),
            &chat_body("more", Some(200), false),
        ),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "rate_limit_exceeded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_occupancy_tokens",
            &[("model", MODEL)]
        ),
        held,
        "a B4 refusal after B2 must leave occupancy exactly where it was"
    );
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_rejections_total",
            &[("reason", "b4_occupancy"), ("model", MODEL)]
        ),
        1.0
    );
    drain(holder);
    assert_settled(&site, Pool::Gated);
}

#[test]
fn b4_input_tokens_per_minute_refuse_with_retry_after() {
    let key = "sk-serverless-itpm";
    let site = serverless_site(
        "b4-itpm",
        key,
        "      quota:\n        input_tokens_per_minute: 400\n",
        "admit_budget_tokens: 100000\n",
        &[],
    );
    let prompt = "tokens ".repeat(60);
    let mut statuses = Vec::new();
    let mut refusal = None;
    for _ in 0..10 {
        let response = request(
            site.http,
            &raw_post(
                "/v1/chat/completions",
                Some(key),
                &chat_body(&prompt, None, false),
            ),
        );
        statuses.push(response.status);
        if response.status == 429 {
            refusal = Some(response);
            break;
        }
    }
    let refusal = refusal.unwrap_or_else(|| panic!("never refused: {statuses:?}"));
    assert_eq!(refusal.error_code(), "rate_limit_exceeded");
    assert_eq!(refusal.header("retry-after"), Some("1"));
    assert!(statuses.iter().filter(|status| **status == 200).count() >= 1);
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_rejections_total",
            &[("reason", "b4_itpm"), ("model", MODEL)]
        ),
        1.0
    );
    assert_settled(&site, Pool::Gated);
}

#[test]
fn b4_output_tokens_per_minute_drained_by_a_response_refuse_the_next() {
    let key = "sk-serverless-otpm";
    // One answer of 64 output tokens drains a 40-token-per-minute output bucket.
    let site = serverless_site(
        "b4-otpm",
        key,
        "      quota:\n        output_tokens_per_minute: 40\n",
        "",
        &["--output-tokens", "64"],
    );
    let body = chat_body("hi", None, false);
    let first = request(
        site.http,
        &raw_post("/v1/chat/completions", Some(key), &body),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    let refused = request(
        site.http,
        &raw_post("/v1/chat/completions", Some(key), &body),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "rate_limit_exceeded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        admission_metric(
            &site,
            "hivenet_admission_rejections_total",
            &[("reason", "b4_otpm"), ("model", MODEL)]
        ),
        1.0
    );
    assert_settled(&site, Pool::None);
}

/// An auth.yaml with two keys: `sk-hold`, without limits, and `sk-tight`, whose extra settings
/// are `settings` (indented by six spaces).
fn two_keys(name: &str, settings: &str) -> PathBuf {
    let path = scratch(name).join("auth.yaml");
    let entry = |raw: &str, extra: &str| {
        format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...{raw}\"\n      metadata:\n        name: \"{raw}\"\n        owner: \"{raw}\"\n{extra}",
            hex::encode(Sha256::digest(raw.as_bytes()))
        )
    };
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n{}{}",
        entry("sk-hold", ""),
        entry("sk-tight", settings)
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A B2 pool of `budget` tokens on [`MODEL`] (admit fraction 1.0), `other-model` without any
/// gate, engines answering 20 tokens `itl` apart, and `auth`'s keys.
fn b2_keyed_site(name: &str, budget: u64, park_timeout: &str, itl: &str, auth: &Path) -> Site {
    let policies = policy_dir(name, &format!("admit_budget_tokens: {budget}\n"));
    Site::start(
        name,
        Options::new()
            .reaper(REAP_INTERVAL, REAP_AFTER)
            .sim(&[
                "--models",
                &format!("{MODEL},other-model"),
                "--itl",
                itl,
                "--output-tokens",
                "20",
            ])
            .agent(0, &["--capacity", "8"])
            .api_key("sk-hold")
            .router_env("HIVENET_ROUTER_ADMIT_FRACTION", "1.0")
            .router_env("HIVENET_ROUTER_ADMIT_PARK_TIMEOUT", park_timeout)
            .router_args(&[
                "--policy-model-dir",
                policies.to_str().unwrap(),
                "--auth-config-file",
                auth.to_str().unwrap(),
            ]),
    )
}

/// The router's input estimate of a request body (default 10 tokens per 32 bytes).
fn estimate(body: &str) -> u64 {
    (body.len() as u64 * 10).div_ceil(32)
}

/// A key's token phase comes after the pool gates (seed, "Gate order"). The router charges it
/// ahead, with the request rate, but gives it back when B2 would park the request: a request
/// parked for room holds none of its key's daily budget while it waits, and is charged when the
/// gates admit it.
#[test]
fn a_request_parked_by_b2_holds_none_of_its_daily_budget_while_it_waits() {
    const DAILY: u64 = 4000;
    let auth = two_keys(
        "ahead-parked",
        &format!("      quota:\n        tokens_per_day: {DAILY}\n"),
    );
    // 20 tokens 150 ms apart: the holder keeps the pool full for 3 s.
    let site = b2_keyed_site("admission-ahead-parked", 3000, "20s", "150ms", &auth);
    let holder_body = chat_body("hold", Some(2500), true);
    let holder = open_stream(&site, Some("sk-tight"), &holder_body);
    site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| {
        tokens >= 2500.0
    });
    // About 1,000 tokens of prompt: parked behind the holder.
    let parked_body = chat_body(&"lorem ipsum ".repeat(265), Some(100), false);
    assert!((900..1100).contains(&estimate(&parked_body)));
    let http = site.http;
    let parked = std::thread::spawn(move || {
        request(
            http,
            &raw_post("/v1/chat/completions", Some("sk-tight"), &parked_body),
        )
    });
    site.wait_metric("hivenet_admission_parked_total", |parked| parked >= 1.0);
    // A request to a model without gates that fits the day's budget only if the parked request
    // holds none of it: the budget less the holder's prompt and 500 tokens.
    let spare = DAILY - estimate(&holder_body) - 500;
    let mut other = json!({
        "model": "other-model",
        "messages": [{"role": "user", "content": "beside"}],
    });
    let other_input = estimate(&other.to_string());
    other["max_tokens"] = json!(spare - estimate(&other.to_string()) - 10);
    let beside = request(
        site.http,
        &raw_post("/v1/chat/completions", Some("sk-tight"), &other.to_string()),
    );
    assert_eq!(beside.status, 200, "{}", beside.text());
    let remaining: u64 = beside
        .header("x-ratelimit-remaining-tokens")
        .expect("X-RateLimit-Remaining-Tokens")
        .parse()
        .unwrap();
    assert!(
        remaining + estimate(&holder_body) + other_input + 30 >= DAILY,
        "{remaining} tokens left: the parked request held some of the budget"
    );
    drain(holder);
    let parked = parked.join().unwrap();
    assert_eq!(parked.status, 200, "{}", parked.text());
    assert_settled(&site, Pool::Gated);
}

/// The gate order decides the answer when both B2 and the daily budget would refuse: B2 first;
/// the daily budget only once the gates admit, and its refusal is counted once.
#[test]
fn b2_answers_before_the_daily_budget_which_refuses_in_its_place() {
    let auth = two_keys("ahead-order", "      quota:\n        tokens_per_day: 500\n");
    let site = b2_keyed_site("admission-ahead-order", 1000, "300ms", "100ms", &auth);
    let holder = open_stream(&site, Some("sk-hold"), &chat_body("hold", Some(900), true));
    site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| {
        tokens >= 900.0
    });
    // Over the day's budget (500) and over what the pool has left (about 70).
    let body = chat_body("tight", Some(600), false);
    let first = request(
        site.http,
        &raw_post("/v1/chat/completions", Some("sk-tight"), &body),
    );
    assert_eq!(first.status, 429, "{}", first.text());
    assert_eq!(
        first.error_code(),
        "concurrency_limit_exceeded",
        "{}",
        first.text()
    );
    drain(holder);
    site.wait_metric("hivenet_admission_occupancy_tokens", |tokens| tokens == 0.0);
    // The pool has room now: the daily budget refuses, after the gates.
    let second = request(
        site.http,
        &raw_post("/v1/chat/completions", Some("sk-tight"), &body),
    );
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(
        second.error_code(),
        "token_limit_exceeded",
        "{}",
        second.text()
    );
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_admission_rejections_total",
            &[("reason", "b2"), ("model", MODEL)]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(&metrics, "hivenet_tenant_token_limited_total", &[]),
        1.0,
        "{metrics}"
    );
    assert_settled(&site, Pool::Gated);
}

#[test]
fn exclude_if_skips_the_hot_agent_and_match_picks_by_engine() {
    let policies = policy_dir(
        "exclude-if",
        "routing_policy:\n  match:\n    engine: vllm\n  exclude_if:\n    kv_cache_utilization:\n      gt: 0.9\n  strategy: least-loaded\n",
    );
    let site = Site::start(
        "admission-exclude-if",
        Options::new()
            .sim(&["--models", MODEL])
            .sim(&["--models", MODEL])
            .sim(&["--models", MODEL])
            .agent(0, &["--engine", "vllm"])
            .agent(1, &["--engine", "vllm"])
            .agent(2, &["--engine", "sglang"])
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()]),
    );
    let control = "POST /sim/control HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: 23\r\nconnection: close\r\n\r\n{\"kv_cache_usage\":0.95}";
    assert_eq!(request(site.sim_addrs[0], control.as_bytes()).status, 200);
    let body = chat_body("hi", None, false);
    // Once sim 0's pressure has reached the router, every request goes to sim 1: sim 0 is
    // excluded by `exclude_if`, sim 2 never matched.
    let settled = poll(Duration::from_secs(10), || {
        let before = site.sim_metric(0, "sim_requests_total");
        for _ in 0..4 {
            let response = request(site.http, &raw_post("/v1/chat/completions", None, &body));
            assert_eq!(response.status, 200, "{}", response.text());
        }
        (site.sim_metric(0, "sim_requests_total") == before).then_some(())
    });
    assert!(
        settled.is_some(),
        "the hot agent kept getting requests\n{}",
        site.logs()
    );
    let served_by_one = site.sim_metric(1, "sim_requests_total");
    for _ in 0..6 {
        let response = request(site.http, &raw_post("/v1/chat/completions", None, &body));
        assert_eq!(response.status, 200);
    }
    assert_eq!(
        site.sim_metric(1, "sim_requests_total"),
        served_by_one + 6.0
    );
}
