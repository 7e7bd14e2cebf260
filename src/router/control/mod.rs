//! The control core: a small `tokio` runtime on its own thread that runs the agent gRPC service,
//! the tunnel acceptor, agent health checks and the Prometheus endpoint, and tells shards what
//! changed. Nothing here is on the request path.
//!
//! Key components: `core` (the start: listeners, watchers and the loop that answers the shards),
//! `registry` (pure agent/model state), `service` (gRPC), `tunnel_accept` (the agent-dialed data
//! sockets) and `tunnel_refusals` (its log lines), `metrics_http` (`/metrics`), `auth_reload`,
//! `policies` and `policy_reload` (`auth.yaml` and routing policies, at start-up and on change),
//! `admin` and `admin_policy` (the control side of `/admin/*`), `daily_flush` and `disk_db`
//! (daily totals to the disk database, `HIVENET_ROUTER_QUOTA_BACKEND=badger`), `site_routers`
//! (the site's routers handed to agents for discovery). The bounded queues to and from the shards
//! are the shard's (`router::shard::queues`).
//! [`ControlShared`] is the state they share; its registry lock is held only for in-memory
//! updates. What goes to the shards is published in turns ([`Publishing`]): a publisher builds its
//! messages and queues them all before the next one builds, waiting when a shard's queue is full,
//! so shards see registry events in the order they happened and a full queue loses nothing that
//! matters (`queues` says what waits and what is dropped).
//!
//! Performance: this is one thread. Work whose cost grows with what an operator or client hands
//! in — parsing and validating an admin body, a policy or `auth.yaml` reload — runs on tokio's
//! blocking threads (`spawn_blocking`), so agent gRPC, tunnel handshakes and `/metrics` keep
//! answering meanwhile; the key and policy locks those paths take are never taken here.

pub mod admin;
pub mod admin_policy;
pub mod admin_views;
pub mod agent_metrics;
pub mod agent_reports;
pub mod auth_reload;
pub mod core;
pub mod daily_flush;
pub mod disk_db;
pub mod metrics_http;
pub mod policies;
pub mod policy_reload;
pub mod registry;
pub mod service;
pub mod site_routers;
pub mod tenant_metrics;
pub mod tunnel_accept;
pub mod tunnel_refusals;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::router::shard::queues::{QueueFullCounts, ToShard};

use crate::base::challenge::{self, NonceLedger};
use crate::base::credentials::Secret;
use crate::logic::routing::AgentId;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::messages::ControlToShard;
use registry::{Event, HealthTimes, Registry};

/// Fixed settings of the control core.
#[derive(Debug, Clone)]
pub struct ControlSettings {
    pub shard_count: usize,
    /// `HIVENET_ROUTER_QUOTA_BACKEND=badger`: the per-agent history is also kept in the disk
    /// database (`daily_flush`).
    pub history_on_disk: bool,
    pub session_ttl: Duration,
    /// `--agent-token-max-lifetime`: agent authentication JWTs valid for longer are refused.
    pub agent_token_max_lifetime: Duration,
    pub heartbeat_interval: Duration,
    pub routing_signal_interval: Duration,
    pub health_check_interval: Duration,
    pub health: HealthTimes,
    /// Multiaddr agents dial for the tunnel.
    pub tunnel_announce: String,
    pub router_peer_id: String,
    /// What this run's session tokens name as their issuer (`credentials::session_issuer`).
    pub session_issuer: String,
    pub grpc_address: SocketAddr,
    /// `auth.yaml`, watched for changes; `None`: keys come from `HIVENET_ROUTER_AUTH_MODE`.
    pub auth_config_file: Option<std::path::PathBuf>,
    pub tunnel_address: SocketAddr,
    /// `--p2p-max-conns-per-ip`: agents allowed per source prefix, each with a tunnel connection
    /// to every shard (`shard::conn_limit`; 0: no limit).
    pub p2p_max_conns_per_ip: u32,
    /// `--tenant-metrics-max-tenants` (`tenant_metrics::TenantCap`; 0: no cap).
    pub tenant_metrics_max_tenants: usize,
    pub metrics_address: SocketAddr,
    /// Cross-site redirect and hold at zero: this site, when `--site-id` is set.
    pub site: Option<SiteControl>,
    /// The tunnel port speaks TLS (`--p2p-tls-cert`): plaintext preambles are refused.
    pub tunnel_tls: bool,
    /// `--advertise-grpc-addr`: the `host:port` agents reach this router's gRPC service at,
    /// handed to agents for discovery; `None`: not advertised (default). Scope: this router.
    pub advertise_grpc_addr: Option<String>,
    /// `--sync-store valkey`: the router is not ready until the sync core reaches the store
    /// (`router::readiness`).
    pub sync_store: bool,
}

