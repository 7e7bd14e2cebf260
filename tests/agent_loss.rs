//! Proves that killing an agent mid-stream ends the client's stream cleanly (an error event and a
//! terminated chunked body, never a hang), that its model then leaves the routing pool promptly,
//! and that the router keeps serving `/health` and other agents' models.

mod common;

use std::time::Instant;

use common::{Conn, Options, Site, chat, metric_sum, post_request};

#[test]
fn killing_the_agent_mid_stream_ends_the_stream_and_drops_the_model() {
    let mut site = Site::start(
        "agent_loss",
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--itl",
                "200ms",
                "--output-tokens",
                "50",
            ])
            .sim(&["--models", "other"])
            .agent(0, &["--capacity", "4"])
            .agent(1, &["--capacity", "4"])
            .models(&["sim-model", "other"]),
    );

    let mut conn = site.send_chat_stream("sim-model");
    let head = conn.read_head().expect("response head");
    assert_eq!(head.status, 200);
    // The role chunk and a first token prove the stream is flowing through the agent.
    let mut before = Vec::new();
    for _ in 0..2 {
        before.push(
            conn.read_chunk()
                .expect("chunk")
                .expect("not the last chunk"),
        );
    }

    site.agents[0].kill();
    let killed_at = Instant::now();

    // The rest of the body must end with the zero-size chunk, not a hang or a reset.
    let mut after = Vec::new();
    loop {
        match conn.read_chunk() {
            Ok(Some(chunk)) => after.push(chunk),
            Ok(None) => break,
            Err(e) => panic!(
                "stream did not end cleanly after the agent died: {e}; got {:?}\n{}",
                String::from_utf8_lossy(&after.concat()),
                site.logs()
            ),
        }
    }
    let tail = String::from_utf8_lossy(&after.concat()).into_owned();
    assert!(
        tail.contains("agent_disconnected"),
        "no error event after the agent died: {tail:?}"
    );
    assert!(
        tail.ends_with("\n\n"),
        "last event not terminated: {tail:?}"
    );
    assert!(
        !tail.contains("[DONE]"),
        "an interrupted stream must not claim completion: {tail:?}"
    );
    eprintln!("stream ended {:?} after the kill", killed_at.elapsed());
    // The stream was cut by the lost tunnel, counted on the agent (its history outlives it).
    let metrics = site.router_metrics();
    let resets = |reason: &str| {
        metric_sum(
            &metrics,
            "hivenet_agent_connection_resets_total",
            &[("model", "sim-model"), ("reason", reason)],
        )
    };
    assert_eq!((resets("tunnel"), resets("engine")), (1.0, 0.0));

    site.wait_model_gone("sim-model");
    eprintln!("model gone {:?} after the kill", killed_at.elapsed());
    let (status, _, body) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert!(status == 404 || status == 503, "{status} {body}");
    let code: serde_json::Value = serde_json::from_str(&body).unwrap();
    let code = code["error"]["code"].as_str().unwrap().to_string();
    assert!(
        [
            "model_not_found",
            "no_agents_available",
            "agent_disconnected"
        ]
        .contains(&code.as_str()),
        "{body}"
    );

    site.wait_health();
    site.assert_chat_ok("other");
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);

    // A new agent in front of the same sim brings the model back.
    site.spawn_agent(0, &["--capacity", "4"]);
    site.wait_models(&["sim-model"]);
    let mut body = chat("sim-model", false);
    body["max_tokens"] = serde_json::json!(1);
    let (status, _, text) = site.post_json("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{text}\n{}", site.logs());
}

#[test]
fn killing_the_agent_mid_anthropic_stream_sends_an_error_event() {
    let mut site = Site::start(
        "agent_loss_anthropic",
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--itl",
                "200ms",
                "--output-tokens",
                "50",
            ])
            .agent(0, &["--capacity", "4"]),
    );
    let body = serde_json::json!({
        "model": "sim-model",
        "max_tokens": 100,
        "stream": true,
        "messages": [{"role": "user", "content": "hello"}],
    });
    let mut conn = Conn::connect(site.http);
    conn.send(&post_request("/v1/messages", &body.to_string()))
        .unwrap();
    assert_eq!(conn.read_head().unwrap().status, 200);
    let mut seen = String::new();
    while !seen.contains("content_block_delta") {
        let chunk = conn.read_chunk().unwrap().expect("stream ended early");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    site.agents[0].kill();
    let mut tail = String::new();
    while let Some(chunk) = conn
        .read_chunk()
        .unwrap_or_else(|e| panic!("stream did not end cleanly: {e}; got {tail:?}"))
    {
        tail.push_str(&String::from_utf8_lossy(&chunk));
    }
    let last_event = tail.trim_end().rsplit("\n\n").next().unwrap_or_default();
    assert!(last_event.starts_with("event: error\ndata: "), "{tail:?}");
    let data: serde_json::Value =
        serde_json::from_str(last_event.split_once("data: ").unwrap().1).unwrap();
    assert_eq!(data["type"], "error", "{last_event}");
    assert!(!tail.contains("message_stop"), "{tail:?}");
    site.wait_model_gone("sim-model");
}

#[test]
fn killing_the_agent_before_the_response_head_answers_503() {
    // Non-streamed: the sim streams its role chunk at once, so only a non-streamed answer is
    // still headless while the sim waits out its time to first token.
    let mut site = Site::start(
        "agent_loss_before_head",
        Options::new()
            .sim(&["--models", "sim-model", "--ttft", "20s"])
            .agent(0, &["--capacity", "4"]),
    );
    let mut conn = Conn::connect(site.http);
    conn.send(&post_request(
        "/v1/chat/completions",
        &chat("sim-model", false).to_string(),
    ))
    .unwrap();
    site.wait_sim_metric(0, "sim_in_flight", |v| v == 1.0);
    site.agents[0].kill();
    let response = conn.read_response().unwrap_or_else(|e| {
        panic!(
            "no answer after the agent died before the head: {e}\n{}",
            site.logs()
        )
    });
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(
        response.error_code(),
        "agent_disconnected",
        "{}",
        response.text()
    );
    site.wait_model_gone("sim-model");
    site.wait_health();
}
