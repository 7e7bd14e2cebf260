//! Proves hold at zero (seed `hold-at-zero.md`) through the real binaries: a request for a model
//! the pushed sibling map places here with `scale_from_zero` is held while no agent serves it,
//! counted in `hivenet_pending_demand`, kept alive with keepalives, and released when an agent
//! registers; the budget ends in `503 model_waking` (or, once keepalives started, a `200` whose
//! body carries the error); the hold limits, the quota while held, client-ID de-duplication and a
//! client leaving while held.

mod common;

use std::time::{Duration, Instant};

use common::{Conn, Options, Site, chat, metric_sum, post_request, request, sse_events};
use serde_json::{Value, json};

/// What every site of these tests starts with: a sim started with `sim` and no agent yet, and a
/// router for site `site-a` with `extra` arguments (admin open unless the caller sets keys).
fn site_options(name: &str, sim: &[&str], extra: &[&str]) -> Options {
    Options::new()
        .site(name, "site-a")
        .sim(sim)
        .router_args(extra)
        .skip_model_wait()
}

/// A site whose sim serves `sleepy` (plus `sim` arguments), with `extra` router arguments.
fn sleepy_site(name: &str, sim: &[&str], extra: &[&str]) -> Site {
    let mut sim_args = vec!["--models", "sleepy"];
    sim_args.extend_from_slice(sim);
    Site::start(
        name,
        site_options(name, &sim_args, extra)
            .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true"),
    )
}

fn admin_put(site: &Site, path: &str, body: &str) -> (u16, Value) {
    let raw = format!(
        "PUT {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    (
        response.status,
        serde_json::from_slice(&response.body).unwrap_or(Value::Null),
    )
}

/// Pushes a map placing `sleepy` (chat) on `site-a` with `scale_from_zero` and `budget`.
fn place_here(site: &Site, budget: &str) {
    let map = json!({
        "sites": [{"id": "site-a", "url": format!("http://{}", site.http)}],
        "placements": [
            {"model": "sleepy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": budget},
        ],
    });
    let (status, body) = admin_put(site, "/admin/sibling-map", &map.to_string());
    assert_eq!(status, 200, "map push: {body}");
}

fn pending(site: &Site) -> f64 {
    metric_sum(
        &site.router_metrics(),
        "hivenet_pending_demand",
        &[("model", "sleepy")],
    )
}

fn holds(site: &Site, outcome: &str) -> f64 {
    metric_sum(
        &site.router_metrics(),
        "hivenet_wake_holds_total",
        &[("outcome", outcome)],
    )
}

