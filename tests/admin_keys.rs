//! Proves the admin API for dynamic keys through the real router: admin calls fail closed without
//! an admin key, a key added with PUT works at once on every shard, an invalid write is refused
//! with 400 and a reason and leaves the registry unchanged, a stale version is 409, DELETE revokes
//! the key, and static-key routers answer 501; and that writes to one key of many, which change
//! the shards' snapshot in place (`auth::keys::live`), leave every other key working.

mod common;

use common::{Options, Site, chat, request};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const ADMIN_KEY: &str = "admin-secret-1";

fn hash(raw: &str) -> String {
    hex::encode(Sha256::digest(raw.as_bytes()))
}

fn admin(
    site: &Site,
    method: &str,
    target: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let body = body.map(Value::to_string).unwrap_or_default();
    let auth = key.map_or(String::new(), |key| {
        format!("authorization: Bearer {key}\r\n")
    });
    let raw = format!(
        "{method} {target} HTTP/1.1\r\nhost: test\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    let value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status, value)
}

/// `POST /admin/api-keys/replace` with the admin key.
fn replace(site: &Site, body: &Value) -> (u16, Value) {
    admin(
        site,
        "POST",
        "/admin/api-keys/replace",
        Some(ADMIN_KEY),
        Some(body),
    )
}

fn chat_status(site: &Site, key: &str) -> u16 {
    let body = chat("sim-model", false).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes()).status
}

fn key_body(version: &str, raw: &str) -> Value {
    json!({
        "version": version,
        "key_hash": hash(raw),
        "key_preview": "sk-...test",
        "owner": "acme-corp",
        "name": "test key",
        "enabled": true,
        "allowed_models": ["sim-model"],
        "quota": {"requests_per_minute": 1000, "tokens_per_day": 1000000}
    })
}

/// A site whose router runs dynamic keys with [`ADMIN_KEY`], one sim and one agent.
fn dynamic_options() -> Options {
    Options::new()
        .sim(&["--models", "sim-model"])
        .agent(0, &["--capacity", "4"])
        .router_env("HIVENET_ROUTER_AUTH_MODE", "dynamic")
        .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
        // No client key exists yet for the harness's `/v1/models` probe.
        .skip_model_wait()
}

#[test]
fn dynamic_keys_are_managed_through_the_admin_api() {
    let site = Site::start("admin-dynamic", dynamic_options());
    assert_eq!(admin(&site, "GET", "/admin/api-keys", None, None).0, 401);
    assert_eq!(
        admin(&site, "GET", "/admin/api-keys", Some("wrong"), None).0,
        401
    );
    let (status, listed) = admin(&site, "GET", "/admin/api-keys", Some(ADMIN_KEY), None);
    assert_eq!(
        (status, listed["count"].as_u64()),
        (200, Some(0)),
        "{listed}"
    );

    assert_eq!(chat_status(&site, "sk-dynamic-one"), 401);
    let (status, written) = admin(
        &site,
        "PUT",
        "/admin/api-keys/acme-one",
        Some(ADMIN_KEY),
        Some(&key_body("rev_00000001", "sk-dynamic-one")),
    );
    assert_eq!(status, 200, "{written}");
    site.wait_for("the new key to work", || {
        (chat_status(&site, "sk-dynamic-one") == 200).then_some(())
    });

    // Invalid: negative limit. Refused with a reason; the registry is unchanged.
    let mut invalid = key_body("rev_00000002", "sk-dynamic-two");
    invalid["quota"]["requests_per_minute"] = json!(-5);
    let (status, refusal) = admin(
        &site,
        "PUT",
        "/admin/api-keys/acme-two",
        Some(ADMIN_KEY),
        Some(&invalid),
    );
    assert_eq!(status, 400, "{refusal}");
    assert!(
        refusal["error"]
            .as_str()
            .unwrap()
            .contains("requests_per_minute"),
        "{refusal}"
    );
    let (_, version) = admin(
        &site,
        "GET",
        "/admin/api-keys/version",
        Some(ADMIN_KEY),
        None,
    );
    assert_eq!(version["version"], "rev_00000001", "{version}");
    assert_eq!(version["count"], 1, "{version}");
    assert_eq!(chat_status(&site, "sk-dynamic-two"), 401);

    // Stale version.
    let (status, stale) = admin(
        &site,
        "PUT",
        "/admin/api-keys/acme-two",
        Some(ADMIN_KEY),
        Some(&key_body("rev_00000000", "sk-dynamic-two")),
    );
    assert_eq!(status, 409, "{stale}");

    let (status, _) = admin(
        &site,
        "DELETE",
        "/admin/api-keys/acme-one?version=rev_00000003",
        Some(ADMIN_KEY),
        None,
    );
    assert_eq!(status, 200);
    site.wait_for("the deleted key to be refused", || {
        (chat_status(&site, "sk-dynamic-one") == 401).then_some(())
    });
    assert!(
        !site.logs().contains("sk-dynamic-one"),
        "a raw key reached the logs"
    );
}

