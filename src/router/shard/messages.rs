//! Messages between the control core and the shards, and between shards over the mesh. Named by
//! route: `ControlToShard`, `ShardToControl`, `ShardToShard`.

use std::sync::Arc;

use crate::base::ids::{AgentId, ModelId, Ticket};
use crate::logic::admission::{PolicyOutcome, Reason};
use crate::router::shard::owner::{Answer, Notice, PoolReport, Visit};

/// Broadcast by the control core to every shard (each applies what it owns), except `Tunnel`,
/// which goes to the one shard the agent dialed for.
pub enum ControlToShard {
    /// A new read-mostly routing snapshot (model names, owners, `/v1/models` body).
    Snapshot(Arc<crate::logic::snapshot::RoutingSnapshot>),
    /// A new client-key registry (start-up, `auth.yaml` reload, admin API write).
    Keys(Arc<crate::logic::auth::keys::KeyRegistry>),
    /// Who may call `/admin/*` (start-up, `auth.yaml` reload).
    AdminAccess(Arc<crate::logic::auth::admin::AdminAccess>),
    /// The agent is registered and has a tunnel to every shard: owners add it to their models.
    AgentUp {
        agent: AgentId,
        /// The agent's stay in the pool: slots are released against it.
        generation: crate::logic::routing::Generation,
        models: Arc<[ModelId]>,
        capacity: u32,
        profile: Arc<crate::logic::routing::AgentProfile>,
    },
    /// The agent left the pool (session ended, heartbeat lost or a tunnel dropped).
    AgentDown {
        agent: AgentId,
        models: Arc<[ModelId]>,
    },
    /// The agent's own count of requests it is serving, from every router, and its engine's
    /// signals (B3 and `exclude_if` read them on the owner).
    Signal {
        agent: AgentId,
        models: Arc<[ModelId]>,
        in_flight: u32,
        engine: crate::logic::routing::EngineSignals,
    },
    /// An authenticated tunnel socket for this shard. The shard speaks `codec` (as the client)
    /// over it.
    Tunnel {
        agent: AgentId,
        codec: crate::net::tunnel::preamble::Codec,
        socket: std::net::TcpStream,
        /// Its place under `--p2p-max-conns-per-ip`, held until the tunnel ends.
        permit: crate::router::shard::conn_limit::ConnPermit,
    },
    /// A tunnel socket that asked for TLS, for the shard its hint named: the shard terminates
    /// the TLS and checks the preamble inside (`tunnel::tls`).
    SecureTunnel {
        socket: std::net::TcpStream,
        permit: crate::router::shard::conn_limit::ConnPermit,
    },
    /// The agent's session ended: drop this shard's tunnel to it.
    CloseTunnel { agent: AgentId },
    /// SIGTERM: stop accepting, fail `/health`, refuse new requests (see `shard::lifecycle`).
    Drain,
    /// The drain deadline passed: end what is still in flight.
    End,
    /// A `/metrics` scrape: the capacity-queue length and admission state of every model this
    /// shard owns, and the admission refusals it counted. Answered from the shard's inbox, so
    /// reporting costs the request path nothing.
    Report(tokio::sync::oneshot::Sender<ShardReport>),
    /// The persistence flush (`HIVENET_ROUTER_QUOTA_BACKEND=badger`, every second): the daily
    /// totals of this shard's quota holders that changed since the last report. Answered from
    /// the inbox; a report the control core no longer waits for is kept for the next one.
    ReportDaily(tokio::sync::oneshot::Sender<Vec<crate::router::shard::owner::quotas::DailyTotal>>),
    /// The sync round (`--sync-store valkey`), step 1: the usage this shard's quota holders
    /// admitted since the last round, the daily totals that changed and what the wallets hold.
    /// `reached`: the last round reached the store. Answered from the inbox.
    TakeUsage {
        reply: tokio::sync::oneshot::Sender<ShardUsage>,
        reached: bool,
        /// The store lost its data: report what the daily budgets count of the other routers.
        remember: bool,
    },
    /// The sync round, step 2: usage other routers published. Broadcast (one `Arc` for every
    /// shard); each shard applies the tenants it owns. At most `sync::store::READ_MAX` entries a
    /// round, the rest come next round.
    ApplyRemote(Arc<crate::router::shard::owner::quotas::RemoteUsage>),
    /// This router's part of every limit from now on (`limits::share`), each round.
    Share(crate::logic::limits::Share),
    /// Today's daily totals from the shared store, for the tenants this shard owns: this
    /// router's own (at start-up) and the other routers' (replacing what was known of them).
    DailyTotals(crate::router::shard::owner::quotas::DailyRestore),
    /// The store lost its data: hand every daily total out again at the next `TakeUsage`.
    RewriteDaily,
    /// Occupancy credits: a refill's answer (to the model's owner), or news for every shard.
    Credits(crate::router::shard::owner::wallets::CreditNews),
}

