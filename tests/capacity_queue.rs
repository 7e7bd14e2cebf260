//! Proves the per-model capacity queue: with the only agent full, a request waits and succeeds
//! once the slot frees, is refused at once (503 no_capacity) when queues are disabled, and gets
//! 504 request_timeout when it waits past the request timeout; the queue metrics count both and
//! time both waits (`hivenet_queue_wait_seconds`).

mod common;

use common::{Conn, Options, Site, chat, post_request};

/// A sim whose streams take about two seconds, behind an agent with capacity 1.
fn site(name: &str, router_args: &[&str]) -> Site {
    Site::start(
        name,
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--itl",
                "200ms",
                "--output-tokens",
                "10",
            ])
            .router_args(router_args)
            .agent(0, &["--capacity", "1"]),
    )
}

/// Opens a stream that holds the agent's only slot until it is read to the end.
fn hold_the_slot(site: &Site) -> Conn {
    let mut conn = site.send_chat_stream("sim-model");
    let head = conn.read_head().expect("head of the slot holder");
    assert_eq!(head.status, 200);
    site.wait_sim_metric(0, "sim_in_flight", |v| v == 1.0);
    conn
}

fn finish_stream(conn: &mut Conn) -> String {
    let mut body = Vec::new();
    while let Some(chunk) = conn.read_chunk().expect("slot holder's stream") {
        body.extend_from_slice(&chunk);
    }
    let body = String::from_utf8(body).unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    body
}

#[test]
fn second_request_waits_for_the_slot_and_succeeds() {
    let site = site("queue_waits", &[]);
    let mut holder = hold_the_slot(&site);
    std::thread::scope(|scope| {
        let waiter =
            scope.spawn(|| site.post_json("/v1/chat/completions", &chat("sim-model", false)));
        site.wait_metric("hivenet_shard_queued_total", |v| v >= 1.0);
        site.wait_metric("hivenet_queue_depth", |v| v == 1.0);
        // While the waiter is queued the sim still sees only the holder.
        assert_eq!(site.sim_metric(0, "sim_in_flight"), 1.0);
        finish_stream(&mut holder);
        let (status, _, body) = waiter.join().unwrap();
        assert_eq!(status, 200, "{body}\n{}", site.logs());
    });
    assert!(
        site.router_metrics()
            .contains("hivenet_queue_depth{model=\"sim-model\"} 0"),
        "{}",
        site.router_metrics()
    );
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 2.0);
    assert_eq!(
        site.router_metric("hivenet_shard_queue_timeouts_total"),
        0.0
    );
    // The waiter's time in the queue is observed once, when it got the slot; the holder never
    // queued.
    site.wait_metric("hivenet_queue_wait_seconds_count", |v| v == 1.0);
    assert!(site.router_metric("hivenet_queue_wait_seconds_sum") > 0.0);
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
}

#[test]
fn queue_depth_zero_refuses_with_no_capacity() {
    let site = site("queue_depth_zero", &["--queue-depth", "0"]);
    let mut holder = hold_the_slot(&site);
    let (status, _, body) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert_eq!(status, 503, "{body}");
    let value: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(value["error"]["code"], "no_capacity", "{body}");
    finish_stream(&mut holder);
    // The refusal took nothing: the next request gets the freed slot.
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
    site.assert_chat_ok("sim-model");
}

#[test]
fn queued_request_past_the_request_timeout_gets_504() {
    let site = site("queue_timeout", &["--request-timeout", "500ms"]);
    let mut holder = hold_the_slot(&site);
    let (status, _, body) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert_eq!(status, 504, "{body}");
    let value: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(value["error"]["code"], "request_timeout", "{body}");
    assert!(site.router_metric("hivenet_shard_queued_total") >= 1.0);
    site.wait_metric("hivenet_shard_queue_timeouts_total", |v| v == 1.0);
    // A ticket that timed out in the queue waited there until its deadline (500 ms after it
    // arrived, less the moment it took to reach the queue).
    site.wait_metric("hivenet_queue_wait_seconds_count", |v| v == 1.0);
    let waited = site.router_metric("hivenet_queue_wait_seconds_sum");
    assert!(waited >= 0.3, "waited {waited} s");
    // The holder is a stream whose head came in time: the timeout does not cut it.
    finish_stream(&mut holder);
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 1.0);
}

#[test]
fn full_model_queue_refuses_with_no_capacity() {
    let site = site("queue_full", &["--queue-depth", "1"]);
    let mut holder = hold_the_slot(&site);
    std::thread::scope(|scope| {
        let waiter =
            scope.spawn(|| site.post_json("/v1/chat/completions", &chat("sim-model", false)));
        site.wait_metric("hivenet_shard_queued_total", |v| v >= 1.0);
        let (status, _, body) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
        assert_eq!(status, 503, "{body}");
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["error"]["code"], "no_capacity", "{body}");
        finish_stream(&mut holder);
        let (status, _, body) = waiter.join().unwrap();
        assert_eq!(status, 200, "{body}");
    });
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 2.0);
}

/// A queued client that leaves gives its queue place back at once: with a queue of one, the next
/// request queues (and is served) instead of being refused for a place held by nobody.
#[test]
fn a_queued_client_that_leaves_frees_its_queue_place() {
    let site = site("queue_place_freed", &["--queue-depth", "1"]);
    let mut holder = hold_the_slot(&site);
    let mut leaver = Conn::connect(site.http);
    leaver
        .send(&post_request(
            "/v1/chat/completions",
            &chat("sim-model", false).to_string(),
        ))
        .unwrap();
    site.wait_metric("hivenet_shard_queued_total", |v| v >= 1.0);
    drop(leaver);
    site.wait_metric("hivenet_shard_client_disconnects_total", |v| v >= 1.0);
    std::thread::scope(|scope| {
        let next =
            scope.spawn(|| site.post_json("/v1/chat/completions", &chat("sim-model", false)));
        site.wait_metric("hivenet_shard_queued_total", |v| v >= 2.0);
        finish_stream(&mut holder);
        let (status, _, body) = next.join().unwrap();
        assert_eq!(status, 200, "{body}\n{}", site.logs());
    });
    // Only the holder and the next request reached the engine.
    assert_eq!(site.sim_metric(0, "sim_requests_total"), 2.0);
}
