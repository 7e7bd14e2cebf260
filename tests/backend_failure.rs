//! Proves through the real router and agent that a failing engine reaches the client as a backend
//! failure, not as a lost agent: an engine that breaks off a streamed answer gives the client a
//! `backend_error` event (source `backend`), one that breaks off a JSON answer gives 502
//! `backend_error`, and one that refuses connections gives 503 `backend_unavailable` — the codes
//! and statuses of the error-code reference. (A lost agent is still `agent_disconnected`:
//! `tests/agent_loss.rs`.)

mod common;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Options, Site, chat, metric_sum, post_request, read_engine_request, request};
use serde_json::Value;

const MODEL: &str = "fake-model";

/// An engine that is healthy, serves one model, and breaks off every chat answer after its head:
/// a stream after its first event, a JSON body after a few bytes. Stops listening (connections
/// are then refused) when `stop` is set.
fn start_failing_engine(stop: Arc<AtomicBool>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((socket, _)) => {
                    std::thread::spawn(move || serve(socket));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        // The listener drops here: new connections are refused.
    });
    addr
}

fn serve(socket: TcpStream) {
    socket.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let Some((head, body)) = read_engine_request(&mut reader) else {
        return;
    };
    let mut socket = socket;
    let first_line = head.lines().next().unwrap_or_default().to_owned();
    let reply = |socket: &mut TcpStream, content_type: &str, body: &str| {
        let _ = write!(
            socket,
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    if first_line.starts_with("get /v1/models") {
        reply(
            &mut socket,
            "application/json",
            &format!(r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model"}}]}}"#),
        );
    } else if first_line.starts_with("get ") {
        reply(&mut socket, "text/plain", "");
    } else if first_line.starts_with("post /v1/chat/completions") {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if request["stream"] == true {
            let event = format!(
                "data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":\"{MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"hi\"}}}}]}}\n\n"
            );
            let _ = write!(
                socket,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                event.len()
            );
        } else {
            let _ = write!(
                socket,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{{\"id\":\"x\","
            );
        }
        let _ = socket.flush();
        // The engine dies mid-answer.
        std::thread::sleep(Duration::from_millis(200));
        let _ = socket.shutdown(std::net::Shutdown::Both);
    }
}

fn start_site(name: &str, engine: SocketAddr) -> Site {
    // The agent probes its backend's health every heartbeat interval and leaves the pool when it
    // fails. This test stops the engine and wants the next request to meet the refused
    // connection, not an agent gone from the pool: the probe runs at start and then only after a
    // minute, and the router waits two minutes for heartbeats, far longer than the test.
    let options = Options::new()
        .skip_model_wait()
        .router_args(&["--unhealthy-after", "120s"]);
    let mut site = Site::start(name, options);
    site.serve_custom_engine(engine, MODEL, &["--heartbeat-interval", "60s"]);
    site
}

#[test]
fn an_engine_failing_mid_answer_is_a_backend_error_not_a_lost_agent() {
    let stop = Arc::new(AtomicBool::new(false));
    let engine = start_failing_engine(stop.clone());
    let site = start_site("backend-failure", engine);

    // A stream: its first event, then the backend's error event, and no [DONE].
    let response = request(
        site.http,
        &post_request("/v1/chat/completions", &chat(MODEL, true).to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let text = response.text();
    assert!(text.contains("\"content\":\"hi\""), "{text}");
    assert!(
        text.contains(r#"data: {"error":{"code":"backend_error","message":"the backend failed mid-stream","source":"backend"}}"#),
        "{text}\n{}",
        site.logs()
    );
    assert!(!text.contains("agent_disconnected"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");

    // A JSON answer cut short after its head.
    let response = request(
        site.http,
        &post_request("/v1/chat/completions", &chat(MODEL, false).to_string()),
    );
    assert_eq!(response.status, 502, "{}", response.text());
    let body = response.json();
    assert_eq!(body["error"]["code"], "backend_error", "{body}");
    assert_eq!(body["error"]["source"], "backend", "{body}");

    // The agent is still there: the tunnel was never lost. Both answers were cut by the
    // engine's connection (counted on the agent as resets for reason `engine`), none by the
    // tunnel, and neither was a refusal.
    assert_eq!(site.model_ids(), vec![MODEL.to_owned()]);
    let metrics = site.router_metrics();
    let resets = |reason: &str| {
        metric_sum(
            &metrics,
            "hivenet_agent_connection_resets_total",
            &[("model", MODEL), ("reason", reason)],
        )
    };
    assert_eq!((resets("engine"), resets("tunnel")), (2.0, 0.0));
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_agent_rejected_requests_total",
            &[("model", MODEL)]
        ),
        0.0
    );

    // The engine stops listening: connection refused is backend_unavailable, 503.
    stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(50));
    let response = request(
        site.http,
        &post_request("/v1/chat/completions", &chat(MODEL, false).to_string()),
    );
    assert_eq!(response.status, 503, "{}\n{}", response.text(), site.logs());
    let body = response.json();
    assert_eq!(body["error"]["code"], "backend_unavailable", "{body}");
    assert_eq!(body["error"]["source"], "backend", "{body}");
    // An engine the agent cannot reach refused the request for readiness: a rejection, not a
    // reset (nothing was cut).
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_agent_rejected_requests_total",
            &[("model", MODEL)]
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_agent_connection_resets_total",
            &[("model", MODEL)]
        ),
        2.0
    );
}