fn chat_request(stream: bool, extra_headers: &str) -> Vec<u8> {
    let body = chat("sleepy", stream).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n{extra_headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn messages_request(stream: bool) -> Vec<u8> {
    let body = json!({
        "model": "sleepy",
        "max_tokens": 8,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    })
    .to_string();
    post_request("/v1/messages", &body)
}

/// Sends `raw` on a new connection (the caller reads the answer later).
fn send(site: &Site, raw: &[u8]) -> Conn {
    let mut conn = Conn::connect(site.http);
    conn.send(raw).unwrap();
    conn
}

fn wake(site: &mut Site, agent_args: &[&str]) {
    site.spawn_agent(0, agent_args);
}

#[test]
fn held_requests_are_released_in_order_when_an_agent_registers() {
    let mut site = sleepy_site(
        "hold_release",
        &["--itl", "20ms", "--output-tokens", "5"],
        &["--shards", "1"],
    );
    // Nothing held without a map: the model is unknown.
    assert_eq!(
        request(site.http, &chat_request(false, "")).error_code(),
        "model_not_found"
    );
    assert!(
        !site.router_metrics().contains("hivenet_pending_demand{"),
        "no series before a map is pushed"
    );
    place_here(&site, "60s");
    site.wait_for("the 0-valued pending-demand series", || {
        site.router_metrics()
            .contains("hivenet_pending_demand{model=\"sleepy\"} 0")
            .then_some(())
    });
    // count_tokens is never held: it fails at once.
    let count = json!({"model": "sleepy", "messages": [{"role": "user", "content": "hi"}]});
    let (status, _, body) = site.post_json("/v1/messages/count_tokens", &count);
    assert_eq!(status, 404, "{body}");

    let mut held = Vec::new();
    for index in 0..6 {
        let stream = index % 2 == 0;
        held.push((stream, send(&site, &chat_request(stream, ""))));
        site.wait_metric("hivenet_pending_demand", |v| v == f64::from(index + 1));
    }
    assert_eq!(holds(&site, "released"), 0.0);
    wake(&mut site, &["--capacity", "1"]);
    let mut finished = Vec::new();
    std::thread::scope(|scope| {
        let readers: Vec<_> = held
            .iter_mut()
            .enumerate()
            .map(|(index, (stream, conn))| {
                let stream = *stream;
                scope.spawn(move || {
                    let response = conn.read_response().expect("held request answered");
                    (index, stream, response, Instant::now())
                })
            })
            .collect();
        for reader in readers {
            finished.push(reader.join().unwrap());
        }
    });
    for (index, stream, response, _) in &finished {
        assert_eq!(response.status, 200, "request {index}: {}", response.text());
        if *stream {
            let events = sse_events(&response.body);
            assert_eq!(events.last().unwrap(), "data: [DONE]", "request {index}");
        } else {
            assert_eq!(response.json()["object"], "chat.completion");
        }
    }
    // One slot: served one after another, in the order they arrived.
    let mut by_time: Vec<(usize, Instant)> = finished
        .iter()
        .map(|(index, _, _, at)| (*index, *at))
        .collect();
    by_time.sort_by_key(|(_, at)| *at);
    let order: Vec<usize> = by_time.iter().map(|(index, _)| *index).collect();
    assert_eq!(order, (0..6).collect::<Vec<_>>(), "served out of order");
    site.wait_metric("hivenet_pending_demand", |v| v == 0.0);
    assert_eq!(holds(&site, "released"), 6.0);
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(&metrics, "hivenet_wake_hold_seconds_count", &[]),
        6.0
    );
    // Awake now: served at once, not held.
    site.assert_chat_ok("sleepy");
    assert_eq!(holds(&site, "released"), 6.0);
    // What the KEDA example reads to keep the model awake.
    let routed = metric_sum(
        &site.router_metrics(),
        "hivenet_routing_requests_routed_total",
        &[("model", "sleepy"), ("tenant_id", "default")],
    );
    assert_eq!(routed, 7.0);
}

#[test]
fn budget_expiry_before_keepalives_is_503_model_waking() {
    let site = sleepy_site("hold_expiry_plain", &[], &["--wake-keepalive", "0"]);
    place_here(&site, "1s");
    for raw in [
        chat_request(false, ""),
        chat_request(true, ""),
        messages_request(false),
        messages_request(true),
    ] {
        let started = Instant::now();
        let response = request(site.http, &raw);
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert_eq!(response.status, 503, "{}", response.text());
        assert_eq!(response.header("retry-after"), Some("30"));
        let error = &response.json()["error"];
        assert_eq!(error["code"], "model_waking");
        assert_eq!(error["retry_after"], 30);
        assert_eq!(
            error["message"],
            "model sleepy is waking up; retry in 30 seconds"
        );
    }
    assert_eq!(holds(&site, "expired"), 4.0);
    site.wait_metric("hivenet_pending_demand", |v| v == 0.0);
    let responses = site.router_metrics();
    assert_eq!(
        metric_sum(
            &responses,
            "hivenet_shard_responses_total",
            &[("code", "503")]
        ),
        4.0
    );
}

#[test]
fn budget_expiry_after_keepalives_is_an_error_in_a_200_body() {
    let site = sleepy_site("hold_expiry_keepalive", &[], &["--wake-keepalive", "300ms"]);
    place_here(&site, "1500ms");
    let ok_before = metric_sum(
        &site.router_metrics(),
        "hivenet_shard_responses_total",
        &[("code", "200")],
    );
    // Non-streamed: spaces, then the JSON envelope.
    let response = request(site.http, &chat_request(false, ""));
    assert_eq!(response.status, 200);
    let text = response.text();
    assert!(text.starts_with(' '), "{text:?}");
    let error: Value = serde_json::from_str(text.trim_start()).expect("envelope after spaces");
    assert_eq!(error["error"]["code"], "model_waking");
    assert_eq!(error["error"]["retry_after"], 30);
    // Streamed, OpenAI: comments, then a final `data: {"error":…}` event.
    let response = request(site.http, &chat_request(true, ""));
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let events = sse_events(&response.body);
    assert!(events.len() >= 3, "{events:?}");
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e == ": keep-alive")
    );
    let last: Value =
        serde_json::from_str(events.last().unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "model_waking");
    // Non-streamed, Anthropic: the same envelope after the spaces.
    let response = request(site.http, &messages_request(false));
    assert_eq!(response.status, 200);
    let text = response.text();
    assert!(text.starts_with(' '), "{text:?}");
    let error: Value = serde_json::from_str(text.trim_start()).expect("envelope after spaces");
    assert_eq!(error["error"]["code"], "model_waking");
    // Streamed, Anthropic: an `error` event whose message starts with the code.
    let response = request(site.http, &messages_request(true));
    assert_eq!(response.status, 200);
    let events = sse_events(&response.body);
    let last = events.last().unwrap();
    let data = last.strip_prefix("event: error\ndata: ").expect(last);
    let value: Value = serde_json::from_str(data).unwrap();
    assert_eq!(value["type"], "error");
    assert!(
        value["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("model_waking: ")
    );
    // The metrics count the status the requests ended with, not the 200 on the wire.
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_shard_responses_total",
            &[("code", "503")]
        ),
        4.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_shard_responses_total",
            &[("code", "200")]
        ),
        ok_before,
        "no 200 counted for the held requests"
    );
    // And so does the audit log (written by its own thread, a moment later).
    let statuses = site.wait_for("four audit records for sleepy", || {
        let audit = std::fs::read_to_string(site.dir.join("audit.jsonl")).ok()?;
        let statuses: Vec<i64> = audit
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|record| record["model"] == "sleepy")
            .map(|record| record["status_code"].as_i64().unwrap_or(0))
            .collect();
        (statuses.len() == 4).then_some(statuses)
    });
    assert_eq!(statuses, vec![503, 503, 503, 503]);
}

