//! Proves through the real router, agents and simulated engines that `GET /v1/models` follows the
//! routing pool: an agent whose engine fails its health check leaves `agents.healthy` within one
//! agent heartbeat interval (and returns when the engine passes again), and an agent whose
//! heartbeats stop leaves it within `--unhealthy-after` plus one `--health-check-interval`, even
//! while its routing signals keep arriving.

mod common;

use std::time::{Duration, Instant};

use common::{Options, Site, get_request, poll, request};
use serde_json::Value;

const MODEL: &str = "sim-model";

/// `agents.healthy` of `MODEL` in `/v1/models` (0 when the model is not listed).
fn healthy_agents(site: &Site) -> u64 {
    let response = request(site.http, &site.with_key(get_request("/v1/models")));
    assert_eq!(response.status, 200, "{}", response.text());
    let listing: Value = response.json();
    listing["data"]
        .as_array()
        .expect("data array")
        .iter()
        .find(|model| model["id"] == MODEL)
        .map_or(0, |model| {
            assert_eq!(model["agents"]["healthy"], model["agents"]["total"]);
            model["agents"]["healthy"].as_u64().expect("agents.healthy")
        })
}

/// Waits up to `within` for `agents.healthy` to be `expected`; returns how long it took.
fn wait_healthy(site: &Site, expected: u64, within: Duration) -> Duration {
    let started = Instant::now();
    poll(within, || (healthy_agents(site) == expected).then_some(())).unwrap_or_else(|| {
        panic!(
            "agents.healthy stayed {} instead of {expected} for {within:?}; router log:\n{}",
            healthy_agents(site),
            site.router.log_tail()
        )
    });
    started.elapsed()
}

fn set_sim_healthy(site: &Site, sim: usize, healthy: bool) {
    let body = format!("{{\"healthy\":{healthy}}}");
    let raw = format!(
        "POST /sim/control HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.sim_addrs[sim], raw.as_bytes());
    assert_eq!(response.status, 200, "{}", response.text());
}

#[test]
fn an_agent_whose_engine_fails_its_health_check_leaves_the_listing() {
    // Heartbeats (and so health probes) every 500 ms.
    let agent = ["--capacity", "4", "--heartbeat-interval", "500ms"];
    let site = Site::start(
        "models-follow-pool-health",
        Options::new()
            .sim(&["--models", MODEL])
            .sim(&["--models", MODEL])
            .agent(0, &agent)
            .agent(1, &agent),
    );
    wait_healthy(&site, 2, Duration::from_secs(10));
    set_sim_healthy(&site, 0, false);
    // One probe interval, the probe itself and a snapshot broadcast; well under the router's
    // 15 s heartbeat timeout, which is not what takes it out.
    let took = wait_healthy(&site, 1, Duration::from_secs(5));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        site.router
            .log_text()
            .contains("agent left the routing pool")
    );
    // Requests go to the healthy agent only.
    for _ in 0..4 {
        site.assert_chat_ok(MODEL);
    }
    set_sim_healthy(&site, 0, true);
    wait_healthy(&site, 2, Duration::from_secs(5));
}

#[test]
fn an_agent_whose_heartbeats_stop_leaves_the_listing_while_signals_flow() {
    const UNHEALTHY_AFTER: Duration = Duration::from_secs(3);
    // One heartbeat at session start, then none for a minute; routing signals every 100 ms.
    let site = Site::start(
        "models-follow-pool-heartbeats",
        Options::new()
            .sim(&["--models", MODEL])
            .agent(
                0,
                &[
                    "--capacity",
                    "4",
                    "--heartbeat-interval",
                    "60s",
                    "--routing-signal-interval",
                    "100ms",
                ],
            )
            .router_args(&[
                "--unhealthy-after",
                "3s",
                "--remove-after",
                "120s",
                "--health-check-interval",
                "250ms",
            ]),
    );
    let started = Instant::now();
    // Listed once the session is up; gone within --unhealthy-after (+ one health pass) of its
    // only heartbeat, which came before `Site::start` returned.
    wait_healthy(&site, 0, UNHEALTHY_AFTER + Duration::from_secs(3));
    assert!(started.elapsed() <= UNHEALTHY_AFTER + Duration::from_secs(3));
    assert!(
        site.router
            .log_text()
            .contains("agent left the routing pool")
    );
    // Signals kept arriving all along; they do not bring it back.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(healthy_agents(&site), 0);
}
