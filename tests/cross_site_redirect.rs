//! Proves cross-site redirect and the sibling map through the real routers: a model a sibling
//! serves gets `307` with a signed single-use token the sibling accepts once (and no other site,
//! and not for another model); a request is not redirected a third time; the map push is all or
//! nothing; and start-up refuses `--site-id` without what it needs.

mod common;

use common::{Options, Site, chat, request};
use serde_json::{Value, json};

/// A router for site `id` (admin open), with a sim and an agent serving `models` when given.
fn site(name: &str, id: &str, models: Option<&str>) -> Site {
    let mut options = Options::new()
        .site(name, id)
        .router_env("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN", "true");
    match models {
        Some(models) => {
            options = options
                .sim(&["--models", models])
                .agent(0, &[])
                .models(&[models]);
        }
        None => options = options.skip_model_wait(),
    }
    Site::start(name, options)
}

fn push(site: &Site, map: &Value) -> (u16, Value) {
    let body = map.to_string();
    let raw = format!(
        "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    (
        response.status,
        serde_json::from_slice(&response.body).unwrap_or(Value::Null),
    )
}

fn get_map(site: &Site) -> (u16, Value) {
    let response = request(
        site.http,
        b"GET /admin/sibling-map HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n",
    );
    (
        response.status,
        serde_json::from_slice(&response.body).unwrap_or(Value::Null),
    )
}

fn location_of(headers: &common::Headers) -> String {
    headers
        .iter()
        .find(|(name, _)| name == "location")
        .map(|(_, value)| value.clone())
        .expect("a Location header")
}

fn url(site: &Site) -> String {
    format!("http://{}", site.http)
}

/// `POST` of `body` to an absolute `location` on `site` (the test resolves the URL to the site it
/// names, as a client would).
fn post_to(site: &Site, location: &str, body: &Value) -> common::Response {
    let target = location
        .strip_prefix(&url(site))
        .unwrap_or_else(|| panic!("{location} is not on {}", url(site)));
    let body = body.to_string();
    let raw = format!(
        "POST {target} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    request(site.http, raw.as_bytes())
}

#[test]
fn a_model_served_by_a_sibling_is_redirected_with_a_single_use_token() {
    let a = site("redirect_a", "site-a", None);
    let b = site("redirect_b", "site-b", Some("far-model"));
    let map = json!({
        "sites": [{"id": "site-a", "url": url(&a)}, {"id": "site-b", "url": url(&b)}],
        "placements": [{"model": "far-model", "kind": "chat", "site": "site-b"}],
    });
    for router in [&a, &b] {
        assert_eq!(push(router, &map).0, 200);
    }
    let (status, active) = get_map(&a);
    assert_eq!(status, 200);
    assert_eq!(active["placements"][0]["model"], "far-model");

    let body = chat("far-model", false);
    let (status, headers, text) = a.post_json("/v1/chat/completions", &body);
    assert_eq!(status, 307, "{text}");
    let location = location_of(&headers);
    assert!(
        location.starts_with(&format!(
            "{}/v1/chat/completions?hivenet_redirect=",
            url(&b)
        )),
        "{location}"
    );
    // The sibling serves it once, without credentials.
    let served = post_to(&b, &location, &body);
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.json()["object"], "chat.completion");
    let replayed = post_to(&b, &location, &body);
    assert_eq!(replayed.status, 401);
    assert_eq!(
        replayed.json()["error"]["message"],
        "redirect token was already used"
    );
    // A fresh token is for this model only.
    let (_, headers, _) = a.post_json("/v1/chat/completions", &body);
    let location = location_of(&headers);
    let other = post_to(&b, &location, &chat("sim-model", false));
    assert_eq!(other.status, 401, "{}", other.text());
    // A token altered in transit is refused.
    let (_, headers, _) = a.post_json("/v1/chat/completions", &body);
    let location = location_of(&headers);
    let tampered = location.replace("hivenet_redirect=", "hivenet_redirect=x");
    assert_eq!(post_to(&b, &tampered, &body).status, 401);
    let metrics = a.router_metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "hivenet_shard_responses_total",
            &[("code", "307")]
        ),
        3.0
    );
}

