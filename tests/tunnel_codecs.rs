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
