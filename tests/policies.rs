//! Proves routing-policy loading through the real router: a policy directory is served by the
//! admin API; global and named policies are replaced through it (invalid writes 400 with the
//! field named, ownership conflicts 409, a policy that would break an existing key 400), each
//! refusal leaving the active policy unchanged; an invalid file change is refused and the
//! previous policy stays; SIGHUP reloads the global file; dynamic key writes and policy writes
//! check each other against the serverless invariant; an invalid policy stops start-up with a
//! message naming the file and the field.

mod common;

use std::path::{Path, PathBuf};

use common::{Options, Site, metric_sum, poll, request};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const ADMIN_KEY: &str = "admin-policy-key";

fn admin(site: &Site, method: &str, target: &str, body: Option<&str>) -> (u16, Value) {
    admin_as(site, Some(ADMIN_KEY), method, target, body)
}

fn admin_as(
    site: &Site,
    key: Option<&str>,
    method: &str,
    target: &str,
    body: Option<&str>,
) -> (u16, Value) {
    let body = body.unwrap_or("");
    let auth = key.map_or(String::new(), |key| {
        format!("authorization: Bearer {key}\r\n")
    });
    let raw = format!(
        "{method} {target} HTTP/1.1\r\nhost: test\r\n{auth}content-type: text/yaml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    let value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status, value)
}

fn error_text(value: &Value) -> &str {
    value["error"].as_str().unwrap_or("")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-policies")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Replaces a file's contents in one rename, so the router never reads half a file.
fn write_atomically(path: &Path, text: &str) {
    let staging = path.with_extension("staging");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

fn reload_count(site: &Site, trigger: &str, result: &str) -> f64 {
    metric_sum(
        &site.router_metrics(),
        "hivenet_policy_reload_total",
        &[("trigger", trigger), ("result", result)],
    )
}

const DEFAULT: &str = "max_inflight: 4
routing_policy:
  match:
    engine: vllm
  strategy: least-loaded
  max_tries: 2
";

const LLAMA: &str = "models:
  - llama-8b
routing_policy:
  exclude_if:
    kv_cache_utilization:
      gt: 0.9
  strategy: least-loaded
";

#[test]
fn a_policy_directory_is_served_and_changed_through_the_admin_api() {
    let dir = temp_dir("dir");
    std::fs::write(dir.join("_default.yaml"), DEFAULT).unwrap();
    std::fs::write(dir.join("llama.yaml"), LLAMA).unwrap();
    std::fs::write(dir.join("README.md"), "not a policy").unwrap();
    let site = Site::start(
        "policy-dir",
        Options::new()
            .router_args(&["--policy-model-dir", dir.to_str().unwrap()])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .skip_model_wait(),
    );

    assert_eq!(
        admin_as(&site, None, "GET", "/admin/policy", None).0,
        401,
        "policy routes need the admin key"
    );

    // The directory as loaded.
    let (status, global) = admin(&site, "GET", "/admin/policy", None);
    assert_eq!(status, 200, "{global}");
    assert_eq!(global["max_inflight"], 4, "{global}");
    assert_eq!(
        global["routing_policy"]["match"]["engine"], "vllm",
        "{global}"
    );
    assert_eq!(global["routing_policy"]["max_tries"], 2, "{global}");
    let (status, named) = admin(&site, "GET", "/admin/policy/models", None);
    assert_eq!(status, 200, "{named}");
    assert_eq!(named["llama"]["models"], json!(["llama-8b"]), "{named}");
    assert_eq!(
        named["llama"]["routing_policy"]["exclude_if"]["kv_cache_utilization"]["gt"], 0.9,
        "{named}"
    );
    let (status, llama) = admin(&site, "GET", "/admin/policy/models/llama", None);
    assert_eq!((status, &llama), (200, &named["llama"]));
    assert_eq!(
        admin(&site, "GET", "/admin/policy/models/absent", None).0,
        404
    );

    // Replace the global policy; an invalid replacement is refused and changes nothing.
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy",
        Some("max_inflight: 8\nrouting_policy:\n  strategy: least-loaded\n"),
    );
    assert_eq!((status, &body), (200, &json!({"status": "policy updated"})));
    for (invalid, field) in [
        (
            "routing_policy:\n  strategy: least-loaded\n  exclude_if:\n    sucess_rate: {lt: 0.9}\n",
            "routing_policy.exclude_if.sucess_rate",
        ),
        (
            "max_inflight: -1\nrouting_policy: {strategy: least-loaded}\n",
            "max_inflight",
        ),
        (
            "routing_policy: {strategy: fastest}\n",
            "routing_policy.strategy",
        ),
        ("routing_policy: [unclosed\n", "routing_policy"),
        (
            "mode: turbo\nrouting_policy: {strategy: least-loaded}\n",
            "mode",
        ),
    ] {
        let (status, body) = admin(&site, "PUT", "/admin/policy", Some(invalid));
        assert_eq!(status, 400, "{invalid}: {body}");
        assert!(error_text(&body).contains(field), "{invalid}: {body}");
    }
    let (_, global) = admin(&site, "GET", "/admin/policy", None);
    assert_eq!(global["max_inflight"], 8, "{global}");
    assert!(global["routing_policy"].get("match").is_none(), "{global}");

    // Named policies: ownership is exclusive, models are required, deletion is idempotent.
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy/models/other",
        Some("models: [llama-8b]\nrouting_policy: {strategy: least-loaded}\n"),
    );
    assert_eq!(status, 409, "{body}");
    assert!(error_text(&body).contains("llama"), "{body}");
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy/models/other",
        Some("routing_policy: {strategy: least-loaded}\n"),
    );
    assert_eq!(status, 400, "{body}");
    assert!(error_text(&body).contains("models"), "{body}");
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy/models/other",
        Some("models: [qwen, qwen-large]\nrouting_policy: {strategy: least-loaded}\n"),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"status": "policy updated", "name": "other", "models": ["qwen", "qwen-large"]})
    );
    let (_, named) = admin(&site, "GET", "/admin/policy/models", None);
    assert_eq!(
        named.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["llama", "other"]
    );
    for _ in 0..2 {
        let (status, body) = admin(&site, "DELETE", "/admin/policy/models/other", None);
        assert_eq!(
            (status, &body),
            (200, &json!({"status": "policy deleted", "name": "other"}))
        );
    }
    assert_eq!(
        admin(&site, "GET", "/admin/policy/models/other", None).0,
        404
    );
    assert!(reload_count(&site, "api", "success") >= 3.0);
    assert!(reload_count(&site, "api", "error") >= 6.0);

    // A broken edit of a file is refused and its previous version stays active.
    write_atomically(
        &dir.join("llama.yaml"),
        "models: [llama-8b]\nrouting_policy:\n  strategy: least-loaded\n  exclude_if:\n    kv_cache_utilization: {gt: 0.5, lt: 0.1}\n",
    );
    site.wait_for("the broken edit to be refused", || {
        (reload_count(&site, "file_change", "error") >= 1.0).then_some(())
    });
    let (_, llama) = admin(&site, "GET", "/admin/policy/models/llama", None);
    assert_eq!(
        llama["routing_policy"]["exclude_if"]["kv_cache_utilization"],
        json!({"gt": 0.9}),
        "{llama}"
    );
    assert!(
        site.logs().contains("kv_cache_utilization"),
        "the refusal names the field"
    );

    // A valid edit applies.
    write_atomically(
        &dir.join("llama.yaml"),
        "models: [llama-8b, llama-70b]\nrouting_policy:\n  strategy: least-loaded\n",
    );
    site.wait_for("the valid edit to apply", || {
        let (_, llama) = admin(&site, "GET", "/admin/policy/models/llama", None);
        (llama["models"] == json!(["llama-8b", "llama-70b"])).then_some(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

fn hash(raw: &str) -> String {
    hex::encode(Sha256::digest(raw.as_bytes()))
}

#[test]
fn sighup_reloads_the_global_file_and_keys_constrain_serverless_policies() {
    let dir = temp_dir("file");
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, "routing_policy:\n  strategy: least-loaded\n").unwrap();
    let auth = dir.join("auth.yaml");
    std::fs::write(
        &auth,
        format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...itpm\"\n      metadata: {{name: small, owner: tenant-a}}\n      quota: {{input_tokens_per_minute: 1000}}\n",
            hash("sk-itpm-key")
        ),
    )
    .unwrap();
    let site = Site::start(
        "policy-file",
        Options::new()
            .router_args(&[
                "--policy-file",
                policy.to_str().unwrap(),
                "--auth-config-file",
                auth.to_str().unwrap(),
            ])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .skip_model_wait(),
    );

    // A serverless cap above the key's input tokens per minute would strand the key: refused.
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy",
        Some(
            "mode: serverless\nmax_input_tokens: 4096\nrouting_policy: {strategy: least-loaded}\n",
        ),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        error_text(&body).contains("input_tokens_per_minute"),
        "{body}"
    );
    assert!(error_text(&body).contains("sk-...itpm"), "{body}");
    let (_, global) = admin(&site, "GET", "/admin/policy", None);
    assert!(global.get("mode").is_none(), "{global}");
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy",
        Some("mode: serverless\nmax_input_tokens: 512\nrouting_policy: {strategy: least-loaded}\n"),
    );
    assert_eq!(status, 200, "{body}");

    // SIGHUP rereads the file.
    write_atomically(
        &policy,
        "max_inflight: 9\nrouting_policy:\n  strategy: least-loaded\n",
    );
    let pid = site.router.pid().expect("router running").to_string();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(hup.success());
    site.wait_for("SIGHUP to reload the file", || {
        (reload_count(&site, "sighup", "success") >= 1.0).then_some(())
    });
    let (_, global) = admin(&site, "GET", "/admin/policy", None);
    assert_eq!(global["max_inflight"], 9, "{global}");

    // An invalid file, and a file the static key cannot live with, are refused; 9 stays.
    for (text, reason) in [
        (
            "routing_policy:\n  strategy: least-loaded\n  bogus: 1\n",
            "bogus",
        ),
        (
            "mode: serverless\nmax_input_tokens: 100000\nrouting_policy: {strategy: least-loaded}\n",
            "input_tokens_per_minute",
        ),
    ] {
        let errors_before =
            reload_count(&site, "file_change", "error") + reload_count(&site, "sighup", "error");
        write_atomically(&policy, text);
        site.wait_for("the bad file to be refused", || {
            (reload_count(&site, "file_change", "error") + reload_count(&site, "sighup", "error")
                > errors_before)
                .then_some(())
        });
        let (_, global) = admin(&site, "GET", "/admin/policy", None);
        assert_eq!(global["max_inflight"], 9, "{reason}: {global}");
        assert!(site.logs().contains(reason), "{reason} not in the logs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dynamic_key_writes_and_policy_writes_check_each_other() {
    let dir = temp_dir("dynamic");
    std::fs::write(
        dir.join("big.yaml"),
        "models: [big-model]\nmode: serverless\nmax_input_tokens: 4096\nrouting_policy: {strategy: least-loaded}\n",
    )
    .unwrap();
    let site = Site::start(
        "policy-dynamic",
        Options::new()
            .router_args(&["--policy-model-dir", dir.to_str().unwrap()])
            .router_env("HIVENET_ROUTER_AUTH_MODE", "dynamic")
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .skip_model_wait(),
    );
    let key = |version: &str, itpm: u64| {
        json!({
            "version": version,
            "key_hash": hash("sk-dynamic-itpm"),
            "key_preview": "sk-...dyn",
            "owner": "tenant-b",
            "name": "dynamic key",
            "enabled": true,
            "quota": {"input_tokens_per_minute": itpm}
        })
        .to_string()
    };
    // The key reaches every model, big-model included: 1000 < 4096 is refused.
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/api-keys/k1",
        Some(&key("rev_00000001", 1000)),
    );
    assert_eq!(status, 400, "{body}");
    assert!(error_text(&body).contains("big-model"), "{body}");
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/api-keys/k1",
        Some(&key("rev_00000001", 8192)),
    );
    assert_eq!(status, 200, "{body}");

    // The reverse: a policy that would strand the key is refused, and the file stays in force.
    let (status, body) = admin(
        &site,
        "PUT",
        "/admin/policy/models/big",
        Some(
            "models: [big-model]\nmode: serverless\nmax_input_tokens: 100000\nrouting_policy: {strategy: least-loaded}\n",
        ),
    );
    assert_eq!(status, 400, "{body}");
    assert!(error_text(&body).contains("key k1"), "{body}");
    let (_, big) = admin(&site, "GET", "/admin/policy/models/big", None);
    assert_eq!(big["max_input_tokens"], 4096, "{big}");
    let (status, body) = admin(&site, "DELETE", "/admin/policy/models/big", None);
    assert_eq!(status, 200, "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the router to completion with `args`; returns its exit success and stderr.
fn start_and_fail(args: &[&str], dir: &Path) -> (bool, String) {
    common::run_router_to_exit(dir, args, &[])
}

#[test]
fn an_invalid_policy_stops_start_up_with_a_message() {
    let dir = temp_dir("invalid");
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "routing_policy:\n  strategy: least-loaded\n  exclude_if:\n    sucess_rate: {lt: 0.95}\n",
    )
    .unwrap();
    let (ok, stderr) = start_and_fail(&["--policy-file", policy.to_str().unwrap()], &dir);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("--policy-file"), "{stderr}");
    assert!(stderr.contains("policy.yaml"), "{stderr}");
    assert!(
        stderr.contains("routing_policy.exclude_if.sucess_rate: unknown metric"),
        "{stderr}"
    );

    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(
        policies.join("_default.yaml"),
        "max_inflight: -5\nrouting_policy: {strategy: least-loaded}\n",
    )
    .unwrap();
    let (ok, stderr) = start_and_fail(&["--policy-model-dir", policies.to_str().unwrap()], &dir);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("_default.yaml"), "{stderr}");
    assert!(
        stderr.contains("max_inflight: must not be negative"),
        "{stderr}"
    );

    let (ok, stderr) = start_and_fail(&["--max-tries-per-step", "0"], &dir);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("--max-tries-per-step"), "{stderr}");

    // A file of the directory with a broken named policy is skipped, not fatal.
    std::fs::write(policies.join("_default.yaml"), DEFAULT).unwrap();
    std::fs::write(
        policies.join("broken.yaml"),
        "models: [x]\nrouting_policy: {}\n",
    )
    .unwrap();
    let site = Site::start(
        "policy-partial",
        Options::new()
            .router_args(&["--policy-model-dir", policies.to_str().unwrap()])
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .skip_model_wait(),
    );
    let (_, named) = admin(&site, "GET", "/admin/policy/models", None);
    assert_eq!(named, json!({}));
    assert!(
        poll(std::time::Duration::from_secs(5), || site
            .logs()
            .contains("broken.yaml")
            .then_some(()))
        .is_some()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
