//! Proves the input estimate learns one tokens-per-byte ratio per model for the whole router
//! (seed `admission-control.md`, "One input estimate": "a separate tokens-per-byte ratio for each
//! model"): requests served by any shard train it, and every shard estimates a prompt with it,
//! as the B1 cap's refusal message shows.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Options, Site, metric_sum, post_request, request};
use serde_json::json;

/// The sim's exact count: `ceil(bytes / 4)` per text, plus 4 per message.
const SIM_TOKENS_PER_BYTE: f64 = 0.25;
const START: f64 = 1.0 / 3.2;
const WEIGHT: f64 = 0.2;

fn chat_with(bytes: usize) -> Vec<u8> {
    let body = json!({
        "model": "sim-model",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "a".repeat(bytes)}],
    })
    .to_string();
    post_request("/v1/chat/completions", &body)
}

/// The estimate a B1 refusal names: `input is N tokens, over the model limit of M`.
fn refused_estimate(site: &Site, bytes: usize) -> u64 {
    let response = request(site.http, &chat_with(bytes));
    assert_eq!(response.status, 400, "{}", response.text());
    let message = response.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    message
        .strip_prefix("input is ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|tokens| tokens.parse().ok())
        .unwrap_or_else(|| panic!("{message}"))
}

fn requests_per_shard(site: &Site, shards: usize) -> Vec<f64> {
    let metrics = site.router_metrics();
    (0..shards)
        .map(|shard| {
            metric_sum(
                &metrics,
                "hivenet_shard_requests_total",
                &[("shard", &shard.to_string())],
            )
        })
        .collect()
}

#[test]
fn every_shard_trains_and_reads_one_ratio_per_model() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("estimator-shared-policies-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sim.yaml"),
        "models:\n  - sim-model\nrouting_policy:\n  strategy: least-loaded\nmax_input_tokens: 1000\n",
    )
    .unwrap();
    let site = Site::start(
        "estimator_shared",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "1"])
            .agent(0, &["--capacity", "4"])
            .router_args(&["--shards", "2", "--policy-model-dir", dir.to_str().unwrap()]),
    );
    // Seven answers, each on its own connection: the shards that served them cannot have
    // served the same number, so two per-shard ratios would differ.
    let trained = 7;
    for _ in 0..trained {
        let response = request(site.http, &chat_with(400));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let mut ratio = START;
    for _ in 0..trained {
        ratio = (1.0 - WEIGHT) * ratio + WEIGHT * SIM_TOKENS_PER_BYTE;
    }
    let expected = (8000.0 * ratio).ceil() as u64 + 4;
    // The releases reach the owner just after the answers: wait for the last to be learned.
    common::poll(Duration::from_secs(5), || {
        (refused_estimate(&site, 8000) == expected).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "the estimate never became {expected} (all seven answers learned): {}",
            refused_estimate(&site, 8000)
        )
    });
    let before = requests_per_shard(&site, 2);
    for probe in 0..20 {
        assert_eq!(refused_estimate(&site, 8000), expected, "probe {probe}");
    }
    let after = requests_per_shard(&site, 2);
    assert!(
        before.iter().zip(&after).all(|(b, a)| a > b),
        "the probes did not reach both shards: {before:?} -> {after:?}"
    );
}
