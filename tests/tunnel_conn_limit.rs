//! Proves `--p2p-max-conns-per-ip` through the real router and agents. It counts agents from one
//! source address, as the reference has it, each with a tunnel connection to every shard: with a
//! limit of one and two shards, the first agent takes both places; a second agent from the same
//! address is refused (and never joins the pool) until the first one leaves, whose tunnels'
//! places are given back when they close on the shards. And with the default (32) on a router with
//! more shards than that, one agent connects to every shard and joins the pool (counted per
//! connection, its 33rd tunnel was refused and it never joined).

mod common;

use std::time::Duration;

use common::{Options, Site, poll};

#[test]
fn tunnels_per_source_address_are_limited_and_given_back() {
    let mut site = Site::start(
        "tunnel-conn-limit",
        Options::new()
            .sim(&["--models", "sim-model"])
            .sim(&["--models", "other-model"])
            .agent(0, &[])
            .router_args(&["--shards", "2", "--p2p-max-conns-per-ip", "1"]),
    );
    let second = site.spawn_agent(1, &[]);
    poll(Duration::from_secs(10), || {
        site.router
            .log_text()
            .contains("too many connections from this address")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("second agent was not refused\n{}", site.logs()));
    assert!(!site.model_ids().contains(&"other-model".to_string()));
    assert_eq!(site.router_metric("hivenet_shard_tunnels_open"), 2.0);

    // The first agent leaves: its two places come back and the second agent gets in.
    site.agents[0].kill();
    site.wait_model_gone("sim-model");
    site.wait_models(&["other-model"]);
    assert!(!site.agents[second].exited());
    assert_eq!(site.router_metric("hivenet_shard_tunnels_open"), 2.0);
}

#[test]
fn one_agent_joins_a_router_with_more_shards_than_the_default_limit() {
    const SHARDS: usize = 40;
    let site = Site::start(
        "tunnel-conn-limit-shards",
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &[])
            .router_args(&["--shards", &SHARDS.to_string(), "--pin-shards", "false"]),
    );
    // The start waited for the agent's model: it joined, with a tunnel to every shard.
    assert_eq!(
        site.router_metric("hivenet_shard_tunnels_open"),
        SHARDS as f64
    );
    assert!(
        !site
            .router
            .log_text()
            .contains("too many connections from this address"),
        "{}",
        site.logs()
    );
    site.assert_chat_ok("sim-model");
}
