//! The router checks what it reads of the sync store's router records (issue 37, "What the store
//! says is checked"): a heartbeat dated in the future goes silent once it stops changing instead
//! of staying live for ever, a record it cannot read is ignored and counted, the silent routers
//! and the share held back for them are gauges, a router restarted under a new router ID does
//! not keep its old ID's share, a router says it left only once its last round went through, and
//! the routers `--sync-min-routers` counts that the store does not list are a gauge.

mod common;

use common::valkey::Valkey;
use common::{Options, Site, Stop, poll};
use serde_json::json;

/// The site's router records in the store (`hivenet:{site}:routers`, the default site).
const ROUTERS: &str = "hivenet:{default}:routers";

fn router(name: &str, store: &Valkey, sim: bool) -> Site {
    router_with(name, store, sim, &[])
}

/// [`router`] with more router arguments.
fn router_with(name: &str, store: &Valkey, sim: bool, extra: &[&str]) -> Site {
    let addrs = store.addr();
    let options = Options::new()
        .skip_model_wait()
        .router_env("HIVENET_ROUTER_ROUTER_ID", name)
        .router_args(&[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addrs,
            "--sync-interval",
            "200ms",
        ])
        .router_args(extra);
    let options = if sim {
        options.sim(&["--models", "sim-model"])
    } else {
        options
    };
    Site::start(name, options)
}

/// Sync rounds `site` has run so far.
fn rounds(site: &Site) -> f64 {
    site.router_metric("hivenet_sync_tick_seconds_count")
}

/// Asserts that `name` on `site` holds `value` at every scrape over the next `count` rounds.
fn holds_for_rounds(site: &Site, name: &str, value: f64, count: f64) {
    let until = rounds(site) + count;
    let done = poll(common::WAIT, || {
        let seen = site.router_metric(name);
        assert_eq!(seen, value, "{name} on {}", site.dir.display());
        (rounds(site) >= until).then_some(())
    });
    assert!(done.is_some(), "{count} rounds never ran\n{}", site.logs());
}

#[test]
fn a_forged_heartbeat_dated_in_the_future_goes_silent_and_garbage_is_counted() {
    let store = Valkey::primary();
    let home = router("records-home", &store, false);
    home.wait_metric("hivenet_sync_up", |up| up == 1.0);

    // A record no router rewrites, dated decades ahead.
    let ghost = json!({
        "run": 1,
        "at_unix_ms": 4_000_000_000_000u64,
        "interval_ms": 1000,
        "peer_id": "12D3KooWGhostGhostGhostGhostGhostGhostGhostGhostGhost",
        "grpc_addr": "127.0.0.1:1",
        "agents": [],
    });
    store.command(&["HSET", ROUTERS, "ghost", &ghost.to_string()]);
    store.command(&["HSET", ROUTERS, "garbage", "{this is not a heartbeat"]);

    // Live when first seen; before the fix the future time kept it live for ever. Now it is
    // silent once this router has seen it unchanged for three of its intervals (3 s).
    home.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);
    home.wait_metric("hivenet_sync_peers", |peers| peers == 0.0);
    assert_eq!(home.router_metric("hivenet_sync_silent_routers"), 1.0);
    assert_eq!(home.router_metric("hivenet_sync_silent_share_ratio"), 0.5);
    assert_eq!(
        home.router_metric("hivenet_sync_malformed_records_total"),
        1.0,
        "the garbage record, counted once"
    );
    holds_for_rounds(&home, "hivenet_sync_malformed_records_total", 1.0, 5.0);
    assert!(
        home.logs().contains("cannot read"),
        "the malformed record is logged\n{}",
        home.logs()
    );

    // The record removed: nothing is held back any more.
    store.command(&["HDEL", ROUTERS, "ghost"]);
    home.wait_metric("hivenet_sync_silent_routers", |silent| silent == 0.0);
    assert_eq!(home.router_metric("hivenet_sync_silent_share_ratio"), 0.0);
}