/// A write changes one key of the shards' snapshot and shares the rest with the snapshot before
/// it; a delete moves the last record into the hole. Every key must authenticate as the writes
/// say, through the real router, and `GET` must answer each entry as supplied.
#[test]
fn writes_to_one_key_of_many_leave_every_other_key_working() {
    const KEYS: usize = 150;
    let site = Site::start("admin-many", dynamic_options());
    let keys: Vec<Value> = (0..KEYS)
        .map(|index| {
            json!({
                "id": format!("many-{index:03}"),
                "key_hash": hash(&format!("sk-many-{index}")),
                "key_preview": "sk-...many",
                "owner": format!("owner-{}", index % 7),
                "name": format!("key {index}"),
                "enabled": true,
                "allowed_models": ["sim-model"],
            })
        })
        .collect();
    let body = json!({"version": "rev_00000001", "keys": keys});
    let (status, answer) = replace(&site, &body);
    assert_eq!(status, 200, "{answer}");
    site.wait_for("the replaced keys to work", || {
        (chat_status(&site, "sk-many-149") == 200).then_some(())
    });

    // Delete one in the middle and the first; rotate one key's hash; add a key of a new owner.
    for deleted in ["many-070", "many-000"] {
        let target = format!("/admin/api-keys/{deleted}?version=rev_00000002");
        assert_eq!(
            admin(&site, "DELETE", &target, Some(ADMIN_KEY), None).0,
            200
        );
    }
    let mut rotated = key_body("rev_00000003", "sk-many-rotated");
    rotated["owner"] = json!("owner-3");
    let mut added = key_body("rev_00000003", "sk-many-added");
    added["owner"] = json!("owner-new");
    added["expires_at"] = json!("2099-01-01T01:00:00+01:00");
    for (id, body) in [("many-003", &rotated), ("many-added", &added)] {
        let target = format!("/admin/api-keys/{id}");
        let (status, written) = admin(&site, "PUT", &target, Some(ADMIN_KEY), Some(body));
        assert_eq!(status, 200, "{written}");
    }
    site.wait_for("the new key to work", || {
        (chat_status(&site, "sk-many-added") == 200).then_some(())
    });

    for index in 0..KEYS {
        let wanted = match index {
            0 | 3 | 70 => 401,
            _ => 200,
        };
        assert_eq!(
            chat_status(&site, &format!("sk-many-{index}")),
            wanted,
            "key {index}"
        );
    }
    assert_eq!(chat_status(&site, "sk-many-rotated"), 200);

    let (status, listed) = admin(&site, "GET", "/admin/api-keys", Some(ADMIN_KEY), None);
    assert_eq!(status, 200);
    assert_eq!(listed["count"], KEYS - 1, "two deleted, one added");
    let (status, read) = admin(
        &site,
        "GET",
        "/admin/api-keys/many-added",
        Some(ADMIN_KEY),
        None,
    );
    assert_eq!(status, 200, "{read}");
    let mut expected = added.clone();
    expected.as_object_mut().unwrap().remove("version");
    expected["id"] = json!("many-added");
    expected["key_hash"] = json!("");
    assert_eq!(read["key"], expected, "the entry as supplied");
}

#[test]
fn static_routers_answer_501_and_admin_fails_closed_without_keys() {
    let site = Site::start(
        "admin-static",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "2"]),
    );
    // No admin key configured and no insecure override: every admin call is refused.
    assert_eq!(
        admin(&site, "GET", "/admin/api-keys", Some("anything"), None).0,
        401
    );
    site.assert_chat_ok("sim-model");
}

#[test]
fn insecure_admin_override_reaches_the_501_of_static_mode() {
    let site = Site::start(
        "admin-insecure",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "2"])
            .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true"),
    );
    let (status, body) = admin(&site, "GET", "/admin/api-keys", None, None);
    assert_eq!(status, 501, "{body}");
    assert_eq!(admin(&site, "GET", "/admin/health", None, None).0, 200);
}

/// `HIVENET_ROUTER_MAX_REQUEST_BYTES` bounds inference bodies only: the admin API's bodies have
/// limits of their own (a registry replace takes up to 16 MiB). A router whose inference limit
/// was set below a replace body refused the replace with 413 before its handler saw it.
#[test]
fn the_inference_body_limit_does_not_cap_admin_bodies() {
    let site = Site::start(
        "admin-body-limit",
        dynamic_options().router_env("HIVENET_ROUTER_MAX_REQUEST_BYTES", "4096"),
    );
    let keys: Vec<Value> = (0..40)
        .map(|index| {
            json!({
                "id": format!("bulk-{index}"),
                "key_hash": hash(&format!("sk-bulk-{index}")),
                "key_preview": "sk-...bulk",
                "owner": format!("owner-{index}"),
                "name": "bulk key",
                "enabled": true,
                "allowed_models": ["sim-model"],
            })
        })
        .collect();
    let body = json!({"version": "rev_00000001", "keys": keys});
    assert!(
        body.to_string().len() > 4096,
        "the body must pass the inference limit"
    );
    let (status, answer) = replace(&site, &body);
    assert_eq!(
        (status, answer["count"].as_u64()),
        (200, Some(40)),
        "{answer}"
    );
    site.wait_for("the replaced keys to work", || {
        (chat_status(&site, "sk-bulk-39") == 200).then_some(())
    });

    // Over the largest admin limit (the replace's 16 MiB), the front refuses the declared body
    // itself, naming that limit rather than the inference one.
    let raw = format!(
        "POST /admin/api-keys/replace HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        16 * 1024 * 1024 + 1
    );
    let refused = request(site.http, raw.as_bytes());
    let refusal: Value = serde_json::from_slice(&refused.body).unwrap();
    assert_eq!(refused.status, 413);
    assert_eq!(
        refusal["error"]["message"],
        "request body exceeds the admin API's limit of 16777216 bytes"
    );

    // The inference limit still holds for inference.
    let padding = "x".repeat(5000);
    let big = json!({"model": "sim-model", "messages": [{"role": "user", "content": padding}]})
        .to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer sk-bulk-0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{big}",
        big.len()
    );
    assert_eq!(request(site.http, raw.as_bytes()).status, 413);
}
