//! Proves, with real routers and a real Valkey whose ACL refuses commands, that the store's
//! permissions are checked where they matter (issue 37, finding 3): a router refuses to start
//! against a store that refuses a command the sync needs (`EVAL`; `WAIT` under Sentinel),
//! naming it; and a refusal at run time
//! (`EVAL` and `EVALSHA` taken from the user while the site runs, with budgeted models holding
//! credits) is a
//! permission error that costs only its own part: the round still reaches the store,
//! `hivenet_sync_up` stays 1 and the heartbeats keep moving, where the whole round used to fail
//! and every router fell back to its share for good.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::valkey::{Sentinels, Valkey, ValkeyOptions};
use common::{Options, Site, chat, metric_sum, request, run_router_within};

const PASSWORD: &str = "acl-test-password";
/// Longer than the start-up check can take (its connect is bounded by 5 s), far shorter than a
/// router that started and runs.
const START_CHECK_WITHIN: Duration = Duration::from_secs(20);

fn temp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-it")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_store_refusing_eval_refuses_the_start_naming_it() {
    let valkey = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    valkey.command(&["ACL", "SETUSER", "default", "-eval"]);
    let addr = valkey.addr();
    let dir = temp_dir("acl-start");
    let outcome = run_router_within(
        &dir,
        &[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addr,
            "--router-id",
            "acl-start",
            "--sync-interval",
            "200ms",
        ],
        &[("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", PASSWORD)],
        START_CHECK_WITHIN,
    );
    let Some((started, stderr)) = outcome else {
        panic!("the router started against a store that refuses EVAL");
    };
    assert!(!started, "exited 0\n{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one ERROR line\n{stderr}");
    assert!(
        errors[0].contains("permission") && errors[0].contains("EVAL (occupancy credits"),
        "{stderr}"
    );
    // Nothing else was refused: the line names only what is missing.
    assert!(!errors[0].contains("XADD"), "{stderr}");
}

/// Without `WAIT` under Sentinel the router used to start and silently keep every grant
/// unacknowledged (6 of 8 budget slots usable); it now refuses to start, naming `WAIT`.
#[test]
fn a_store_refusing_wait_under_sentinel_refuses_the_start_naming_it() {
    let primary = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    let _replica = Valkey::replica_of(&primary);
    let sentinels = Sentinels::start(3, &primary, "hivenet");
    primary.command(&["ACL", "SETUSER", "default", "-wait"]);
    let addrs = sentinels.addrs_joined();
    let dir = temp_dir("acl-wait");
    let outcome = run_router_within(
        &dir,
        &[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addrs,
            "--sync-valkey-sentinel-master",
            "hivenet",
            "--router-id",
            "acl-wait",
            "--sync-interval",
            "200ms",
        ],
        &[("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", PASSWORD)],
        START_CHECK_WITHIN,
    );
    let Some((started, output)) = outcome else {
        panic!("the router started against a primary that refuses WAIT under Sentinel");
    };
    assert!(!started, "exited 0\n{output}");
    let errors: Vec<&str> = output.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one ERROR line\n{output}");
    assert!(
        errors[0].contains("permission") && errors[0].contains("WAIT (a replica's acknowledgement"),
        "{output}"
    );
    assert!(!errors[0].contains("EVAL"), "{output}");
}

/// A policy for `sim-model` admitting `budget` requests at a time (an occupancy budget, shared
/// through credits in the store).
fn policy_dir(name: &str, budget: usize) -> String {
    let dir = temp_dir(&format!("{name}-policies"));
    std::fs::write(
        dir.join("sim-model.yaml"),
        format!(
            "models:\n  - sim-model\nrouting_policy:\n  strategy: least-loaded\nmax_inflight: {budget}\n"
        ),
    )
    .unwrap();
    dir.display().to_string()
}

fn router(index: usize, store: &str, policies: &str) -> Site {
    let id = format!("router-{index}");
    Site::start(
        &format!("acl-runtime-{index}"),
        Options::new()
            .router_args(&[
                "--shards",
                "1",
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                store,
                "--router-id",
                &id,
                "--sync-interval",
                "200ms",
                "--sync-min-routers",
                "2",
                "--policy-model-dir",
                policies,
            ])
            .router_env("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", PASSWORD)
            .router_env("HIVENET_ROUTER_ADMIT_PARK_TIMEOUT", "1s")
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .agent(0, &["--capacity", "64"]),
    )
}