#[test]
fn keepalives_then_the_answer_once_the_model_wakes() {
    let mut site = sleepy_site("hold_keepalive_wake", &[], &["--wake-keepalive", "200ms"]);
    place_here(&site, "60s");
    let mut plain = send(&site, &chat_request(false, ""));
    let mut stream = send(&site, &chat_request(true, ""));
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    std::thread::sleep(Duration::from_millis(700));
    wake(&mut site, &[]);
    let plain = plain.read_response().unwrap();
    assert_eq!(plain.status, 200);
    let text = plain.text();
    assert!(text.starts_with("  "), "several spaces first: {text:?}");
    let value: Value = serde_json::from_str(text.trim_start()).unwrap();
    assert_eq!(value["object"], "chat.completion");
    let stream = stream.read_response().unwrap();
    let events = sse_events(&stream.body);
    assert_eq!(events[0], ": keep-alive");
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    assert!(
        events
            .iter()
            .any(|event| event.starts_with("data: {") && event.contains("chat.completion.chunk"))
    );
}

/// Holds a streaming request of `body` to `path` on `sleepy` until keepalives went out, wakes
/// the model, and returns the answer's SSE events (its status is the keepalives' `200`).
fn answered_after_keepalives(site: &mut Site, path: &str, body: &Value) -> Vec<String> {
    place_here(site, "60s");
    let mut conn = send(site, &post_request(path, &body.to_string()));
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    std::thread::sleep(Duration::from_millis(500));
    wake(site, &[]);
    let response = conn.read_response().unwrap();
    assert_eq!(response.status, 200);
    let events = sse_events(&response.body);
    assert_eq!(events[0], ": keep-alive");
    events
}

