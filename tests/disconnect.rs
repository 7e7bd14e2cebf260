//! Proves that a client dropping its socket mid-stream (or while its request waits for the first
//! token) cancels the request all the way to the backend and frees the agent's slot.

mod common;

use std::net::Shutdown;

use common::{Conn, Options, Site, chat, post_request, post_request_keep_alive};

fn site(name: &str, sim_args: &[&str]) -> Site {
    let mut args = vec!["--models", "sim-model"];
    args.extend_from_slice(sim_args);
    Site::start(
        name,
        Options::new().sim(&args).agent(0, &["--capacity", "1"]),
    )
}

fn assert_cancelled_and_freed(site: &Site) {
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
    site.wait_sim_metric(0, "sim_cancelled_total", |v| v >= 1.0);
    site.wait_sim_metric(0, "sim_in_flight", |v| v == 0.0);
    assert!(site.router_metric("hivenet_shard_client_disconnects_total") >= 1.0);
    // Capacity 1: a new request is granted the slot only if the dropped one gave it back. A
    // stream shows that at once (the sim sends its role chunk before its time to first token).
    let mut conn = site.send_chat_stream("sim-model");
    let head = conn.read_head().unwrap();
    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&head.raw));
    let first = conn.read_chunk().unwrap().expect("role chunk");
    assert!(String::from_utf8_lossy(&first).contains("\"role\":\"assistant\""));
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 2.0);
}

#[test]
fn dropping_a_slow_stream_cancels_it_at_the_backend() {
    let site = site(
        "disconnect_stream",
        &["--itl", "200ms", "--output-tokens", "100"],
    );
    let mut conn = site.send_chat_stream("sim-model");
    assert_eq!(conn.read_head().unwrap().status, 200);
    conn.read_chunk().unwrap().expect("first chunk");
    site.wait_metric("hivenet_shard_in_flight", |v| v == 1.0);
    let _ = conn.stream.shutdown(Shutdown::Both);
    drop(conn);
    assert_cancelled_and_freed(&site);
}

/// Sends a non-streamed request to a sim that takes 30 s to its first token, waits until the sim
/// has it, then drops the connection.
fn drop_while_waiting_for_the_head(site: &Site, request: &[u8]) {
    let mut conn = Conn::connect(site.http);
    conn.send(request).unwrap();
    site.wait_sim_metric(0, "sim_in_flight", |v| v == 1.0);
    let _ = conn.stream.shutdown(Shutdown::Both);
    drop(conn);
}

#[test]
fn dropping_a_keep_alive_request_waiting_for_its_answer_cancels_it_at_the_backend() {
    let site = site("disconnect_waiting_keep_alive", &["--ttft", "30s"]);
    let body = chat("sim-model", false).to_string();
    drop_while_waiting_for_the_head(
        &site,
        &post_request_keep_alive("/v1/chat/completions", &body),
    );
    assert_cancelled_and_freed(&site);
}

#[test]
fn dropping_a_connection_close_request_waiting_for_its_answer_cancels_it_at_the_backend() {
    let site = site("disconnect_waiting_close", &["--ttft", "30s"]);
    let body = chat("sim-model", false).to_string();
    drop_while_waiting_for_the_head(&site, &post_request("/v1/chat/completions", &body));
    assert_cancelled_and_freed(&site);
}

/// A request queued behind a busy slot whose client leaves must not take the slot later.
fn drop_a_queued_request(name: &str, request: fn(&str, &str) -> Vec<u8>) {
    let site = site(name, &["--itl", "100ms", "--output-tokens", "20"]);
    let mut holder = Conn::connect(site.http);
    holder
        .send(&post_request(
            "/v1/chat/completions",
            &chat("sim-model", true).to_string(),
        ))
        .unwrap();
    assert_eq!(holder.read_head().unwrap().status, 200);
    site.wait_sim_metric(0, "sim_in_flight", |v| v == 1.0);

    let mut queued = Conn::connect(site.http);
    let body = chat("sim-model", false).to_string();
    queued
        .send(&request("/v1/chat/completions", &body))
        .unwrap();
    site.wait_metric("hivenet_shard_queued_total", |v| v >= 1.0);
    let _ = queued.stream.shutdown(Shutdown::Both);
    drop(queued);
    site.wait_metric("hivenet_shard_client_disconnects_total", |v| v >= 1.0);

    while holder.read_chunk().unwrap().is_some() {}
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
    site.assert_chat_ok("sim-model");
    // The holder and the follow-up reached the sim; the dropped request never did.
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 2.0);
}

#[test]
fn dropping_a_queued_keep_alive_request_leaves_the_queue_and_takes_no_slot() {
    drop_a_queued_request("disconnect_queued_keep_alive", post_request_keep_alive);
}

#[test]
fn dropping_a_queued_connection_close_request_leaves_the_queue_and_takes_no_slot() {
    drop_a_queued_request("disconnect_queued_close", post_request);
}
