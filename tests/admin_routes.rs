//! Proves through the real router and agents that the admin reference's registry routes answer
//! with its shapes and statuses (`/admin/models`, `/admin/models/{model}`,
//! `/admin/routing-table`, `/admin/storage`, `/admin/metrics/reset`), that
//! `/admin/registration-stream` streams agents joining and leaving as SSE, and that each route
//! refuses a missing admin key with the `unauthorized` envelope and the bearer challenge.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Options, Site, request, write_temp};
use serde_json::Value;
use sha2::{Digest, Sha256};

const ADMIN_KEY: &str = "admin-routes-key-1";
const CLIENT_KEY: &str = "sk-admin-routes-1";

fn admin(site: &Site, method: &str, path: &str) -> common::Response {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    request(site.http, raw.as_bytes())
}

fn unauthenticated(site: &Site, method: &str, path: &str) -> common::Response {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    request(site.http, raw.as_bytes())
}

/// Reads `stream` until `text` has arrived (after `from`), returning everything read so far.
fn read_until(stream: &mut TcpStream, seen: &mut String, text: &str, from: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(at) = seen[from..].find(text) {
            return from + at + text.len();
        }
        assert!(
            Instant::now() < deadline,
            "{text:?} not received; stream so far: {seen}"
        );
        match stream.read(&mut buffer) {
            Ok(0) => panic!("stream closed before {text:?}: {seen}"),
            Ok(read) => seen.push_str(&String::from_utf8_lossy(&buffer[..read])),
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(error) => panic!("reading the stream: {error}"),
        }
    }
}

