//! Proves that the router answers each kind of bad or unusual client input with the documented
//! status and error envelope (or closes the connection where the byte stream can no longer be
//! trusted), accepts chunked bodies, pipelining and keep-alive, and that after each one a good
//! request on a fresh connection still succeeds.

mod common;

use std::time::Duration;

use common::{Conn, Options, Response, Site, chat, post_request, post_request_keep_alive};
use serde_json::json;

const MAX_REQUEST_BYTES: usize = 4096;

fn site(name: &str) -> Site {
    Site::start(
        name,
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "4"])
            .router_args(&[
                "--client-header-timeout",
                "2s",
                "--client-body-timeout",
                "2s",
            ])
            .router_env(
                "HIVENET_ROUTER_MAX_REQUEST_BYTES",
                &MAX_REQUEST_BYTES.to_string(),
            )
            .agent(0, &["--capacity", "4"]),
    )
}

fn assert_error(response: &Response, status: u16, code: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    let value = response.json();
    assert_eq!(value["error"]["code"], code, "{}", response.text());
    assert!(value["error"]["message"].is_string(), "{}", response.text());
    assert!(value["error"]["source"].is_string(), "{}", response.text());
}

/// Sends `raw` on a fresh connection and reads the one answer.
fn send(site: &Site, raw: &[u8]) -> (Conn, Response) {
    let mut conn = Conn::connect(site.http);
    conn.send(raw).unwrap();
    let response = conn
        .read_response()
        .unwrap_or_else(|e| panic!("no answer: {e}\n{}", site.logs()));
    (conn, response)
}

#[test]
fn malformed_json_is_400_request_invalid() {
    let site = site("malformed_json");
    let (_, response) = send(
        &site,
        &post_request("/v1/chat/completions", "{\"model\": \"sim-"),
    );
    assert_error(&response, 400, "request_invalid");
    site.assert_chat_ok("sim-model");
}

#[test]
fn missing_model_is_400_request_invalid() {
    let site = site("missing_model");
    let body = json!({"messages": [{"role": "user", "content": "hi"}]}).to_string();
    let (_, response) = send(&site, &post_request("/v1/chat/completions", &body));
    assert_error(&response, 400, "request_invalid");
    site.assert_chat_ok("sim-model");
}

#[test]
fn unknown_model_is_404_model_not_found() {
    let site = site("unknown_model");
    let body = chat("no-such-model", false).to_string();
    let (_, response) = send(&site, &post_request("/v1/chat/completions", &body));
    assert_error(&response, 404, "model_not_found");
    site.assert_chat_ok("sim-model");
}

#[test]
fn body_over_the_limit_is_413_and_closes_the_connection() {
    let site = site("too_large");
    let mut body = chat("sim-model", false);
    body["messages"][0]["content"] = json!("x".repeat(MAX_REQUEST_BYTES + 100));
    let (mut conn, response) = send(
        &site,
        &post_request_keep_alive("/v1/chat/completions", &body.to_string()),
    );
    assert_error(&response, 413, "request_too_large");
    assert!(conn.closed_by_peer(), "connection left open after 413");
    site.assert_chat_ok("sim-model");
}

#[test]
fn head_over_64_kib_is_431() {
    let site = site("huge_header");
    let raw = format!(
        "GET /v1/models HTTP/1.1\r\nhost: test\r\nx-big: {}\r\n\r\n",
        "a".repeat(70 * 1024)
    );
    let (_, response) = send(&site, raw.as_bytes());
    assert_eq!(response.status, 431, "{}", response.text());
    site.assert_chat_ok("sim-model");
}

#[test]
fn more_than_100_headers_is_431() {
    let site = site("many_headers");
    let mut raw = String::from("GET /v1/models HTTP/1.1\r\nhost: test\r\n");
    for i in 0..120 {
        raw.push_str(&format!("x-h{i}: v\r\n"));
    }
    raw.push_str("\r\n");
    let (_, response) = send(&site, raw.as_bytes());
    assert_eq!(response.status, 431, "{}", response.text());
    site.assert_chat_ok("sim-model");
}

#[test]
fn unknown_path_is_404_not_found() {
    let site = site("unknown_path");
    let (_, response) = send(&site, &common::get_request("/v1/nothing-here"));
    assert_error(&response, 404, "not_found");
    site.assert_chat_ok("sim-model");
}

#[test]
fn wrong_method_is_405() {
    let site = site("wrong_method");
    let (_, response) = send(&site, &common::get_request("/v1/chat/completions"));
    assert_error(&response, 405, "method_not_allowed");
    site.assert_chat_ok("sim-model");
}

#[test]
fn stall_mid_head_is_408_or_close() {
    let site = site("stall_head");
    let mut conn = Conn::connect(site.http);
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-le")
        .unwrap();
    // Past the 2 s header timeout the router must answer 408 or hang up; never wait forever
    // (the client's read timeout turns a hang into a failure).
    match conn.read_response() {
        Ok(response) => {
            assert_error(&response, 408, "request_timeout");
            assert!(conn.closed_by_peer(), "connection left open after 408");
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}"),
    }
    site.assert_chat_ok("sim-model");
}

