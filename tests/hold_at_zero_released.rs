//! Proves what a request a wake released does when the woken capacity is short (seed
//! `hold-at-zero.md`, "After the wake" and "Pending demand"): when its wait in the capacity queue
//! runs out it moves to the next fallback step instead of failing, and when the provider
//! fallback serves it, it leaves `hivenet_pending_demand` as the provider starts, not when the
//! provider's answer ends.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Conn, Options, Site, chat, metric_sum, request, sse_events};
use serde_json::{Value, json};

/// A site `site-a` with `sims`, whose policy for `sleepy` is `policy` (after its `models:`
/// line), with `extra` router arguments; no agent yet.
fn site(name: &str, sims: &[&[&str]], policy: &str, extra: &[&str], env: &[(&str, &str)]) -> Site {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-policies-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sleepy.yaml"),
        format!("models:\n  - sleepy\n{policy}"),
    )
    .unwrap();
    let policy_dir = dir.display().to_string();
    let mut args = vec!["--policy-model-dir", &policy_dir, "--wake-keepalive", "0"];
    args.extend_from_slice(extra);
    let mut options = Options::new()
        .site(name, "site-a")
        .router_args(&args)
        .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true")
        .skip_model_wait();
    for sim in sims {
        options = options.sim(sim);
    }
    for (key, value) in env {
        options = options.router_env(key, value);
    }
    Site::start(name, options)
}

/// Pushes a map placing `sleepy` (chat) on `site-a` with `scale_from_zero`.
fn place_here(site: &Site) {
    let map = json!({
        "sites": [{"id": "site-a", "url": format!("http://{}", site.http)}],
        "placements": [
            {"model": "sleepy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "60s"},
        ],
    })
    .to_string();
    let raw = format!(
        "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{map}",
        map.len()
    );
    let response = request(site.http, raw.as_bytes());
    assert_eq!(response.status, 200, "map push: {}", response.text());
}

fn pending(site: &Site) -> f64 {
    metric_sum(
        &site.router_metrics(),
        "hivenet_pending_demand",
        &[("model", "sleepy")],
    )
}

fn send_chat(site: &Site, stream: bool) -> Conn {
    let body = chat("sleepy", stream).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut conn = Conn::connect(site.http);
    conn.send(raw.as_bytes()).unwrap();
    conn
}

/// Sim flags for `sleepy` answers that stream for about eight seconds.
const EIGHT_SECOND_ANSWERS: [&str; 6] = [
    "--models",
    "sleepy",
    "--itl",
    "800ms",
    "--output-tokens",
    "10",
];

#[test]
fn a_released_request_whose_queue_wait_runs_out_moves_to_the_next_fallback_step() {
    // Each streamed answer takes about eight seconds; the queue wait is five.
    let mut site = site(
        "released_move_on",
        &[&EIGHT_SECOND_ANSWERS],
        "routing_policy:\n  match:\n    region: primary\n  strategy: least-loaded\nfallback_chain:\n  - name: spare\n    match:\n      region: spare\n    strategy: least-loaded\n",
        &["--request-timeout", "5s", "--queue-depth", "1"],
        &[],
    );
    place_here(&site);
    let mut first = send_chat(&site, true);
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    let mut second = send_chat(&site, true);
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    // The wake: one primary slot. The first request takes it, the second waits at step 0.
    site.spawn_agent(0, &["--capacity", "1", "--region", "primary"]);
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    let released = Instant::now();
    // A spare agent only the fallback step may use: free, but not for a waiter of step 0.
    site.spawn_agent(0, &["--capacity", "1", "--region", "spare"]);
    site.wait_for("the spare agent in the pool", || {
        let (_, _, models) = site.get("/v1/models");
        let models: Value = serde_json::from_str(&models).ok()?;
        let healthy = models["data"]
            .as_array()?
            .iter()
            .find(|model| model["id"] == "sleepy")?["agents"]["healthy"]
            .as_u64()?;
        (healthy == 2).then_some(())
    });
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "the spare agent came after the wait ran out: the test proves nothing"
    );
    assert_eq!(pending(&site), 1.0, "the second request still waits");
    std::thread::scope(|scope| {
        let first = scope.spawn(move || first.read_response().unwrap());
        let second = scope.spawn(move || second.read_response().unwrap());
        for (name, response) in [("first", first), ("second", second)] {
            let response = response.join().unwrap();
            assert_eq!(response.status, 200, "{name}: {}", response.text());
            let events = sse_events(&response.body);
            assert_eq!(events.last().unwrap(), "data: [DONE]", "{name}");
        }
    });
    // Routed once by the primary step and once by the fallback step.
    let metrics = site.router_metrics();
    for name in [
        "hivenet_policy_primary_routed_total",
        "hivenet_policy_fallback_routed_total",
    ] {
        assert_eq!(
            metric_sum(&metrics, name, &[("model", "sleepy")]),
            1.0,
            "{name}"
        );
    }
    assert_eq!(pending(&site), 0.0);
}

