//! Proves through the real router that the admin key is accepted only as
//! `Authorization: Bearer <key>` (the admin reference's one documented form): the same key in
//! `x-api-key` or as a raw `Authorization` value is 401 with the reference's `unauthorized`
//! envelope and bearer challenge, while client keys keep every form the client reference
//! documents (bearer, raw `Authorization`, `x-api-key`).

mod common;

use common::{Options, Site, chat, request, write_temp};
use serde_json::Value;
use sha2::{Digest, Sha256};

const ADMIN_KEY: &str = "admin-bearer-key-1";
const CLIENT_KEY: &str = "sk-client-bearer-1";

fn send(site: &Site, head: &str, path: &str, body: &str) -> common::Response {
    let method = if body.is_empty() { "GET" } else { "POST" };
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\n{head}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

#[test]
fn the_admin_key_is_a_bearer_token_only() {
    let auth = write_temp(
        "admin-bearer-auth.yaml",
        &format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...r-1\"\n      metadata:\n        name: client\n        owner: client\nadmin:\n  mode: api-key\n",
            hex::encode(Sha256::digest(CLIENT_KEY.as_bytes()))
        ),
    );
    let site = Site::start(
        "admin-bearer",
        Options::new()
            .api_key(CLIENT_KEY)
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "4"])
            .router_args(&["--auth-config-file", &auth])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY),
    );

    let ok = send(
        &site,
        &format!("authorization: Bearer {ADMIN_KEY}\r\n"),
        "/admin/health",
        "",
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let lowercase = send(
        &site,
        &format!("authorization: bearer {ADMIN_KEY}\r\n"),
        "/admin/health",
        "",
    );
    assert_eq!(lowercase.status, 200, "{}", lowercase.text());

    for head in [
        format!("x-api-key: {ADMIN_KEY}\r\n"),
        format!("authorization: {ADMIN_KEY}\r\n"),
        format!("authorization: Basic {ADMIN_KEY}\r\n"),
        String::new(),
        format!("authorization: Bearer {CLIENT_KEY}\r\n"),
    ] {
        let refused = send(&site, &head, "/admin/health", "");
        assert_eq!(refused.status, 401, "{head:?}: {}", refused.text());
        assert_eq!(
            refused.header("www-authenticate"),
            Some("Bearer realm=\"hivenet-router\""),
            "{head:?}"
        );
        let body: Value = refused.json();
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        assert_eq!(body["error"]["message"], "unauthorized", "{body}");
        assert_eq!(body["error"]["source"], "router", "{body}");
    }

    // Client keys: every documented form still works; a client 401 carries the challenge too.
    let body = chat("sim-model", false).to_string();
    for head in [
        format!("authorization: Bearer {CLIENT_KEY}\r\n"),
        format!("authorization: {CLIENT_KEY}\r\n"),
        format!("x-api-key: {CLIENT_KEY}\r\n"),
    ] {
        let answered = send(&site, &head, "/v1/chat/completions", &body);
        assert_eq!(answered.status, 200, "{head:?}: {}", answered.text());
    }
    let refused = send(&site, "", "/v1/chat/completions", &body);
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.header("www-authenticate"),
        Some("Bearer realm=\"hivenet-router\"")
    );
}