#[test]
fn a_router_restarted_under_a_new_id_does_not_keep_its_old_share() {
    let store = Valkey::primary();
    let mut home = router("restart-home", &store, true);
    let mut other = router("restart-old-id", &store, false);
    let routers = format!("{},{}", home.grpc, other.grpc);
    home.spawn_agent(0, &["--routers", &routers]);
    home.wait_metric("hivenet_shard_tunnels_open", |open| open >= 2.0);
    other.wait_metric("hivenet_shard_tunnels_open", |open| open >= 2.0);
    home.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);

    // A crash, and the same process (same identity file, same ports) back under a new ID: the
    // agent reconnects to it; the old ID's record stays in the store, never rewritten.
    other.restart_router(Stop::Kill, &["--router-id", "restart-new-id"]);
    other.wait_metric("hivenet_shard_tunnels_open", |open| open >= 2.0);
    let fields = store.command(&["HKEYS", ROUTERS]);
    assert!(
        fields.contains("restart-old-id") && fields.contains("restart-new-id"),
        "{fields}"
    );
    home.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);
    // Wait until the old record is silent (unchanged for over three intervals).
    let silent_since = poll(common::WAIT, || {
        let record = store.command(&["HGET", ROUTERS, "restart-old-id"]);
        let at = serde_json::from_str::<serde_json::Value>(&record).ok()?["at_unix_ms"].as_u64()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_millis() as u64;
        (now > at + 1000).then_some(at)
    });
    assert!(silent_since.is_some(), "the old record kept changing");
    // It must not be counted: the same identity runs live under the new ID.
    holds_for_rounds(&home, "hivenet_sync_silent_routers", 0.0, 10.0);
    assert_eq!(home.router_metric("hivenet_sync_silent_share_ratio"), 0.0);
    assert_eq!(home.router_metric("hivenet_sync_peers"), 1.0);
}

/// `left` in a router's record in the store.
fn record_says_left(store: &Valkey, id: &str) -> Option<bool> {
    let record = store.command(&["HGET", ROUTERS, id]);
    let record = serde_json::from_str::<serde_json::Value>(&record).ok()?;
    Some(record["left"].as_bool().unwrap_or(false))
}

/// A router that stops cleanly says it left only once its last round went through. A round
/// whose usage the store refused still wrote the heartbeat beside it (a transaction runs on
/// past a command's error): the others then dropped the part they kept for that router while
/// its usage waited in its journal (`sync::simulation`, seed 3,043). Here the store refuses a
/// command of every round after the heartbeat's (the epoch's key holds a hash), and the record
/// of the router that stops does not say it left; a router whose last round went through says
/// so.
#[test]
fn a_router_says_it_left_only_once_its_last_round_went_through() {
    let store = Valkey::primary();
    let mut refused = router("left-refused", &store, false);
    let mut clean = router("left-clean", &store, false);
    refused.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);
    clean.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);

    clean.router.terminate();
    assert_eq!(record_says_left(&store, "left-clean"), Some(true));

    let from = rounds(&refused);
    store.command(&["DEL", "hivenet:{default}:epoch"]);
    store.command(&["HSET", "hivenet:{default}:epoch", "not", "a string"]);
    refused.wait_metric("hivenet_sync_errors_total", |errors| errors >= 1.0);
    assert!(rounds(&refused) > from);
    refused.router.terminate();
    assert_eq!(
        record_says_left(&store, "left-refused"),
        Some(false),
        "a router whose last round failed said it left"
    );
}

/// `--sync-min-routers 2` and one router running: the store lists one router, the other is
/// unlisted (each daily budget leaves it its part of the whole budget, `limits::daily`), and a
/// warning says so. Listed once a second router runs; once that one leaves cleanly its record
/// says it left: a router known gone, not unlisted.
#[test]
fn routers_the_site_counts_and_the_store_does_not_list_are_a_gauge() {
    let store = Valkey::primary();
    let min_routers = ["--sync-min-routers", "2"];
    let home = router_with("unlisted-home", &store, false, &min_routers);
    home.wait_metric("hivenet_sync_up", |up| up == 1.0);
    home.wait_metric("hivenet_sync_unlisted_routers", |unlisted| unlisted == 1.0);
    home.wait_for("the warning about the unlisted router", || {
        home.logs()
            .contains("lists fewer routers than --sync-min-routers")
            .then_some(())
    });

    let mut other = router_with("unlisted-other", &store, false, &min_routers);
    home.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);
    assert_eq!(home.router_metric("hivenet_sync_unlisted_routers"), 0.0);
    let status = other.router.terminate();
    assert!(status.success(), "{status:?}");
    home.wait_metric("hivenet_sync_peers", |peers| peers == 0.0);
    holds_for_rounds(&home, "hivenet_sync_unlisted_routers", 0.0, 10.0);
    assert_eq!(home.router_metric("hivenet_sync_silent_routers"), 0.0);
}
