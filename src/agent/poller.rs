//! The engine-metrics poller: scrapes `GET {backend}/metrics` every `--engine-sample-interval`
//! and publishes the latest [`EngineSnapshot`] (and the fuller [`EngineReport`]) for the routing
//! signals.
//!
//! A failed scrape keeps the previous snapshot (routing signals carry stale data rather than
//! none) and logs once when scraping starts failing and once when it recovers. A successful scrape
//! replaces the snapshot even when it holds no known metric, so an engine with metrics disabled
//! reports `has_engine_metrics = false`.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tracing::{info, warn};

use super::backend::Backend;
use super::config::Engine;
use super::engine_metrics::{self, EngineSnapshot};
use super::engine_report;
use crate::wire::proto::EngineReport;

pub async fn run(
    backend: Backend,
    engine: Engine,
    models: Arc<[String]>,
    every: std::time::Duration,
    to_sessions: watch::Sender<EngineSnapshot>,
    reports_to_sessions: watch::Sender<Option<EngineReport>>,
) {
    if !engine_metrics::engine_has_metrics(engine) {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match backend.scrape_metrics().await {
            Ok(text) => {
                let snapshot = engine_metrics::extract(&text, engine, &models);
                to_sessions.send_replace(snapshot);
                reports_to_sessions
                    .send_replace(Some(engine_report::extract(&text, engine, &models)));
                if failing {
                    info!("engine metrics scrape recovered");
                    failing = false;
                }
            }
            Err(error) => {
                if !failing {
                    warn!(%error, "Engine metrics scrape started failing — routing signals will carry stale data");
                    failing = true;
                }
            }
        }
    }
}
