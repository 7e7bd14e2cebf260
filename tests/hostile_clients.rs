//! Proves that what one hostile client does costs the router bounded memory and time and costs no
//! other client its request: credentials are refused on the head before a body is read, the bytes
//! of arriving bodies are bounded per shard, a trickled body ends at the request deadline, h2c
//! connections obey the header timeout, connections are capped per shard, and a flood of HTTP/2
//! stream resets neither reaches the agents' tunnels nor stops a well-behaved client's stream.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{Conn, Options, Site, chat, write_temp};
use sha2::{Digest, Sha256};

const KEY: &str = "sk-hostile-test-key";

fn keyed_site(name: &str, router_args: &[&str]) -> Site {
    let auth = write_temp(
        &format!("hostile-{name}-auth.yaml"),
        &format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...test\"\n      metadata:\n        name: \"tenant\"\n        owner: \"acme\"\n",
            hex::encode(Sha256::digest(KEY.as_bytes()))
        ),
    );
    let mut args = vec!["--auth-config-file", auth.as_str()];
    args.extend_from_slice(router_args);
    Site::start(
        name,
        Options::new()
            .sim(&[])
            .agent(0, &["--capacity", "8"])
            .api_key(KEY)
            .router_args(&args),
    )
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn head_with_length(key: Option<&str>, length: usize) -> Vec<u8> {
    let auth = key.map_or(String::new(), |key| {
        format!("authorization: Bearer {key}\r\n")
    });
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\n{auth}content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn a_body_without_credentials_is_refused_on_its_head_and_never_buffered() {
    let site = keyed_site("head_auth", &[]);
    let pid = site.router.pid().unwrap();
    let before = rss_kib(pid);
    // 50 connections announce 10 MB bodies and send 1 MiB of each: every one is answered 401
    // from its head, and the router holds none of those bytes.
    let chunk = vec![b'x'; 1024 * 1024];
    let mut refused = 0;
    for _ in 0..50 {
        let mut conn = Conn::connect(site.http);
        conn.send(&head_with_length(None, 10_000_000)).unwrap();
        let _ = conn.send(&chunk);
        let head = conn.read_head().expect("an answer before the body");
        assert_eq!(head.status, 401);
        refused += 1;
    }
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("{refused} refused on the head; router RSS grew {grown} KiB");
    assert!(
        grown < 32 * 1024,
        "router RSS grew {grown} KiB for bodies it refused"
    );
    // The admin API too: a large body without the admin key is refused on its head.
    let mut conn = Conn::connect(site.http);
    conn.send(
        b"PUT /admin/policy HTTP/1.1\r\nhost: test\r\ncontent-type: application/yaml\r\ncontent-length: 10000000\r\n\r\n",
    )
    .unwrap();
    let _ = conn.send(&chunk);
    let refused = conn.read_response().expect("an answer before the body");
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert_eq!(refused.error_code(), "unauthorized");
    // A keyed request with the same kind of body is served.
    let body = chat("sim-model", false).to_string();
    let mut conn = Conn::connect(site.http);
    conn.send(&head_with_length(Some(KEY), body.len())).unwrap();
    conn.send(body.as_bytes()).unwrap();
    assert_eq!(conn.read_response().unwrap().status, 200);
}

#[test]
fn arriving_bodies_are_bounded_per_shard_and_a_trickle_ends_at_the_request_deadline() {
    let site = keyed_site(
        "body_budget",
        &[
            "--shards",
            "1",
            "--max-buffered-body-bytes",
            "1000000",
            "--request-timeout",
            "3s",
            "--client-body-timeout",
            "30s",
        ],
    );
    // One body of 800 kB is arriving; a second one would pass the shard's million bytes.
    let mut first = Conn::connect(site.http);
    first.send(&head_with_length(Some(KEY), 800_000)).unwrap();
    first.send(&[b' '; 1000]).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut second = Conn::connect(site.http);
    second.send(&head_with_length(Some(KEY), 800_000)).unwrap();
    let refused = second.read_response().unwrap();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.error_code(), "queue_full");
    assert!(refused.header("retry-after").is_some());

    // The first body trickles one byte a second: it ends with 408 at the request deadline
    // (3 s), not at the 30 s gap timeout, and gives its bytes back.
    let started = Instant::now();
    let mut trickle = first.stream.try_clone().unwrap();
    let trickler = std::thread::spawn(move || {
        while trickle.write_all(b" ").is_ok() && started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let timed_out = first
        .read_response()
        .expect("an answer to the trickled body");
    assert_eq!(timed_out.status, 408, "{}", timed_out.text());
    let ended = started.elapsed();
    eprintln!("trickled body ended after {ended:?}");
    assert!(ended < Duration::from_secs(15), "{ended:?}");
    drop(first);
    let _ = trickler.join();
    let mut third = Conn::connect(site.http);
    let body = chat("sim-model", false).to_string();
    third
        .send(&head_with_length(Some(KEY), body.len()))
        .unwrap();
    third.send(body.as_bytes()).unwrap();
    assert_eq!(third.read_response().unwrap().status, 200);
}

/// Reads until the peer closes or `within` passes; true when it closed.
fn closes_within(socket: &mut TcpStream, within: Duration) -> bool {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < within {
        match socket.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

#[test]
fn h2c_connections_obey_the_header_timeout_and_connections_are_capped() {
    let site = keyed_site(
        "h2c_timeouts",
        &[
            "--shards",
            "1",
            "--client-header-timeout",
            "1s",
            "--max-client-connections",
            "4",
        ],
    );
    // A bare preface.
    let mut bare = TcpStream::connect(site.http).unwrap();
    bare.write_all(PREFACE).unwrap();
    // HEADERS (stream 1) without END_HEADERS, and no CONTINUATION ever.
    let mut unfinished = TcpStream::connect(site.http).unwrap();
    unfinished.write_all(PREFACE).unwrap();
    unfinished.write_all(SETTINGS).unwrap();
    let block = [0x83u8, 0x86, 0x84]; // :method POST, :scheme http, :path /
    let mut headers = vec![0, 0, block.len() as u8, 1, 0x0, 0, 0, 0, 1];
    headers.extend_from_slice(&block);
    unfinished.write_all(&headers).unwrap();
    // Two idle HTTP/1.1 connections fill the shard's four places.
    let _idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(site.http).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = Conn::connect(site.http);
    let refused = over.read_response().unwrap();
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.error_code(), "queue_full");

    assert!(
        closes_within(&mut bare, Duration::from_secs(10)),
        "a bare h2c preface stayed open"
    );
    assert!(
        closes_within(&mut unfinished, Duration::from_secs(10)),
        "unfinished h2c HEADERS stayed open"
    );
}

/// How a flooding connection resets its streams.
#[derive(Clone, Copy)]
enum Flood {
    /// HEADERS, DATA and RST_STREAM back to back (the reset may beat the forward).
    Instant,
    /// After the response head: the request is on an agent's tunnel when it is reset.
    AfterHead,
}

/// One h2c connection from `source` that opens `streams` chat requests, one after another, and
/// resets each. Returns how many it reset before the router closed the connection.
async fn reset_flood(router: SocketAddr, source: [u8; 4], streams: usize, flood: Flood) -> usize {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind a loopback source address");
    let Ok(stream) = socket.connect(router).await else {
        return 0;
    };
    let Ok((send, connection)) = h2::client::handshake(stream).await else {
        return 0;
    };
    tokio::spawn(connection);
    let body = bytes::Bytes::from(chat("sim-model", true).to_string());
    let mut reset = 0;
    for _ in 0..streams {
        let Ok(mut ready) = send.clone().ready().await else {
            break;
        };
        let request = http::Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let Ok((response, mut outbound)) = ready.send_request(request, false) else {
            break;
        };
        if outbound.send_data(body.clone(), true).is_err() {
            break;
        }
        if let Flood::AfterHead = flood {
            match tokio::time::timeout(Duration::from_secs(10), response).await {
                Ok(Ok(_head)) => {}
                _ => break,
            }
        }
        outbound.send_reset(h2::Reason::CANCEL);
        reset += 1;
    }
    reset
}

#[test]
fn a_reset_flood_costs_no_other_client_its_stream_and_its_source_is_refused() {
    let mut site = Site::start(
        "reset_flood",
        Options::new()
            .sim(&["--itl", "20ms", "--output-tokens", "100"])
            .agent(0, &["--capacity", "64"])
            .agent(0, &["--capacity", "64"]),
    );
    let tunnels = site.router_metric("hivenet_shard_tunnels_open");
    // A well-behaved client's stream runs through the flood.
    let mut victim = site.send_chat_stream("sim-model");
    let head = victim.read_head().unwrap();
    assert_eq!(head.status, 200);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = site.http;
    let resets: usize = runtime.block_on(async {
        let floods: Vec<_> = (0..100)
            .map(|index| {
                let flood = if index % 2 == 0 {
                    Flood::Instant
                } else {
                    Flood::AfterHead
                };
                tokio::spawn(reset_flood(http, [127, 0, 0, 2], 20, flood))
            })
            .collect();
        let mut total = 0;
        for flood in floods {
            total += flood.await.unwrap_or(0);
        }
        total
    });
    eprintln!("{resets} streams reset by the flood");

    let events = victim
        .read_chunked_text()
        .unwrap_or_else(|error| panic!("the victim's stream broke: {error}\n{}", site.logs()));
    assert!(
        events.contains("[DONE]") && !events.contains("\"error\""),
        "the victim's stream did not complete: {events}"
    );
    let logs = site.router.log_text();
    assert!(
        !logs.contains("agent left the routing pool"),
        "the flood took an agent out of the pool\n{}",
        site.logs()
    );
    assert_eq!(site.router_metric("hivenet_shard_tunnels_open"), tunnels);
    for agent in &mut site.agents {
        assert!(
            !agent.log_text().contains("too_many_resets") && !agent.exited(),
            "{}",
            agent.log_tail()
        );
    }
    // The flooding address is refused for a while; everyone else is served.
    let refused = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from(([127, 0, 0, 2], 0))).unwrap();
        let mut stream = socket.connect(http).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    });
    assert!(
        refused.starts_with("HTTP/1.1 429") && refused.contains("rate_limit_exceeded"),
        "{refused}"
    );
    site.assert_chat_ok("sim-model");
}
