//! A router's agents travel apart from its heartbeat (issue 33, "heartbeats that do not grow with
//! routers × agents"): the heartbeat names the version of the router's agent list, the list is
//! written to `hivenet:{site}:agents` when it changes and not every round, written again on a
//! new connection, since a store that failed over or restarted may have lost it, and every 60
//! rounds, so a list lost otherwise comes back. That other
//! routers still give a crashed router up through the list is `shared_occupancy`'s
//! `a_crashed_router_is_given_up_once_its_agents_report_it_gone`.

mod common;

use common::valkey::Valkey;
use common::{Options, Site, poll};
use hivenet_router::router::sync::site::{AGENTS_LISTED_APART, AgentList};

const ROUTER: &str = "lists";
const ROUTERS: &str = "hivenet:{default}:routers";
const AGENTS: &str = "hivenet:{default}:agents";

fn rounds(site: &Site) -> f64 {
    site.router_metric("hivenet_sync_tick_seconds_count")
}

/// The router's heartbeat as stored.
fn heartbeat(store: &Valkey) -> serde_json::Value {
    serde_json::from_str(&store.command(&["HGET", ROUTERS, ROUTER])).expect("a heartbeat")
}

/// The router's stored agent list, when there is one.
fn list(store: &Valkey) -> Option<AgentList> {
    AgentList::parse(&store.command(&["HGET", AGENTS, ROUTER]))
}

/// Waits until the stored list names `count` agents and the heartbeat names its version.
fn wait_list_of(site: &Site, store: &Valkey, count: usize) -> AgentList {
    site.wait_for(&format!("a list of {count} agents"), || {
        let list = list(store)?;
        let named = heartbeat(store)["agents_version"].as_u64()?;
        (list.agents.len() == count && list.version == named).then_some(list)
    })
}

#[test]
fn the_agent_list_is_written_when_it_changes_and_again_on_a_new_connection() {
    let store = Valkey::primary();
    let addrs = store.addr();
    let mut site = Site::start(
        ROUTER,
        Options::new()
            .skip_model_wait()
            .router_env("HIVENET_ROUTER_ROUTER_ID", ROUTER)
            .router_args(&[
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                &addrs,
                "--sync-interval",
                "200ms",
            ])
            .sim(&["--models", "sim-model"]),
    );
    site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    site.spawn_agent(0, &[]);
    let one = wait_list_of(&site, &store, 1);
    // The heartbeat itself lists no agent: only what routers of the version before read as an
    // agent no one reports.
    assert_eq!(
        heartbeat(&store)["agents"],
        serde_json::json!([AGENTS_LISTED_APART])
    );

    // Unchanged, the list is not written again: a marked copy of it stays for ten rounds (the
    // periodic rewrite comes 60 rounds after the write, a few rounds before the marking).
    let marked = serde_json::json!({"version": one.version, "agents": one.agents, "marked": true})
        .to_string();
    store.command(&["HSET", AGENTS, ROUTER, &marked]);
    let until = rounds(&site) + 10.0;
    let done = poll(common::WAIT, || {
        assert_eq!(store.command(&["HGET", AGENTS, ROUTER]), marked);
        (rounds(&site) >= until).then_some(())
    });
    assert!(done.is_some(), "ten rounds never ran\n{}", site.logs());

    // A second agent changes it.
    site.spawn_agent(0, &[]);
    let two = wait_list_of(&site, &store, 2);
    assert_ne!(two.version, one.version);
    assert!(two.agents.contains(&one.agents[0]));

    // Lost from the store with the connection (as a restart or a failover loses it): the new
    // connection writes it again.
    store.command(&["HDEL", AGENTS, ROUTER]);
    store.command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    assert_eq!(wait_list_of(&site, &store, 2), two);

    // Lost on the same connection: the periodic rewrite brings it back.
    store.command(&["HDEL", AGENTS, ROUTER]);
    let from = rounds(&site);
    assert_eq!(wait_list_of(&site, &store, 2), two);
    assert!(
        rounds(&site) - from <= 61.0 + 5.0,
        "{} rounds",
        rounds(&site) - from
    );
}
