//! Proves the ranking strategies through the real router, agents and simulated engines: two
//! agents serve one model, each in front of its own engine, one engine ten times slower to its
//! first token. Under `least-loaded` sequential requests go to both; once both engines report
//! an average time to first token, `best-ttft` sends every request to the faster one; under
//! `round-robin` they alternate, one each. The strategy changes through the admin API, as an
//! operator changes it, and applies to the model's routes at once.

mod common;

use std::path::PathBuf;

use common::{Options, Site, poll, request};
use serde_json::Value;

const ADMIN_KEY: &str = "admin-strategies-key";
const MODEL: &str = "sim-model";

fn put_policy(site: &Site, strategy: &str) {
    let body = format!("routing_policy: {{strategy: {strategy}}}\n");
    let raw = format!(
        "PUT /admin/policy HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-type: text/yaml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    assert_eq!(
        response.status,
        200,
        "{strategy}: {}",
        String::from_utf8_lossy(&response.body)
    );
}

/// Requests each engine served so far.
fn served(site: &Site) -> [f64; 2] {
    [0, 1].map(|sim| site.sim_metric(sim, "sim_requests_total"))
}

/// Sends `count` requests one after the other and returns how many each engine served.
fn send(site: &Site, count: usize) -> [f64; 2] {
    let before = served(site);
    for _ in 0..count {
        site.assert_chat_ok(MODEL);
    }
    let after = served(site);
    [after[0] - before[0], after[1] - before[1]]
}

#[test]
fn best_ttft_picks_the_faster_engine_and_round_robin_takes_each_in_turn() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hivenet-strategies-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("_default.yaml"),
        "routing_policy: {strategy: least-loaded}\n",
    )
    .unwrap();
    let engine = |ttft: &'static str| ["--models", MODEL, "--output-tokens", "4", "--ttft", ttft];
    let agent = ["--capacity", "4", "--engine-sample-interval", "100ms"];
    let site = Site::start(
        "routing_strategies",
        Options::new()
            .router_args(&["--policy-model-dir", dir.to_str().unwrap()])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .sim(&engine("2ms"))
            .sim(&engine("60ms"))
            .agent(0, &agent)
            .agent(1, &agent),
    );
    site.wait_for("both agents healthy", || {
        let listing: Value = serde_json::from_str(&site.get("/v1/models").2).ok()?;
        let healthy = listing["data"]
            .as_array()?
            .iter()
            .find(|model| model["id"] == MODEL)?["agents"]["healthy"]
            .as_u64()?;
        (healthy == 2).then_some(())
    });

    let spread = send(&site, 8);
    assert!(
        spread.iter().all(|&count| count > 0.0),
        "least-loaded left an engine idle: {spread:?}"
    );
    // Both engines' averages reach the router with the agents' signals.
    poll(common::WAIT, || {
        let text = site.router_metrics();
        let reported = text
            .lines()
            .filter(|line| line.starts_with("hivenet_agent_engine_avg_ttft_seconds{"))
            .filter(|line| line.contains(&format!("model=\"{MODEL}\"")))
            .count();
        (reported == 2).then_some(())
    })
    .unwrap_or_else(|| panic!("both engines' TTFT never reported\n{}", site.logs()));

    put_policy(&site, "best-ttft");
    assert_eq!(send(&site, 10), [10.0, 0.0], "best-ttft: the 2 ms engine");

    put_policy(&site, "round-robin");
    assert_eq!(send(&site, 10), [5.0, 5.0], "round-robin: one each in turn");
    site.wait_metric("hivenet_shard_in_flight", |value| value == 0.0);
}
