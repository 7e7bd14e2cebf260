//! Proves, with real routers and a real Valkey, that one `--router-id` runs one process (issue 37,
//! finding 4): a second process started under the ID of a running router refuses to start,
//! naming the other; a router cut off from the store past its claim, whose ID another process
//! took meanwhile, steps down loudly when it is back; and the daily total in the store is every
//! token both processes spent, where the two used to overwrite one field (10,911 tokens spent,
//! 8,186 in the store).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::relay::TunnelRelay;
use common::valkey::Valkey;
use common::{Options, Site, chat, poll, request, run_router_within};
use sha2::{Digest, Sha256};

const KEY: &str = "sk-router-id-daily";
const CLAIM: &str = "hivenet:{default}:owner:r1";
/// The claim's expiry at a 200 ms interval (`sync::claim::TTL_MIN`), plus one interval: a
/// start-up waits this long on another process's claim before it refuses.
const PATIENCE: Duration = Duration::from_millis(2_200);

fn auth_file() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-it")
        .join(format!("router-id-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auth.yaml");
    std::fs::write(
        &path,
        format!(
            "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: \"sk-...test\"\n      metadata:\n        name: \"{KEY}\"\n        owner: \"{KEY}\"\n      quota:\n        tokens_per_day: 1000000\n",
            hex::encode(Sha256::digest(KEY.as_bytes()))
        ),
    )
    .unwrap();
    path
}

/// A router `--router-id r1` reaching the store at `store` (host:port), with its sim and agent.
fn router(name: &str, store: &str, auth: &str) -> Site {
    Site::start(
        name,
        Options::new()
            .api_key(KEY)
            .router_args(&[
                "--auth-config-file",
                auth,
                "--shards",
                "1",
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                store,
                "--router-id",
                "r1",
                "--sync-interval",
                "200ms",
                "--sync-min-routers",
                "1",
            ])
            .sim(&["--models", "sim-model", "--output-tokens", "4"])
            .agent(0, &["--capacity", "64"]),
    )
}

