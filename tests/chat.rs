//! Proves that chat, Anthropic messages, token counting, embeddings, rerank and model listing work
//! end to end through the real router, agent and sim, with byte-exact SSE framing and usage
//! accounting that hides the usage chunk only from clients that did not ask for it.

mod common;

use common::{Conn, Options, Site, chat, post_request, sse_events};
use serde_json::{Value, json};

const OUTPUT_TOKENS: usize = 5;

fn site(name: &str) -> Site {
    Site::start(
        name,
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--output-tokens",
                &OUTPUT_TOKENS.to_string(),
            ])
            .agent(0, &["--capacity", "4"]),
    )
}

/// Parses every `data: ` event except the final `[DONE]`, checking byte-exact framing.
fn openai_chunks(body: &[u8]) -> Vec<Value> {
    let events = sse_events(body);
    assert_eq!(
        events.last().map(|s| s.as_str()),
        Some("data: [DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|event| {
            let json = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event is not `data: `: {event:?}"));
            assert!(!json.contains('\n'), "multi-line event: {event:?}");
            serde_json::from_str(json).unwrap_or_else(|e| panic!("bad JSON in {event:?}: {e}"))
        })
        .collect()
}

fn is_usage_only(chunk: &Value) -> bool {
    chunk["choices"].as_array().is_some_and(|c| c.is_empty()) && chunk["usage"].is_object()
}

