//! Proves through the real router and agent that an engine's response headers reach the client
//! (custom-engine reference: "Backend response headers and response bodies are returned through
//! the agent and router to the client"), over HTTP/1.1 and HTTP/2, for a JSON answer and a
//! stream, while the hop-by-hop ones stop at the first hop and the router's own fields
//! (`x-request-id`, the framing, a stream's `cache-control`) are never doubled or replaced.

mod common;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use common::{Options, Response, Site, chat, h2c_post, post_request, read_engine_request, request};
use serde_json::Value;

const MODEL: &str = "header-model";

/// The fields this engine adds to every chat answer: its own, and ones that must not pass.
const ENGINE_FIELDS: &str = "server: test-engine\r\n\
    x-engine-trace: trace-7\r\n\
    set-cookie: a=1\r\n\
    set-cookie: b=2\r\n\
    cache-control: no-store\r\n\
    x-request-id: engine-chosen-id\r\n\
    x-ratelimit-remaining-requests: 7\r\n\
    keep-alive: timeout=5\r\n\
    x-hop: named-by-connection\r\n\
    connection: close, x-hop\r\n";

fn start_engine() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for socket in listener.incoming().flatten() {
            std::thread::spawn(move || serve(socket));
        }
    });
    addr
}

fn serve(mut socket: TcpStream) {
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let Some((head, body)) = read_engine_request(&mut reader) else {
        return;
    };
    let first_line = head.lines().next().unwrap_or_default().to_owned();
    if first_line.starts_with("post /v1/chat/completions") {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if request["stream"] == true {
            let event = format!(
                "data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"model\":\"{MODEL}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"hi\"}}}}]}}\n\ndata: [DONE]\n\n"
            );
            let _ = write!(
                socket,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n{ENGINE_FIELDS}\r\n{:x}\r\n{event}\r\n0\r\n\r\n",
                event.len()
            );
        } else {
            let answer = format!(
                r#"{{"id":"x","object":"chat.completion","model":"{MODEL}","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}}}"#
            );
            let _ = write!(
                socket,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{ENGINE_FIELDS}\r\n{answer}",
                answer.len()
            );
        }
    } else {
        let body = match first_line.starts_with("get /v1/models") {
            true => format!(r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model"}}]}}"#),
            false => String::new(),
        };
        let _ = write!(
            socket,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let _ = socket.flush();
}

fn start_site(name: &str, engine: SocketAddr) -> Site {
    let mut site = Site::start(name, Options::new().skip_model_wait());
    site.serve_custom_engine(engine, MODEL, &[]);
    site
}

fn values<'r>(response: &'r Response, name: &str) -> Vec<&'r str> {
    response
        .headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// What every answer carries whatever its kind: the engine's own fields, once, and none of the
/// hop-by-hop or router-owned ones the engine sent.
fn assert_engine_fields(response: &Response) {
    assert_eq!(
        values(response, "server"),
        ["test-engine"],
        "{:?}",
        response.headers
    );
    assert_eq!(values(response, "x-engine-trace"), ["trace-7"]);
    assert_eq!(values(response, "set-cookie"), ["a=1", "b=2"]);
    let request_id = values(response, "x-request-id");
    assert_eq!(request_id.len(), 1, "{request_id:?}");
    assert_ne!(
        request_id[0], "engine-chosen-id",
        "the router names its requests"
    );
    assert!(values(response, "x-ratelimit-remaining-requests").is_empty());
    assert!(values(response, "keep-alive").is_empty());
    assert!(values(response, "x-hop").is_empty());
    // The client asked to close: the router's one `connection` field says so.
    assert_eq!(values(response, "connection"), ["close"]);
}

#[test]
fn an_engines_response_headers_reach_the_client_without_hop_by_hop_ones() {
    let engine = start_engine();
    let site = start_site("engine-headers", engine);

    let response = request(
        site.http,
        &post_request("/v1/chat/completions", &chat(MODEL, false).to_string()),
    );
    assert_eq!(response.status, 200, "{}\n{}", response.text(), site.logs());
    assert_eq!(response.json()["choices"][0]["message"]["content"], "hi");
    assert_engine_fields(&response);
    assert_eq!(values(&response, "cache-control"), ["no-store"]);
    assert_eq!(values(&response, "content-type"), ["application/json"]);
    assert_eq!(
        values(&response, "content-length"),
        [response.body.len().to_string()]
    );
    assert!(values(&response, "transfer-encoding").is_empty());

    let response = request(
        site.http,
        &post_request("/v1/chat/completions", &chat(MODEL, true).to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.text().contains("[DONE]"), "{}", response.text());
    assert_engine_fields(&response);
    // A stream keeps the router's caching rule, and one framing.
    assert_eq!(values(&response, "cache-control"), ["no-cache"]);
    assert_eq!(values(&response, "transfer-encoding"), ["chunked"]);
    assert!(values(&response, "content-length").is_empty());

    // HTTP/2 refuses connection-specific fields outright: the answer arrives, with the
    // engine's own.
    for stream in [false, true] {
        let (status, headers, _) = h2c_post(
            site.http,
            "/v1/chat/completions",
            &chat(MODEL, stream).to_string(),
        );
        assert_eq!(status, 200, "stream {stream}: {headers:?}");
        assert_eq!(headers["server"], "test-engine");
        assert_eq!(headers["x-engine-trace"], "trace-7");
        assert_eq!(headers.get_all("set-cookie").iter().count(), 2);
        assert!(!headers.contains_key("keep-alive") && !headers.contains_key("x-hop"));
    }
}