/// A shard's answer to [`ControlToShard::TakeUsage`].
#[derive(Debug, Default)]
pub struct ShardUsage {
    pub usage: Vec<crate::router::shard::owner::quotas::BucketUsage>,
    /// The rate buckets low enough for the round to anchor to the site's level.
    pub views: Vec<crate::router::shard::owner::quotas::BucketView>,
    pub daily: Vec<crate::router::shard::owner::quotas::DailyTotal>,
    /// With `remember`: what each daily budget counts of the other routers.
    pub memory: Vec<crate::router::shard::owner::quotas::DailyTotal>,
    /// What this router holds of every budget this shard's models have credits for.
    pub credits: Vec<crate::router::shard::owner::wallets::CreditHolding>,
    /// The shards that answered within the wait (`sync::whole`: a round claims its totals whole
    /// only when every shard reported them).
    pub answered: usize,
}

/// A shard's answer to [`ControlToShard::Report`].
#[derive(Debug, Default)]
pub struct ShardReport {
    pub queues: Vec<(ModelId, u32)>,
    /// `hivenet_queue_wait_seconds`: the waits of the models this shard owns.
    pub queue_waits: Vec<(ModelId, crate::router::metrics::histogram::DurationCounts)>,
    /// Hold at zero: the pending demand of every model this shard owns that has any.
    pub pending_demand: Vec<(ModelId, u32)>,
    /// `prefix-aware` routing on the models this shard owns that ranked by it.
    pub prefix: Vec<(ModelId, crate::logic::routing::prefix::PrefixStats)>,
    pub admission: AdmissionReport,
    pub tenants: crate::router::accounting::tenants::TenantReport,
    /// `hivenet_shard_quota_holders{kind}`: owners' holders, keys' token-rate holders, and
    /// tenants with only other routers' usage waiting (`owner::quotas`).
    pub quota_holders: QuotaHolders,
}

/// How many quota holders a shard keeps, by kind (`hivenet_shard_quota_holders`).
#[derive(Debug, Default, Clone, Copy)]
pub struct QuotaHolders {
    /// The reporting shard.
    pub shard: usize,
    pub owners: usize,
    pub key_rates: usize,
    pub remote_only: usize,
}

/// What `/metrics` reads of a shard's admission state.
#[derive(Debug, Default)]
pub struct AdmissionReport {
    pub pools: Vec<PoolReport>,
    pub rejections: Vec<(ModelId, Reason, u64)>,
    pub policy_outcomes: Vec<(ModelId, PolicyOutcome, u64)>,
}

/// From a shard to the control core.
#[derive(Debug)]
pub enum ShardToControl {
    /// This shard's tunnel to the agent is up (HTTP/2 handshake done).
    TunnelUp { agent: AgentId, shard: usize },
    /// This shard's tunnel to the agent failed or closed.
    TunnelDown { agent: AgentId, shard: usize },
    /// An authenticated `/admin/*` request, for the control core to serve.
    Admin(AdminCall),
}

/// One `/admin/*` request handed to the control core, and where its answer goes.
#[derive(Debug)]
pub struct AdminCall {
    pub method: crate::wire::http::request::Method,
    /// Path and query as sent.
    pub target: bytes::Bytes,
    pub body: bytes::Bytes,
    pub reply: tokio::sync::oneshot::Sender<AdminReply>,
}

/// The control core's answer to an [`AdminCall`]: status and JSON body, or a stream.
#[derive(Debug)]
pub struct AdminReply {
    pub status: u16,
    /// The whole JSON body; empty when `stream` is set.
    pub body: Vec<u8>,
    /// A streamed answer (`GET /admin/registration-stream`): the shard sends `status` with
    /// `text/event-stream` and then each frame as it comes (`api::admin`).
    pub stream: Option<crate::router::shard::registration_feed::Subscription>,
}

/// Between shards over the SPSC mesh: a request's visit to an owner, the owner's answer, and
/// the one-way notices that give back what a request held (`shard::owner`).
#[derive(Debug)]
pub enum ShardToShard {
    /// Requester -> owner.
    Visit { ticket: Ticket, visit: Visit },
    /// Owner -> requester (`ticket.shard`).
    Answer { ticket: Ticket, answer: Answer },
    /// Requester -> owner.
    Notice(Notice),
    /// A client connection for the shard that owns its first request's key (`shard::handoff`).
    Connection(Box<crate::router::shard::handoff::Handoff>),
}

#[cfg(test)]
mod tests {
    /// `shard::mesh` and `shard::outbox` size their memory with this figure in their docs.
    #[test]
    fn a_mesh_message_is_at_most_144_bytes() {
        assert!(std::mem::size_of::<super::ShardToShard>() <= 144);
    }
}
