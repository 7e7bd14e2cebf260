//! Proves through the real router, agent and simulated engine that B4's input tokens per minute
//! are kept per key and model (seed `admission-control.md`, B4: "independent for each
//! key-and-model combination"): a key of one owner that spent its input rate does not refuse the
//! owner's other key, while the requests per minute the auth reference shares per owner still
//! count both keys.

mod common;

use std::path::PathBuf;

use common::{Options, Site, metric_sum, request};
use serde_json::json;
use sha2::{Digest, Sha256};

const MODEL: &str = "sim-model";
const REQUESTS_PER_MINUTE: usize = 8;
const FIRST: &str = "sk-owner-first";
const SECOND: &str = "sk-owner-second";

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-key-token-rates")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Two keys of owner `acme`, each with the same flat quota.
fn auth_file(dir: &std::path::Path) -> PathBuf {
    let key = |raw: &str, name: &str| {
        format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...{name}\"\n      metadata:\n        name: \"{name}\"\n        owner: \"acme\"\n      quota:\n        requests_per_minute: {REQUESTS_PER_MINUTE}\n        input_tokens_per_minute: 400\n",
            hex::encode(Sha256::digest(raw.as_bytes()))
        )
    };
    let path = dir.join("auth.yaml");
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n{}{}",
        key(FIRST, "first"),
        key(SECOND, "second")
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn post(site: &Site, key: &str, content: &str) -> common::Response {
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

#[test]
fn two_keys_of_one_owner_have_their_own_input_rate_and_share_the_request_rate() {
    let dir = scratch("two-keys");
    let auth = auth_file(&dir);
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(
        policies.join("sim.yaml"),
        format!(
            "models:\n  - {MODEL}\nrouting_policy:\n  strategy: least-loaded\nmode: serverless\nadmit_budget_tokens: 100000\n"
        ),
    )
    .unwrap();
    let site = Site::start(
        "key-token-rates",
        Options::new()
            .sim(&["--models", MODEL])
            .agent(0, &["--capacity", "8"])
            .api_key(FIRST)
            .router_args(&[
                "--policy-model-dir",
                policies.to_str().unwrap(),
                "--auth-config-file",
                auth.to_str().unwrap(),
            ]),
    );
    let prompt = "tokens ".repeat(60);
    // The first key spends its input tokens per minute.
    let mut sent = 0;
    let refusal = loop {
        let response = post(&site, FIRST, &prompt);
        sent += 1;
        match response.status {
            200 => {}
            429 => break response,
            other => panic!("unexpected {other}: {}", response.text()),
        }
        assert!(sent < REQUESTS_PER_MINUTE, "the input rate never refused");
    };
    assert_eq!(refusal.error_code(), "rate_limit_exceeded");
    assert_eq!(refusal.header("retry-after"), Some("1"), "a B4 refusal");
    assert!(sent >= 2, "at least one request fit the input rate");
    let b4_refusals = |site: &Site| {
        metric_sum(
            &site.router_metrics(),
            "hivenet_admission_rejections_total",
            &[("reason", "b4_itpm"), ("model", MODEL)],
        )
    };
    assert_eq!(b4_refusals(&site), 1.0);

    // The same prompt with the owner's other key fits its own, untouched bucket.
    let second = post(&site, SECOND, &prompt);
    sent += 1;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(b4_refusals(&site), 1.0);

    // Requests per minute stay per owner: the second key gets what the first left, no more.
    let rpm_refusal = loop {
        let response = post(&site, SECOND, "hi");
        sent += 1;
        match response.status {
            200 => {}
            429 => break response,
            other => panic!("unexpected {other}: {}", response.text()),
        }
        assert!(
            sent <= REQUESTS_PER_MINUTE + 1,
            "the owner's requests per minute let {sent} requests through"
        );
    };
    assert_eq!(rpm_refusal.error_code(), "rate_limit_exceeded");
    assert_eq!(
        rpm_refusal.header("retry-after"),
        None,
        "the request rate, not B4"
    );
    assert_eq!(
        rpm_refusal.header("x-ratelimit-remaining-requests"),
        Some("0")
    );
}
