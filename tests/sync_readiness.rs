//! Readiness (issue 37, "Readiness"): a router started while its sync store is frozen answers
//! `/health` 200 (it is alive) but `/ready` 503 naming why, on the API port and on the metrics
//! port, so a load balancer steers away; once the store answers, `/ready` is 200.

mod common;

use common::valkey::Valkey;
use common::{Options, Site, get_request, poll, try_request};
use serde_json::Value;

/// `path` on `addr`: the status and the JSON body.
fn probe(addr: std::net::SocketAddr, path: &str) -> Option<(u16, Value)> {
    let response = try_request(addr, &get_request(path)).ok()?;
    let body = serde_json::from_slice(&response.body).ok()?;
    Some((response.status, body))
}

#[test]
fn a_router_started_while_the_store_is_frozen_is_alive_but_not_ready_until_it_answers() {
    let store = Valkey::primary();
    store.freeze();
    let addrs = store.addr();
    let site = Site::start(
        "readiness",
        Options::new().skip_model_wait().router_args(&[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addrs,
            "--router-id",
            "readiness",
            "--sync-interval",
            "200ms",
        ]),
    );

    // Alive (Site::start waited for /health), not ready, on both ports, for as long as the store
    // stays frozen: a few rounds of it.
    site.wait_metric("hivenet_sync_errors_total", |errors| errors >= 3.0);
    for addr in [site.http, site.metrics] {
        let (status, body) = probe(addr, "/ready").expect("/ready answers");
        assert_eq!(status, 503, "{addr}: {body}");
        assert_eq!(body["status"], "not_ready", "{body}");
        assert_eq!(body["reason"], "sync_store_not_reached", "{body}");
    }
    let (status, body) = probe(site.http, "/health").expect("/health answers");
    assert_eq!((status, &body["status"]), (200, &Value::from("ok")));

    store.thaw();
    for addr in [site.http, site.metrics] {
        let ready = poll(common::WAIT, || {
            let (status, body) = probe(addr, "/ready")?;
            (status == 200).then_some(body)
        });
        let body = ready.unwrap_or_else(|| panic!("{addr}: /ready never 200\n{}", site.logs()));
        assert_eq!(body["status"], "ready");
    }
    assert_eq!(site.router_metric("hivenet_sync_up"), 1.0);
}
