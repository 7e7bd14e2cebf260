//! Proves the mesh of a router with more shards than CI has cores (8 on two), where its rings are
//! shallower than with two (`shard::mesh::ring_capacity`: 1,170 messages, not 8,192): keys owned
//! by every shard and a model owned by one, 16 keep-alive connections at once, each request's key
//! owned by another shard than the last one's, JSON and streamed, more requests at once than the
//! agent has slots so the model's owner queues them and grants across shards. Every request is
//! answered; one key shared by every connection is admitted its requests per minute and the
//! minute's refill, no more, whichever shards read its requests; every shard reads requests;
//! afterwards nothing is in flight, the mesh dropped and refused nothing, and the agent's 8 slots
//! are all free again (8 more requests at once find a slot each without queueing).

mod common;

use std::path::PathBuf;

use common::{Conn, Options, Site, metric_sum};
use sha2::{Digest, Sha256};

const PROBE_KEY: &str = "sk-many-probe";
const LIMITED_KEY: &str = "sk-many-limited";
const SHARDS: usize = 8;
const CONNECTIONS: usize = 16;
const REQUESTS_EACH: usize = 40;
/// The agent's slots: half the connections, so requests queue at the model's owner.
const CAPACITY: usize = 8;
/// The shared key's limit; every fourth request uses it, 160 in all.
const LIMITED_RPM: usize = 100;

/// An owner name whose tenant is owned by `shard` of [`SHARDS`].
fn owner_on(shard: usize) -> String {
    common::owner_on(shard, SHARDS)
}

fn key_for(shard: usize) -> String {
    format!("sk-many-shard-{shard}")
}

fn key_entry(raw: &str, name: &str, owner: &str, rpm: usize) -> String {
    format!(
        "    - key_hash: \"{}\"\n      key_preview: \"sk-...{name}\"\n      metadata:\n        name: \"{name}\"\n        owner: \"{owner}\"\n      quota:\n        requests_per_minute: {rpm}\n",
        hex::encode(Sha256::digest(raw.as_bytes())),
    )
}

