//! A connection's reader waits for its second request, and for every request once it has carried
//! an answer streaming for a while (it is quiet), holding no read buffer: a one-byte read first.
//! These prove, through the real router, agent and sim, that such a wait still notices the client
//! leaving mid-stream and that the requests after it are still read whole, however large.

mod common;

use std::net::Shutdown;

use common::{Conn, Options, Site, chat, post_request, post_request_keep_alive};

/// A token a second: the stream waits long between two writes, so a client that leaves is
/// noticed by the reader (its one-byte read ending), not by the next write failing.
fn site(name: &str) -> Site {
    Site::start(
        name,
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--ttft",
                "0ms",
                "--itl",
                "1s",
                "--output-tokens",
                "30",
            ])
            .agent(0, &["--capacity", "1"]),
    )
}

/// Makes `conn` quiet: a keep-alive stream of three tokens a second apart, read to its end. The
/// router's wait for the third token comes a second after its first wait, past `QUIET_AFTER`.
fn make_quiet(conn: &mut Conn) {
    let mut stream = chat("sim-model", true);
    stream["max_tokens"] = 3.into();
    conn.send(&post_request_keep_alive(
        "/v1/chat/completions",
        &stream.to_string(),
    ))
    .unwrap();
    let response = conn.read_response().unwrap();
    assert_eq!(response.status, 200);
    assert!(String::from_utf8_lossy(&response.body).contains("[DONE]"));
}

/// The tokens the sim has generated (after the first), from its inter-token histogram.
fn later_tokens(site: &Site) -> f64 {
    site.sim_metric(0, "vllm:inter_token_latency_seconds_count")
}

/// Streams on a connection (made quiet first, or new), leaves the stream after its first token
/// and checks the sim stopped before its next.
fn leaving_a_stream_cancels_it(name: &str, quiet: bool, request: fn(&str, &str) -> Vec<u8>) {
    let site = site(name);
    let mut conn = Conn::connect(site.http);
    if quiet {
        make_quiet(&mut conn);
    }
    conn.send(&request(
        "/v1/chat/completions",
        &chat("sim-model", true).to_string(),
    ))
    .unwrap();
    assert_eq!(conn.read_head().unwrap().status, 200);
    conn.read_chunk().unwrap().expect("role chunk");
    conn.read_chunk().unwrap().expect("first token");
    let tokens = later_tokens(&site);
    let _ = conn.stream.shutdown(Shutdown::Both);
    drop(conn);
    site.wait_sim_metric(0, "sim_cancelled_total", |v| v >= 1.0);
    // Cancelled before the sim's next token (a second away): the reader noticed the client
    // leave; a write failing on that token would have let the sim generate it first.
    assert_eq!(later_tokens(&site), tokens, "{}", site.logs());
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
    site.wait_sim_metric(0, "sim_in_flight", |v| v == 0.0);
    assert!(site.router_metric("hivenet_shard_client_disconnects_total") >= 1.0);
    // Capacity 1: the next stream gets the slot only if the one that was left gave it back.
    let mut conn = site.send_chat_stream("sim-model");
    assert_eq!(conn.read_head().unwrap().status, 200);
    conn.read_chunk().unwrap().expect("role chunk");
}

#[test]
fn a_keep_alive_client_leaving_a_quiet_stream_cancels_it_at_the_backend() {
    leaving_a_stream_cancels_it("quiet_leave_keep_alive", true, post_request_keep_alive);
}

#[test]
fn a_connection_close_client_leaving_a_quiet_stream_cancels_it_at_the_backend() {
    leaving_a_stream_cancels_it("quiet_leave_close", true, post_request);
}

/// A new connection's first request is read with a buffer; the wait for its second takes none,
/// so the client leaving its first stream is noticed by a one-byte read.
#[test]
fn a_client_leaving_the_first_stream_of_its_connection_cancels_it_at_the_backend() {
    leaving_a_stream_cancels_it("quiet_leave_first", false, post_request_keep_alive);
}

#[test]
fn a_quiet_connection_reads_its_next_requests_whole() {
    let site = site("quiet_next_requests");
    let mut conn = Conn::connect(site.http);
    make_quiet(&mut conn);

    // A prompt larger than a read between requests takes (4 KiB), then a small one, each read
    // by the quiet connection from its first byte on; both must arrive whole to be answered.
    for words in [3_000, 2] {
        let mut request = chat("sim-model", false);
        request["messages"][0]["content"] = "word ".repeat(words).into();
        request["max_tokens"] = 2.into();
        conn.send(&post_request_keep_alive(
            "/v1/chat/completions",
            &request.to_string(),
        ))
        .unwrap();
        let response = conn.read_response().unwrap();
        let body = String::from_utf8_lossy(&response.body);
        assert_eq!(response.status, 200, "{body}\n{}", site.logs());
        let value: serde_json::Value = serde_json::from_str(&body).expect("chat JSON");
        assert_eq!(value["object"], "chat.completion", "{body}");
    }
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 3.0);
}

/// A client that sends the first byte of its next request and stalls is answered 408, as one
/// that stalls later in the head is: the byte the one-byte read took is part of the request.
#[test]
fn a_stall_after_the_first_byte_of_the_next_request_is_408() {
    let site = Site::start(
        "quiet_stall",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .router_args(&["--client-header-timeout", "2s"])
            .agent(0, &["--capacity", "1"]),
    );
    let mut conn = Conn::connect(site.http);
    conn.send(&post_request_keep_alive(
        "/v1/chat/completions",
        &chat("sim-model", false).to_string(),
    ))
    .unwrap();
    assert_eq!(conn.read_response().unwrap().status, 200);
    conn.send(b"P").unwrap();
    let response = conn
        .read_response()
        .unwrap_or_else(|e| panic!("no 408 for a stall after one byte: {e}\n{}", site.logs()));
    assert_eq!(response.status, 408, "{}", response.text());
    assert_eq!(response.json()["error"]["code"], "request_timeout");
}

/// `--client-header-timeout` is how long a connection may stay idle between requests: counted
/// from when its answer ends, not from when its request was read. A stream that outlasts it
/// leaves the connection open for the client's next request.
#[test]
fn a_stream_longer_than_the_idle_timeout_leaves_its_connection_open() {
    let site = Site::start(
        "quiet_long_stream",
        Options::new()
            .sim(&["--models", "sim-model", "--ttft", "0ms", "--itl", "1s"])
            .router_args(&["--client-header-timeout", "2s"])
            .agent(0, &["--capacity", "1"]),
    );
    let mut conn = Conn::connect(site.http);
    for max_tokens in [5, 1] {
        let mut request = chat("sim-model", true);
        request["max_tokens"] = max_tokens.into();
        let bytes = post_request_keep_alive("/v1/chat/completions", &request.to_string());
        // The second request's head comes in two parts, as a slow client's may: its time runs
        // from its first bytes, not from the long wait before them.
        let (first, rest) = bytes.split_at(if max_tokens == 1 { 20 } else { 0 });
        conn.send(first).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        conn.send(rest).unwrap();
        let response = conn.read_response().unwrap_or_else(|e| {
            panic!(
                "the connection closed after a long stream: {e}\n{}",
                site.logs()
            )
        });
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(response.text().contains("[DONE]"), "{}", response.text());
    }
}