#[test]
fn a_request_is_not_redirected_a_third_time() {
    let sites = [
        site("hops_a", "site-a", None),
        site("hops_b", "site-b", None),
        site("hops_c", "site-c", None),
    ];
    // Every site lists the model, none serves it: each hop forwards to a site not yet seen.
    let ids = ["site-a", "site-b", "site-c"];
    let listed: Vec<Value> = sites
        .iter()
        .zip(ids)
        .map(|(site, id)| json!({"id": id, "url": url(site)}))
        .collect();
    let placements: Vec<Value> = ids
        .iter()
        .map(|id| json!({"model": "ghost", "kind": "chat", "site": id}))
        .collect();
    let map = json!({"sites": listed, "placements": placements});
    for site in &sites {
        assert_eq!(push(site, &map).0, 200);
    }
    let body = chat("ghost", false);
    let (status, headers, _) = sites[0].post_json("/v1/chat/completions", &body);
    assert_eq!(status, 307);
    let mut location = location_of(&headers);
    let mut hops = 1;
    loop {
        let next = sites
            .iter()
            .find(|site| location.starts_with(&url(site)))
            .expect("the Location names a site of the map");
        let response = post_to(next, &location, &body);
        if response.status != 307 {
            assert_eq!(hops, 2, "stopped after {hops} redirects");
            assert_eq!(response.error_code(), "model_not_found");
            break;
        }
        hops += 1;
        assert!(hops <= 2, "redirected a third time");
        location = response.header("location").unwrap().to_string();
    }
}

#[test]
fn an_invalid_map_push_is_refused_whole_and_keeps_the_active_map() {
    let a = site("map_push", "site-a", None);
    assert_eq!(get_map(&a).0, 404, "no map before the first push");
    let good = json!({
        "sites": [{"id": "site-b", "url": "http://127.0.0.1:1"}],
        "placements": [{"model": "m", "kind": "chat", "site": "site-b"}],
        "generated_at": "2026-11-29T20:00:00Z",
        "fresh_for": "60s",
    });
    assert_eq!(push(&a, &good).0, 200);
    for (bad, reason) in [
        (
            json!({"sites": [{"id": "site-b", "url": "https://evil.example.com"}], "placements": []}),
            "evil.example.com",
        ),
        (
            json!({"sites": [], "placements": [{"model": "m", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "2h"}]}),
            "hold_budget",
        ),
        (
            json!({"sites": [], "placements": [{"model": "m", "kind": "vision", "site": "site-a"}]}),
            "kind",
        ),
    ] {
        let (status, body) = push(&a, &bad);
        assert_eq!(status, 400, "{bad}: {body}");
        let message = body["error"].as_str().unwrap_or_default().to_string();
        assert!(message.contains(reason), "{message:?} should name {reason}");
    }
    let (status, active) = get_map(&a);
    assert_eq!(status, 200);
    assert_eq!(active["sites"][0]["id"], "site-b");
}

#[test]
fn start_up_refuses_site_id_without_what_it_needs() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("site-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secrets = common::write_temp("redirect-flags", &format!("{}\n", common::REDIRECT_SECRET));
    let short = common::write_temp("redirect-flags-short", "short\n");
    let run = |args: &[&str], env: &[(&str, &str)]| common::refused_start(&dir, args, env);
    let error = run(&["--site-id", "site-a"], &[]);
    assert!(error.contains("--redirect-secret-file"), "{error}");
    let error = run(
        &["--site-id", "site-a", "--redirect-secret-file", &secrets],
        &[],
    );
    assert!(error.contains("--redirect-allowed-domains"), "{error}");
    let error = run(
        &[
            "--site-id",
            "site-a",
            "--redirect-secret-file",
            &short,
            "--redirect-allowed-domains",
            "example.com",
        ],
        &[],
    );
    assert!(error.contains("--redirect-secret-file"), "{error}");
    let keys = dir.join("auth.yaml");
    std::fs::write(
        &keys,
        format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      metadata: {{name: k, owner: o}}\n",
            "a".repeat(64)
        ),
    )
    .unwrap();
    let error = run(
        &[
            "--site-id",
            "site-a",
            "--redirect-secret-file",
            &secrets,
            "--redirect-allowed-domains",
            "example.com",
            "--auth-config-file",
            &keys.display().to_string(),
        ],
        &[],
    );
    assert!(error.contains("dynamic API keys"), "{error}");
    for (flag, value) in [
        ("--wake-hold-budget", "0"),
        ("--wake-hold-max", "0"),
        ("--wake-hold-max-per-key", "-1"),
        ("--wake-hold-max-total", "0"),
        ("--wake-keepalive", "-1s"),
    ] {
        let error = run(&[flag, value], &[]);
        assert!(error.contains(flag), "{flag} {value}: {error}");
    }
}

