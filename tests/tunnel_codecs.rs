//! Proves through the real binaries that a router serves agents of both tunnel codecs at once:
//! one offering the lean tunnel (the default) and one started with `--p2p-codec http2`, which
//! dials as an agent of the previous release does, each carry chat and streams on one router.
//! (An agent's fallback to HTTP/2 against a router of the previous release is proven in
//! `agent_tunnel.rs`, whose stand-in router is one.)

mod common;

use common::{Options, Site, sse_events};

#[test]
fn a_router_serves_lean_and_http2_agents_side_by_side() {
    let site = Site::start(
        "tunnel_codecs",
        Options::new()
            .sim(&["--models", "lean-model"])
            .sim(&["--models", "http2-model"])
            .agent(0, &[])
            .agent(1, &["--p2p-codec", "http2"])
            .models(&["lean-model", "http2-model"]),
    );
    for model in ["lean-model", "http2-model"] {
        site.assert_chat_ok(model);
        let mut stream = site.send_chat_stream(model);
        let response = stream.read_response().unwrap();
        assert_eq!(response.status, 200, "{model}: {}", response.text());
        let events = sse_events(&response.body);
        assert_eq!(events.last().unwrap(), "data: [DONE]", "{model}");
    }
    let lean = site.agents[0].log_text();
    let http2 = site.agents[1].log_text();
    assert!(lean.contains("codec=Lean"), "{lean}");
    assert!(!lean.contains("codec=Http2"), "{lean}");
    assert!(http2.contains("codec=Http2"), "{http2}");
    assert!(!http2.contains("codec=Lean"), "{http2}");
}

/// An HTTP/2 tunnel has 2^30 stream ids; h2 then refuses every new stream on a connection that
/// still answers pings, which would leave the agent in the pool with a tunnel that fails every
/// request. The router retires such a tunnel before its ids run out: out of the shard (the agent
/// leaves the pool), its requests finished, then closed; the agent dials a new one and rejoins.
/// A debug build takes the allowance from `HIVENET_TEST_HTTP2_TUNNEL_STREAMS`: 8 here, so the
/// tunnel retires every 8 requests. Whatever is refused meanwhile is refused for the agent
/// being away (the model has no healthy agent for that moment), never hung or failed on a spent
/// tunnel, and serving resumes each time.
#[test]
fn an_http2_tunnel_retires_before_its_stream_ids_run_out_and_the_agent_rejoins() {
    let site = Site::start(
        "tunnel_http2_retire",
        Options::new()
            .sim(&[
                "--models",
                "http2-model",
                "--output-tokens",
                "40",
                "--itl",
                "25ms",
            ])
            .agent(0, &["--p2p-codec", "http2"])
            .router_args(&["--shards", "1"])
            .router_env("HIVENET_TEST_HTTP2_TUNNEL_STREAMS", "8")
            .models(&["http2-model"]),
    );
    let mut body = common::chat("http2-model", false);
    body["max_tokens"] = serde_json::json!(1);
    // A stream of 40 tokens (1 s) takes the first id; seven short answers take the rest, and the
    // tunnel retires under the stream, which still ends whole on it.
    let mut stream = site.send_chat_stream("http2-model");
    let head = stream.read_head().unwrap();
    assert_eq!(head.status, 200);
    for _ in 0..7 {
        let (status, _, text) = site.post_json("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{text}");
    }
    let streamed = stream.read_chunked_text().unwrap();
    assert!(streamed.trim_end().ends_with("data: [DONE]"), "{streamed}");
    let (mut served, mut refused) = (7, Vec::new());
    let started = std::time::Instant::now();
    while served < 30 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{served} served in a minute; refused: {refused:?}"
        );
        let (status, _, text) = site.post_json("/v1/chat/completions", &body);
        match status {
            200 => served += 1,
            // The model's one agent is away: not served by any healthy agent here, for now.
            404 | 503
                if [
                    "model_not_found",
                    "no_agents_available",
                    "agent_disconnected",
                ]
                .iter()
                .any(|code| text.contains(code)) =>
            {
                refused.push(text);
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => panic!("{other}: {text}"),
        }
    }
    let log = site.router.log_text();
    let retired = log.matches("tunnel retiring").count();
    assert!(
        retired >= 3,
        "{retired} retirements for {served} requests:\n{log}"
    );
    assert!(
        !log.contains("stream ID overflowed"),
        "a request reached a spent tunnel:\n{log}"
    );
    let agent = site.agents[0].log_text();
    assert!(agent.matches("codec=Http2").count() > retired, "{agent}");
}
