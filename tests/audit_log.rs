//! Proves the audit log through the real router: one JSON line per request (none for
//! `/health`), with the reference's fields — the client's UUID request ID kept and anything else
//! replaced by a UUID, tenant and key, model, final status, exact tokens, the serving agent's peer
//! ID, the error code of a refusal — and every record written before a graceful stop ends. The
//! request ID is returned as `X-Request-ID`.

mod common;

use common::{Options, Site, chat, request};
use serde_json::Value;
use sha2::{Digest, Sha256};

#[test]
fn every_request_leaves_one_audit_record() {
    let key = "sk-audited";
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-audit")
        .join(format!("auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let auth = dir.join("auth.yaml");
    std::fs::write(
        &auth,
        format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...ited\"\n      metadata:\n        name: \"audited\"\n        owner: \"acme\"\n",
            hex::encode(Sha256::digest(key.as_bytes()))
        ),
    )
    .unwrap();
    let mut site = Site::start(
        "audit-log",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &[])
            .api_key(key)
            .router_args(&["--auth-config-file", auth.to_str().unwrap()]),
    );
    let body = chat("sim-model", false).to_string();
    let post = |extra: &str, authorization: &str| {
        let raw = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\n{authorization}{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        request(site.http, raw.as_bytes())
    };
    let bearer = format!("authorization: Bearer {key}\r\n");
    let served = post(
        "x-request-id: 8B9E4A6D-DFB4-4B95-BADA-319E7E5B878A\r\n",
        &bearer,
    );
    assert_eq!(served.status, 200);
    assert_eq!(
        served.header("x-request-id"),
        Some("8b9e4a6d-dfb4-4b95-bada-319e7e5b878a")
    );
    let refused = post("x-request-id: \"><script>\r\n", "");
    assert_eq!(refused.status, 401);
    let generated = refused.header("x-request-id").unwrap().to_owned();
    assert_eq!(generated.len(), 36);
    let (health, _, _) = site.get("/health");
    assert_eq!(health, 200);

    // A graceful stop writes everything recorded.
    let status = site.router.terminate();
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(site.dir.join("audit.jsonl")).unwrap();
    let records: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    let chats: Vec<&Value> = records
        .iter()
        .filter(|record| record["model"] == "sim-model" || record["status_code"] == 401)
        .collect();
    assert_eq!(chats.len(), 2, "{text}");
    let ok = chats
        .iter()
        .find(|record| record["status_code"] == 200)
        .unwrap();
    assert_eq!(ok["log_type"], "audit");
    assert_eq!(ok["level"], "info");
    assert_eq!(ok["request_id"], "8b9e4a6d-dfb4-4b95-bada-319e7e5b878a");
    assert_eq!(ok["tenant_id"], "acme");
    assert!(ok["key_id"].as_str().unwrap().starts_with("static:"));
    assert!(ok["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(ok["output_tokens"], 16);
    assert!(
        ok["agent_id"].as_str().unwrap().starts_with("12D3KooW"),
        "{ok}"
    );
    assert_eq!(ok["error_code"], "");
    assert_eq!(ok["source_ip"], "127.0.0.1");
    assert!(ok["ts"].as_str().unwrap().ends_with('Z'));
    let denied = chats
        .iter()
        .find(|record| record["status_code"] == 401)
        .unwrap();
    assert_eq!(denied["level"], "error");
    assert_eq!(denied["error_code"], "unauthorized");
    assert_eq!(denied["tenant_id"], "");
    assert_eq!(denied["request_id"], generated.as_str());
    // Nothing for /health, nothing but metadata anywhere.
    assert!(!text.contains("/health") && !text.contains(key) && !text.contains("messages"));
}