/// A backend's error answer after the keepalives committed `200` reaches a streaming
/// `/v1/messages` client as an Anthropic `error` event whose message starts with the error code
/// (not as the backend's body, passed through).
#[test]
fn a_backend_error_after_keepalives_is_an_anthropic_error_event_that_starts_with_the_code() {
    let mut site = sleepy_site("hold_anthropic_error", &[], &["--wake-keepalive", "200ms"]);
    // No `max_tokens`: the router forwards it, the engine (the sim, like Anthropic) refuses it.
    let body = json!({
        "model": "sleepy",
        "stream": true,
        "messages": [{"role": "user", "content": "hello"}],
    });
    let events = answered_after_keepalives(&mut site, "/v1/messages", &body);
    let last = events.last().unwrap();
    let data = last.strip_prefix("event: error\ndata: ").expect(last);
    let value: Value = serde_json::from_str(data).unwrap();
    assert_eq!(value["type"], "error");
    assert_eq!(value["error"]["type"], "invalid_request_error");
    assert_eq!(
        value["error"]["message"],
        "invalid_parameter: max_tokens: field required"
    );
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_shard_responses_total",
            &[("code", "400")]
        ),
        1.0
    );
}

/// The same through an OpenAI endpoint: the backend's error answer after the keepalives is a
/// final `data:` event in the router's envelope, with a code of the error-code reference (the
/// issue saw the backend's own body, `"code":null`, passed through).
#[test]
fn a_backend_error_after_keepalives_is_an_openai_event_in_the_routers_envelope() {
    let mut site = sleepy_site("hold_openai_error", &[], &["--wake-keepalive", "200ms"]);
    // `messages` that is not an array: the router counts nothing of it and forwards it, the
    // engine refuses it with its own error body.
    let body = json!({"model": "sleepy", "stream": true, "messages": 5});
    let events = answered_after_keepalives(&mut site, "/v1/chat/completions", &body);
    let last = events.last().unwrap();
    let data = last.strip_prefix("data: ").expect(last);
    let value: Value = serde_json::from_str(data).unwrap();
    assert_eq!(value["error"]["code"], "invalid_parameter", "{data}");
    assert_eq!(value["error"]["source"], "backend", "{data}");
    let message = value["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("request body is not valid"),
        "{message}"
    );
    assert_eq!(
        metric_sum(
            &site.router_metrics(),
            "hivenet_shard_responses_total",
            &[("code", "400")]
        ),
        1.0
    );
}

#[test]
fn hold_limits_refuse_at_once_and_count_full() {
    let site = Site::start(
        "hold_limits",
        site_options(
            "hold_limits",
            &["--models", "sleepy,drowsy"],
            &["--wake-hold-max", "2", "--wake-hold-max-total", "3"],
        )
        .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true"),
    );
    let map = json!({
        "sites": [{"id": "site-a", "url": format!("http://{}", site.http)}],
        "placements": [
            {"model": "sleepy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "30s"},
            {"model": "drowsy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "30s"},
        ],
    });
    assert_eq!(
        admin_put(&site, "/admin/sibling-map", &map.to_string()).0,
        200
    );
    let _first = send(&site, &chat_request(false, ""));
    let _second = send(&site, &chat_request(false, ""));
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    // Per model: the third for `sleepy` is refused at once.
    let started = Instant::now();
    let refused = request(site.http, &chat_request(false, ""));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), Some("30"));
    assert_eq!(
        refused.json()["error"]["message"],
        "model sleepy is waking up and too many requests are already waiting for it; retry in 30 seconds"
    );
    // In total: one more for `drowsy` fits, the next does not.
    let drowsy = |_: ()| post_request("/v1/chat/completions", &chat("drowsy", false).to_string());
    let _third = send(&site, &drowsy(()));
    site.wait_metric("hivenet_pending_demand", |v| v == 3.0);
    let refused = request(site.http, &drowsy(()));
    assert_eq!(refused.error_code(), "model_waking");
    assert_eq!(holds(&site, "full"), 2.0);
    // Refused requests are not counted in the demand.
    assert_eq!(pending(&site), 2.0);
}