/// What the control core needs of `--site-id` and its companions.
#[derive(Debug, Clone)]
pub struct SiteControl {
    pub id: String,
    /// `--redirect-allowed-domains`: pushed maps may name sites only under these.
    pub allowed_domains: Vec<String>,
    /// `--wake-hold-budget`.
    pub default_hold_budget: Duration,
}

pub struct ControlShared {
    pub settings: ControlSettings,
    pub secret: Secret,
    registry: Mutex<Registry>,
    /// The dynamic client-key registry, when `api.mode` is `dynamic`; written only through the
    /// admin API, one write at a time.
    pub dynamic_keys: Option<Mutex<crate::logic::auth::dynamic::DynamicRegistry>>,
    to_shards: Vec<ToShard>,
    /// Whose turn it is to publish to the shards ([`Publishing`]). A tokio mutex: fair (first
    /// come, first served) and held across the waits for room in a full shard queue.
    publishing: tokio::sync::Mutex<()>,
    /// `hivenet_control_queue_full_total`, shared with the shards.
    pub queue_full: Arc<QueueFullCounts>,
    sessions: Mutex<HashMap<AgentId, oneshot::Sender<&'static str>>>,
    next_session: AtomicU64,
    pub shard_metrics: Vec<Arc<ShardMetrics>>,
    /// The active routing policies (`policies.current()`, `policies.subscribe()` for changes),
    /// installed only through `policy_reload::commit`. Lock order with the key registries:
    /// `dynamic_keys`, then the policies' static-auth slot, then the policy set.
    pub policies: policies::PolicyControl,
    /// `hivenet_quota_backend_errors_total`: daily-total flushes that failed.
    pub quota_backend_errors_total: AtomicU64,
    /// Open tunnel connections per source prefix (`--p2p-max-conns-per-ip`).
    pub tunnel_conns: crate::router::shard::conn_limit::ConnLimiter,
    /// Rate-limited log lines for refused tunnel connections.
    pub tunnel_refusals: tunnel_refusals::RefusalLog,
    /// The provider-fallback client's outbound HTTP metrics, when it runs.
    pub provider_metrics: Option<Arc<crate::router::provider::ProviderMetrics>>,
    /// Agents joining and leaving the pool, for `/admin/registration-stream`.
    pub registrations: crate::router::shard::registration_feed::RegistrationFeed,
    /// The sync core's metrics, set when it runs (`--sync-store valkey`).
    pub sync_metrics: std::sync::OnceLock<Arc<dyn crate::router::metrics::Collect + Send + Sync>>,
    /// The site's routers handed to agents in authentication responses and heartbeat acks. The
    /// sync core, when there is one, publishes to it each round; without one it holds just this
    /// router (`SiteRouters::single`).
    pub site_routers: Arc<site_routers::SiteRouters>,
    /// The router nonces agents have spent (`base::challenge`): each opens one session.
    spent_nonces: Mutex<NonceLedger>,
    /// `hivenet_agent_auth_refused_total{reason}`: `Challenge`/`Authenticate` calls refused.
    pub auth_refusals: AuthRefusals,
    /// `GET /ready` (`router::readiness`): the sync core marks the store reached, the drain marks
    /// the router draining; the metrics port's probe reads it.
    pub readiness: Arc<crate::router::readiness::Readiness>,
}