/// A map pushed to `a` placing `model` on `site-b` (at `b_url`) with the `warm` hint, and on
/// `site-a` with `scale_from_zero`; the hints are fresh for an hour.
fn map_with_hints(a: &Site, b_url: &str, warm: bool) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let generated = time_rfc3339(now - 5);
    json!({
        "sites": [{"id": "site-a", "url": url(a)}, {"id": "site-b", "url": b_url}],
        "placements": [
            {"model": "sim-model", "kind": "chat", "site": "site-a", "scale_from_zero": true, "hold_budget": "30s"},
            {"model": "sim-model", "kind": "chat", "site": "site-b", "warm": warm},
        ],
        "generated_at": generated,
        "fresh_for": "1h",
    })
}

/// Seconds since the epoch as RFC 3339 (UTC).
fn time_rfc3339(unix: u64) -> String {
    let days = unix / 86_400;
    let seconds = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

#[test]
fn a_cold_home_set_keeps_a_holdable_request_here_and_a_warm_one_redirects() {
    let a = site("cold_home_a", "site-a", None);
    let b_url = "http://127.0.0.1:9";
    // Site B is the whole home set and is cold: waking the model here is no slower.
    assert_eq!(push(&a, &map_with_hints(&a, b_url, false)).0, 200);
    let mut held = common::Conn::connect(a.http);
    held.send(&common::post_request(
        "/v1/chat/completions",
        &chat("sim-model", false).to_string(),
    ))
    .unwrap();
    a.wait_metric("hivenet_pending_demand", |v| v == 1.0);
    drop(held);
    a.wait_metric("hivenet_pending_demand", |v| v == 0.0);
    // Warm: redirected.
    assert_eq!(push(&a, &map_with_hints(&a, b_url, true)).0, 200);
    let (status, headers, _) = a.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert_eq!(status, 307);
    assert!(location_of(&headers).starts_with(b_url));
}

const ADMIN_KEY: &str = "admin-redirect";

fn put_key(site: &Site, raw: &str) {
    use sha2::{Digest, Sha256};
    let body = json!({
        "version": "rev_00000001",
        "key_hash": hex::encode(Sha256::digest(raw.as_bytes())),
        "key_preview": "sk-...shared",
        "owner": "acme",
        "name": "shared",
        "enabled": true,
        "quota": {"requests_per_minute": 1000, "tokens_per_day": 1000000},
    })
    .to_string();
    let request_text = format!(
        "PUT /admin/api-keys/shared HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, request_text.as_bytes());
    assert_eq!(response.status, 200, "{}", response.text());
}

#[test]
fn a_redirected_request_is_the_same_dynamic_key_at_the_sibling() {
    let start = |name: &str, id: &str, models: Option<&str>| {
        let mut options = Options::new()
            .site(name, id)
            .router_env("HIVENET_ROUTER_AUTH_MODE", "dynamic")
            .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY)
            .skip_model_wait();
        if let Some(models) = models {
            options = options.sim(&["--models", models]).agent(0, &[]);
        }
        Site::start(name, options)
    };
    let a = start("keyed_a", "site-a", None);
    let mut b = start("keyed_b", "site-b", Some("far-model"));
    put_key(&a, "sk-shared");
    let map = json!({
        "sites": [{"id": "site-a", "url": url(&a)}, {"id": "site-b", "url": url(&b)}],
        "placements": [{"model": "far-model", "kind": "chat", "site": "site-b"}],
    });
    for router in [&a, &b] {
        let body = map.to_string();
        let raw = format!(
            "PUT /admin/sibling-map HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(request(router.http, raw.as_bytes()).status, 200);
    }
    let body = chat("far-model", false).to_string();
    let keyed = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer sk-shared\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let redirected = request(a.http, keyed.as_bytes());
    assert_eq!(redirected.status, 307, "{}", redirected.text());
    // The sibling does not know the key yet: the token names a key it cannot vouch for.
    let location = redirected.header("location").unwrap().to_string();
    assert_eq!(
        post_to(&b, &location, &chat("far-model", false)).status,
        401
    );
    put_key(&b, "sk-shared");
    b.api_key = Some("sk-shared".into());
    b.wait_models(&["far-model"]);
    let redirected = request(a.http, keyed.as_bytes());
    let location = redirected.header("location").unwrap().to_string();
    let served = post_to(&b, &location, &chat("far-model", false));
    assert_eq!(served.status, 200, "{}", served.text());
    // Served as the key: its tenant's series counts it at the sibling.
    let counted = b.wait_for("the key's success counted at the sibling", || {
        // The series appears with the first count, which may land just after the answer: a
        // missing series here means "not counted yet", and the wait times out if it never is.
        let value = common::metric_sum_present(
            &b.router_metrics(),
            "hivenet_tenant_requests_success_total",
            &[("key_id", "shared"), ("model", "far-model")],
        )?;
        (value >= 1.0).then_some(value)
    });
    assert!(counted >= 1.0);
}