/// The hold limits count per model and per key and model, whatever the kind of endpoint (not per
/// model and kind).
#[test]
fn hold_limits_count_a_model_across_its_kinds() {
    let site = Site::start(
        "hold_limits_kinds",
        site_options(
            "hold_limits_kinds",
            &["--models", "sleepy"],
            &["--wake-hold-max", "3", "--wake-hold-max-per-key", "1"],
        )
        .router_env("HIVENET_ROUTER_AUTH_MODE", "dynamic")
        .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY),
    );
    for (index, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        put_key(
            &site,
            name,
            &format!("rev_0000000{}", index + 1),
            &format!("sk-{name}"),
            json!({"requests_per_minute": 1000}),
            &[],
        );
    }
    let map = json!({
        "sites": [{"id": "site-a", "url": format!("http://{}", site.http)}],
        "placements": [
            {"model": "sleepy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "30s"},
            {"model": "sleepy", "kind": "embedding", "site": "site-a", "scale_from_zero": true, "hold_budget": "30s"},
        ],
    })
    .to_string();
    let raw = format!(
        "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{map}",
        map.len()
    );
    assert_eq!(request(site.http, raw.as_bytes()).status, 200);
    let as_key = |key: &str| format!("authorization: Bearer sk-{key}\r\n");
    let embedding = |key: &str| {
        let body = json!({"model": "sleepy", "input": "hello"}).to_string();
        format!(
            "POST /v1/embeddings HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n{}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            as_key(key),
            body.len()
        )
        .into_bytes()
    };
    let full = "model sleepy is waking up and too many requests are already waiting for it; retry in 30 seconds";
    let _a_chat = send(&site, &chat_request(false, &as_key("a")));
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    // Per key and model: key a's embedding request is its second for `sleepy`.
    let refused = request(site.http, &embedding("a"));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["message"], full);
    let _b_embedding = send(&site, &embedding("b"));
    let _c_chat = send(&site, &chat_request(false, &as_key("c")));
    site.wait_metric("hivenet_pending_demand", |v| v == 3.0);
    // Per model: three held, of both kinds.
    let refused = request(site.http, &embedding("d"));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["message"], full);
    assert_eq!(holds(&site, "full"), 2.0);
    assert_eq!(pending(&site), 3.0);
}

#[test]
fn a_client_that_leaves_while_held_is_499_and_leaves_the_demand() {
    let site = sleepy_site("hold_disconnect", &[], &[]);
    place_here(&site, "60s");
    let conn = send(&site, &chat_request(false, ""));
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    drop(conn);
    site.wait_metric("hivenet_pending_demand", |v| v == 0.0);
    site.wait_for("the cancelled hold", || {
        (holds(&site, "cancelled") == 1.0).then_some(())
    });
    site.wait_for("the 499 audit record", || {
        let audit = std::fs::read_to_string(site.dir.join("audit.jsonl")).ok()?;
        audit
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .any(|record| record["status_code"] == 499 && record["model"] == "sleepy")
            .then_some(())
    });
}

#[test]
fn retries_with_one_client_request_id_count_once() {
    let site = sleepy_site("hold_client_ids", &[], &[]);
    place_here(&site, "60s");
    let id = "8B9E4A6D-DFB4-4B95-BADA-319E7E5B878A";
    let _first = send(
        &site,
        &chat_request(false, &format!("x-client-request-id: {id}\r\n")),
    );
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    // The same ID in another letter case, through X-Request-ID: the same request.
    let _retry = send(
        &site,
        &chat_request(false, &format!("x-request-id: {}\r\n", id.to_lowercase())),
    );
    site.wait_for("the retry to be held", || {
        let text = site.router_metrics();
        (metric_sum(&text, "hivenet_pending_demand", &[]) == 1.0).then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(pending(&site), 1.0);
    // A value that is not a UUID is ignored: each counts on its own.
    let _other = send(
        &site,
        &chat_request(false, "x-client-request-id: retry-1\r\n"),
    );
    let _other_again = send(
        &site,
        &chat_request(false, "x-client-request-id: retry-1\r\n"),
    );
    site.wait_metric("hivenet_pending_demand", |v| v == 3.0);
}

#[test]
fn a_hundred_held_requests_released_onto_four_slots_are_all_answered() {
    let mut site = sleepy_site(
        "hold_burst",
        &["--itl", "5ms", "--output-tokens", "4"],
        &["--request-timeout", "120s"],
    );
    place_here(&site, "120s");
    let conns: Vec<Conn> = (0..100)
        .map(|index| send(&site, &chat_request(index % 3 == 0, "")))
        .collect();
    site.wait_metric("hivenet_pending_demand", |v| v == 100.0);
    wake(&mut site, &["--capacity", "4"]);
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let readers: Vec<_> = conns
            .into_iter()
            .map(|mut conn| scope.spawn(move || conn.read_response().map(|r| r.status)))
            .collect();
        readers
            .into_iter()
            .map(|reader| {
                reader
                    .join()
                    .unwrap()
                    .expect("every held request is answered")
            })
            .collect()
    });
    assert!(statuses.iter().all(|status| *status == 200), "{statuses:?}");
    site.wait_metric("hivenet_pending_demand", |v| v == 0.0);
    assert_eq!(holds(&site, "released"), 100.0);
}