fn chat_request() -> Vec<u8> {
    let body = chat("sim-model", false).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `count` chats to `router`, each admitted; returns the tokens they cost.
fn spend(router: &Site, count: usize) -> u64 {
    (0..count)
        .map(|_| {
            let response = request(router.http, &chat_request());
            assert_eq!(
                response.status,
                200,
                "{}\n{}",
                response.text(),
                router.logs()
            );
            response.json()["usage"]["total_tokens"]
                .as_u64()
                .expect("usage.total_tokens")
        })
        .sum()
}

/// Today's total of router ID `r1` in the store (every field of it, every daily hash).
fn stored(valkey: &Valkey) -> u64 {
    let keys = valkey.command(&["KEYS", "hivenet:{default}:daily:*"]);
    keys.lines()
        .filter(|key| !key.is_empty())
        .map(|key| {
            let fields = valkey.command(&["HGETALL", key]);
            let fields: Vec<&str> = fields.lines().collect();
            fields
                .chunks(2)
                .filter(|pair| pair[0].starts_with("r1|"))
                .map(|pair| pair[1].parse::<u64>().expect("a total"))
                .sum::<u64>()
        })
        .sum()
}

fn rounds(router: &Site) -> f64 {
    router.router_metric("hivenet_sync_tick_seconds_count")
}

fn wait_rounds(router: &Site, count: f64) {
    let from = rounds(router);
    router.wait_metric("hivenet_sync_tick_seconds_count", |v| v >= from + count);
}

#[test]
fn a_second_process_under_a_running_router_id_refuses_to_start() {
    let valkey = Valkey::primary();
    let auth = auth_file();
    let first = router("router-id-first", &valkey.addr(), auth.to_str().unwrap());
    first.wait_metric("hivenet_sync_up", |v| v == 1.0);
    let pid = first.router.pid().expect("a running router").to_string();
    let addr = valkey.addr();
    let outcome = run_router_within(
        &first.dir,
        &[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addr,
            "--router-id",
            "r1",
            "--sync-interval",
            "200ms",
        ],
        &[],
        PATIENCE + Duration::from_secs(15),
    );
    let Some((started, output)) = outcome else {
        panic!("a second process under --router-id r1 started and ran");
    };
    assert!(!started, "exited 0\n{output}");
    let errors: Vec<&str> = output.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one ERROR line\n{output}");
    assert!(
        errors[0].contains("another process runs under --router-id r1")
            && errors[0].contains(&format!("pid {pid} ")),
        "the line names the running process (pid {pid})\n{output}"
    );
    // The running router did not notice.
    wait_rounds(&first, 3.0);
    assert_eq!(first.router_metric("hivenet_sync_up"), 1.0);
    assert_eq!(first.router_metric("hivenet_sync_router_id_conflict"), 0.0);
}

#[test]
fn two_processes_under_one_router_id_lose_no_daily_tokens_and_the_cut_off_one_steps_down() {
    let valkey = Valkey::primary();
    let auth = auth_file();
    // Router A reaches the store through a relay the test cuts.
    let relay = TunnelRelay::start();
    relay.forward_to(valkey.port());
    let a = router(
        "router-id-a",
        &format!("127.0.0.1:{}", relay.port),
        auth.to_str().unwrap(),
    );
    a.wait_metric("hivenet_sync_up", |v| v == 1.0);
    let mut spent = spend(&a, 5);
    wait_rounds(&a, 2.0);

    // A is cut off from the store; its claim expires; B starts under the same ID and takes it.
    relay.forward_to(0);
    relay.cut(usize::MAX);
    poll(common::WAIT, || {
        (valkey.command(&["EXISTS", CLAIM]) == "0").then_some(())
    })
    .expect("A's claim never expired while it was cut off");
    let b = router("router-id-b", &valkey.addr(), auth.to_str().unwrap());
    b.wait_metric("hivenet_sync_up", |v| v == 1.0);
    // Both spend: A alone, B through the store.
    spent += spend(&a, 7);
    spent += spend(&b, 11);
    wait_rounds(&b, 2.0);

    // A is back: it writes what it held back, and finds B holding the ID.
    relay.forward_to(valkey.port());
    let in_store = poll(Duration::from_secs(20), || {
        let stored = stored(&valkey);
        (stored == spent).then_some(stored)
    });
    let last = stored(&valkey);
    eprintln!("tokens spent under r1 by both processes: {spent}; in the store: {last}");
    assert_eq!(
        in_store,
        Some(spent),
        "{spent} tokens spent under r1, {last} in the store\nA:\n{}\nB:\n{}",
        a.logs(),
        b.logs()
    );
    a.wait_metric("hivenet_sync_router_id_conflict", |v| v == 1.0);
    let b_pid = b.router.pid().expect("B runs").to_string();
    let log = a.router.log_text();
    let stepped_down = log
        .lines()
        .find(|line| line.contains("ERROR") && line.contains("steps down"))
        .unwrap_or_else(|| panic!("A never logged stepping down\n{log}"));
    assert!(
        stepped_down.contains(&format!("pid {b_pid} ")),
        "{stepped_down}"
    );
    // A stays down (it writes nothing more), B keeps the site; nothing is counted twice.
    wait_rounds(&b, 5.0);
    assert_eq!(a.router_metric("hivenet_sync_up"), 0.0);
    assert_eq!(a.router_metric("hivenet_sync_router_id_conflict"), 1.0);
    assert_eq!(b.router_metric("hivenet_sync_up"), 1.0);
    assert_eq!(b.router_metric("hivenet_sync_router_id_conflict"), 0.0);
    assert_eq!(stored(&valkey), spent);

    // B stops cleanly and gives the ID up: A takes it back and shares limits again.
    let mut b = b;
    let status = b.router.terminate();
    assert!(status.success(), "{}", b.logs());
    a.wait_metric("hivenet_sync_router_id_conflict", |v| v == 0.0);
    a.wait_metric("hivenet_sync_up", |v| v == 1.0);
    spent += spend(&a, 2);
    poll(common::WAIT, || (stored(&valkey) == spent).then_some(())).unwrap_or_else(|| {
        panic!(
            "{spent} tokens spent, {} in the store after A took the ID back",
            stored(&valkey)
        )
    });
}
