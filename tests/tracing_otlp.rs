//! Proves distributed tracing through the real router, agent and sim, exporting to a small OTLP
//! gRPC receiver run by the test (`common::otlp`): one request's `traceparent` is continued by
//! the router (service `hivenet-router`) and the agent (service `hivenet-agent`, a child of the
//! router's span, with a client span of its engine call), the engine receives that call's
//! context, the response and the audit record carry the trace, and a request without (or with
//! an invalid) `traceparent` gets a fresh trace; the sampler, the export at SIGTERM and TLS to
//! the collector.

mod common;

use std::sync::Mutex;

use common::otlp::{
    CLIENT, ReceivedSpan, SERVER, SPANS_WAIT, start_receiver, start_receiver_with, wait_span,
};
use common::{Options, Site, chat, poll, request};
use serde_json::Value;

fn post_chat(site: &Site, traceparent: Option<&str>) -> common::Response {
    let body = chat("sim-model", false).to_string();
    let traceparent =
        traceparent.map_or(String::new(), |value| format!("traceparent: {value}\r\n"));
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\n{traceparent}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    assert_eq!(response.status, 200, "{}\n{}", response.text(), site.logs());
    response
}

/// A site whose router (with `router_env` besides the endpoint) and agent (exporting every
/// 100 ms) export to `endpoint`, once the agent's tunnel is open on every shard.
fn traced_site(name: &str, endpoint: &str, router_env: &[(&str, &str)]) -> Site {
    traced_site_with(name, endpoint, router_env, "100")
}

/// As [`traced_site`], the agent exporting every `agent_delay_ms`.
fn traced_site_with(
    name: &str,
    endpoint: &str,
    router_env: &[(&str, &str)],
    agent_delay_ms: &str,
) -> Site {
    let mut options = Options::new()
        .sim(&["--models", "sim-model"])
        .router_env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .skip_model_wait();
    for (key, value) in router_env {
        options = options.router_env(key, value);
    }
    let mut site = Site::start(name, options);
    site.spawn_agent_with_env(
        0,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", agent_delay_ms),
        ],
    );
    site.wait_models(&["sim-model"]);
    let tunnels = site.shards as f64;
    site.wait_metric("hivenet_shard_tunnels_open", |open| open >= tunnels);
    site
}

/// The spans of `trace_id` once both services have sent theirs.
fn wait_trace(
    spans: &Mutex<Vec<ReceivedSpan>>,
    trace_id: &str,
    site: &Site,
) -> (ReceivedSpan, ReceivedSpan) {
    poll(SPANS_WAIT, || {
        let spans = spans.lock().unwrap();
        let of = |service: &str| {
            spans
                .iter()
                .find(|span| {
                    span.trace_id == trace_id && span.service == service && span.kind == SERVER
                })
                .cloned()
        };
        Some((of("hivenet-router")?, of("hivenet-agent")?))
    })
    .unwrap_or_else(|| {
        panic!(
            "no router and agent spans of trace {trace_id}; received {:?}\n{}",
            spans.lock().unwrap(),
            site.logs()
        )
    })
}

/// The audit record of `request_id`, once the writer has written it.
fn audit_record(site: &Site, request_id: &str) -> Value {
    poll(SPANS_WAIT, || {
        let text = std::fs::read_to_string(site.dir.join("audit.jsonl")).ok()?;
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|record| record["request_id"] == request_id)
    })
    .unwrap_or_else(|| panic!("no audit record for {request_id}\n{}", site.logs()))
}

/// `00-<trace>-<span>-<flags>` split into its trace and span ids.
fn ids_of(traceparent: &str) -> (String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    assert_eq!(fields[0], "00", "{traceparent}");
    (fields[1].to_owned(), fields[2].to_owned())
}