fn chat_request() -> Vec<u8> {
    let body = chat("sim-model", false).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `router-{index}`'s heartbeat time in the store.
fn heartbeat_at(valkey: &Valkey, index: usize) -> u64 {
    let record = valkey.command(&[
        "HGET",
        "hivenet:{default}:routers",
        &format!("router-{index}"),
    ]);
    let record: serde_json::Value = serde_json::from_str(&record).expect("a heartbeat record");
    record["at_unix_ms"].as_u64().expect("at_unix_ms")
}

fn rounds(router: &Site) -> f64 {
    router.router_metric("hivenet_sync_tick_seconds_count")
}

#[test]
fn eval_refused_at_run_time_costs_the_credits_not_the_round() {
    // Settled: no first-deployment settle window before the first grant.
    let valkey = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    valkey.command(&["SET", "hivenet:{default}:epoch", "1-an-earlier-router"]);
    let policies = policy_dir("acl-runtime", 4);
    let routers: Vec<Site> = std::thread::scope(|scope| {
        let started: Vec<_> = (0..2)
            .map(|index| {
                let (store, policies) = (valkey.addr(), policies.clone());
                scope.spawn(move || router(index, &store, &policies))
            })
            .collect();
        started.into_iter().map(|s| s.join().unwrap()).collect()
    });
    for router in &routers {
        router.wait_metric("hivenet_sync_up", |v| v == 1.0);
        router.wait_metric("hivenet_sync_peers", |v| v == 1.0);
    }
    // Each router's wallet is granted credits: its rounds rewrite its holding from now on.
    for router in &routers {
        let response = request(router.http, &chat_request());
        assert_eq!(
            response.status,
            200,
            "{}\n{}",
            response.text(),
            router.logs()
        );
    }

    // The scripts refused, by text and by SHA1 (the pools' rewrite runs by its SHA1 once cached).
    valkey.command(&["ACL", "SETUSER", "default", "-eval", "-evalsha"]);
    // Budgeted requests while the store refuses EVAL: what each wallet holds may serve them;
    // new grants are refused.
    for router in &routers {
        for _ in 0..3 {
            let response = request(router.http, &chat_request());
            assert!([200, 429].contains(&response.status), "{}", response.text());
        }
    }
    // Ten rounds of each router: three failed rounds are enough to take hivenet_sync_up to 0.
    let from: Vec<f64> = routers.iter().map(rounds).collect();
    let beats: Vec<u64> = (0..2).map(|index| heartbeat_at(&valkey, index)).collect();
    let mut up_seen = vec![Vec::new(); 2];
    common::poll(common::WAIT, || {
        for (index, router) in routers.iter().enumerate() {
            up_seen[index].push(router.router_metric("hivenet_sync_up"));
        }
        routers
            .iter()
            .zip(&from)
            .all(|(router, from)| rounds(router) >= from + 10.0)
            .then_some(())
    })
    .expect("ten rounds");
    for (index, router) in routers.iter().enumerate() {
        let up = router.router_metric("hivenet_sync_up");
        eprintln!(
            "router-{index}: hivenet_sync_up {up}, seen over ten rounds: {:?}",
            up_seen[index]
        );
        assert!(
            up_seen[index].iter().all(|up| *up == 1.0) && up == 1.0,
            "router-{index}: hivenet_sync_up left 1 with EVAL refused: {:?}\n{}",
            up_seen[index],
            router.logs()
        );
        assert_eq!(router.router_metric("hivenet_sync_peers"), 1.0);
        assert!(
            heartbeat_at(&valkey, index) > beats[index],
            "router-{index}'s heartbeat stood still"
        );
        let metrics = router.router_metrics();
        let refused = metric_sum(
            &metrics,
            "hivenet_sync_errors_total",
            &[("kind", "permission")],
        );
        assert!(refused >= 1.0, "no permission error counted\n{metrics}");
        assert_eq!(
            metric_sum(
                &metrics,
                "hivenet_sync_errors_total",
                &[("kind", "unreachable")]
            ),
            0.0,
            "a refusal counted as an unreachable store"
        );
        let logs = router.router.log_text();
        assert!(
            logs.contains("permission") && !logs.contains("unreachable"),
            "router-{index}'s log\n{logs}"
        );
    }

    // A new connection is checked again: the store's refusal is named in the log.
    valkey.command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    for router in &routers {
        router.wait_for("the check of the new connection", || {
            router
                .router
                .log_text()
                .contains("EVAL (occupancy credits")
                .then_some(())
        });
        router.wait_metric("hivenet_sync_up", |v| v == 1.0);
    }
}

/// Daily totals do not depend on the scripts: they go packed in the round's usage script
/// (`store::scripts`), and a store that stops allowing `EVAL` and `EVALSHA` at run time gets
/// them as one `HINCRBY` per total instead: every token reaches it, and the site stays up.
#[test]
fn daily_totals_reach_the_store_when_eval_is_refused_at_run_time() {
    const KEY: &str = "sk-acl-daily";
    let valkey = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    let auth = temp_dir("acl-daily-auth").join("auth.yaml");
    std::fs::write(
        &auth,
        format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...aily\"\n      metadata: {{name: daily, owner: daily}}\n      quota: {{tokens_per_day: 1000000}}\n",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(KEY.as_bytes()))
        ),
    )
    .unwrap();
    let store = valkey.addr();
    let site = Site::start(
        "acl-daily",
        Options::new()
            .router_args(&[
                "--shards",
                "1",
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                &store,
                "--router-id",
                "router-0",
                "--sync-interval",
                "200ms",
                "--sync-min-routers",
                "1",
                "--auth-config-file",
                auth.to_str().unwrap(),
            ])
            .router_env("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", PASSWORD)
            .api_key(KEY)
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .agent(0, &["--capacity", "8"]),
    );
    site.wait_metric("hivenet_sync_up", |v| v == 1.0);
    valkey.command(&["ACL", "SETUSER", "default", "-eval", "-evalsha"]);
    let body = chat("sim-model", false).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut used = 0;
    for _ in 0..5 {
        let response = request(site.http, raw.as_bytes());
        assert_eq!(response.status, 200, "{}", response.text());
        used += response.json()["usage"]["total_tokens"].as_u64().unwrap();
        let from = rounds(&site);
        site.wait_metric("hivenet_sync_tick_seconds_count", move |v| v >= from + 2.0);
    }
    let stored = || valkey.daily_tokens("default");
    common::poll(common::WAIT, || (stored() == used).then_some(())).unwrap_or_else(|| {
        panic!(
            "{used} tokens used, {} in the store\n{}",
            stored(),
            site.logs()
        )
    });
    assert_eq!(site.router_metric("hivenet_sync_up"), 1.0);
    assert_eq!(
        metric_sum(
            &site.router_metrics(),
            "hivenet_sync_errors_total",
            &[("kind", "unreachable")]
        ),
        0.0
    );
}

