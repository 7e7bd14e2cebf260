//! Proves, with real routers (no sync store) and a real agent, what agent discovery does before a
//! store lists the site's routers: an agent given two routers with `--routers` (or
//! `HIVENET_AGENT_ROUTERS`) keeps a session with each and is served through both; a router
//! reached under two addresses gets one session and one registration (recognized by its peer
//! ID), and so does a router that lists itself under its advertised address; and a router refuses
//! to start with a listen address as `--advertise-grpc-addr`.

mod common;

use std::time::Duration;

use common::{Options, Site, metric_sum, refused_start};

/// Tunnels per agent session: the harness starts routers with `--shards 2`.
const SHARDS: f64 = 2.0;

fn sim_site(name: &str) -> Site {
    // The advertised address is not this router's gRPC port (the harness picks that port at
    // start): without a store a router lists only itself, so the agent, which already reaches
    // it, must never dial the address. Nothing listens there; a dial would show in its log.
    Site::start(
        name,
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "2"])
            .router_args(&["--advertise-grpc-addr", "127.0.0.1:1"])
            .skip_model_wait(),
    )
}

/// Sessions an agent opened, from its log.
fn connects(site: &Site, agent: usize) -> usize {
    site.agents[agent]
        .log_text()
        .matches("connecting to router")
        .count()
}

#[test]
fn an_agent_keeps_a_session_with_each_listed_router() {
    let mut site_a = sim_site("discovery_two_routers_a");
    let site_b = Site::start(
        "discovery_two_routers_b",
        Options::new()
            .router_args(&["--advertise-grpc-addr", "127.0.0.1:2"])
            .skip_model_wait(),
    );
    let routers = format!("{},{}", site_a.grpc, site_b.grpc);
    // `--router-grpc` (the harness's, naming router A) is ignored when the list is given.
    site_a.spawn_agent_with_env(0, &["--capacity", "4"], &[("HIVENET_AGENT_ROUTERS", &routers)]);
    for site in [&site_a, &site_b] {
        site.wait_metric("hivenet_shard_tunnels_open", |open| open == SHARDS);
        site.wait_metric("hivenet_routing_agents_routable", |routable| routable == 1.0);
        site.wait_models(&["sim-model"]);
    }
    site_a.assert_chat_ok("sim-model");
    site_b.assert_chat_ok("sim-model");
    // Heartbeats (every 5 s) carried each router's list of itself: still two sessions.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(connects(&site_a, 0), 2, "{}", site_a.agents[0].log_tail());
    for site in [&site_a, &site_b] {
        let metrics = site.router_metrics();
        assert_eq!(metric_sum(&metrics, "hivenet_shard_tunnels_open", &[]), SHARDS);
        assert_eq!(metric_sum(&metrics, "hivenet_routing_agents_routable", &[]), 1.0);
    }
}

#[test]
fn a_router_reached_under_two_addresses_gets_one_session() {
    let mut site = sim_site("discovery_dedupe");
    let port = site.grpc.port();
    let routers = format!("127.0.0.1:{port},localhost:{port}");
    site.spawn_agent(0, &["--capacity", "4", "--routers", &routers]);
    site.wait_metric("hivenet_routing_agents_routable", |routable| routable == 1.0);
    site.wait_for("the agent to see the router twice", || {
        site.agents[0]
            .log_text()
            .contains("is already reached by another session")
            .then_some(())
    });
    site.assert_chat_ok("sim-model");
    // One registration and one session's tunnels, also after heartbeats carry the router's
    // list of itself.
    std::thread::sleep(Duration::from_secs(6));
    let metrics = site.router_metrics();
    assert_eq!(
        metric_sum(&metrics, "hivenet_shard_tunnels_open", &[]),
        SHARDS,
        "{}",
        site.logs()
    );
    assert_eq!(metric_sum(&metrics, "hivenet_routing_agents_routable", &[]), 1.0);
    let registered = site.router.log_text().matches("agent registered").count();
    assert_eq!(registered, 1, "{}", site.router.log_tail());
    assert_eq!(connects(&site, 0), 2, "the two --routers entries only");
}

#[test]
fn a_listen_address_is_refused_as_the_advertised_address() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("agent-discovery-refusals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for bad in [":50051", "0.0.0.0:50051", "[::]:50051"] {
        let stderr = refused_start(&dir, &["--advertise-grpc-addr", bad], &[]);
        assert!(
            stderr.contains("--advertise-grpc-addr") && stderr.contains("listen address"),
            "{bad}: {stderr}"
        );
    }
    let stderr = refused_start(
        &dir,
        &[],
        &[("HIVENET_ROUTER_ADVERTISE_GRPC_ADDR", "router-0:grpc")],
    );
    assert!(
        stderr.contains("--advertise-grpc-addr") && stderr.contains("numeric port"),
        "{stderr}"
    );
}