#[test]
fn chat_non_stream_returns_completion_with_usage() {
    let site = site("chat_non_stream");
    let (status, headers, body) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert_eq!(status, 200, "{body}");
    assert!(
        headers
            .iter()
            .any(|(n, v)| n == "content-type" && v.starts_with("application/json")),
        "{headers:?}"
    );
    let value: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(value["object"], "chat.completion");
    assert_eq!(value["choices"][0]["message"]["role"], "assistant");
    assert_eq!(value["usage"]["completion_tokens"], OUTPUT_TOKENS);
    assert!(
        value["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );
    site.wait_metric("hivenet_shard_output_tokens_total", |v| {
        v == OUTPUT_TOKENS as f64
    });
}

#[test]
fn chat_stream_without_usage_request_hides_usage_chunk_but_counts_it() {
    let site = site("chat_stream_no_usage");
    let mut conn = Conn::connect(site.http);
    conn.send(&post_request(
        "/v1/chat/completions",
        &chat("sim-model", true).to_string(),
    ))
    .unwrap();
    let response = conn.read_response().unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    assert_eq!(response.header("transfer-encoding"), Some("chunked"));

    let chunks = openai_chunks(&response.body);
    // Role chunk, one chunk per token, finish chunk.
    assert_eq!(chunks.len(), 1 + OUTPUT_TOKENS + 1, "{}", response.text());
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for token in &chunks[1..=OUTPUT_TOKENS] {
        assert!(
            token["choices"][0]["delta"]["content"].is_string(),
            "{token}"
        );
    }
    assert_eq!(
        chunks[OUTPUT_TOKENS + 1]["choices"][0]["finish_reason"],
        "stop"
    );
    assert!(
        !chunks.iter().any(is_usage_only),
        "usage chunk leaked: {}",
        response.text()
    );

    site.wait_metric("hivenet_shard_output_tokens_total", |v| {
        v == OUTPUT_TOKENS as f64
    });
    assert!(site.router_metric("hivenet_shard_input_tokens_total") > 0.0);
    assert_eq!(site.router_metric("hivenet_shard_usage_missing_total"), 0.0);
}

#[test]
fn chat_stream_max_tokens_cuts_the_answer() {
    let site = site("chat_stream_max_tokens");
    let mut body = chat("sim-model", true);
    body["max_tokens"] = json!(3);
    let response = common::request(
        site.http,
        &post_request("/v1/chat/completions", &body.to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let chunks = openai_chunks(&response.body);
    assert_eq!(chunks.len(), 1 + 3 + 1, "{}", response.text());
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    site.wait_metric("hivenet_shard_output_tokens_total", |v| v == 3.0);
}

#[test]
fn chat_stream_with_usage_request_sees_usage_chunk() {
    let site = site("chat_stream_usage");
    let mut body = chat("sim-model", true);
    body["stream_options"] = json!({"include_usage": true});
    let response = common::request(
        site.http,
        &post_request("/v1/chat/completions", &body.to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let chunks = openai_chunks(&response.body);
    assert_eq!(
        chunks.len(),
        1 + OUTPUT_TOKENS + 1 + 1,
        "{}",
        response.text()
    );
    let usage = chunks.last().unwrap();
    assert!(
        is_usage_only(usage),
        "last chunk is not usage-only: {usage}"
    );
    assert_eq!(usage["usage"]["completion_tokens"], OUTPUT_TOKENS);
    site.wait_metric("hivenet_shard_output_tokens_total", |v| {
        v == OUTPUT_TOKENS as f64
    });
    assert_eq!(site.router_metric("hivenet_shard_usage_missing_total"), 0.0);
}

fn messages_body(stream: bool) -> Value {
    json!({
        "model": "sim-model",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello there"}],
    })
}

#[test]
fn anthropic_messages_non_stream_and_stream_event_order() {
    let site = site("anthropic_messages");
    let (status, _, body) = site.post_json("/v1/messages", &messages_body(false));
    assert_eq!(status, 200, "{body}");
    let value: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(value["type"], "message");
    assert_eq!(value["role"], "assistant");
    assert_eq!(value["usage"]["output_tokens"], OUTPUT_TOKENS);

    let response = common::request(
        site.http,
        &post_request("/v1/messages", &messages_body(true).to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let mut types = Vec::new();
    for event in sse_events(&response.body) {
        let mut lines = event.split('\n');
        let name = lines
            .next()
            .and_then(|l| l.strip_prefix("event: "))
            .unwrap_or_else(|| panic!("no event line: {event:?}"));
        let data = lines
            .next()
            .and_then(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no data line: {event:?}"));
        assert!(lines.next().is_none(), "extra lines in {event:?}");
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["type"], name, "{event:?}");
        types.push(name.to_string());
    }
    let deltas = types.iter().filter(|t| *t == "content_block_delta").count();
    assert_eq!(deltas, OUTPUT_TOKENS, "{types:?}");
    let expected: Vec<String> = ["message_start", "content_block_start"]
        .into_iter()
        .map(String::from)
        .chain(std::iter::repeat_n(
            "content_block_delta".to_string(),
            OUTPUT_TOKENS,
        ))
        .chain(
            ["content_block_stop", "message_delta", "message_stop"]
                .into_iter()
                .map(String::from),
        )
        .collect();
    let without_pings: Vec<String> = types.iter().filter(|t| *t != "ping").cloned().collect();
    assert_eq!(without_pings, expected);
    site.wait_metric("hivenet_shard_output_tokens_total", |v| {
        v == 2.0 * OUTPUT_TOKENS as f64
    });
    assert_eq!(site.router_metric("hivenet_shard_usage_missing_total"), 0.0);
}

#[test]
fn anthropic_count_tokens() {
    let site = site("count_tokens");
    let (status, _, body) = site.post_json(
        "/v1/messages/count_tokens",
        &json!({"model": "sim-model", "messages": [{"role": "user", "content": "hello there"}]}),
    );
    assert_eq!(status, 200, "{body}");
    let value: Value = serde_json::from_str(&body).unwrap();
    assert!(value["input_tokens"].as_u64().unwrap() > 0, "{body}");
}

#[test]
fn embeddings_and_rerank_go_through_agents_with_those_capabilities() {
    let site = Site::start(
        "embeddings_rerank",
        Options::new()
            .sim(&["--models", "embed-model,rerank-model"])
            .agent(0, &["--model", "embed-model", "--capability", "embedding"])
            .agent(0, &["--model", "rerank-model", "--capability", "reranker"])
            .models(&["embed-model", "rerank-model"]),
    );
    let (status, _, body) = site.post_json(
        "/v1/embeddings",
        &json!({"model": "embed-model", "input": ["one text", "another text"]}),
    );
    assert_eq!(status, 200, "{body}");
    let value: Value = serde_json::from_str(&body).unwrap();
    let data = value["data"].as_array().expect("data");
    assert_eq!(data.len(), 2, "{body}");
    assert_eq!(data[1]["index"], 1);
    assert!(!data[0]["embedding"].as_array().unwrap().is_empty());

    let (status, _, body) = site.post_json(
        "/v1/rerank",
        &json!({"model": "rerank-model", "query": "cats", "documents": ["about cats", "about dogs", "x"]}),
    );
    assert_eq!(status, 200, "{body}");
    let value: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        value["results"].as_array().expect("results").len(),
        3,
        "{body}"
    );
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 2.0);

    let listing: Value = serde_json::from_str(&site.get("/v1/models").2).unwrap();
    for (id, capability) in [("embed-model", "embedding"), ("rerank-model", "reranker")] {
        let model = listing["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {listing}"));
        assert_eq!(model["capability"], capability, "{model}");
    }
}

#[test]
fn models_lists_every_served_model() {
    let site = Site::start(
        "models_listing",
        Options::new()
            .sim(&["--models", "sim-model,other"])
            .agent(0, &[])
            .models(&["sim-model", "other"]),
    );
    let (status, _, body) = site.get("/v1/models");
    assert_eq!(status, 200, "{body}");
    let value: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(value["object"], "list");
    let mut ids: Vec<&str> = value["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model", "{m}");
            assert_eq!(m["agents"]["healthy"], 1, "{m}");
            m["id"].as_str().unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["other", "sim-model"]);
    site.assert_chat_ok("other");
}

#[test]
fn chat_stream_with_include_usage_false_hides_usage_chunk_but_counts_it() {
    let site = site("chat_stream_usage_false");
    let mut body = chat("sim-model", true);
    body["stream_options"] = json!({"include_usage": false});
    let response = common::request(
        site.http,
        &post_request("/v1/chat/completions", &body.to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let chunks = openai_chunks(&response.body);
    assert_eq!(chunks.len(), 1 + OUTPUT_TOKENS + 1, "{}", response.text());
    assert!(
        !chunks.iter().any(is_usage_only),
        "usage chunk leaked: {}",
        response.text()
    );
    site.wait_metric("hivenet_shard_output_tokens_total", |v| {
        v == OUTPUT_TOKENS as f64
    });
    assert_eq!(site.router_metric("hivenet_shard_usage_missing_total"), 0.0);
}

/// The router corks a stream's head, events and end so that what the agent sent together leaves in
/// one write, and writes out whatever is corked before it waits. Against an engine slow to its
/// first token, the head must therefore still reach the client at admission, not with the first
/// token: a cork left in place would hold it for the whole TTFT.
#[test]
fn a_streamed_head_reaches_the_client_before_a_slow_first_token() {
    let site = Site::start(
        "chat_head_before_first_token",
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--ttft",
                "2s",
                "--output-tokens",
                "2",
            ])
            .agent(0, &["--capacity", "2"]),
    );
    let mut conn = site.send_chat_stream("sim-model");
    let head = conn.read_head().expect("response head");
    let head_at = std::time::Instant::now();
    assert_eq!(head.status, 200, "{}", site.logs());
    let first = conn.read_chunk().expect("first chunk").expect("a chunk");
    let waited = head_at.elapsed();
    assert!(
        String::from_utf8_lossy(&first).starts_with("data: "),
        "{:?}",
        String::from_utf8_lossy(&first)
    );
    // The head came at admission; the first event a TTFT (2 s) after it. Only the order is
    // asserted, with a wide margin: a held head would arrive with the event.
    assert!(
        waited >= std::time::Duration::from_millis(1000),
        "the head waited for the first token: only {waited:?} between them"
    );
    let mut body = first;
    while let Some(chunk) = conn.read_chunk().expect("chunk") {
        body.extend_from_slice(&chunk);
    }
    let chunks = openai_chunks(&body);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

/// `anthropic-beta` reaches the engine as the client sent it (the first one, when several came),
/// through the router's HTTP/1.1 front and the agent.
#[test]
fn anthropic_beta_reaches_the_engine() {
    let site = site("anthropic_beta");
    let body = messages_body(false).to_string();
    let raw = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         anthropic-version: 2023-06-01\r\nAnthropic-Beta: tools-2024-04-04\r\n\
         anthropic-beta: second-one\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = common::request(site.http, raw.as_bytes());
    assert_eq!(response.status, 200, "{}", response.text());
    let control = common::request(site.sim_addrs[0], &common::get_request("/sim/control"));
    assert_eq!(control.json()["last_anthropic_beta"], "tools-2024-04-04");
}
