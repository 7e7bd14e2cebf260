//! Proves on the real router (two shards) that a client connection moves to the shard that owns
//! its key (`shard::handoff`): every request of a keep-alive connection, JSON and streamed, is
//! served by the key's owner whichever shard the kernel gave the connection to, each connection
//! that landed elsewhere is counted once in `hivenet_shard_connections_handed_off_total`, and
//! the open-connections gauge follows it. With `HIVENET_ROUTER_CONNECTION_HANDOFF=off`
//! connections stay where they landed.

mod common;

use std::path::PathBuf;

use common::{Conn, Options, Site, chat, metric_sum};
use sha2::{Digest, Sha256};

const PROBE_KEY: &str = "sk-handoff-probe";
const SHARDS: usize = 2;
const CONNECTIONS: usize = 6;
const REQUESTS_EACH: usize = 3;

/// An owner name whose tenant is owned by `shard` of [`SHARDS`].
fn owner_on(shard: usize) -> String {
    common::owner_on(shard, SHARDS)
}

fn key_for(shard: usize) -> String {
    format!("sk-handoff-shard-{shard}")
}

fn auth_file(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-handoff")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...probe\"\n      metadata:\n        name: \"probe\"\n        owner: \"probe\"\n",
        hex::encode(Sha256::digest(PROBE_KEY.as_bytes()))
    );
    for shard in 0..SHARDS {
        text.push_str(&format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...{shard}\"\n      metadata:\n        name: \"on-{shard}\"\n        owner: \"{}\"\n      quota:\n        requests_per_minute: 6000\n",
            hex::encode(Sha256::digest(key_for(shard).as_bytes())),
            owner_on(shard),
        ));
    }
    let path = dir.join("auth.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A site of one router with `SHARDS` shards; `handoff` empty: the router's default.
fn start(name: &str, handoff: &str, driver: &str) -> Site {
    let auth = auth_file(name);
    let mut options = Options::new()
        .sim(&["--models", "sim-model"])
        .agent(0, &["--capacity", "64"])
        .api_key(PROBE_KEY)
        .router_env("HIVENET_ROUTER_IO_DRIVER", driver)
        .router_args(&[
            "--auth-config-file",
            auth.to_str().unwrap(),
            "--shards",
            &SHARDS.to_string(),
        ]);
    if !handoff.is_empty() {
        options = options.router_env("HIVENET_ROUTER_CONNECTION_HANDOFF", handoff);
    }
    Site::start(name, options)
}

fn by_shard(site: &Site, name: &str) -> Vec<f64> {
    let metrics = site.router_metrics();
    (0..SHARDS)
        .map(|shard| metric_sum(&metrics, name, &[("shard", &shard.to_string())]))
        .collect()
}

fn chat_request(key: &str, stream: bool) -> Vec<u8> {
    let body = chat("sim-model", stream).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What one run of [`CONNECTIONS`] keep-alive connections saw, each connection's key owned by
/// shard `i % SHARDS`.
struct Run {
    /// The shard that accepted each connection, and the key's owner.
    placements: Vec<(usize, usize)>,
    /// `hivenet_shard_requests_total` added on each shard.
    requests: Vec<f64>,
    handed_off: Vec<f64>,
    /// The connections, still open.
    _open: Vec<Conn>,
}

/// Opens the connections one after the other (so each one's accepting shard shows in the
/// accept counters) and sends each [`REQUESTS_EACH`] requests, the second one streamed, all on
/// the same connection.
fn run(site: &Site) -> Run {
    let requests_before = by_shard(site, "hivenet_shard_requests_total");
    let handed_before = by_shard(site, "hivenet_shard_connections_handed_off_total");
    let mut placements = Vec::new();
    let mut open = Vec::new();
    for index in 0..CONNECTIONS {
        let owner = index % SHARDS;
        let key = key_for(owner);
        let accepted_before = by_shard(site, "hivenet_shard_connections_accepted_total");
        let mut conn = Conn::connect(site.http);
        for request in 0..REQUESTS_EACH {
            let stream = request == 1;
            conn.send(&chat_request(&key, stream)).unwrap();
            let response = conn.read_response().unwrap();
            assert_eq!(response.status, 200, "{}", response.text());
            if stream {
                assert!(
                    response.text().contains("data: [DONE]"),
                    "{}",
                    response.text()
                );
            } else {
                assert!(response.json()["choices"][0]["message"]["content"].is_string());
            }
        }
        let accepted_after = by_shard(site, "hivenet_shard_connections_accepted_total");
        let front = (0..SHARDS)
            .find(|&shard| accepted_after[shard] > accepted_before[shard])
            .expect("one shard accepted the connection");
        placements.push((front, owner));
        // Kept open: the next connections are placed against this one's load.
        open.push(conn);
    }
    let requests_after = by_shard(site, "hivenet_shard_requests_total");
    let handed_after = by_shard(site, "hivenet_shard_connections_handed_off_total");
    Run {
        placements,
        requests: (0..SHARDS)
            .map(|shard| requests_after[shard] - requests_before[shard])
            .collect(),
        handed_off: (0..SHARDS)
            .map(|shard| handed_after[shard] - handed_before[shard])
            .collect(),
        _open: open,
    }
}

#[test]
fn a_keep_alive_connection_is_served_by_the_shard_that_owns_its_key() {
    // The router's defaults: handoff on, and the io_uring driver where the kernel allows it.
    served_by_the_keys_owner(&start("handoff-default", "", ""));
}

/// The socket leaves the giver's epoll set and joins the owner's (`front::handoff::into_std`).
#[test]
fn with_epoll_a_keep_alive_connection_is_served_by_the_shard_that_owns_its_key() {
    served_by_the_keys_owner(&start("handoff-epoll", "on", "epoll"));
}

fn served_by_the_keys_owner(site: &Site) {
    let run = run(site);
    // Every request on the key's owner, whichever shard accepted its connection.
    let per_owner = (CONNECTIONS / SHARDS * REQUESTS_EACH) as f64;
    assert_eq!(
        run.requests,
        vec![per_owner; SHARDS],
        "{:?}",
        run.placements
    );
    // Each connection that landed on the other shard moved once, counted by the shard that
    // gave it.
    for shard in 0..SHARDS {
        let landed_here_owned_elsewhere = run
            .placements
            .iter()
            .filter(|(front, owner)| *front == shard && *owner != shard)
            .count() as f64;
        assert_eq!(
            run.handed_off[shard], landed_here_owned_elsewhere,
            "shard {shard}: {:?}",
            run.placements
        );
    }
    // A connection whose first request's key has no limit stays where it landed: nothing to
    // visit on the key's owner.
    let handed_before = by_shard(site, "hivenet_shard_connections_handed_off_total");
    let mut probe = Conn::connect(site.http);
    probe.send(&chat_request(PROBE_KEY, false)).unwrap();
    assert_eq!(probe.read_response().unwrap().status, 200);
    assert_eq!(
        by_shard(site, "hivenet_shard_connections_handed_off_total"),
        handed_before
    );
    drop(probe);
    // The open gauge followed the connections to their owners (the harness's own connections,
    // closed before, may take a moment to leave it).
    let half = vec![(CONNECTIONS / SHARDS) as f64; SHARDS];
    site.wait_for("the open connections on their keys' owners", || {
        (by_shard(site, "hivenet_shard_connections_open") == half).then_some(())
    });
}

#[test]
fn switched_off_a_connection_stays_where_it_landed() {
    let site = start("handoff-off", "off", "");
    let run = run(&site);
    assert_eq!(run.handed_off, vec![0.0; SHARDS]);
    for shard in 0..SHARDS {
        let landed_here = run
            .placements
            .iter()
            .filter(|(front, _)| *front == shard)
            .count();
        assert_eq!(
            run.requests[shard],
            (landed_here * REQUESTS_EACH) as f64,
            "shard {shard}: {:?}",
            run.placements
        );
    }
}

/// A client that opens many connections at once with one key: the shard that accepted some of
/// them gives the owner only as many as keep the owner within the slack, though the owner has
/// taken none of them yet when the giver decides (`handoff::Loads` counts them on their way; it
/// gave 56 of 64 when it did not).
#[test]
fn a_burst_of_connections_with_one_key_leaves_the_shards_within_the_slack() {
    const BURST: usize = 24;
    let site = start("handoff-burst", "on", "");
    let key = key_for(0);
    let accepted_before = by_shard(&site, "hivenet_shard_connections_accepted_total");
    let handed_before = by_shard(&site, "hivenet_shard_connections_handed_off_total");
    // Every connection accepted (and counted open where it landed) before any request is read.
    let mut conns: Vec<Conn> = (0..BURST).map(|_| Conn::connect(site.http)).collect();
    let accepted = site.wait_for("every connection accepted", || {
        let now = by_shard(&site, "hivenet_shard_connections_accepted_total");
        let accepted: Vec<i64> = (0..SHARDS)
            .map(|shard| (now[shard] - accepted_before[shard]) as i64)
            .collect();
        (accepted.iter().sum::<i64>() == BURST as i64).then_some(accepted)
    });
    for conn in &mut conns {
        conn.send(&chat_request(&key, false)).unwrap();
    }
    for conn in &mut conns {
        assert_eq!(conn.read_response().unwrap().status, 200);
    }
    let handed_after = by_shard(&site, "hivenet_shard_connections_handed_off_total");
    // Shard 1 decides for its connections one after the other, each against the counts the
    // moves before it left (shard 0 owns the key and gives none away).
    let (mut giver, mut owner, mut moves) = (accepted[1], accepted[0], 0.0);
    for _ in 0..accepted[1] {
        if hivenet_router::router::shard::handoff::worth_moving(giver, owner) {
            giver -= 1;
            owner += 1;
            moves += 1.0;
        }
    }
    assert_eq!(
        [
            handed_after[0] - handed_before[0],
            handed_after[1] - handed_before[1]
        ],
        [0.0, moves],
        "accepted {accepted:?}"
    );
}
