//! Proves through the real router that deeply nested configuration documents (the reported
//! `shed_if: [[[…]]]` 60 000 levels deep, 117 KiB) are refused quickly with the nesting limit named
//! — as a `PUT /admin/policy` body (400), a sibling map (400), a policy file reload and an
//! `auth.yaml` reload (refused, previous configuration kept) — while `/metrics` keeps answering
//! promptly and the agent keeps serving.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Options, Site, get_request, metric_sum, request, try_request, write_temp};
use serde_json::Value;

const ADMIN_KEY: &str = "nesting-admin-key";
const POLICY: &str = "max_inflight: 4\nrouting_policy:\n  strategy: least-loaded\n";
const AUTH: &str = "api:\n  mode: none\n";
const LIMIT_MESSAGE: &str = "nesting deeper than 64 levels";
/// Longest a refusal or a `/metrics` answer may take here. Without the nesting limit a 60 000-level
/// document holds the control core for 11 s in a release build.
const PROMPT: Duration = Duration::from_secs(2);

fn deep_policy() -> String {
    format!(
        "{POLICY}shed_if: {}{}\n",
        "[".repeat(60_000),
        "]".repeat(60_000)
    )
}

fn admin(site: &Site, method: &str, target: &str, body: &str) -> (u16, Value, Duration) {
    let raw = format!(
        "{method} {target} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    let response = request(site.http, raw.as_bytes());
    let took = started.elapsed();
    let value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status, value, took)
}

/// Polls `/metrics` until stopped; returns the slowest answer (a failed one counts as forever).
fn watch_metrics(site: &Site, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Duration> {
    let metrics = site.metrics;
    std::thread::spawn(move || {
        let mut slowest = Duration::ZERO;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let answered = try_request(metrics, &get_request("/metrics"))
                .map(|response| response.status == 200)
                .unwrap_or(false);
            let took = if answered {
                started.elapsed()
            } else {
                Duration::MAX
            };
            slowest = slowest.max(took);
            std::thread::sleep(Duration::from_millis(20));
        }
        slowest
    })
}

#[test]
fn deeply_nested_documents_are_refused_quickly_and_the_control_core_keeps_answering() {
    let policy_file = write_temp("nesting-policy.yaml", POLICY);
    let auth_file = write_temp("nesting-auth.yaml", AUTH);
    let site = Site::start(
        "config-nesting",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "4"])
            .site("nesting", "site-a")
            .router_args(&[
                "--policy-file",
                &policy_file,
                "--auth-config-file",
                &auth_file,
            ])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_metrics(&site, stop.clone());

    // The admin API: a policy body (YAML) and a sibling map (JSON).
    let (status, body, took) = admin(&site, "PUT", "/admin/policy", &deep_policy());
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(message.contains(LIMIT_MESSAGE), "{body}");
    assert!(took < PROMPT, "refusal took {took:?}");
    let deep_map = format!(
        "{{\"sites\": [], \"placements\": {}{}}}",
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    let (status, body, took) = admin(&site, "PUT", "/admin/sibling-map", &deep_map);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains(LIMIT_MESSAGE),
        "{body}"
    );
    assert!(took < PROMPT, "refusal took {took:?}");
    // Nothing changed.
    let (status, global, _) = admin(&site, "GET", "/admin/policy", "");
    assert_eq!(status, 200);
    assert_eq!(global["max_inflight"], 4, "{global}");

    // The policy file: the reload is refused and counted; the previous policy stays.
    let refusals = || {
        metric_sum(
            &site.router_metrics(),
            "hivenet_policy_reload_total",
            &[("trigger", "file_change"), ("result", "error")],
        )
    };
    let before = refusals();
    std::fs::write(&policy_file, deep_policy()).unwrap();
    site.wait_for("the deep policy file to be refused", || {
        (refusals() > before).then_some(())
    });
    let (_, global, _) = admin(&site, "GET", "/admin/policy", "");
    assert_eq!(global["max_inflight"], 4, "{global}");

    // auth.yaml: refused with the limit named, the previous configuration stays.
    let deep_auth = format!(
        "{AUTH}  keys: {}{}\n",
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    std::fs::write(&auth_file, deep_auth).unwrap();
    site.wait_for("the deep auth.yaml to be refused", || {
        let log = site.router.log_text();
        (log.contains("auth config reload refused") && log.contains(LIMIT_MESSAGE)).then_some(())
    });

    stop.store(true, Ordering::Relaxed);
    let slowest = watcher.join().unwrap();
    assert!(
        slowest < PROMPT,
        "/metrics took {slowest:?} at worst\n{}",
        site.logs()
    );
    // The agent is still in the pool and serving.
    site.assert_chat_ok("sim-model");
}