#[test]
fn a_released_request_whose_wait_runs_out_at_the_last_step_is_504() {
    let mut site = site(
        "released_last_step",
        &[&EIGHT_SECOND_ANSWERS],
        "routing_policy:\n  strategy: least-loaded\n",
        // Long enough for the first request to outlive the agent's start on a loaded machine
        // (2 s was not, under CI), short of the eight-second answer the second waits behind.
        // One shard: with two, the requests could be held on different shards, which race for
        // the agent's one slot when it registers, and the second sometimes won it (the first
        // then got the 504; seen twice under CI).
        &[
            "--request-timeout",
            "7s",
            "--queue-depth",
            "1",
            "--shards",
            "1",
        ],
        &[],
    );
    place_here(&site);
    let mut first = send_chat(&site, true);
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    let mut second = send_chat(&site, false);
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    site.spawn_agent(0, &["--capacity", "1"]);
    let first = first.read_head().unwrap();
    assert_eq!(first.status, 200);
    let second = second.read_response().unwrap();
    assert_eq!(second.status, 504, "{}", second.text());
    assert_eq!(second.error_code(), "request_timeout");
}

#[test]
fn a_released_request_served_by_the_provider_leaves_the_demand_as_the_provider_starts() {
    // sim0 serves `sleepy` (one slot, no queue); sim1 plays the provider. Each answer takes
    // about four seconds.
    let mut site = site(
        "released_provider",
        &[
            &[
                "--models",
                "sleepy",
                "--itl",
                "400ms",
                "--output-tokens",
                "10",
            ],
            &[
                "--models",
                "provider-model",
                "--itl",
                "400ms",
                "--output-tokens",
                "10",
            ],
        ],
        "routing_policy:\n  strategy: least-loaded\nfallback_provider:\n  engine: openai\n  model: provider-model\n",
        &["--queue-depth", "0"],
        &[
            ("HIVENET_ROUTER_OPENAI_API_KEY", "sk-provider-test"),
            ("HIVENET_ROUTER_OPENAI_BASE_URL", "http://{sim1}"),
        ],
    );
    place_here(&site);
    let first = send_chat(&site, false);
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    let second = send_chat(&site, false);
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    site.spawn_agent(0, &["--capacity", "1"]);
    std::thread::scope(|scope| {
        let readers: Vec<_> = [first, second]
            .into_iter()
            .map(|mut conn| {
                scope.spawn(move || {
                    let response = conn.read_response().unwrap();
                    (response, Instant::now())
                })
            })
            .collect();
        // One request has the agent's slot, the other the provider: neither is pending demand
        // while they generate.
        site.wait_metric("hivenet_pending_demand", |v| v == 0.0);
        let emptied = Instant::now();
        let mut by_provider = 0;
        for reader in readers {
            let (response, answered) = reader.join().unwrap();
            assert_eq!(response.status, 200, "{}", response.text());
            if response.json()["processed_by"] == "provider:openai" {
                by_provider += 1;
                assert!(
                    answered > emptied + Duration::from_secs(1),
                    "the demand emptied only as the provider answered"
                );
            }
        }
        assert_eq!(by_provider, 1, "{}", site.logs());
    });
}
