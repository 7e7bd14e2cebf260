//! Proves `HIVENET_ROUTER_QUOTA_BACKEND=badger` through the real router: today's daily token
//! totals (flat and per-model) and the per-agent history are the same after a SIGTERM restart
//! and after a crash that came more than a flush interval after the usage, `--reset-disk-db`
//! starts them from zero, and the `memory` backend forgets them.
//!
//! Remaining tokens are read without spending any: a request whose declared maximum output is
//! larger than the budget is refused with `429 token_limit_exceeded` and
//! `X-RateLimit-Remaining-Tokens`, and a refusal charges nothing.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Options, Site, Stop, request};
use sha2::{Digest, Sha256};

const FLAT_KEY: &str = "sk-persist-flat";
const ADMIN_KEY: &str = "sk-persist-admin";
const PER_MODEL_KEY: &str = "sk-persist-per-model";
const FLAT_BUDGET: u64 = 100_000;
const PER_MODEL_BUDGET: u64 = 50_000;
/// Longer than the one-second flush plus a write, on a loaded two-core box.
const AFTER_A_FLUSH: Duration = Duration::from_secs(2);

/// An `auth.yaml` with a flat key (owner `acme`) and a per-model key (owner `globex`), each with
/// a daily token budget.
fn auth_file(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-persistence")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auth.yaml");
    let hash = |key: &str| hex::encode(Sha256::digest(key.as_bytes()));
    let text = format!(
        "admin:
  mode: api-key
api:
  mode: api-key
  keys:
    - key_hash: \"{}\"
      key_preview: \"sk-...flat\"
      metadata: {{name: \"flat\", owner: \"acme\"}}
      quota: {{tokens_per_day: {FLAT_BUDGET}}}
    - key_hash: \"{}\"
      key_preview: \"sk-...model\"
      metadata: {{name: \"per-model\", owner: \"globex\"}}
      quota:
        per_model:
          sim-model: {{requests_per_minute_per_replica: 1000, tokens_per_day: {PER_MODEL_BUDGET}}}
",
        hash(FLAT_KEY),
        hash(PER_MODEL_KEY)
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn start(name: &str, options: Options) -> Site {
    let auth = auth_file(name);
    Site::start(
        name,
        options
            .sim(&["--models", "sim-model", "--output-tokens", "8"])
            .agent(0, &["--capacity", "4"])
            .api_key(FLAT_KEY)
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .router_args(&["--auth-config-file", auth.to_str().unwrap()]),
    )
}

fn post(site: &Site, key: &str, body: &str) -> common::Response {
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

/// What `key` has left today, read from a refusal that charges nothing.
fn remaining_tokens(site: &Site, key: &str) -> u64 {
    let body = serde_json::json!({
        "model": "sim-model",
        "max_tokens": 10 * FLAT_BUDGET,
        "messages": [{"role": "user", "content": "how much is left?"}],
    })
    .to_string();
    let response = post(site, key, &body);
    assert_eq!(response.status, 429, "{}\n{}", response.text(), site.logs());
    assert_eq!(response.error_code(), "token_limit_exceeded");
    response
        .header("x-ratelimit-remaining-tokens")
        .expect("X-RateLimit-Remaining-Tokens on a daily refusal")
        .parse()
        .unwrap()
}

/// Exact tokens the router has counted (input + output, every key).
fn usage_total(site: &Site) -> u64 {
    (site.router_metric("hivenet_shard_input_tokens_total")
        + site.router_metric("hivenet_shard_output_tokens_total")) as u64
}

/// The agent's lifetime successes on `sim-model` as the router exposes them (its history), once
/// the router exposes them at all (after a restart: once it has read the disk, or the agent has
/// registered again).
fn agent_successes(site: &Site) -> f64 {
    site.wait_for("the agent's history on the router", || {
        common::metric_sum_present(
            &site.router_metrics(),
            "hivenet_agent_requests_success_total",
            &[("model", "sim-model")],
        )
    })
}

/// Sends `requests` chat completions with `key`, which had `remaining` tokens, and returns what
/// it has left once every one has settled: its daily total then equals the exact usage.
fn spend(site: &Site, key: &str, remaining: u64, requests: usize) -> u64 {
    let before = usage_total(site);
    let body = common::chat("sim-model", false).to_string();
    for _ in 0..requests {
        let response = post(site, key, &body);
        assert_eq!(response.status, 200, "{}", response.text());
    }
    site.wait_for("the daily total to equal exact usage", || {
        let spent = usage_total(site) - before;
        let left = remaining_tokens(site, key);
        (spent > 0 && left + spent == remaining).then_some(left)
    })
}

#[test]
fn graceful_restart_keeps_todays_flat_and_per_model_totals() {
    // The default --disk-db-path, ./badger_disk, lands in the site's directory.
    let mut site = start(
        "persist-graceful",
        Options::new().router_env("HIVENET_ROUTER_QUOTA_BACKEND", "badger"),
    );
    let flat = spend(&site, FLAT_KEY, FLAT_BUDGET, 3);
    let per_model = spend(&site, PER_MODEL_KEY, PER_MODEL_BUDGET, 2);
    assert!(flat < FLAT_BUDGET && per_model < PER_MODEL_BUDGET);
    // The refusals that read what is left never reach the agent: five served.
    assert_eq!(agent_successes(&site), 5.0);

    let status = site.restart_router(Stop::Terminate, &[]).unwrap();
    assert!(status.success(), "graceful shutdown exits 0: {status}");
    assert!(site.dir.join("badger_disk/hivenet-router.redb").exists());
    assert!(
        site.router
            .log_text()
            .contains("daily token totals restored from the disk database"),
        "{}",
        site.router.log_tail()
    );
    assert_eq!(remaining_tokens(&site, FLAT_KEY), flat);
    assert_eq!(remaining_tokens(&site, PER_MODEL_KEY), per_model);
    assert_eq!(agent_successes(&site), 5.0, "{}", site.router.log_tail());
    // The restored budget and history keep counting.
    let flat_after = spend(&site, FLAT_KEY, flat, 1);
    assert!(flat_after < flat);
    site.wait_for("the agent's sixth success", || {
        (agent_successes(&site) == 6.0).then_some(())
    });
    let status = site.restart_router(Stop::Terminate, &[]).unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(remaining_tokens(&site, FLAT_KEY), flat_after);
    assert_eq!(remaining_tokens(&site, PER_MODEL_KEY), per_model);
    assert_eq!(agent_successes(&site), 6.0);

    // A reset clears the history on disk too (at the next flush, here the one at shutdown): a
    // restart then starts it from zero, and the daily totals are untouched.
    let raw = format!(
        "POST /admin/metrics/reset HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let reset = request(site.http, raw.as_bytes());
    assert_eq!(reset.status, 200, "{}", reset.text());
    assert_eq!(
        reset.json()["message"],
        "per-agent lifetime counters cleared (disk, in-memory, and Prometheus series)"
    );
    assert_eq!(agent_successes(&site), 0.0);
    let status = site.restart_router(Stop::Terminate, &[]).unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(agent_successes(&site), 0.0);
    assert_eq!(remaining_tokens(&site, FLAT_KEY), flat_after);
}

#[test]
fn a_crash_keeps_the_totals_flushed_before_it() {
    // An explicit path, through the environment variable.
    let disk = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-persistence")
        .join(format!("crash-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&disk);
    let mut site = start(
        "persist-crash",
        Options::new()
            .router_env("HIVENET_ROUTER_QUOTA_BACKEND", "badger")
            .router_env("HIVENET_ROUTER_DISK_DB_PATH", disk.to_str().unwrap()),
    );
    let flat = spend(&site, FLAT_KEY, FLAT_BUDGET, 3);
    let per_model = spend(&site, PER_MODEL_KEY, PER_MODEL_BUDGET, 1);
    assert_eq!(agent_successes(&site), 4.0);
    std::thread::sleep(AFTER_A_FLUSH);
    site.restart_router(Stop::Kill, &[]);
    assert!(disk.join("hivenet-router.redb").exists());
    assert_eq!(remaining_tokens(&site, FLAT_KEY), flat);
    assert_eq!(remaining_tokens(&site, PER_MODEL_KEY), per_model);
    assert_eq!(agent_successes(&site), 4.0);
    drop(site);
    let _ = std::fs::remove_dir_all(&disk);
}

#[test]
fn reset_disk_db_starts_today_from_zero() {
    let mut site = start(
        "persist-reset",
        Options::new().router_env("HIVENET_ROUTER_QUOTA_BACKEND", "badger"),
    );
    let flat = spend(&site, FLAT_KEY, FLAT_BUDGET, 2);
    assert!(flat < FLAT_BUDGET);
    site.restart_router(Stop::Terminate, &["--reset-disk-db"]);
    assert_eq!(remaining_tokens(&site, FLAT_KEY), FLAT_BUDGET);
    assert_eq!(remaining_tokens(&site, PER_MODEL_KEY), PER_MODEL_BUDGET);
}

#[test]
fn memory_backend_forgets_todays_totals() {
    let mut site = start("persist-memory", Options::new());
    let flat = spend(&site, FLAT_KEY, FLAT_BUDGET, 2);
    assert!(flat < FLAT_BUDGET);
    site.restart_router(Stop::Terminate, &[]);
    assert!(
        !site.dir.join("badger_disk").exists(),
        "memory writes no database"
    );
    assert_eq!(remaining_tokens(&site, FLAT_KEY), FLAT_BUDGET);
    // The agent registered again into an empty history.
    assert_eq!(agent_successes(&site), 0.0);
}