fn auth_file() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-many-shards")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...probe\"\n      metadata:\n        name: \"probe\"\n        owner: \"probe\"\n",
        hex::encode(Sha256::digest(PROBE_KEY.as_bytes()))
    );
    for shard in 0..SHARDS {
        text.push_str(&key_entry(
            &key_for(shard),
            &format!("on-{shard}"),
            &owner_on(shard),
            60_000,
        ));
    }
    text.push_str(&key_entry(LIMITED_KEY, "limited", "acme", LIMITED_RPM));
    let path = dir.join("auth.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A chat request on a keep-alive connection; `max_tokens` cuts the sim's answer (50 tokens at
/// 20 ms, one second) short.
fn chat_request(key: &str, stream: bool, max_tokens: Option<u32>) -> Vec<u8> {
    let mut body = common::chat("sim-model", stream);
    if let Some(max_tokens) = max_tokens {
        body["max_tokens"] = max_tokens.into();
    }
    let body = body.to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// What one connection saw: for each request, whether it used the shared key, and its status
/// and error code.
type Seen = Vec<(bool, u16, String)>;

fn one_connection(site_http: std::net::SocketAddr, index: usize) -> Seen {
    let mut conn = Conn::connect(site_http);
    let mut seen = Vec::new();
    for request in 0..REQUESTS_EACH {
        // The first request's key is owned by shard `index % SHARDS` (the connection moves
        // there); every later one's by the next shard, or the shared key's owner.
        let limited = request % 4 == 1;
        let key = match limited {
            true => LIMITED_KEY.to_owned(),
            false => key_for((index + request) % SHARDS),
        };
        let stream = request % 3 == 2;
        conn.send(&chat_request(&key, stream, Some(2))).unwrap();
        let response = conn.read_response().unwrap();
        let code = match response.status {
            200 if stream => {
                assert!(
                    response.text().contains("data: [DONE]"),
                    "{}",
                    response.text()
                );
                String::new()
            }
            200 => {
                assert!(
                    response.json()["choices"][0]["message"]["content"].is_string(),
                    "{}",
                    response.text()
                );
                String::new()
            }
            _ => response.error_code(),
        };
        seen.push((limited, response.status, code));
    }
    seen
}

#[test]
fn eight_shards_answer_every_request_and_share_one_key_s_limit_exactly() {
    let auth = auth_file();
    let site = Site::start(
        "many-shards",
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--output-tokens",
                "50",
                "--itl",
                "20ms",
            ])
            .agent(0, &["--capacity", &CAPACITY.to_string()])
            .api_key(PROBE_KEY)
            .router_args(&[
                "--auth-config-file",
                auth.to_str().unwrap(),
                "--shards",
                &SHARDS.to_string(),
                "--pin-shards",
                "false",
            ]),
    );
    let by_shard = |name: &str| -> Vec<f64> {
        let metrics = site.router_metrics();
        (0..SHARDS)
            .map(|shard| metric_sum(&metrics, name, &[("shard", &shard.to_string())]))
            .collect()
    };
    let requests_before = by_shard("hivenet_shard_requests_total");
    let queued_before = metric_sum(&site.router_metrics(), "hivenet_shard_queued_total", &[]);
    let http = site.http;
    let started = std::time::Instant::now();
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|index| std::thread::spawn(move || one_connection(http, index)))
        .collect();
    let seen: Vec<_> = threads
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect();
    let elapsed = started.elapsed();
    assert_eq!(seen.len(), CONNECTIONS * REQUESTS_EACH);

    // Every key but the shared one: every request served.
    let unserved: Vec<_> = seen
        .iter()
        .filter(|(limited, status, _)| !limited && *status != 200)
        .collect();
    assert!(unserved.is_empty(), "{unserved:?}\n{}", site.logs());

    // The shared key: its minute and the refill while the run lasted, refused past it with 429
    // `rate_limit_exceeded` and nothing else, however its requests spread over the shards.
    let limited: Vec<_> = seen.iter().filter(|(limited, ..)| *limited).collect();
    let admitted = limited
        .iter()
        .filter(|(_, status, _)| *status == 200)
        .count();
    let refused: Vec<_> = limited
        .iter()
        .filter(|(_, status, _)| *status != 200)
        .collect();
    assert!(
        refused
            .iter()
            .all(|(_, status, code)| *status == 429 && code == "rate_limit_exceeded"),
        "{refused:?}"
    );
    let refilled = (elapsed.as_secs_f64() * LIMITED_RPM as f64 / 60.0).ceil() as usize;
    assert!(
        (LIMITED_RPM..=LIMITED_RPM + refilled).contains(&admitted),
        "the shared key was admitted {admitted} of {} in {elapsed:?} (limit {LIMITED_RPM}, refill {refilled})",
        limited.len()
    );
    let served = seen.iter().filter(|(_, status, _)| *status == 200).count();
    assert_eq!(
        site.sim_metric(0, "sim_requests_total") as usize,
        served,
        "refused requests never reach the engine"
    );

    // Each shard read requests of its own keys' connections.
    let requests_after = by_shard("hivenet_shard_requests_total");
    for shard in 0..SHARDS {
        assert!(
            requests_after[shard] > requests_before[shard],
            "shard {shard} read nothing: {requests_before:?} -> {requests_after:?}"
        );
    }

    // More requests at once than slots: the model's owner queued some and granted them as
    // others ended, over the mesh to the shards that read them.
    let queued = metric_sum(&site.router_metrics(), "hivenet_shard_queued_total", &[]);
    assert!(
        queued > queued_before,
        "nothing queued: the run did not fill the agent"
    );
    eprintln!(
        "{} requests in {elapsed:?}; the shared key admitted {admitted} of {} (refill {refilled}); {} queued",
        seen.len(),
        limited.len(),
        queued - queued_before
    );

    // Nothing left in flight; the mesh dropped nothing and refused no visit.
    site.wait_metric("hivenet_shard_in_flight", |value| value == 0.0);
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(&metrics, "hivenet_shard_mesh_dropped_total", &[]),
        0.0
    );
    assert_eq!(
        metric_sum(&metrics, "hivenet_shard_mesh_full_total", &[]),
        0.0
    );

    // Every slot is free again: as many requests at once as the agent has slots, each holding
    // its slot for the sim's whole answer (a second), none waits in the capacity queue. A round
    // may see a release still on its way to the model's owner, or the agent's last report not
    // yet caught up; a leaked slot makes every round queue.
    let free = (0..10).any(|_| every_slot_free(&site));
    assert!(
        free,
        "requests queued with every slot free, round after round: a slot leaked"
    );
}

/// Opens [`CAPACITY`] streams at once and reads each one's head; whether none of them waited in
/// the capacity queue.
fn every_slot_free(site: &Site) -> bool {
    let queued = || metric_sum(&site.router_metrics(), "hivenet_shard_queued_total", &[]);
    let before = queued();
    let mut holding: Vec<Conn> = (0..CAPACITY)
        .map(|index| {
            let mut conn = Conn::connect(site.http);
            conn.send(&chat_request(&key_for(index % SHARDS), true, None))
                .unwrap();
            conn
        })
        .collect();
    for conn in &mut holding {
        assert_eq!(conn.read_head().unwrap().status, 200);
    }
    let none_waited = queued() == before;
    for conn in &mut holding {
        assert!(conn.read_chunked_text().unwrap().contains("data: [DONE]"));
    }
    none_waited
}