const ADMIN_KEY: &str = "admin-secret-hold";

fn put_key(site: &Site, id: &str, version: &str, raw: &str, quota: Value, allowed: &[&str]) {
    use sha2::{Digest, Sha256};
    let body = json!({
        "version": version,
        "key_hash": hex::encode(Sha256::digest(raw.as_bytes())),
        "key_preview": "sk-...test",
        "owner": id,
        "name": id,
        "enabled": true,
        "allowed_models": allowed,
        "quota": quota,
    })
    .to_string();
    let raw_request = format!(
        "PUT /admin/api-keys/{id} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw_request.as_bytes());
    assert_eq!(response.status, 200, "key {id}: {}", response.text());
}

#[test]
fn per_key_hold_limit_quota_while_held_and_client_ids_per_key() {
    let site = Site::start(
        "hold_keys",
        site_options(
            "hold_keys",
            &["--models", "sleepy"],
            &["--wake-hold-max-per-key", "3"],
        )
        .router_env("HIVENET_ROUTER_AUTH_MODE", "dynamic")
        .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY),
    );
    put_key(
        &site,
        "busy",
        "rev_00000001",
        "sk-busy",
        json!({"requests_per_minute": 1000, "tokens_per_day": 1000000}),
        &[],
    );
    // A per-model quota scales with the healthy replicas; a model that may be held here counts
    // at least one, so held requests are charged.
    put_key(
        &site,
        "metered",
        "rev_00000002",
        "sk-metered",
        json!({"per_model": {"sleepy": {"requests_per_minute_per_replica": 2, "tokens_per_day": 1000000}}}),
        &[],
    );
    let map = json!({
        "sites": [{"id": "site-a", "url": format!("http://{}", site.http)}],
        "placements": [{"model": "sleepy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "60s"}],
    })
    .to_string();
    let raw = format!(
        "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{map}",
        map.len()
    );
    assert_eq!(request(site.http, raw.as_bytes()).status, 200);

    let id = "0f3c2a9e-7d41-4b8e-9a55-1c2d3e4f5a6b";
    let as_key =
        |key: &str| format!("authorization: Bearer {key}\r\nx-client-request-id: {id}\r\n");
    // One key, one client ID: three held requests, one in the demand.
    let _busy: Vec<Conn> = (0..3)
        .map(|_| send(&site, &chat_request(false, &as_key("sk-busy"))))
        .collect();
    site.wait_for("three held requests of one key", || {
        (metric_sum(&site.router_metrics(), "hivenet_shard_requests_total", &[]) >= 3.0)
            .then_some(())
    });
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    // The per-key limit counts held requests, not the demand.
    let refused = request(site.http, &chat_request(false, &as_key("sk-busy")));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused
            .text()
            .contains("too many requests are already waiting")
    );
    // Another key with the same client ID counts on its own, and is charged while held.
    let _metered: Vec<Conn> = (0..2)
        .map(|_| send(&site, &chat_request(false, &as_key("sk-metered"))))
        .collect();
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    let over_quota = request(site.http, &chat_request(false, &as_key("sk-metered")));
    assert_eq!(over_quota.status, 429, "{}", over_quota.text());
    assert_eq!(over_quota.error_code(), "rate_limit_exceeded");
    // A key that may not use the model is never held: 403 at once.
    put_key(
        &site,
        "narrow",
        "rev_00000003",
        "sk-narrow",
        json!({"requests_per_minute": 10, "tokens_per_day": 1000}),
        &["another-model"],
    );
    let forbidden = request(
        site.http,
        &chat_request(false, "authorization: Bearer sk-narrow\r\n"),
    );
    assert_eq!(forbidden.status, 403, "{}", forbidden.text());
    assert_eq!(forbidden.error_code(), "model_forbidden");
    assert_eq!(pending(&site), 2.0);
}

/// With an admission gate in the model's policy, the daily budget and the token buckets are
/// checked before the hold too, not only after the release: a key with no tokens left is refused
/// at once rather than held, raising the demand, only to get `429` once the model wakes.
#[test]
fn a_key_over_its_daily_tokens_is_refused_before_it_is_held() {
    let name = "hold_quota_first";
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sleepy.yaml"),
        "models:\n  - sleepy\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: 1\n",
    )
    .unwrap();
    let policy_dir = dir.display().to_string();
    let site = Site::start(
        name,
        site_options(
            name,
            &["--models", "sleepy"],
            &["--policy-model-dir", &policy_dir, "--wake-keepalive", "0"],
        )
        .router_env("HIVENET_ROUTER_AUTH_MODE", "dynamic")
        .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY),
    );
    put_key(
        &site,
        "poor",
        "rev_00000001",
        "sk-poor",
        json!({"requests_per_minute": 100, "tokens_per_day": 1}),
        &[],
    );
    let map = json!({
        "sites": [{"id": "site-a", "url": format!("http://{}", site.http)}],
        "placements": [{"model": "sleepy", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "10s"}],
    })
    .to_string();
    let raw = format!(
        "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{map}",
        map.len()
    );
    assert_eq!(request(site.http, raw.as_bytes()).status, 200);
    site.wait_for("the 0-valued pending-demand series", || {
        site.router_metrics()
            .contains("hivenet_pending_demand{model=\"sleepy\"} 0")
            .then_some(())
    });
    let started = Instant::now();
    let refused = request(
        site.http,
        &chat_request(false, "authorization: Bearer sk-poor\r\n"),
    );
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "token_limit_exceeded");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once, not after a hold"
    );
    // Never held: no hold outcome at all, nothing in the demand.
    let metrics = site.router_metrics();
    assert_eq!(metric_sum(&metrics, "hivenet_wake_holds_total", &[]), 0.0);
    assert_eq!(pending(&site), 0.0);
}

