//! Messages between the control core and the shards, and between shards over the mesh. Named by
//! route: `ControlToShard`, `ShardToControl`, `ShardToShard`.

use std::sync::Arc;

use crate::routing::{AgentId, Ticket};
use crate::shard::snapshot::ModelId;

/// Broadcast by the control core to every shard (each applies what it owns), except `Tunnel`,
/// which goes to the one shard the agent dialed for.
pub enum ControlToShard {
    /// A new read-mostly routing snapshot (model names, owners, `/v1/models` body).
    Snapshot(Arc<crate::shard::snapshot::RoutingSnapshot>),
    /// A new client-key registry (start-up, `auth.yaml` reload, admin API write).
    Keys(Arc<crate::auth::keys::KeyRegistry>),
    /// Who may call `/admin/*` (start-up, `auth.yaml` reload).
    AdminAccess(Arc<crate::auth::admin::AdminAccess>),
    /// The agent is registered and has a tunnel to every shard: owners add it to their models.
    AgentUp {
        agent: AgentId,
        /// The agent's stay in the pool: slots are released against it.
        generation: crate::routing::Generation,
        models: Arc<[ModelId]>,
        capacity: u32,
        profile: Arc<crate::routing::AgentProfile>,
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
        engine: crate::routing::EngineSignals,
    },
    /// An authenticated tunnel socket for this shard. The shard speaks HTTP/2 (client) over it.
    Tunnel {
        agent: AgentId,
        socket: std::net::TcpStream,
        /// Its place under `--p2p-max-conns-per-ip`, held until the tunnel ends.
        permit: crate::control::conn_limit::ConnPermit,
    },
    /// A tunnel socket that asked for TLS, for the shard its hint named: the shard terminates
    /// the TLS and checks the preamble inside (`tunnel::tls`).
    SecureTunnel {
        socket: std::net::TcpStream,
        permit: crate::control::conn_limit::ConnPermit,
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
    ReportDaily(tokio::sync::oneshot::Sender<Vec<crate::shard::quotas::DailyTotal>>),
}

/// A shard's answer to [`ControlToShard::Report`].
#[derive(Debug, Default)]
pub struct ShardReport {
    pub queues: Vec<(ModelId, u32)>,
    /// Hold at zero: the pending demand of every model this shard owns that has any.
    pub pending_demand: Vec<(ModelId, u32)>,
    pub admission: crate::shard::state::AdmissionReport,
    pub tenants: crate::shard::tenants::TenantReport,
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
    pub method: crate::http::request::Method,
    /// Path and query as sent.
    pub target: bytes::Bytes,
    pub body: bytes::Bytes,
    pub reply: tokio::sync::oneshot::Sender<AdminReply>,
}

/// The control core's answer to an [`AdminCall`]: status and JSON body.
#[derive(Debug)]
pub struct AdminReply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// What a model's owner finally answers to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Granted(crate::routing::Grant),
    /// The pool gates passed and occupancy is reserved under the ticket (no slot asked for yet).
    Reserved,
    QueueFull,
    NoAgents,
    /// B3: the pool's engine signals breach `shed_if`.
    Shed,
    /// B2: the pool stayed full for the park timeout.
    PoolFull,
    /// B4: the key's occupancy share is in use.
    KeyShare,
    /// B2: the request is larger than the pool's whole budget (asked to be refused at once).
    PoolTooSmall,
}

/// What a model's owner answers to a [`ShardToShard::Hold`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAnswer {
    /// An agent serves the model now (it was there already, or it just registered): go on.
    Awake,
    /// A per-model hold limit is reached: `503 model_waking` at once.
    Full,
}

/// Between shards over the SPSC mesh.
#[derive(Debug)]
pub enum ShardToShard {
    /// Requester -> quota owner: check (and charge) the key's limits for one request.
    QuotaAdmit {
        ticket: Ticket,
        key: crate::auth::keys::KeyId,
        model: crate::limits::ModelContext,
        charge: crate::shard::quotas::Charge,
    },
    /// Quota owner -> requester: the answer; an admission must later be settled or cancelled.
    QuotaDecided {
        sequence: u64,
        tenant: crate::auth::keys::TenantId,
        result: crate::shard::state::QuotaAnswer,
    },
    /// Requester -> quota owner: the request is over; charge exact usage, or give back.
    QuotaRelease(crate::shard::quotas::Release),
    /// Requester -> quota owner: settle a non-streamed answer before it is delivered, and say
    /// whether its output still fits the daily budget.
    QuotaSettle {
        ticket: Ticket,
        tenant: crate::auth::keys::TenantId,
        admission: crate::limits::Admission,
        usage: crate::limits::Usage,
    },
    /// Quota owner -> requester: the settlement (`None`: the holder is gone; deliver).
    QuotaSettled {
        sequence: u64,
        settlement: Option<crate::limits::Settlement>,
    },
    /// Requester -> owner: pass the pool gates (`pool`, reserving occupancy under the ticket)
    /// and/or find an agent slot (`slot`) for `model`.
    Acquire {
        ticket: Ticket,
        model: ModelId,
        pool: Option<crate::shard::state::PoolRequest>,
        /// `Some`: find a slot, from this step on, avoiding these agents.
        slot: Option<crate::routing::Ask>,
    },
    /// Requester -> owner: the request gave up waiting (timeout, client left); whatever the
    /// ticket holds or waits for at the owner goes.
    Cancel { ticket: Ticket, model: ModelId },
    /// Requester -> owner: the request is finished with its slot and its reservation.
    Release {
        model: ModelId,
        grant: crate::routing::Grant,
        ticket: Ticket,
    },
    /// Requester -> owner: the request ends before it got a slot; its reservation goes.
    ReleaseReservation { model: ModelId, ticket: Ticket },
    /// Requester -> owner: a reserved request's output so far, or its exact input.
    Occupancy {
        model: ModelId,
        ticket: Ticket,
        update: crate::shard::state::OccupancyUpdate,
    },
    /// Requester -> owner: hold the request until an agent for `model` registers (hold at zero),
    /// counting it in the model's pending demand and against the per-model hold limits.
    Hold {
        ticket: Ticket,
        model: ModelId,
        key: Option<crate::auth::keys::KeyId>,
        client: Option<crate::hold::ClientId>,
    },
    /// Owner -> requester: how the hold went (at once, or when the model woke).
    HoldAnswered { sequence: u64, answer: HoldAnswer },
    /// Requester -> owner: the request leaves the hold book (it got a slot, was answered, or its
    /// client left); also withdraws a hold that is still waiting.
    HoldLeave { ticket: Ticket, model: ModelId },
    /// Requester -> the nonce's owner: spend a redirect token (single use per router).
    SpendToken {
        ticket: Ticket,
        nonce: [u8; 16],
        expires_unix_ms: i64,
    },
    /// Owner -> requester: whether the token was fresh (first use).
    TokenSpent { sequence: u64, fresh: bool },
    /// Owner -> requester: the final answer for a ticket (`model` lets an unwanted grant go back).
    Decided {
        sequence: u64,
        decision: Decision,
        model: ModelId,
    },
}