#[test]
fn stall_mid_body_is_408() {
    let site = site("stall_body");
    let mut conn = Conn::connect(site.http);
    conn.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":",
    )
    .unwrap();
    let response = conn
        .read_response()
        .unwrap_or_else(|e| panic!("no 408 for a stalled body: {e}\n{}", site.logs()));
    assert_error(&response, 408, "request_timeout");
    assert!(conn.closed_by_peer(), "connection left open after 408");
    site.assert_chat_ok("sim-model");
}

#[test]
fn chunked_request_body_is_accepted() {
    let site = site("chunked_body");
    let body = chat("sim-model", false).to_string();
    let (first, second) = body.split_at(body.len() / 2);
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{first}\r\n{:x};ext=1\r\n{second}\r\n0\r\n\r\n",
        first.len(),
        second.len()
    );
    let mut conn = Conn::connect(site.http);
    // In two writes with a pause, so the body really arrives in pieces.
    let split = raw.len() / 2;
    conn.send(&raw.as_bytes()[..split]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    conn.send(&raw.as_bytes()[split..]).unwrap();
    let response = conn.read_response().unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["object"], "chat.completion");
    site.assert_chat_ok("sim-model");
}

fn chat_with_max_tokens(max_tokens: u64) -> String {
    let mut body = chat("sim-model", false);
    body["max_tokens"] = json!(max_tokens);
    body.to_string()
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let site = site("pipelined");
    let mut raw = Vec::new();
    raw.extend(post_request_keep_alive(
        "/v1/chat/completions",
        &chat_with_max_tokens(3),
    ));
    raw.extend(b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n");
    raw.extend(post_request_keep_alive(
        "/v1/chat/completions",
        &chat_with_max_tokens(1),
    ));
    raw.extend(b"GET /nope HTTP/1.1\r\nhost: test\r\n\r\n");
    raw.extend(post_request(
        "/v1/chat/completions",
        &chat_with_max_tokens(2),
    ));
    let mut conn = Conn::connect(site.http);
    conn.send(&raw).unwrap();

    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(conn.read_response().unwrap_or_else(|e| {
            panic!(
                "pipelined answer {} missing: {e}\n{}",
                answers.len(),
                site.logs()
            )
        }));
    }
    assert!(
        conn.closed_by_peer(),
        "connection left open after `connection: close`"
    );
    let completion_tokens = |r: &Response| r.json()["usage"]["completion_tokens"].as_u64();
    assert_eq!(answers[0].status, 200, "{}", answers[0].text());
    assert_eq!(completion_tokens(&answers[0]), Some(3));
    assert_eq!(answers[1].status, 200);
    assert_eq!(answers[1].json()["status"], "ok");
    assert_eq!(completion_tokens(&answers[2]), Some(1));
    assert_error(&answers[3], 404, "not_found");
    assert_eq!(completion_tokens(&answers[4]), Some(2));
    site.assert_chat_ok("sim-model");
}

#[test]
fn keep_alive_connection_serves_several_requests() {
    let site = site("keep_alive");
    let mut conn = Conn::connect(site.http);
    for max_tokens in 1..=3 {
        conn.send(&post_request_keep_alive(
            "/v1/chat/completions",
            &chat_with_max_tokens(max_tokens),
        ))
        .unwrap();
        let response = conn.read_response().unwrap();
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.json()["usage"]["completion_tokens"], max_tokens);
        assert_ne!(response.header("connection"), Some("close"));
    }
    // A stream on the same connection, then a plain request after it.
    let mut stream = chat("sim-model", true);
    stream["max_tokens"] = json!(2);
    conn.send(&post_request_keep_alive(
        "/v1/chat/completions",
        &stream.to_string(),
    ))
    .unwrap();
    let response = conn.read_response().unwrap();
    assert_eq!(response.status, 200);
    assert!(
        response.text().ends_with("data: [DONE]\n\n"),
        "{}",
        response.text()
    );
    conn.send(&common::get_request("/health")).unwrap();
    assert_eq!(conn.read_response().unwrap().status, 200);
    assert!(conn.closed_by_peer());
    site.assert_chat_ok("sim-model");
}

#[test]
fn expect_100_continue_invites_a_body_within_the_limit_and_refuses_one_over_it() {
    let site = site("expect_continue");
    let body = chat("sim-model", false).to_string();
    let mut conn = Conn::connect(site.http);
    conn.send(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let interim = conn.read_head().expect("interim response");
    assert_eq!(interim.status, 100);
    conn.send(body.as_bytes()).unwrap();
    let response = conn.read_response().expect("final response");
    assert_eq!(response.status, 200, "{}", response.text());

    // Over the limit: refused at once, without inviting the body.
    let mut conn = Conn::connect(site.http);
    conn.send(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
            MAX_REQUEST_BYTES + 1
        )
        .as_bytes(),
    )
    .unwrap();
    let response = conn.read_response().expect("refusal");
    assert_error(&response, 413, "request_too_large");
    site.assert_chat_ok("sim-model");
}