/// A site whose policy for `sleepy` admits one request at a time (`max_inflight: 1`), with no
/// park timeout: without a hold, a request over the budget is refused at once.
fn gated_site(name: &str, sim: &[&str], extra: &[&str]) -> Site {
    gated_site_with(name, "max_inflight: 1", sim, extra)
}

/// [`gated_site`] with its own admission line in the policy of `sleepy`.
fn gated_site_with(name: &str, gate: &str, sim: &[&str], extra: &[&str]) -> Site {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sleepy.yaml"),
        format!("models:\n  - sleepy\nrouting_policy:\n  strategy: least-loaded\n{gate}\n"),
    )
    .unwrap();
    let policy_dir = dir.display().to_string();
    let mut args = vec!["--policy-model-dir", &policy_dir];
    args.extend_from_slice(extra);
    let mut sim_args = vec!["--models", "sleepy"];
    sim_args.extend_from_slice(sim);
    Site::start(
        name,
        site_options(name, &sim_args, &args)
            .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true")
            .router_env("HIVENET_ROUTER_ADMIT_PARK_TIMEOUT", "0"),
    )
}

#[test]
fn released_requests_wait_in_the_admission_gate_up_to_their_hold_budget() {
    let mut site = gated_site(
        "hold_gate",
        &["--itl", "100ms", "--output-tokens", "3"],
        &[],
    );
    place_here(&site, "30s");
    let conns: Vec<Conn> = (0..3)
        .map(|_| send(&site, &chat_request(false, "")))
        .collect();
    site.wait_metric("hivenet_pending_demand", |v| v == 3.0);
    wake(&mut site, &["--capacity", "4"]);
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let readers: Vec<_> = conns
            .into_iter()
            .map(|mut conn| scope.spawn(move || conn.read_response().unwrap().status))
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(statuses, vec![200, 200, 200], "{}", site.logs());
    // A reservation is given back just after its answer's last byte is written, over the mesh
    // when another shard owns the model: wait for it, or the next request may race it and find
    // the budget still held (seen in CI).
    site.wait_metric("hivenet_admission_inflight_requests", |v| v == 0.0);
    // Awake, a request over the budget is refused at once as usual.
    let mut holder = send(&site, &chat_request(true, ""));
    let head = holder.read_head().unwrap();
    assert_eq!(head.status, 200);
    let refused = request(site.http, &chat_request(false, ""));
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.error_code(), "concurrency_limit_exceeded");
}

