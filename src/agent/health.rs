//! The backend health monitor: after registration, probes the engine's health check (the same
//! probe readiness waits on) every heartbeat interval and publishes whether it passes.
//!
//! Sessions carry the answer in every heartbeat (`Heartbeat.backend_unhealthy`) and send one at
//! once when it changes: the router takes the agent out of its routing pool, and out of
//! `GET /v1/models`, while the backend fails, and brings it back when the backend passes again,
//! without closing the session. Logs once when the backend starts failing and once when it
//! recovers.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use super::backend::Backend;
use super::config::Engine;

/// How often the backend is probed when `--heartbeat-interval` is not given (the router's
/// default heartbeat interval): a failing backend leaves the pool within one interval plus the
/// probe's timeout.
pub const HEALTH_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

/// Probes forever every `every`; `to_sessions` holds true while the backend passes.
pub async fn run(
    backend: Backend,
    engine: Engine,
    health_url: String,
    every: Duration,
    to_sessions: watch::Sender<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = backend.check_health(engine, &health_url).await;
        let healthy = result.is_ok();
        if healthy == *to_sessions.borrow() {
            continue;
        }
        match result {
            Ok(()) => info!("backend passes its health check again: back in the routing pool"),
            Err(error) => {
                warn!(%error, "backend failed its health check: leaving the routing pool")
            }
        }
        to_sessions.send_replace(healthy);
    }
}
