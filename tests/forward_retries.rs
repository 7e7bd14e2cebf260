//! Proves forward retries through the real router (policy reference, "Forward-attempt budgets"):
//! when an agent's backend fails (here: its engine is killed, so the agent answers 502), the
//! request is tried again on another eligible agent within the step's `max_tries`, and the
//! client only ever sees successful answers.

mod common;

use std::path::PathBuf;

use common::{Options, Site, chat, request};

#[test]
fn a_failing_backend_is_retried_on_another_agent() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-retries")
        .join(format!("policies-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sim.yaml"),
        "models:\n  - sim-model\nrouting_policy:\n  strategy: least-loaded\n  max_tries: 2\n",
    )
    .unwrap();
    let mut site = Site::start(
        "forward-retries",
        Options::new()
            .sim(&["--models", "sim-model"])
            .sim(&["--models", "sim-model"])
            // Agents probe their backend once a minute (and the router waits two for
            // heartbeats), so the killed engine is met by requests, not by a probe that would
            // take its agent out of the pool first.
            .agent(0, &["--heartbeat-interval", "60s"])
            .agent(1, &["--heartbeat-interval", "60s"])
            .router_args(&[
                "--policy-model-dir",
                dir.to_str().unwrap(),
                "--shards",
                "1",
                "--unhealthy-after",
                "120s",
            ]),
    );
    // Both agents serve; then sim 1 dies while its agent is still in the pool. The site is
    // ready once both agents' tunnels are open, which can be a moment before the router has put
    // the second in the model's pool: a first request then had no other agent to retry on
    // (CI, 2026-12-07). Two healthy agents in `/v1/models` means both are in the pool.
    site.wait_healthy_agents("sim-model", 2);
    site.sims[1].kill();
    let body = chat("sim-model", false).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    for _ in 0..6 {
        let response = request(site.http, raw.as_bytes());
        assert_eq!(response.status, 200, "{}\n{}", response.text(), site.logs());
    }
    assert_eq!(
        common::metric_sum(
            &site.router_metrics(),
            "hivenet_policy_primary_routed_total",
            &[("model", "sim-model")]
        ),
        6.0
    );
    assert!(
        site.router_metric("hivenet_shard_forward_retries_total") >= 1.0,
        "no request was retried\n{}",
        site.logs()
    );
}
