//! What every session of the agent reads: its configuration and identity, the models it serves,
//! and the watch channels of the engine, host and readiness signals.

use std::sync::Arc;

use tokio::sync::watch;

use super::config::Config;
use super::engine_metrics::EngineSnapshot;
use super::forward::ForwardContext;
use crate::base::credentials::Secret;

/// What every session reads; built once after readiness.
pub struct Shared {
    pub config: Config,
    pub secret: Secret,
    pub peer_id: String,
    /// The identity key: it signs each router's challenge (`base::challenge`).
    pub keypair: libp2p_identity::Keypair,
    /// Routers dialled that failed the challenge since the agent started (each heartbeat's
    /// `unproven_routers`).
    pub unproven_routers: std::sync::atomic::AtomicU64,
    /// The models registered with every router.
    pub models: Vec<String>,
    pub forward: Arc<ForwardContext>,
    pub engine: watch::Receiver<EngineSnapshot>,
    /// The rest of the last engine scrape (`engine_report`); `None` before the first.
    pub engine_report: watch::Receiver<Option<crate::wire::proto::EngineReport>>,
    /// Whether the backend passed its last health check (`health`).
    pub backend_healthy: watch::Receiver<bool>,
    /// The host's CPU, memory and GPUs at the last sample (`host`); `None` before the first.
    pub host: watch::Receiver<Option<crate::wire::proto::HostStats>>,
    /// TLS for routers that announce a `/tls` tunnel address (`--p2p-tls-ca` or the web roots).
    pub tunnel_tls: Arc<rustls::ClientConfig>,
    /// True once the agent is shutting down: sessions tell their routers and do not reconnect.
    pub draining: watch::Receiver<bool>,
}
