//! Proves that a policy's fallback step serves a plain request whose first step is saturated
//! (policy reference: when a step's queue is full or its wait expires, the routing session
//! advances to the next step). Step `primary` has one agent with one slot, held by a long
//! stream; step `spare` has an idle agent. A second request waits in the primary step's queue
//! for its share of `--request-timeout` (half, with one step after it), then the spare step
//! serves it. Before, it waited the whole timeout there and got `504 request_timeout`.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Conn, Options, Site, chat, metric_sum, sse_events};

const MODEL: &str = "sim-model";

fn send_chat(site: &Site, stream: bool) -> Conn {
    let body = chat(MODEL, stream).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut conn = Conn::connect(site.http);
    conn.send(raw.as_bytes()).unwrap();
    conn
}

#[test]
fn a_request_waiting_in_a_saturated_step_is_served_by_the_idle_next_step() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fallback-steps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("_default.yaml"),
        "routing_policy:\n  match:\n    region: primary\n  strategy: least-loaded\nfallback_chain:\n  - name: spare\n    match:\n      region: spare\n    strategy: least-loaded\n",
    )
    .unwrap();
    let site = Site::start(
        "fallback_steps",
        Options::new()
            .router_args(&[
                "--policy-model-dir",
                dir.to_str().unwrap(),
                "--request-timeout",
                "6s",
            ])
            // The primary engine streams each answer over about 8 s; the spare one at once.
            .sim(&["--models", MODEL, "--itl", "800ms", "--output-tokens", "10"])
            .sim(&["--models", MODEL, "--output-tokens", "4"])
            .agent(0, &["--capacity", "1", "--region", "primary"])
            .agent(1, &["--capacity", "4", "--region", "spare"]),
    );
    site.wait_healthy_agents(MODEL, 2);
    // The primary step's one slot, held by a long stream.
    let mut long = send_chat(&site, true);
    site.wait_metric("hivenet_shard_in_flight", |value| value == 1.0);
    let started = Instant::now();
    let response = send_chat(&site, false).read_response().unwrap();
    let waited = started.elapsed();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["object"], "chat.completion");
    // It waited about its share, half of the 6 s (not the whole timeout).
    assert!(waited >= Duration::from_secs(3), "waited {waited:?}");
    assert!(waited < Duration::from_secs(6), "waited {waited:?}");
    // The long stream was not disturbed; each step routed one request.
    let stream = long.read_response().unwrap();
    assert_eq!(stream.status, 200);
    assert_eq!(sse_events(&stream.body).last().unwrap(), "data: [DONE]");
    site.wait_metric("hivenet_shard_in_flight", |value| value == 0.0);
    let metrics = site.router_metrics();
    let routed = |name| metric_sum(&metrics, name, &[("model", MODEL)]);
    assert_eq!(routed("hivenet_policy_primary_routed_total"), 1.0);
    assert_eq!(routed("hivenet_policy_fallback_routed_total"), 1.0);
}