/// Agent authentications refused, by reason (`hivenet_agent_auth_refused_total`).
#[derive(Debug, Default)]
pub struct AuthRefusals {
    /// The token: bad signature, expired, another router's, another nonce's, too long-lived.
    pub token: AtomicU64,
    /// An agent older than router-bound tokens.
    pub unbound: AtomicU64,
    /// The router nonce: not this router's, expired, or spent already (a replay).
    pub nonce: AtomicU64,
    /// The agent's key: does not hash to its peer ID, or did not make the signature.
    pub identity: AtomicU64,
    /// Malformed requests: capacity 0, subject is another peer.
    pub request: AtomicU64,
}

/// The longest the sync round waits for the shards' usage (shards answer from their inbox in
/// microseconds; this is a stalled shard).
pub const TAKE_USAGE_TIMEOUT: Duration = Duration::from_secs(5);

impl ControlShared {
    pub fn new(
        settings: ControlSettings,
        secret: Secret,
        dynamic_keys: Option<crate::logic::auth::dynamic::DynamicRegistry>,
        to_shards: crate::router::shard::queues::ToShards,
        shard_metrics: Vec<Arc<ShardMetrics>>,
        policies: policies::PolicyControl,
        provider_metrics: Option<Arc<crate::router::provider::ProviderMetrics>>,
    ) -> ControlShared {
        let readiness = Arc::new(crate::router::readiness::Readiness::new(
            settings.sync_store,
        ));
        let site_routers = Arc::new(site_routers::SiteRouters::single(
            &settings.router_peer_id,
            settings.advertise_grpc_addr.as_deref(),
        ));
        ControlShared {
            site_routers,
            readiness,
            provider_metrics,
            tunnel_conns: crate::router::shard::conn_limit::ConnLimiter::for_agents(
                settings.p2p_max_conns_per_ip,
                settings.shard_count,
            ),
            tunnel_refusals: tunnel_refusals::RefusalLog::default(),
            policies,
            registry: Mutex::new(Registry::new(settings.shard_count, settings.health)),
            dynamic_keys: dynamic_keys.map(Mutex::new),
            settings,
            secret,
            to_shards: to_shards.shards,
            publishing: tokio::sync::Mutex::new(()),
            queue_full: to_shards.full,
            sessions: Mutex::new(HashMap::new()),
            next_session: AtomicU64::new(1),
            shard_metrics,
            quota_backend_errors_total: AtomicU64::new(0),
            registrations: crate::router::shard::registration_feed::RegistrationFeed::default(),
            sync_metrics: std::sync::OnceLock::new(),
            spent_nonces: Mutex::new(NonceLedger::new(challenge::LEDGER_CAPACITY)),
            auth_refusals: AuthRefusals::default(),
        }
    }

    /// Spends a router nonce an agent answered with a valid token (`base::challenge`).
    pub fn spend_nonce(
        &self,
        nonce: challenge::IssuedNonce,
        now_unix_ms: u64,
    ) -> Result<(), challenge::ChallengeError> {
        self.spent_nonces
            .lock()
            .expect("nonce ledger lock poisoned")
            .spend(nonce, now_unix_ms)
    }

