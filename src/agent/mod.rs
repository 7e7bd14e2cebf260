//! `hivenet-agent`: connects one local inference engine to one or more routers.
//!
//! ## Key components
//! - `config`: flags and their validation (pure).
//! - `readiness` + `backend`: wait for the engine to be healthy, discover and warm up its models.
//! - `session`: per router, the gRPC control session (authenticate, register, heartbeats, routing
//!   signals, refresh) and the lifetime of that router's tunnels.
//! - `discovery` (pure) + `sessions` (its driver): which routers get a session — every
//!   `--routers` entry and every router they list — one session per router (by peer ID).
//! - `tunnel`: per router shard, an agent-dialed socket serving HTTP/2 to the router.
//! - `forward`: one tunnelled request proxied to the backend and streamed back.
//! - `engine_client`: the keep-alive HTTP/1.1 connections to the engine, pooled.
//! - `poller` + `engine_metrics` + `engine_report`: engine signals and the re-exported engine
//!   metrics from `/metrics` (parsers pure).
//! - `health`: the backend's health check after registration, carried by every heartbeat.
//! - `host` + `gpu`: the host's CPU and memory (`/proc`) and GPUs (NVML, when loadable), carried
//!   by every heartbeat.
//! - `headers`, `multiaddr`, `backoff`: small pure helpers.
//!
//! ## Architecture
//! ```text
//! main ─ readiness ─┬─ sessions ─┬─ session(router 1) ─┬─ tunnel(shard 0) ─ forward ─ backend
//!                   │            │                     └─ tunnel(shard n) ─ …
//!                   │            └─ session(router 2) ─ …  (added and closed by discovery)
//!                   ├─ poller ─ watch<EngineSnapshot> ─▶ routing signals
//!                   ├─ health ─ watch<bool> ─▶ heartbeats
//!                   └─ host ─ watch<HostStats> ─▶ heartbeats
//! ```
//! The in-flight count is shared by every router and shard: it is what the agent is doing, not
//! what one router asked of it.
//!
//! ## Error handling
//! Nothing after start-up is fatal: sessions and tunnels reconnect with backoff, a failed metrics
//! scrape keeps the last snapshot, a failed backend request becomes a 502/504 for that request only.

pub mod backend;
pub mod backoff;
pub mod config;
pub mod discovery;
pub mod engine_client;
pub mod engine_metrics;
pub mod engine_report;
pub mod forward;
pub mod gpu;
pub mod headers;
pub mod health;
pub mod host;
pub mod multiaddr;
pub mod poller;
pub mod readiness;
pub mod session;
pub mod session_link;
pub mod sessions;
pub mod shared;
pub mod stream;
pub mod tunnel;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::info;

use self::config::Config;
use self::engine_metrics::EngineSnapshot;
use self::forward::{ForwardContext, InFlight};
use crate::base::credentials::Secret;

pub use shared::Shared;

/// Tracing on: the queue request tasks push finished spans to, and the exporter draining it on
/// this runtime (finished once the agent has drained).
fn start_span_export(
    settings: &crate::net::telemetry::TracingSettings,
    peer_id: &str,
) -> anyhow::Result<(
    crate::net::telemetry::SpanQueue,
    crate::net::telemetry::export::SpanExport,
)> {
    use crate::net::telemetry::{self, export};
    let (queue, receiver, dropped) = telemetry::SpanQueue::build(settings.sampler);
    let export = export::spawn(
        settings,
        telemetry::AGENT_SERVICE,
        peer_id,
        export::SpanSource::Queue(receiver),
        dropped,
    )
    .map_err(|error| anyhow::anyhow!("OTEL_EXPORTER_OTLP_ENDPOINT: {error}"))?;
    tracing::info!(endpoint = %settings.endpoint, interval = ?settings.export_interval, "spans exported over OTLP gRPC as hivenet-agent");
    Ok((queue, export))
}

/// The longest a stopping agent waits for its last spans to be exported.
const SPAN_EXPORT_FINISH: std::time::Duration = std::time::Duration::from_secs(5);

/// How often a draining agent looks at its requests in flight.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs the agent until `stop` turns true, then drains: every router is told to route nothing
/// new here, and the requests in flight get up to `--drain-timeout` to finish.
pub async fn run(
    config: Config,
    secret: Secret,
    identity: crate::base::identity::Identity,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let peer_id = identity.peer_id.to_string();
    let tunnel_tls = crate::net::tunnel::tls::client_config(config.p2p_tls_ca.as_deref())
        .map_err(|error| anyhow::anyhow!("--p2p-tls-ca: {error}"))?;
    let backend = backend::Backend::new(&config.backend_url);
    let models = tokio::select! {
        models = readiness::wait_until_ready(&config, &backend) => models,
        _ = stop.wait_for(|stop| *stop) => return Ok(()),
    };

    let (spans, span_export) = match &config.tracing {
        Some(settings) => {
            let (queue, export) = start_span_export(settings, &peer_id)?;
            (Some(queue), Some(export))
        }
        None => (None, None),
    };
    let forward = Arc::new(
        ForwardContext::new(
            &config.backend_url,
            config.http_timeout,
            config.stream_write_timeout,
            InFlight::default(),
        )
        .map_err(anyhow::Error::msg)?
        .with_spans(spans),
    );
    let (to_sessions, engine) = watch::channel(EngineSnapshot::default());
    let (reports_to_sessions, engine_report) = watch::channel(None);
    let mut tasks = JoinSet::new();
    tasks.spawn(poller::run(
        backend.clone(),
        config.engine,
        Arc::from(models.clone()),
        config.engine_sample_interval,
        to_sessions,
        reports_to_sessions,
    ));
    // Readiness saw the backend healthy.
    let (to_heartbeats, backend_healthy) = watch::channel(true);
    tasks.spawn(health::run(
        backend.clone(),
        config.engine,
        config.health_url.clone(),
        config
            .heartbeat_interval
            .unwrap_or(health::HEALTH_CHECK_INTERVAL_DEFAULT),
        to_heartbeats,
    ));
    let (to_heartbeats_host, host) = watch::channel(None);
    tasks.spawn(host::run(to_heartbeats_host));
    let routers = config.routers.clone();
    let drain_timeout = config.drain_timeout;
    let (start_draining, draining) = watch::channel(false);
    let shared = Arc::new(Shared {
        config,
        secret,
        peer_id,
        keypair: identity.keypair,
        unproven_routers: std::sync::atomic::AtomicU64::new(0),
        models,
        forward,
        engine,
        engine_report,
        backend_healthy,
        host,
        tunnel_tls,
        draining,
    });
    tasks.spawn(sessions::run(shared.clone(), routers));
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                // The poller returns at once for engines without metrics, the host sampler when
                // its receivers are gone; sessions never return.
                Some(joined) => joined?,
                None => return Ok(()),
            },
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    let in_flight = || shared.forward.in_flight.get();
    info!(
        in_flight = in_flight(),
        ?drain_timeout,
        "draining: routers route nothing new here; requests in flight run on"
    );
    start_draining.send_replace(true);
    let deadline = tokio::time::Instant::now() + drain_timeout;
    while in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    if in_flight() > 0 {
        tracing::warn!(
            in_flight = in_flight(),
            "drain deadline passed: cutting the requests still in flight"
        );
    }
    if let Some(export) = span_export
        && !export.finish(SPAN_EXPORT_FINISH).await
    {
        tracing::warn!("the last spans were not exported before the agent stopped");
    }
    Ok(())
}