/// The case, as an operator sets it up: a named ACL user (`--sync-valkey-username`) that
/// may run the sync's commands on the site's keys but not `EVAL`. The router refuses to start
/// and names `EVAL`; the same user with `EVAL` allowed starts and shares limits.
#[test]
fn a_named_acl_user_without_eval_refuses_the_start_and_with_it_starts() {
    let valkey = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    let grant = |eval: &str| {
        valkey.command(&[
            "ACL",
            "SETUSER",
            "hivenet",
            "reset",
            "on",
            ">user-secret",
            "~hivenet:*",
            "+@all",
            "-@dangerous",
            "+info",
            eval,
        ]);
    };
    grant("-eval");
    let addr = valkey.addr();
    let args = [
        "--sync-store",
        "valkey",
        "--sync-valkey-addrs",
        &addr,
        "--sync-valkey-username",
        "hivenet",
        "--router-id",
        "acl-user",
        "--sync-interval",
        "200ms",
    ];
    let env = [("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", "user-secret")];
    let outcome = run_router_within(&temp_dir("acl-user"), &args, &env, START_CHECK_WITHIN);
    let Some((started, stderr)) = outcome else {
        panic!("the router started as a user that may not run EVAL");
    };
    assert!(!started, "exited 0\n{stderr}");
    assert!(
        stderr.contains("permission") && stderr.contains("EVAL (occupancy credits"),
        "{stderr}"
    );
    grant("+eval");
    let site = Site::start(
        "acl-user-allowed",
        Options::new()
            .skip_model_wait()
            .router_args(&args)
            .router_env("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", "user-secret"),
    );
    site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    assert_eq!(
        metric_sum(
            &site.router_metrics(),
            "hivenet_sync_errors_total",
            &[("kind", "permission")]
        ),
        0.0,
        "{}",
        site.logs()
    );
}