fn engine_traceparent(site: &Site) -> String {
    let control = request(site.sim_addrs[0], &common::get_request("/sim/control"));
    control.json()["last_traceparent"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_request_is_traced_through_router_agent_and_engine() {
    let (endpoint, spans) = start_receiver();
    let mut site = traced_site(
        "tracing-otlp",
        &endpoint,
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );

    // A client's trace is continued.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let response = post_chat(&site, Some(&format!("00-{trace_id}-{client_span}-01")));
    let returned = response
        .header("traceparent")
        .unwrap_or_else(|| panic!("no traceparent on the response: {:?}", response.headers))
        .to_owned();
    let (returned_trace, returned_span) = ids_of(&returned);
    assert_eq!(returned_trace, trace_id);
    let request_id = response.header("x-request-id").unwrap().to_owned();

    let (router, agent) = wait_trace(&spans, trace_id, &site);
    assert_eq!(router.parent_span_id, client_span, "{router:?}");
    assert_eq!(
        router.span_id, returned_span,
        "the response names the router's span"
    );
    assert_eq!(router.name, "POST /v1/chat/completions");
    assert_eq!(router.request_id.as_deref(), Some(request_id.as_str()));
    assert_eq!(
        agent.parent_span_id, router.span_id,
        "the agent's span is a child of the router's: {agent:?}"
    );
    assert_ne!(agent.span_id, router.span_id);
    // The resource a collector groups by: the version, and each process by its peer ID.
    for span in [&router, &agent] {
        assert_eq!(span.version, env!("CARGO_PKG_VERSION"), "{span:?}");
        assert!(span.instance.starts_with("12D3KooW"), "{span:?}");
    }
    assert_ne!(router.instance, agent.instance);

    // The agent's call to the engine is a client span under its server span, and the engine's
    // parent.
    let engine_call = spans
        .lock()
        .unwrap()
        .iter()
        .find(|span| span.trace_id == trace_id && span.kind == CLIENT)
        .cloned()
        .expect("the agent's client span of the engine call, exported with its server span");
    assert_eq!(engine_call.service, "hivenet-agent");
    assert_eq!(engine_call.parent_span_id, agent.span_id, "{engine_call:?}");
    let (engine_trace, engine_span) = ids_of(&engine_traceparent(&site));
    assert_eq!(engine_trace, trace_id, "the engine got the trace");
    assert_eq!(
        engine_span, engine_call.span_id,
        "the engine's parent is the agent's client span"
    );

    assert_eq!(audit_record(&site, &request_id)["trace_id"], trace_id);

    // No traceparent, then an invalid one: each starts a fresh trace, and the request is served.
    for sent in [
        None,
        Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
    ] {
        let response = post_chat(&site, sent);
        let returned = response.header("traceparent").unwrap().to_owned();
        let (fresh_trace, _) = ids_of(&returned);
        assert_ne!(fresh_trace, trace_id);
        assert_ne!(fresh_trace, "0".repeat(32));
        let (router, agent) = wait_trace(&spans, &fresh_trace, &site);
        assert_eq!(
            router.parent_span_id, "",
            "a new trace has no parent: {router:?}"
        );
        assert_eq!(agent.parent_span_id, router.span_id);
        let request_id = response.header("x-request-id").unwrap();
        assert_eq!(audit_record(&site, request_id)["trace_id"], fresh_trace);
    }
    site.router.terminate();
}

/// `OTEL_TRACES_SAMPLER=parentbased_traceidratio` with ratio 0 on the router: a new trace is
/// not recorded, and says so to the agent and the engine (`sampled` clear), which record
/// nothing of it either; a client's sampled trace is still followed. With an export interval
/// of a minute, the spans still waiting at SIGTERM reach the collector as the router, then the
/// agent, stop.
#[test]
fn the_sampler_decides_and_spans_waiting_at_sigterm_are_exported() {
    let (endpoint, spans) = start_receiver();
    let mut site = traced_site_with(
        "tracing-sampler",
        &endpoint,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ],
        "60000",
    );

    let unsampled = post_chat(&site, None);
    let returned = unsampled.header("traceparent").unwrap().to_owned();
    assert!(
        returned.ends_with("-00"),
        "a new trace is not sampled: {returned}"
    );
    let (unsampled_trace, _) = ids_of(&returned);
    assert!(
        engine_traceparent(&site).ends_with("-00"),
        "the engine is told the trace is not recorded"
    );

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    post_chat(&site, Some(&format!("00-{trace_id}-00f067aa0ba902b7-01")));
    let of_service = |service: &str| -> Vec<ReceivedSpan> {
        spans
            .lock()
            .unwrap()
            .iter()
            .filter(|span| span.service == service)
            .cloned()
            .collect()
    };
    assert!(
        spans.lock().unwrap().is_empty(),
        "nothing exported before the minute: {:?}",
        spans.lock().unwrap()
    );

    let status = site.router.terminate();
    assert!(status.success(), "{status}");
    let router = of_service("hivenet-router");
    assert!(
        router.iter().any(|span| span.trace_id == trace_id),
        "the span waiting at SIGTERM was exported before the router exited: {router:?}"
    );
    assert!(
        router.iter().all(|span| span.trace_id != unsampled_trace),
        "{router:?}"
    );
    // The agent, stopped in turn, exports its own: the sampled trace's server and engine-call
    // spans, nothing of the other (it followed the router's decision).
    let status = site.agents[0].terminate();
    assert!(status.success(), "{status}");
    let agent = of_service("hivenet-agent");
    assert_eq!(
        agent
            .iter()
            .filter(|span| span.trace_id == trace_id)
            .count(),
        2,
        "{agent:?}"
    );
    assert!(
        agent.iter().all(|span| span.trace_id != unsampled_trace),
        "{agent:?}"
    );
}

/// `OTEL_EXPORTER_OTLP_CERTIFICATE`: the router exports over TLS to a collector whose
/// certificate that CA signed (the endpoint written without a scheme); a certificate path that
/// does not exist is refused at start, naming the variable.
#[test]
fn spans_reach_a_tls_collector_signed_by_the_given_ca() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(fixtures.join("router.pem")).unwrap(),
        std::fs::read(fixtures.join("router.key")).unwrap(),
    );
    let (endpoint, spans) = start_receiver_with(Some(identity));
    let ca = fixtures.join("ca.pem");
    let site = Site::start(
        "tracing-tls",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &[])
            .router_env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .router_env("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.to_str().unwrap())
            .router_env("OTEL_BSP_SCHEDULE_DELAY", "100"),
    );
    let response = post_chat(&site, None);
    let (trace_id, _) = ids_of(response.header("traceparent").unwrap());
    wait_span(&spans, &trace_id, "hivenet-router", &site);

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hivenet-router"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")
        .env("HIVENET_ROUTER_JWT_SECRET", "devsecret")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_CERTIFICATE /nonexistent/ca.pem"),
        "{stderr}"
    );
}

#[test]
fn tracing_off_sends_no_traceparent_and_audits_an_empty_trace_id() {
    let site = Site::start(
        "tracing-off",
        Options::new().sim(&["--models", "sim-model"]).agent(0, &[]),
    );
    let response = post_chat(
        &site,
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    assert_eq!(response.header("traceparent"), None);
    let request_id = response.header("x-request-id").unwrap();
    assert_eq!(audit_record(&site, request_id)["trace_id"], "");
    // The client's header is not forwarded by a router that is not tracing.
    assert_eq!(engine_traceparent(&site), "");
}
