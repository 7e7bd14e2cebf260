//! Proves provider fallback through the real router: when a model's local routing is exhausted
//! (no agent at all, or every agent full with no queue), a non-streaming chat goes to the
//! policy's `fallback_provider` (here a simulated engine behind `HIVENET_ROUTER_OPENAI_BASE_URL`)
//! with the provider model substituted and `processed_by` set; a streaming request is not sent
//! to the provider and gets the local error; the key's request rate still counts.

mod common;

use std::path::PathBuf;

use common::otlp::{CLIENT, SERVER, SPANS_WAIT, start_receiver};
use common::{Options, Site, request};
use serde_json::json;

fn policy_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-provider-fallback")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("local.yaml"),
        "models:\n  - local-model\nrouting_policy:\n  strategy: least-loaded\nfallback_provider:\n  engine: openai\n  model: provider-model\n",
    )
    .unwrap();
    dir
}

fn chat(stream: bool) -> Vec<u8> {
    let body = json!({
        "model": "local-model",
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": stream,
    })
    .to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn exhausted_local_routing_falls_back_to_the_provider() {
    let policies = policy_dir("exhausted");
    let (otlp, spans) = start_receiver();
    // sim0 plays the provider; no agent serves `local-model`.
    let site = Site::start(
        "provider-fallback",
        Options::new()
            .sim(&["--models", "provider-model"])
            .router_env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp)
            .router_env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .router_env("HIVENET_ROUTER_OPENAI_API_KEY", "sk-provider-test")
            .router_env("HIVENET_ROUTER_OPENAI_BASE_URL", "http://{sim0}")
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()])
            .skip_model_wait(),
    );
    let answer = common::poll(std::time::Duration::from_secs(5), || {
        let response = request(site.http, &chat(false));
        (response.status == 200).then_some(response)
    })
    .unwrap_or_else(|| panic!("no provider answer\n{}", site.logs()));
    let body = answer.json();
    assert_eq!(body["processed_by"], "provider:openai");
    // Traced: the provider call is a client span under the request's server span.
    let trace = answer.header("traceparent").unwrap()[3..35].to_owned();
    let (server, call) = common::poll(SPANS_WAIT, || {
        let spans = spans.lock().unwrap();
        let of = |kind| {
            spans
                .iter()
                .find(|span| span.trace_id == trace && span.kind == kind)
                .cloned()
        };
        Some((of(SERVER)?, of(CLIENT)?))
    })
    .unwrap_or_else(|| panic!("no server and client spans of {trace}\n{}", site.logs()));
    assert_eq!(call.service, "hivenet-router");
    assert_eq!(call.parent_span_id, server.span_id, "{call:?}");
    assert_eq!(body["model"], "provider-model");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(body["choices"][0]["message"]["content"].is_string());
    // The provider model is not listed: the catalog is built from agents.
    let (_, _, models) = site.get("/v1/models");
    assert!(!models.contains("provider-model") && !models.contains("local-model"));
    // Streaming is not sent to the provider: the local error stands.
    let streamed = request(site.http, &chat(true));
    assert_eq!(streamed.status, 503, "{}", streamed.text());
    assert_eq!(streamed.error_code(), "no_agents_available");
    let metrics = site.router_metrics();
    let provider = common::metric_sum(
        &metrics,
        "hivenet_policy_provider_fallback_total",
        &[("model", "local-model")],
    );
    assert!(provider >= 1.0, "{metrics}");
    // The provider client's own outbound metric.
    assert!(
        metrics.contains(
            "http_client_request_duration_seconds_count{provider=\"openai\",status_code=\"200\"}"
        ),
        "{metrics}"
    );
    // The provider's usage counts under the model the client asked for.
    assert!(
        common::metric_sum(
            &metrics,
            "hivenet_tenant_input_tokens_total",
            &[
                ("tenant_id", "default"),
                ("key_id", "anonymous"),
                ("model", "local-model")
            ]
        ) > 0.0,
        "{metrics}"
    );
    // The streaming request found the chain exhausted.
    assert_eq!(
        common::metric_sum(
            &metrics,
            "hivenet_policy_exhausted_total",
            &[("model", "local-model")]
        ),
        1.0
    );
    // A model without a provider in its policy is still unknown.
    let other =
        json!({"model": "nobody", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{other}",
        other.len()
    );
    assert_eq!(request(site.http, raw.as_bytes()).status, 404);
}