#[test]
fn a_released_request_that_finds_no_room_before_its_budget_ends_is_503_model_waking() {
    // Each answer (10 tokens) takes about seven seconds: longer than the budget.
    let mut site = gated_site(
        "hold_capacity",
        &["--itl", "700ms", "--output-tokens", "10"],
        &["--wake-keepalive", "0"],
    );
    place_here(&site, "4s");
    let conns: Vec<Conn> = (0..2)
        .map(|_| send(&site, &chat_request(false, "")))
        .collect();
    site.wait_metric("hivenet_pending_demand", |v| v == 2.0);
    wake(&mut site, &["--capacity", "4"]);
    let mut responses: Vec<common::Response> = std::thread::scope(|scope| {
        let readers: Vec<_> = conns
            .into_iter()
            .map(|mut conn| scope.spawn(move || conn.read_response().unwrap()))
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    responses.sort_by_key(|response| response.status);
    assert_eq!(responses[0].status, 200, "{}", responses[0].text());
    assert_eq!(responses[1].status, 503, "{}", responses[1].text());
    assert_eq!(
        responses[1].json()["error"]["message"],
        "model sleepy woke up but is still at capacity; retry in 30 seconds"
    );
    assert_eq!(responses[1].header("retry-after"), Some("30"));
}

#[test]
fn an_http2_client_gets_keepalives_then_the_answer() {
    let mut site = sleepy_site("hold_h2c", &[], &["--wake-keepalive", "200ms"]);
    place_here(&site, "60s");
    let body = chat("sleepy", false).to_string();
    let http = site.http;
    std::thread::scope(|scope| {
        let held = scope.spawn(move || {
            let (status, _, body) = common::h2c_post(http, "/v1/chat/completions", &body);
            (status, body)
        });
        site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
        std::thread::sleep(Duration::from_millis(500));
        wake(&mut site, &[]);
        let (status, data) = held.join().unwrap();
        assert_eq!(status, 200);
        let text = String::from_utf8(data).unwrap();
        assert!(text.starts_with(' '), "{text:?}");
        let value: Value = serde_json::from_str(text.trim_start()).unwrap();
        assert_eq!(value["object"], "chat.completion");
    });
}

#[test]
fn a_released_request_larger_than_the_whole_pool_is_refused_at_once() {
    // One replica's budget: 0.9 x 200 = 180 tokens; the request declares 1000 output tokens.
    let mut site = gated_site_with(
        "hold_oversize",
        "admit_budget_tokens: 200",
        &[],
        &["--wake-keepalive", "0"],
    );
    place_here(&site, "60s");
    let body = json!({
        "model": "sleepy",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "hello"}],
    })
    .to_string();
    let mut conn = send(&site, &post_request("/v1/chat/completions", &body));
    site.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    wake(&mut site, &[]);
    let started = Instant::now();
    let response = conn.read_response().unwrap();
    assert_eq!(response.status, 429, "{}", response.text());
    assert_eq!(response.error_code(), "concurrency_limit_exceeded");
    // Not after the 60 s budget: at once, once awake.
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// A held request still waiting when the router's drain ends gets an error (the model cannot wake
/// on a router that is going away), not a cut connection.
#[test]
fn a_held_request_ends_with_an_error_when_the_drain_ends() {
    let mut site = sleepy_site(
        "hold_drain",
        &[],
        &["--wake-keepalive", "0", "--drain-timeout", "1s"],
    );
    place_here(&site, "60s");
    let mut conn = Conn::connect(site.http);
    conn.send(&chat_request(false, "")).unwrap();
    site.wait_for("the request to be held", || {
        (pending(&site) == 1.0).then_some(())
    });
    let terminated = Instant::now();
    site.router.signal("TERM");
    let response = conn
        .read_response()
        .expect("an answer, not a cut connection");
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(response.error_code(), "no_capacity");
    assert!(
        response.text().contains("shutting down"),
        "{}",
        response.text()
    );
    assert!(terminated.elapsed() < Duration::from_secs(10));
    let status = site.router.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|status| status.success()), "{status:?}");
}
