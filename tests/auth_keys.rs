//! Proves client authentication through the real router: Bearer and x-api-key both work, a
//! missing, unknown or expired key is 401 (expired with its own message), a model outside the
//! key's allowlist is 403 model_forbidden, `/v1/models` lists only what the key may use, an
//! invalid auth.yaml is refused at start, and a reload swaps keys while a bad reload is refused
//! and the previous keys keep working.

mod common;

use std::path::{Path, PathBuf};

use common::{Options, Site, chat, poll, request};
use sha2::{Digest, Sha256};

fn hash(raw: &str) -> String {
    hex::encode(Sha256::digest(raw.as_bytes()))
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-auth")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auth.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn auth_yaml(keys: &[(&str, &str, &[&str], Option<&str>)]) -> String {
    let mut text = String::from("api:\n  mode: api-key\n  keys:\n");
    for (raw, owner, models, expires) in keys {
        text.push_str(&format!(
            "    - key_hash: \"{}\"\n      key_preview: \"{}\"\n      metadata:\n        name: \"{owner}\"\n        owner: \"{owner}\"\n",
            hash(raw),
            &raw[..6]
        ));
        if let Some(expires) = expires {
            text.push_str(&format!("        expires_at: \"{expires}\"\n"));
        }
        text.push_str("      models: [");
        text.push_str(
            &models
                .iter()
                .map(|model| format!("\"{model}\""))
                .collect::<Vec<_>>()
                .join(", "),
        );
        text.push_str("]\n");
    }
    text
}

fn chat_with(site: &Site, model: &str, header: &str) -> common::Response {
    let body = chat(model, false).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n{header}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

fn start(name: &str, auth: &Path, probe_key: &str) -> Site {
    Site::start(
        name,
        Options::new()
            .api_key(probe_key)
            .sim(&["--models", "sim-model,other-model"])
            .agent(0, &["--capacity", "4"])
            .router_args(&["--auth-config-file", auth.to_str().unwrap()]),
    )
}

#[test]
fn keys_are_checked_and_allowlists_enforced() {
    let auth = temp_file(
        "checks",
        &auth_yaml(&[
            ("sk-open-key", "acme", &[], None),
            ("sk-narrow-key", "beta", &["sim-model"], None),
            ("sk-old-key", "gone", &[], Some("01-01-2020")),
        ]),
    );
    let site = start("auth-checks", &auth, "sk-open-key");

    let ok = chat_with(&site, "sim-model", "authorization: Bearer sk-open-key");
    assert_eq!(ok.status, 200, "{}", ok.text());
    let ok = chat_with(&site, "sim-model", "x-api-key: sk-open-key");
    assert_eq!(ok.status, 200, "{}", ok.text());

    let missing = chat_with(&site, "sim-model", "x-nothing: 1");
    assert_eq!(
        (missing.status, missing.error_code().as_str()),
        (401, "unauthorized")
    );
    let unknown = chat_with(&site, "sim-model", "authorization: Bearer sk-wrong");
    assert_eq!(
        (unknown.status, unknown.error_code().as_str()),
        (401, "unauthorized")
    );
    let expired = chat_with(&site, "sim-model", "authorization: Bearer sk-old-key");
    assert_eq!(expired.status, 401);
    assert!(expired.text().contains("expired"), "{}", expired.text());
    assert!(!unknown.text().contains("expired"));

    let forbidden = chat_with(&site, "other-model", "authorization: Bearer sk-narrow-key");
    assert_eq!(
        (forbidden.status, forbidden.error_code().as_str()),
        (403, "model_forbidden")
    );
    let allowed = chat_with(&site, "sim-model", "authorization: Bearer sk-narrow-key");
    assert_eq!(allowed.status, 200);

    let listing = request(
        site.http,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-narrow-key\r\n\r\n",
    );
    let ids: Vec<String> = listing.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec!["sim-model".to_owned()]);
    let anonymous = request(site.http, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n");
    assert_eq!(anonymous.status, 401);
    let health = request(site.http, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n");
    assert_eq!(health.status, 200, "health needs no key");
    assert!(
        !site.logs().contains("sk-open-key"),
        "a raw key reached the logs"
    );
}

#[test]
fn reload_swaps_keys_and_a_bad_reload_is_refused() {
    let auth = temp_file("reload", &auth_yaml(&[("sk-first-key", "acme", &[], None)]));
    let site = start("auth-reload", &auth, "sk-first-key");
    assert_eq!(
        chat_with(&site, "sim-model", "authorization: Bearer sk-first-key").status,
        200
    );

    std::fs::write(
        &auth,
        auth_yaml(&[
            ("sk-first-key", "acme", &[], None),
            ("sk-second-key", "acme", &[], None),
        ]),
    )
    .unwrap();
    poll(std::time::Duration::from_secs(20), || {
        (chat_with(&site, "sim-model", "authorization: Bearer sk-second-key").status == 200)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the new key never worked\n{}", site.logs()));

    std::fs::write(
        &auth,
        "api:\n  mode: api-key\n  keys:\n    - key_hash: nothex\n",
    )
    .unwrap();
    poll(std::time::Duration::from_secs(20), || {
        site.logs().contains("reload refused").then_some(())
    })
    .unwrap_or_else(|| panic!("the bad reload was not refused\n{}", site.logs()));
    assert_eq!(
        chat_with(&site, "sim-model", "authorization: Bearer sk-second-key").status,
        200,
        "the previous keys stay active after a refused reload"
    );
}

#[test]
fn invalid_auth_config_is_refused_at_start() {
    let auth = temp_file(
        "invalid",
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"abc\"\n      bogus_field: 1\n",
    );
    let (started, stderr) = common::run_router_to_exit(
        auth.parent().unwrap(),
        &["--auth-config-file", auth.to_str().unwrap()],
        &[],
    );
    assert!(!started);
    assert!(stderr.contains("auth config"), "{stderr}");
    assert!(stderr.contains("bogus_field"), "{stderr}");
}