/// The JSON of the first `data:` line after `from`.
fn data_after(seen: &str, from: usize) -> Value {
    let line = seen[from..]
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("no data line in {seen}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn the_admin_registry_routes_answer_as_the_reference_documents() {
    let auth = write_temp(
        "admin-routes-auth.yaml",
        &format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...s-1\"\n      metadata:\n        name: client\n        owner: client\n      models: [other-model]\nadmin:\n  mode: api-key\n",
            hex::encode(Sha256::digest(CLIENT_KEY.as_bytes()))
        ),
    );
    let mut site = Site::start(
        "admin-routes",
        Options::new()
            .api_key(CLIENT_KEY)
            .skip_model_wait()
            .sim(&["--models", "org/sim-model"])
            .agent(
                0,
                &[
                    "--capacity",
                    "4",
                    "--deployment-id",
                    "deploy-42",
                    "--replica-id",
                    "replica-0",
                ],
            )
            .router_args(&["--auth-config-file", &auth])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY),
    );
    site.wait_for("the agent in the admin catalog", || {
        let listed = admin(&site, "GET", "/admin/models");
        (listed.json()["data"][0]["agents"]["healthy"] == 1).then_some(())
    });

    // The catalog is complete even for a client key that may see none of it.
    let client_view = request(
        site.http,
        format!("GET /v1/models HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {CLIENT_KEY}\r\nconnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(client_view.status, 200, "{}", client_view.text());
    assert_eq!(client_view.json()["data"], serde_json::json!([]));
    let listed = admin(&site, "GET", "/admin/models");
    assert_eq!(listed.status, 200, "{}", listed.text());
    let listed = listed.json();
    assert_eq!(listed["object"], "list");
    let entry = &listed["data"][0];
    assert_eq!(entry["id"], "org/sim-model");
    assert_eq!(entry["object"], "model");
    assert_eq!(entry["capability"], "llm");
    assert_eq!(entry["agents"]["total"], 1);
    assert_eq!(entry["agents"]["total_capacity"], 4);
    assert!(entry["agents"]["engines"].is_array(), "{entry}");
    assert!(entry["agents"]["regions"].is_array(), "{entry}");

    // One model, its ID with a slash, and its agent list.
    let one = admin(&site, "GET", "/admin/models/org/sim-model");
    assert_eq!(one.status, 200, "{}", one.text());
    let one = one.json();
    assert_eq!(one["id"], "org/sim-model");
    let agents = one["agents"]["list"].as_array().expect("agents.list");
    assert_eq!(agents.len(), 1);
    let peer_id = agents[0]["peer_id"].as_str().expect("peer_id").to_owned();
    assert_eq!(agents[0]["is_healthy"], true);
    assert_eq!(agents[0]["capacity"], 4);
    assert!(agents[0]["last_seen"].as_i64().unwrap() > 1_700_000_000);
    let encoded = admin(&site, "GET", "/admin/models/org%2Fsim-model");
    assert_eq!(encoded.status, 200, "{}", encoded.text());
    let missing = admin(&site, "GET", "/admin/models/no-such-model");
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.json(),
        serde_json::json!({"error": "model not found: no-such-model"})
    );

    let table = admin(&site, "GET", "/admin/routing-table");
    assert_eq!(table.status, 200, "{}", table.text());
    let table = table.json();
    assert_eq!(table["total"], 1);
    let row = &table["agents"][0];
    assert_eq!(row["peer_id"], peer_id.as_str());
    assert_eq!(row["metadata"]["model"], "org/sim-model");
    assert_eq!(row["metadata"]["capacity"], 4);
    assert_eq!(row["metadata"]["capability"], "llm");
    assert_eq!(row["metadata"]["replica_id"], "replica-0");
    assert_eq!(row["status"]["healthy"], true);
    assert_eq!(row["status"]["backend_healthy"], true);
    assert!(row["status"]["active_requests"].is_u64(), "{row}");
    assert!(row["status"]["capacity_utilization"].is_number(), "{row}");
    assert!(
        row["status"]["last_seen"].as_str().unwrap().ends_with('Z'),
        "{row}"
    );

    let storage = admin(&site, "GET", "/admin/storage");
    assert_eq!(storage.status, 200);
    assert_eq!(
        storage.json(),
        serde_json::json!({"error": "storage stats not available for this backend"})
    );
    let reset = admin(&site, "POST", "/admin/metrics/reset");
    assert_eq!(reset.status, 200, "{}", reset.text());
    assert_eq!(reset.json()["status"], "metrics reset");

    for (method, path) in [
        ("POST", "/admin/models"),
        ("DELETE", "/admin/models/org/sim-model"),
        ("POST", "/admin/routing-table"),
        ("GET", "/admin/metrics/reset"),
        ("PUT", "/admin/storage"),
    ] {
        let refused = admin(&site, method, path);
        assert_eq!(refused.status, 405, "{method} {path}: {}", refused.text());
        assert!(refused.json()["error"].is_string(), "{}", refused.text());
    }

    // Every route, and the client API, answers a missing credential with the challenge.
    for (method, path) in [
        ("GET", "/admin/models"),
        ("GET", "/admin/models/org/sim-model"),
        ("GET", "/admin/routing-table"),
        ("GET", "/admin/registration-stream"),
        ("GET", "/admin/storage"),
        ("POST", "/admin/metrics/reset"),
        ("POST", "/v1/messages"),
        ("POST", "/v1/embeddings"),
    ] {
        let refused = unauthenticated(&site, method, path);
        assert_eq!(refused.status, 401, "{method} {path}: {}", refused.text());
        assert_eq!(
            refused.header("www-authenticate"),
            Some("Bearer realm=\"hivenet-router\""),
            "{method} {path}"
        );
        if path.starts_with("/admin/") {
            assert_eq!(
                refused.json(),
                serde_json::json!({"error": {"code": "unauthorized", "message": "unauthorized", "source": "router"}}),
                "{method} {path}"
            );
        }
    }

    // The registration stream: a second agent joins, then goes.
    let mut stream = TcpStream::connect(site.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    write!(
        stream,
        "GET /admin/registration-stream HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\n\r\n"
    )
    .unwrap();
    let mut seen = String::new();
    let opened = read_until(&mut stream, &mut seen, ": registration stream open", 0);
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(
        seen.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{seen}"
    );
    let second = site.spawn_agent(
        0,
        &[
            "--capacity",
            "2",
            "--deployment-id",
            "deploy-42",
            "--replica-id",
            "replica-1",
        ],
    );
    let joined = read_until(&mut stream, &mut seen, "\"registered\"", opened);
    let event = data_after(&seen, opened);
    assert_eq!(event["event_type"], "registered", "{seen}");
    assert_eq!(event["deployment_id"], "deploy-42");
    assert_eq!(event["replica_id"], "replica-1");
    assert!(event["agent_id"].as_str().is_some_and(|id| id != peer_id));
    assert!(event["timestamp"].as_str().unwrap().ends_with('Z'));
    let listed = admin(&site, "GET", "/admin/models/org/sim-model").json();
    assert_eq!(listed["agents"]["total"], 2, "{listed}");
    assert_eq!(listed["agents"]["total_capacity"], 6, "{listed}");

    site.agents[second].terminate();
    read_until(&mut stream, &mut seen, "\"unregistered\"", joined);
    let event = data_after(&seen, joined);
    assert_eq!(event["event_type"], "unregistered", "{seen}");
    assert_eq!(event["replica_id"], "replica-1");
}
