//! Proves what a request a wake released does when the woken capacity is short (seed
//! `hold-at-zero.md`, "After the wake" and "Pending demand"): when the provider fallback serves
//! it, it leaves `hivenet_pending_demand` as the provider starts, not when the provider's answer
//! ends.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Conn, Options, Site, chat, request};
use serde_json::json;

/// A site `site-a` with `sims`, whose policy for `sleepy` is `policy` (after its `models:`
/// line), with `extra` router arguments; no agent yet.
fn site(
    name: &str,
    sims: &[&[&str]],
    policy: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Site {
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

#[test]
fn a_released_request_served_by_the_provider_leaves_the_demand_as_the_provider_starts() {
    // sim0 serves `sleepy` (one slot, no queue); sim1 plays the provider. Each answer takes
    // about four seconds.
    let mut site = site(
        "released_provider",
        &[
            &["--models", "sleepy", "--itl", "400ms", "--output-tokens", "10"],
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
