//! Proves `--p2p-max-conns-per-ip` through the real router and agents: with a limit of two tunnel
//! connections per source address and two shards, the first agent takes both places; a second
//! agent from the same address is refused (and never joins the pool) until the first one leaves,
//! whose tunnels' places are given back when they close on the shards.

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
            .router_args(&["--shards", "2", "--p2p-max-conns-per-ip", "2"]),
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