    /// For the sync core: the tenant of each key the shards know, static or dynamic, as of now
    /// (`sync::counted` counts the others' daily usage by tenant).
    pub fn key_tenants(
        &self,
    ) -> impl Fn(crate::base::ids::KeyId) -> Option<crate::base::ids::TenantId> + use<> {
        let dynamic = self.dynamic_keys.as_ref().map(|keys| {
            keys.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .snapshot()
        });
        let static_keys = self.policies.static_keys();
        move |key| {
            static_keys
                .get(key)
                .or_else(|| dynamic.as_ref()?.get(key))
                .map(|record| record.tenant_id)
        }
    }

    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().expect("registry lock poisoned")
    }

    /// For the sync core: the peer IDs of the routers the agents with a live session here
    /// report a session with (their last heartbeat's `connected_router_peer_ids`), this router
    /// included, as a union over agents. A router in it that the store does not list counts in
    /// `hivenet_sync_unknown_routers`.
    pub fn reported_routers(&self) -> HashSet<String> {
        self.registry().reported_routers()
    }

    /// For the sync core: what every agent served here reports of its routers.
    pub fn agent_reports(&self) -> std::collections::HashMap<String, Box<[String]>> {
        self.registry().agent_reports()
    }

    /// For the sync core: the registered sessions and their peer IDs, for the heartbeat.
    pub fn served_sessions(&self) -> (Vec<AgentId>, Vec<String>) {
        self.registry().served_sessions()
    }

    /// For the sync core: `sessions` are in this router's heartbeat in the store; they may join
    /// the routing pool (`Registry::published`).
    pub async fn agents_published(&self, sessions: &[AgentId]) {
        let publishing = self.publishing().await;
        let events = self.registry().published(sessions, Instant::now());
        publishing.apply(events).await;
    }

    /// For the sync core: whether new sessions wait for a heartbeat to publish them
    /// (`Registry::hold_unpublished`): while the store answers.
    pub async fn hold_unpublished_agents(&self, hold: bool) {
        let publishing = self.publishing().await;
        let events = self.registry().hold_unpublished(hold, Instant::now());
        publishing.apply(events).await;
    }

    /// For the sync core: the peer IDs of the agents with a live, registered session here,
    /// sorted and without duplicates (its heartbeat record in the store).
    pub fn served_agents(&self) -> Vec<String> {
        self.registry().served_agents()
    }

    /// Agent sessions started so far (each authentication starts one).
    pub fn sessions_started(&self) -> u64 {
        self.next_session.load(Ordering::Relaxed) - 1
    }

    pub fn next_session(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// Records the live stream of a session; `None` when one is already attached.
    pub fn attach_session(&self, agent: AgentId) -> Option<oneshot::Receiver<&'static str>> {
        let mut sessions = self.sessions.lock().expect("sessions lock poisoned");
        if sessions.contains_key(&agent) {
            return None;
        }
        let (kill, killed) = oneshot::channel();
        sessions.insert(agent, kill);
        Some(killed)
    }

    /// The session is over: the agent leaves the pool at once and every shard drops its tunnel.
    pub async fn close_session(&self, agent: AgentId) {
        self.sessions
            .lock()
            .expect("sessions lock poisoned")
            .remove(&agent);
        let publishing = self.publishing().await;
        let events = self.registry().session_closed(agent);
        publishing.apply(events).await;
        publishing
            .broadcast(|| ControlToShard::CloseTunnel { agent })
            .await;
    }

    /// Waits for this task's turn to publish to the shards. Take it before computing what to
    /// publish when the order matters; the control core's own tasks only.
    pub async fn publishing(&self) -> Publishing<'_> {
        Publishing {
            shared: self,
            _turn: self.publishing.lock().await,
        }
    }

    /// [`ControlShared::publishing`] for the control core's blocking threads (admin calls,
    /// `auth.yaml` reloads). Panics when called from an async task.
    pub fn publishing_blocking(&self) -> Publishing<'_> {
        Publishing {
            shared: self,
            _turn: self.publishing.blocking_lock(),
        }
    }

    /// Publishes registry events, in order, in this task's turn. Call it right after computing
    /// `events`, with no await in between: the turn is queued for in that order.
    pub async fn apply(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.publishing().await.apply(events).await;
    }

    /// The messages that publish `events`, in order, one per shard for each (a snapshot is built
    /// from the registry as it is now).
    fn messages_for(
        &self,
        registry: &mut Registry,
        events: Vec<Event>,
        out: &mut Vec<(usize, ControlToShard)>,
    ) {
        let shards = self.to_shards.len();
        for event in events {
            match event {
                Event::AgentUp {
                    agent,
                    generation,
                    models,
                    capacity,
                    profile,
                } => {
                    tracing::info!(
                        session = agent.0,
                        stay = generation.0,
                        "agent joined the routing pool"
                    );
                    to_every_shard(out, shards, || ControlToShard::AgentUp {
                        agent,
                        generation,
                        models: models.clone(),
                        capacity,
                        profile: profile.clone(),
                    });
                }
                Event::AgentDown { agent, models } => {
                    tracing::info!(session = agent.0, "agent left the routing pool");
                    to_every_shard(out, shards, || ControlToShard::AgentDown {
                        agent,
                        models: models.clone(),
                    });
                }
                Event::Signal {
                    agent,
                    models,
                    in_flight,
                    engine,
                } => to_every_shard(out, shards, || ControlToShard::Signal {
                    agent,
                    models: models.clone(),
                    in_flight,
                    engine,
                }),
                Event::Membership(change) => {
                    // Stamped as it is published: the registry keeps no wall clock.
                    let timestamp =
                        crate::router::audit::Timestamp(std::time::SystemTime::now()).to_string();
                    self.registrations.publish(&change, &timestamp);
                }
                Event::SnapshotChanged => {
                    let snapshot = registry.snapshot(&self.policies.current());
                    to_every_shard(out, shards, || ControlToShard::Snapshot(snapshot.clone()));
                }
                Event::CloseSession { agent } => {
                    if let Some(kill) = self
                        .sessions
                        .lock()
                        .expect("sessions lock poisoned")
                        .remove(&agent)
                    {
                        let _ = kill.send("heartbeat lost or session expired");
                    } else {
                        // No stream was ever attached: close it here.
                        let events = registry.session_closed(agent);
                        self.messages_for(registry, events, out);
                        to_every_shard(out, shards, || ControlToShard::CloseTunnel { agent });
                    }
                }
            }
        }
    }

    /// Sends `message` to every shard in this task's turn, waiting for room in full queues.
    pub async fn broadcast(&self, message: impl Fn() -> ControlToShard) {
        self.publishing().await.broadcast(message).await;
    }

    /// [`ControlShared::broadcast`] for the control core's blocking threads.
    pub fn broadcast_blocking(&self, message: impl Fn() -> ControlToShard) {
        self.publishing_blocking().broadcast_blocking(message);
    }

    /// Asks every shard for its report (capacity queues, admission state); shards that do not
    /// answer within `timeout` are left out, and so is a shard whose queue is full (counted in
    /// `hivenet_control_queue_full_total`): the scrape answers either way.
    pub async fn shard_reports(
        &self,
        timeout: Duration,
    ) -> Vec<crate::router::shard::messages::ShardReport> {
        let mut answers = Vec::with_capacity(self.to_shards.len());
        for shard in &self.to_shards {
            let (reply, answer) = oneshot::channel();
            if shard.try_report(ControlToShard::Report(reply)).is_ok() {
                answers.push(answer);
            }
        }
        let mut reports = Vec::with_capacity(answers.len());
        for answer in answers {
            if let Ok(Ok(report)) = tokio::time::timeout(timeout, answer).await {
                reports.push(report);
            }
        }
        reports
    }

    /// Asks every shard for the daily totals that changed since its last report and waits for
    /// every answer: a total a shard hands out is no longer its to report, so none is given up
    /// on (a full queue is waited for). A shard that has stopped answers nothing.
    pub async fn daily_totals(&self) -> Vec<crate::router::shard::owner::quotas::DailyTotal> {
        let mut answers = Vec::with_capacity(self.to_shards.len());
        for shard in &self.to_shards {
            let (reply, answer) = oneshot::channel();
            if shard.send(ControlToShard::ReportDaily(reply)).await.is_ok() {
                answers.push(answer);
            }
        }
        let mut totals = Vec::new();
        for answer in answers {
            if let Ok(mut reported) = answer.await {
                totals.append(&mut reported);
            }
        }
        totals
    }

    /// The sync round's step 1: every shard's usage since the last round and its changed daily
    /// totals. Waits for every answer, at most [`TAKE_USAGE_TIMEOUT`] in all: a shard that
    /// answers later keeps its daily totals for the next round (`shard::inbox`); only a shard
    /// stalled that long loses one round's usage to the other routers. `reached`: the last
    /// round reached the store (the wallets give back only then).
    pub async fn take_usage(
        &self,
        reached: bool,
        remember: bool,
    ) -> crate::router::shard::messages::ShardUsage {
        let mut usage = crate::router::shard::messages::ShardUsage::default();
        let gather = async {
            let mut answers = Vec::with_capacity(self.to_shards.len());
            for shard in &self.to_shards {
                let (reply, answer) = oneshot::channel();
                if shard
                    .send(ControlToShard::TakeUsage {
                        reply,
                        reached,
                        remember,
                    })
                    .await
                    .is_ok()
                {
                    answers.push(answer);
                }
            }
            for answer in answers {
                if let Ok(mut report) = answer.await {
                    usage.usage.append(&mut report.usage);
                    usage.views.append(&mut report.views);
                    usage.memory.append(&mut report.memory);
                    usage.daily.append(&mut report.daily);
                    // What each owner holds of the occupancy budgets: the round rewrites it.
                    usage.credits.append(&mut report.credits);
                    usage.answered += 1;
                }
            }
        };
        let _ = tokio::time::timeout(TAKE_USAGE_TIMEOUT, gather).await;
        usage
    }

    pub fn shard_count(&self) -> usize {
        self.to_shards.len()
    }

    /// Builds and broadcasts a snapshot in this task's turn, like every other publication, so
    /// shards see snapshots in the order they were built.
    async fn publish_snapshot(&self, policies: &crate::logic::policy::PolicySet) {
        let publishing = self.publishing().await;
        let snapshot = self.registry().snapshot(policies);
        publishing
            .broadcast(|| ControlToShard::Snapshot(snapshot.clone()))
            .await;
    }

    /// Sends `message` to one shard, waiting for room when its queue is full (a tunnel socket,
    /// a tunnel to close: neither is ordered with the publications).
    pub async fn send_to_shard(&self, shard: usize, message: ControlToShard) {
        // A shard that has stopped is shutting down with the process; nothing to do.
        let _ = self.to_shards[shard].send(message).await;
    }
}

