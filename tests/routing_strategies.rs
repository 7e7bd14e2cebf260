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

/// A policy directory whose `_default.yaml` ranks by `strategy`.
fn policy_dir(name: &str, strategy: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let policy = format!("routing_policy: {{strategy: {strategy}}}\n");
    std::fs::write(dir.join("_default.yaml"), policy).unwrap();
    dir
}

#[test]
fn best_ttft_picks_the_faster_engine_and_round_robin_takes_each_in_turn() {
    let dir = policy_dir("hivenet-strategies", "least-loaded");
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
    site.wait_healthy_agents(MODEL, 2);

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

/// `prefix-aware` through the real router, agents and engines that cache prompt prefixes. Six
/// conversations, each with its own long system prompt, take four turns each, one request at a
/// time: every conversation's later turns go to the engine that served its first, and find
/// their prefix in its cache. Then one prompt sent eight times at once, each slow to answer:
/// past `--prefix-balance-abs-threshold` requests more on one agent than the other, the load
/// is unbalanced and the prompt spills to the other agent.
#[test]
fn prefix_aware_keeps_each_conversation_on_one_engine_and_spills_when_unbalanced() {
    const CHATS: usize = 6;
    const TURNS: usize = 4;
    let dir = policy_dir("hivenet-prefix", "prefix-aware");
    let engine = [
        "--models",
        MODEL,
        "--output-tokens",
        "4",
        "--ttft",
        "0ms",
        "--itl",
        "50ms",
        "--prefix-cache-blocks",
        "4096",
        "--block-tokens",
        "16",
    ];
    let agent = ["--capacity", "16"];
    let site = Site::start(
        "routing_prefix",
        Options::new()
            .router_args(&[
                "--policy-model-dir",
                dir.to_str().unwrap(),
                "--prefix-balance-abs-threshold",
                "2",
            ])
            .sim(&engine)
            .sim(&engine)
            .agent(0, &agent)
            .agent(1, &agent),
    );
    site.wait_healthy_agents(MODEL, 2);

    let turn = |chat: usize, turns: usize| {
        let mut messages = vec![serde_json::json!({
            "role": "system",
            "content": format!("conversation {chat}: {}", "you are a careful assistant. ".repeat(60)),
        })];
        for turn in 0..turns {
            messages.push(serde_json::json!({"role": "user", "content": format!("question {turn} {}", "why? ".repeat(30))}));
            if turn + 1 < turns {
                messages.push(
                    serde_json::json!({"role": "assistant", "content": "because ".repeat(20)}),
                );
            }
        }
        serde_json::json!({"model": MODEL, "messages": messages})
    };
    let served_by = |body: &Value| {
        let before = served(&site);
        let (status, _, text) = site.post_json("/v1/chat/completions", body);
        assert_eq!(status, 200, "{text}");
        let after = served(&site);
        if after[0] > before[0] { 0 } else { 1 }
    };
    let mut homes = Vec::new();
    for chat in 0..CHATS {
        homes.push(served_by(&turn(chat, 1)));
    }
    assert!(
        homes.contains(&0) && homes.contains(&1),
        "least-loaded first turns: {homes:?}"
    );
    // Each turn in another order: least-loaded's rotation, which alternates, cannot follow.
    for turns in 2..=TURNS {
        for chat in (0..CHATS).map(|index| (index * 5 + turns) % CHATS) {
            let home = homes[chat];
            assert_eq!(
                served_by(&turn(chat, turns)),
                home,
                "chat {chat}, turn {turns}"
            );
        }
    }
    let router = site.router_metrics();
    let labels = [("model", MODEL)];
    let hits = common::metric_sum(&router, "hivenet_prefix_index_hits_total", &labels);
    let misses = common::metric_sum(&router, "hivenet_prefix_index_misses_total", &labels);
    assert_eq!((hits, misses), (((TURNS - 1) * CHATS) as f64, CHATS as f64));
    let ranked = common::metric_sum(&router, "hivenet_prefix_matched_ratio_count", &labels);
    assert_eq!(ranked, (TURNS * CHATS) as f64);
    assert!(common::metric_sum(&router, "hivenet_prefix_index_blocks", &labels) > 0.0);
    // The engines found the later turns' prefixes in their caches.
    let [queried, cached] = [
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ]
    .map(|name| site.sim_metric(0, name) + site.sim_metric(1, name));
    let rate = cached / queried;
    eprintln!("engines' prefix-cache hit rate {rate:.2} ({cached} of {queried} prompt tokens)");
    assert!(rate > 0.5, "{cached} of {queried}");

    // One prompt eight times at once, each held 200 ms by its engine: the third more on its home
    // agent than on the other unbalances the load, and the prompt spills.
    let burst = turn(0, 1);
    let before = served(&site);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                let (status, _, text) = site.post_json("/v1/chat/completions", &burst);
                assert_eq!(status, 200, "{text}");
            });
        }
    });
    let after = served(&site);
    let spread = [after[0] - before[0], after[1] - before[1]];
    assert!(
        spread[0] > 0.0 && spread[1] > 0.0,
        "the burst stayed on one engine: {spread:?}"
    );
    site.wait_metric("hivenet_shard_in_flight", |value| value == 0.0);
}
