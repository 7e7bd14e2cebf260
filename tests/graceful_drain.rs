//! Proves a graceful shutdown through the real binaries: on SIGTERM the router stops accepting,
//! fails `/health`, lets the requests in flight finish, and ends those still running at
//! `--drain-timeout` with an error the client can read; an agent on SIGTERM tells its routers to
//! send it nothing new and finishes its streams before it exits; and agents are back within seconds
//! of a router restart.

mod common;

use std::time::{Duration, Instant};

use common::{Conn, Options, Site, Stop, chat, post_request};

fn stream_to_end(conn: &mut Conn) -> String {
    let head = conn.read_head().expect("a response head");
    assert_eq!(head.status, 200);
    conn.read_chunked_text().expect("the stream's body")
}

fn send_json(site: &Site) -> Conn {
    let mut conn = Conn::connect(site.http);
    conn.send(&post_request(
        "/v1/chat/completions",
        &chat("sim-model", false).to_string(),
    ))
    .unwrap();
    conn
}

#[test]
fn sigterm_lets_requests_in_flight_finish_and_fails_health() {
    let mut site = Site::start(
        "drain",
        Options::new()
            .sim(&["--itl", "100ms", "--output-tokens", "20"])
            .agent(0, &["--capacity", "16"])
            .router_args(&["--drain-timeout", "20s"]),
    );
    // A keep-alive connection that will ask for /health during the drain.
    let mut probe = Conn::connect(site.http);
    probe
        .send(b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n")
        .unwrap();
    assert_eq!(probe.read_response().unwrap().status, 200);

    let mut streams: Vec<Conn> = (0..4).map(|_| site.send_chat_stream("sim-model")).collect();
    let mut jsons: Vec<Conn> = (0..2).map(|_| send_json(&site)).collect();
    // The gauge counts the streams; the JSON requests are on their way meanwhile.
    site.wait_metric("hivenet_shard_in_flight", |v| v >= 4.0);
    std::thread::sleep(Duration::from_millis(300));
    site.router.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));

    probe
        .send(b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n")
        .unwrap();
    let health = probe.read_response().unwrap();
    assert_eq!(health.status, 503, "{}", health.text());
    assert!(
        std::net::TcpStream::connect(site.http).is_err(),
        "a draining router still accepts connections"
    );

    for conn in &mut streams {
        let body = stream_to_end(conn);
        assert!(
            body.contains("[DONE]"),
            "a stream was cut by the drain: {body}"
        );
    }
    for conn in &mut jsons {
        let response = conn.read_response().unwrap();
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let status = site.router.wait_exit(Duration::from_secs(15));
    assert!(
        status.is_some_and(|status| status.success()),
        "{status:?}\n{}",
        site.router.log_tail()
    );
}

#[test]
fn the_drain_deadline_ends_what_is_left_with_an_error() {
    let mut site = Site::start(
        "drain_deadline",
        Options::new()
            .sim(&["--itl", "200ms", "--output-tokens", "100"])
            .agent(0, &["--capacity", "16"])
            .router_args(&["--drain-timeout", "1s"]),
    );
    let mut stream = site.send_chat_stream("sim-model");
    let head = stream.read_head().unwrap();
    assert_eq!(head.status, 200);
    let mut json = send_json(&site);
    std::thread::sleep(Duration::from_millis(300));
    let terminated = Instant::now();
    site.router.signal("TERM");

    let body = stream
        .read_chunked_text()
        .expect("the stream ends with its last chunk");
    assert!(
        body.contains("shutting down") && !body.contains("[DONE]"),
        "no error event at the drain deadline: {body}"
    );
    let response = json.read_response().unwrap();
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(response.error_code(), "no_capacity");
    let status = site.router.wait_exit(Duration::from_secs(10));
    assert!(
        status.is_some_and(|status| status.success()),
        "{status:?}\n{}",
        site.router.log_tail()
    );
    eprintln!("router gone {:?} after SIGTERM", terminated.elapsed());
}

#[test]
fn an_agent_on_sigterm_finishes_its_streams_and_gets_nothing_new() {
    let mut site = Site::start(
        "agent_drain",
        Options::new()
            .sim(&["--itl", "100ms", "--output-tokens", "30"])
            .agent(0, &["--capacity", "16", "--drain-timeout", "20s"])
            .agent(0, &["--capacity", "16"]),
    );
    let mut streams: Vec<Conn> = (0..6).map(|_| site.send_chat_stream("sim-model")).collect();
    // The gauge counts the streams; the JSON requests are on their way meanwhile.
    site.wait_metric("hivenet_shard_in_flight", |v| v >= 4.0);
    std::thread::sleep(Duration::from_millis(300));
    site.agents[0].signal("TERM");
    site.wait_for("the router to hear the agent is leaving", || {
        site.router
            .log_text()
            .contains("agent is shutting down")
            .then_some(())
    });
    // New requests go to the other agent meanwhile.
    for _ in 0..4 {
        site.assert_chat_ok("sim-model");
    }
    for conn in &mut streams {
        let body = stream_to_end(conn);
        assert!(
            body.contains("[DONE]"),
            "a stream was cut by the agent's drain: {body}"
        );
    }
    let status = site.agents[0].wait_exit(Duration::from_secs(15));
    assert!(
        status.is_some_and(|status| status.success()),
        "{status:?}\n{}",
        site.agents[0].log_tail()
    );
}

#[test]
fn agents_are_back_within_seconds_of_a_router_restart() {
    let mut site = Site::start(
        "rejoin_speed",
        Options::new().sim(&[]).agent(0, &["--capacity", "4"]),
    );
    site.router.kill();
    // Long enough for the agents' backoff to grow over several failed attempts.
    std::thread::sleep(Duration::from_secs(6));
    let restarted = Instant::now();
    site.restart_router(Stop::Kill, &[]);
    let back = restarted.elapsed();
    eprintln!("agent back {back:?} after the router restarted");
    // Sessions reconnect with backoff from 1 s to 30 s with jitter (seed, run-several-routers,
    // "Connect agents to every router"): attempts at about 1, 3 and 7 s after the loss, so after
    // 6 s down the next attempt is at most 8 s × 1.2 away.
    assert!(
        back < Duration::from_secs(12),
        "agents took {back:?} to rejoin"
    );
    site.assert_chat_ok("sim-model");
}