/// Adds one `message()` per shard to `out`.
fn to_every_shard(
    out: &mut Vec<(usize, ControlToShard)>,
    shards: usize,
    message: impl Fn() -> ControlToShard,
) {
    out.extend((0..shards).map(|shard| (shard, message())));
}

/// One publisher's turn to send to the shards ([`ControlShared::publishing`]): while it is held,
/// no other publication is built or queued, so what it queues reaches every shard in the order
/// it was built, after everything published before it. It waits for room in a full queue rather
/// than drop a message, except a routing signal (`queues::waits_when_full`).
pub struct Publishing<'a> {
    shared: &'a ControlShared,
    _turn: tokio::sync::MutexGuard<'a, ()>,
}

impl Publishing<'_> {
    /// Publishes registry events, in order.
    pub async fn apply(&self, events: Vec<Event>) {
        let mut messages = Vec::new();
        {
            let mut registry = self.shared.registry();
            self.shared
                .messages_for(&mut registry, events, &mut messages);
        }
        for (shard, message) in messages {
            // A shard that has stopped is shutting down with the process; a signal that found
            // the queue full was counted and is superseded by the next.
            let _ = self.shared.to_shards[shard].send(message).await;
        }
    }

    /// Sends `message` to every shard.
    pub async fn broadcast(&self, message: impl Fn() -> ControlToShard) {
        for shard in &self.shared.to_shards {
            let _ = shard.send(message()).await;
        }
    }

    /// [`Publishing::broadcast`] from a blocking thread.
    pub fn broadcast_blocking(&self, message: impl Fn() -> ControlToShard) {
        for shard in &self.shared.to_shards {
            let _ = shard.send_blocking(message());
        }
    }
}
