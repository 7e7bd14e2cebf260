//! `hivenet_sync_unknown_routers` (seed `run-several-routers.md`, "Occupancy after the store
//! comes back"): routers the agents report a connection to that the store does not list. A
//! router given the wrong `--sync-site` is one: its agents report it, the others' store never
//! lists it.

mod common;

use common::valkey::Valkey;
use common::{Options, Site};

fn router(name: &str, store: &Valkey, site: &str) -> Site {
    let addrs = store.addr();
    let options = Options::new()
        .sim(&["--models", "sim-model"])
        .skip_model_wait()
        .router_args(&[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addrs,
            "--sync-site",
            site,
            "--router-id",
            name,
            "--sync-interval",
            "200ms",
        ]);
    Site::start(name, options)
}

#[test]
fn a_router_the_agents_reach_but_the_store_does_not_list_is_counted() {
    let store = Valkey::primary();
    let stray = router("unknown-stray", &store, "site-b");
    let mut home = router("unknown-home", &store, "site-a");
    let routers = format!("{},{}", home.grpc, stray.grpc);
    home.spawn_agent(0, &["--routers", &routers]);
    // The agent is on both routers; the store of site-a lists only unknown-home.
    home.wait_metric("hivenet_sync_peers", |peers| peers == 0.0);
    home.wait_metric("hivenet_sync_unknown_routers", |unknown| unknown == 1.0);
    // site-b's view: the agent reports unknown-home, which site-b's store does not list.
    stray.wait_metric("hivenet_sync_unknown_routers", |unknown| unknown == 1.0);
}
