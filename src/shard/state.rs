//! What one shard owns, and the code that mutates it. Single-threaded: plain `RefCell`/`Cell`, no
//! lock and no shared atomic. `RefCell` borrows never cross an `.await`.
//!
//! Key components: [`Shard::acquire`] (ask a model's owner for an agent slot, locally or over the
//! mesh, waiting in the owner's capacity queue up to a deadline), [`Slot`] (the held slot; dropping
//! it releases it exactly once, on every path), the control inbox and mesh handlers that apply
//! other cores' messages.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::admission::occupancy::{Ask, Footprint, Limits, Pool, Refusal, Verdict};
use crate::admission::{PolicyOutcome, Reason};
use crate::auth::admin::AdminAccess;
use crate::auth::keys::KeyRegistry;
use crate::auth::keys::{KeyId, KeyRecord, TenantId};
use crate::hold::{ClientId, HoldBook};
use crate::limits::{Admission, BurstSeconds, Day, Delivery, Millis, ModelContext, Usage};
use crate::metrics::ShardMetrics;
use crate::policy::ModelPolicy;
use crate::routing::{
    Acquire, AgentId, AnyAgent, Ask as RouteAsk, Generation, Grant, ModelRoutes, StepFilter, Ticket,
};
use crate::shard::IdMap;
use crate::shard::latch::race;
use crate::shard::mesh::Endpoint;
use crate::shard::messages::{ControlToShard, Decision, HoldAnswer, ShardToControl, ShardToShard};
use crate::shard::quotas::{Admitted, Charge, Quotas, Release};
use crate::shard::snapshot::{ModelEntry, ModelId, RoutingSnapshot};
use futures_util::future::Either;

/// Messages handled per mesh wake-up before the mesh task yields to the shard's other tasks.
const MESH_DRAIN_BUDGET: usize = 256;

/// Parked requests are re-evaluated at least this often (milliseconds).
const PARK_RECHECK_MS: u64 = 1000;

/// A reservation untouched this long lost its release (every request path releases on drop, and
/// streams refresh theirs as output flows), so the reaper gives it back.
pub const RESERVATION_REAP_MS: u64 = 30 * 60 * 1000;

/// Per-shard settings (copied into each shard at start-up).
#[derive(Debug, Clone)]
pub struct ShardSettings {
    pub queue_depth: usize,
    pub request_timeout: Duration,
    /// `None`: no limit (`HIVENET_ROUTER_MAX_REQUEST_BYTES=0`).
    pub max_request_bytes: Option<usize>,
    pub client_header_timeout: Duration,
    pub client_body_timeout: Duration,
    /// `HIVENET_ROUTER_RPM_BURST_SECONDS`.
    pub rpm_burst: BurstSeconds,
    /// `HIVENET_ROUTER_ADMIT_FRACTION`: the share of `admit_budget_tokens` B2 admits.
    pub admit_fraction: f64,
    /// `HIVENET_ROUTER_ADMIT_PARK_TIMEOUT`: how long a request that does not fit B2 waits.
    pub admit_park_timeout: Duration,
    /// The provider-fallback client; `None` when no provider key is configured.
    pub provider: Option<crate::provider::ProviderPool>,
    /// Hold at zero: the `--wake-*` flags.
    pub hold: crate::hold::HoldSettings,
    /// Hold at zero: `--wake-hold-max-total`, counted across the shards.
    pub held_total: Arc<crate::hold::HeldTotal>,
    /// Cross-site redirect: this site, when `--site-id` is set.
    pub site: Option<Arc<crate::config::RedirectSite>>,
    /// TLS on the tunnel (`--p2p-tls-cert`): this shard terminates the TLS of its tunnels.
    pub tunnel_tls: Option<Arc<crate::tunnel::tls::TunnelSecurity>>,
    /// What the clients of one shard may hold (connections, body bytes, resets).
    pub client_limits: crate::shard::guard::ClientLimits,
    /// The occupancy reaper (`--admission-reap-interval`, `--admission-reap-after`).
    pub reaper: crate::config::ReaperSettings,
}

/// Why a request found no agent slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// Every agent is full and the model's queue is full (or disabled).
    QueueFull,
    /// The model has no agent in the pool.
    NoAgents,
    /// The capacity wait reached the request deadline.
    Timeout,
    /// The mesh ring to the owner shard is full.
    MeshFull,
    /// B3 shed the request.
    Shed,
    /// B2: the pool stayed full for the park timeout.
    PoolFull,
    /// B4: the key's occupancy share is in use.
    KeyShare,
    /// B2: the request alone is larger than the pool's whole budget (refused at once for a
    /// request released by a wake, which would otherwise wait its whole hold budget).
    PoolTooSmall,
}

impl RouteError {
    fn from_decision(decision: Decision) -> RouteError {
        match decision {
            Decision::QueueFull => RouteError::QueueFull,
            Decision::Shed => RouteError::Shed,
            Decision::PoolFull => RouteError::PoolFull,
            Decision::KeyShare => RouteError::KeyShare,
            Decision::PoolTooSmall => RouteError::PoolTooSmall,
            // A grant or reservation where the other was asked for cannot happen; treat it as
            // the model having nothing to offer.
            Decision::NoAgents | Decision::Granted(_) | Decision::Reserved => RouteError::NoAgents,
        }
    }
}

/// What a request asks of the model's owner besides a slot.
pub enum Admit {
    /// No pool gate for this model: straight to the capacity queue.
    Direct,
    /// The pool gates, then the capacity queue, in one visit to the owner.
    Gated(PoolAsk),
    /// A reservation taken earlier with [`Shard::reserve`]: its ticket joins the capacity queue.
    Reserved(Reservation),
}

/// A request's pool admission, as the requester fills it in.
#[derive(Debug, Clone)]
pub struct PoolAsk {
    pub footprint: Footprint,
    pub key: KeyId,
    /// The key's `max_occupancy_share` when the model is serverless; 0 otherwise.
    pub share: f64,
    pub policy: Arc<ModelPolicy>,
    /// Hold at zero: a request released by a wake waits for room until its hold budget ends,
    /// whatever the park timeout (seed, "After the wake").
    pub hold_until: Option<Instant>,
}

/// A pool admission on its way to the owner.
#[derive(Debug, Clone)]
pub struct PoolRequest {
    pub ask: Ask,
    pub policy: Arc<ModelPolicy>,
    /// Park until then when B2 does not fit; `None`: refuse at once (park timeout 0).
    pub park_until: Option<Instant>,
    /// Refuse at once a request larger than the pool's whole budget instead of parking it (a
    /// request released by a wake parks up to its hold budget, too long to wait for nothing).
    pub refuse_oversize: bool,
}

/// A change to a reservation while its request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OccupancyUpdate {
    /// Output tokens streamed so far.
    Output(u64),
    /// The backend's exact input count.
    ExactInput(u64),
}

/// One model's occupancy on its owner, with the latest policy seen for it.
struct OwnedPool {
    pool: Pool,
    policy: Arc<ModelPolicy>,
    /// Parked tickets, and the slot each asked for as well (`None`: a reservation only).
    parked_for_slot: IdMap<Ticket, Option<RouteAsk>>,
}

/// The admission gauges of one model this shard owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolReport {
    pub model: ModelId,
    pub occupancy_tokens: u64,
    pub budget_tokens: u64,
    pub inflight: u64,
    pub max_inflight: u64,
}

/// What `/metrics` reads of a shard's admission state.
#[derive(Debug, Default)]
pub struct AdmissionReport {
    pub pools: Vec<PoolReport>,
    pub rejections: Vec<(ModelId, Reason, u64)>,
    pub policy_outcomes: Vec<(ModelId, PolicyOutcome, u64)>,
}

/// The router-side HTTP/2 client handle over one agent tunnel.
#[derive(Clone)]
pub struct Tunnel {
    pub send: h2::client::SendRequest<Bytes>,
    pub generation: u64,
}

/// What the quota owner answered: an admission to settle later (or `None` when nothing is
/// counted), or a refusal.
pub type QuotaAnswer = Result<Admitted, QuotaRefusal>;

/// Why the quota phase refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaRefusal {
    Limit(crate::limits::Rejection),
    /// The mesh ring to the owner is full.
    MeshFull,
    /// The owner did not answer before the request deadline.
    Timeout,
}

pub struct Shard {
    pub id: usize,
    pub count: usize,
    pub settings: ShardSettings,
    pub metrics: Arc<ShardMetrics>,
    snapshot: RefCell<Arc<RoutingSnapshot>>,
    keys: RefCell<Arc<KeyRegistry>>,
    admin_access: RefCell<Arc<AdminAccess>>,
    routes: RefCell<IdMap<ModelId, ModelRoutes>>,
    tunnels: RefCell<IdMap<AgentId, Tunnel>>,
    waiting: RefCell<IdMap<u64, oneshot::Sender<Decision>>>,
    next_sequence: Cell<u64>,
    next_tunnel_generation: Cell<u64>,
    mesh: RefCell<Endpoint<ShardToShard>>,
    /// Quota holders this shard owns (`tenant % count`).
    quotas: RefCell<Quotas>,
    quota_waiting: RefCell<IdMap<u64, oneshot::Sender<QuotaAnswer>>>,
    settle_waiting: RefCell<IdMap<u64, oneshot::Sender<Option<crate::limits::Settlement>>>>,
    /// Occupancy of the models this shard owns.
    pools: RefCell<IdMap<ModelId, OwnedPool>>,
    /// Hold at zero: the held and released-but-waiting requests of the models this shard owns.
    holds: RefCell<HoldBook>,
    /// Hold at zero: this shard's held requests, waiting for their owner's answer.
    hold_waiting: RefCell<IdMap<u64, oneshot::Sender<HoldAnswer>>>,
    /// Cross-site redirect: the redirect tokens spent here (this shard owns `nonce[0] % count`).
    spent_tokens: RefCell<crate::sibling::token::SpentTokens>,
    /// Cross-site redirect: this shard's requests waiting to hear whether their token was fresh.
    spend_waiting: RefCell<IdMap<u64, oneshot::Sender<bool>>>,
    /// Whether the park timer task runs.
    park_timer: Cell<bool>,
    /// Admission refusals decided on this shard, by model and gate.
    rejections: PerModelCounts<Reason>,
    /// How the policy routed this shard's requests, by model.
    policy_outcomes: PerModelCounts<PolicyOutcome>,
    /// This shard's learned tokens-per-byte ratios, trained on the exact usage of the requests
    /// it serves (each shard learns its own copy; with connections spread over shards the copies
    /// see the same traffic and converge alike).
    pub estimator: RefCell<crate::admission::estimator::Estimator>,
    /// Per-tenant request and token counters (`hivenet_tenant_*`).
    pub tenants: RefCell<crate::shard::tenants::TenantCounters>,
    /// This shard's end of the audit log (`None` until start-up hands it over).
    audit: RefCell<Option<crate::audit::AuditSender>>,
    /// Every pooled agent's peer ID, for the audit log (all shards hear every agent).
    agent_peers: RefCell<IdMap<AgentId, Arc<crate::routing::AgentProfile>>>,
    /// Origin of the monotonic `Millis` the limits run on.
    started: Instant,
    /// Mesh messages that found their ring full; retried before anything new is drained. Only
    /// releases and decisions land here: they must not be lost.
    deferred: RefCell<VecDeque<(usize, ShardToShard)>>,
    to_control: crate::control::queues::ToControl,
    /// What this shard's clients hold: connections, body bytes, resets per source.
    pub clients: Rc<crate::shard::guard::ClientGuard>,
    /// Draining and ending on SIGTERM.
    pub lifecycle: crate::shard::lifecycle::Lifecycle,
}

/// The current UTC day from the wall clock: what daily budgets count in.
pub fn utc_today() -> Day {
    let unix_seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    Day::from_unix_seconds(unix_seconds)
}

/// The shard that owns a key owner's quota holder.
pub fn owner_of_tenant(tenant: TenantId, shard_count: usize) -> usize {
    tenant.0 as usize % shard_count
}

/// The owner shard of a model.
pub fn owner_of_model(model: ModelId, shard_count: usize) -> usize {
    model.0 as usize % shard_count
}

impl Shard {
    pub fn new(
        mesh: Endpoint<ShardToShard>,
        count: usize,
        settings: ShardSettings,
        metrics: Arc<ShardMetrics>,
        keys: Arc<KeyRegistry>,
        admin_access: Arc<AdminAccess>,
        to_control: crate::control::queues::ToControl,
    ) -> Shard {
        let rpm_burst = settings.rpm_burst;
        let hold_limits = settings.hold.limits;
        let clients = Rc::new(crate::shard::guard::ClientGuard::new(
            settings.client_limits,
        ));
        Shard {
            id: mesh.shard(),
            count,
            settings,
            metrics,
            snapshot: RefCell::new(RoutingSnapshot::empty()),
            keys: RefCell::new(keys),
            admin_access: RefCell::new(admin_access),
            routes: RefCell::new(IdMap::default()),
            tunnels: RefCell::new(IdMap::default()),
            waiting: RefCell::new(IdMap::default()),
            next_sequence: Cell::new(1),
            next_tunnel_generation: Cell::new(1),
            mesh: RefCell::new(mesh),
            quotas: RefCell::new(Quotas::new(rpm_burst)),
            quota_waiting: RefCell::new(IdMap::default()),
            settle_waiting: RefCell::new(IdMap::default()),
            pools: RefCell::new(IdMap::default()),
            holds: RefCell::new(HoldBook::new(hold_limits)),
            hold_waiting: RefCell::new(IdMap::default()),
            spent_tokens: RefCell::new(crate::sibling::token::SpentTokens::new()),
            spend_waiting: RefCell::new(IdMap::default()),
            park_timer: Cell::new(false),
            rejections: RefCell::new(IdMap::default()),
            policy_outcomes: RefCell::new(IdMap::default()),
            estimator: RefCell::new(crate::admission::estimator::Estimator::default()),
            tenants: RefCell::new(crate::shard::tenants::TenantCounters::default()),
            audit: RefCell::new(None),
            agent_peers: RefCell::new(IdMap::default()),
            started: Instant::now(),
            clients,
            lifecycle: Default::default(),
            deferred: RefCell::new(VecDeque::new()),
            to_control,
        }
    }

    pub fn snapshot(&self) -> Arc<RoutingSnapshot> {
        self.snapshot.borrow().clone()
    }

    pub fn keys(&self) -> Arc<KeyRegistry> {
        self.keys.borrow().clone()
    }

    pub fn admin_access(&self) -> Arc<AdminAccess> {
        self.admin_access.borrow().clone()
    }

    /// Hands an `/admin/*` request to the control core; refused at once when its queue is full.
    pub fn call_control(
        &self,
        call: crate::shard::messages::AdminCall,
    ) -> Result<(), crate::control::queues::QueueError> {
        self.to_control.try_send(ShardToControl::Admin(call))
    }

    pub fn tunnel(&self, agent: AgentId) -> Option<Tunnel> {
        self.tunnels.borrow().get(&agent).cloned()
    }

    // ----- acquire / release -----

    /// Asks the model's owner for an agent slot, waiting in its capacity queue until `deadline`;
    /// with [`Admit::Gated`] the owner first runs the pool gates (B3, B2 with parking, the B4
    /// share) in the same visit.
    pub async fn acquire(
        self: &Rc<Self>,
        model: &ModelEntry,
        deadline: Instant,
        admit: Admit,
        route: RouteAsk,
    ) -> Result<Slot, RouteError> {
        let (ticket, pool, reservation) = match admit {
            Admit::Direct => (self.new_ticket(), None, None),
            Admit::Gated(ask) => {
                let ticket = self.new_ticket();
                (ticket, Some(self.pool_request(ticket, ask, deadline)), None)
            }
            Admit::Reserved(reservation) => (reservation.ticket, None, Some(reservation)),
        };
        let reserved = pool.is_some() || reservation.is_some();
        let decision = self
            .visit_owner(model.id, ticket, pool, Some(route), deadline)
            .await?;
        match decision {
            Decision::Granted(grant) => {
                // The slot now answers for the reservation too.
                if let Some(mut reservation) = reservation {
                    reservation.armed = false;
                }
                Ok(Slot {
                    shard: self.clone(),
                    model: model.id,
                    agent: grant.agent,
                    generation: grant.generation,
                    step: grant.step,
                    ticket,
                    reserved,
                })
            }
            other => Err(RouteError::from_decision(other)),
        }
    }

    /// Runs the pool gates at the model's owner and reserves occupancy, without asking for a
    /// slot yet (a per-key check still has to run between the two).
    pub async fn reserve(
        self: &Rc<Self>,
        model: &ModelEntry,
        ask: PoolAsk,
        deadline: Instant,
    ) -> Result<Reservation, RouteError> {
        let ticket = self.new_ticket();
        let pool = self.pool_request(ticket, ask, deadline);
        match self
            .visit_owner(model.id, ticket, Some(pool), None, deadline)
            .await?
        {
            Decision::Reserved => Ok(Reservation {
                shard: self.clone(),
                model: model.id,
                ticket,
                armed: true,
            }),
            other => Err(RouteError::from_decision(other)),
        }
    }

    fn new_ticket(&self) -> Ticket {
        let sequence = self.next_sequence.get();
        self.next_sequence.set(sequence + 1);
        Ticket {
            shard: self.id as u16,
            sequence,
        }
    }

    /// Registers the waiter of `ticket` in `waiters`: the answer (local or over the mesh) goes
    /// to the returned receiver.
    fn await_answer<A>(
        waiters: &RefCell<IdMap<u64, oneshot::Sender<A>>>,
        ticket: Ticket,
    ) -> oneshot::Receiver<A> {
        let (answered, answer) = oneshot::channel();
        waiters.borrow_mut().insert(ticket.sequence, answered);
        answer
    }

    /// Sends a request to another shard; false (counted in `mesh_full_total`) when its ring is
    /// full. The caller takes back whatever waits for the answer.
    fn send_request(&self, to: usize, message: ShardToShard) -> bool {
        let sent = self.mesh.borrow_mut().send(to, message).is_ok();
        if !sent {
            ShardMetrics::add(&self.metrics.mesh_full_total, 1);
        }
        sent
    }

    fn pool_request(&self, ticket: Ticket, ask: PoolAsk, deadline: Instant) -> PoolRequest {
        let park = self.settings.admit_park_timeout;
        let park_until = match ask.hold_until {
            Some(until) => Some(until),
            None => (!park.is_zero()).then(|| deadline.min(Instant::now() + park)),
        };
        PoolRequest {
            ask: Ask {
                ticket,
                footprint: ask.footprint,
                key: ask.key,
                share: ask.share,
            },
            policy: ask.policy,
            park_until,
            refuse_oversize: ask.hold_until.is_some(),
        }
    }

    /// One visit to the model's owner: a decision now (the owner is this shard and decided at
    /// once) or later over the mesh, waiting at most until `deadline`.
    async fn visit_owner(
        self: &Rc<Self>,
        model: ModelId,
        ticket: Ticket,
        pool: Option<PoolRequest>,
        slot: Option<RouteAsk>,
        deadline: Instant,
    ) -> Result<Decision, RouteError> {
        let owner = owner_of_model(model, self.count);
        if owner == self.id
            && let Some(decision) = self.admit_at_owner(ticket, model, pool.clone(), slot.clone())
        {
            return Ok(decision);
        }
        let decision = Self::await_answer(&self.waiting, ticket);
        // From here the ticket waits (locally or at the owner): if this future is dropped (the
        // client left) or times out, the guard withdraws it so it holds no place and no
        // occupancy.
        let mut waiting = Waiting {
            shard: self,
            ticket,
            owner,
            model,
            armed: true,
        };
        if owner != self.id
            && !self.send_request(
                owner,
                ShardToShard::Acquire {
                    ticket,
                    model,
                    pool,
                    slot,
                },
            )
        {
            waiting.armed = false;
            self.waiting.borrow_mut().remove(&ticket.sequence);
            return Err(RouteError::MeshFull);
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let decided = monoio::time::timeout(wait, decision).await;
        if decided.is_ok() {
            // Answered: nothing left to withdraw.
            waiting.armed = false;
        }
        match decided {
            Ok(Ok(decision)) => Ok(decision),
            Ok(Err(_)) => Err(RouteError::NoAgents),
            Err(_) => {
                ShardMetrics::add(&self.metrics.queue_timeouts_total, 1);
                Err(RouteError::Timeout)
            }
        }
    }

    /// The owner's side of [`Shard::visit_owner`]: the pool gates (when asked), then the slot
    /// (when asked). `None`: the ticket waits (parked or queued) and is decided later.
    fn admit_at_owner(
        self: &Rc<Self>,
        ticket: Ticket,
        model: ModelId,
        pool: Option<PoolRequest>,
        slot: Option<RouteAsk>,
    ) -> Option<Decision> {
        if let Some(request) = pool {
            // B3: the pool's averaged engine signals against `shed_if`; missing signals pass.
            if !request.policy.shed_if.is_empty()
                && request.policy.shed_if.fails(&self.pool_signals(model))
            {
                self.count_rejection(model, Reason::B3);
                return Some(Decision::Shed);
            }
            let now = self.now_millis();
            let healthy = self.healthy_agents(model);
            let limits = Limits::new(
                self.settings.admit_fraction,
                request.policy.admit_budget_tokens,
                u64::from(request.policy.max_inflight),
                healthy,
            );
            if request.refuse_oversize && !limits.could_ever_fit(&request.ask.footprint) {
                self.count_rejection(model, Reason::B2);
                return Some(Decision::PoolTooSmall);
            }
            let park_until = request.park_until.map(|until| self.millis_at(until));
            let verdict = {
                let mut pools = self.pools.borrow_mut();
                let owned = pools.entry(model).or_insert_with(|| OwnedPool {
                    pool: Pool::new(now),
                    policy: request.policy.clone(),
                    parked_for_slot: IdMap::default(),
                });
                owned.policy = request.policy;
                let verdict = owned.pool.admit(now, &limits, request.ask, park_until);
                if verdict == Verdict::Parked {
                    owned.parked_for_slot.insert(ticket, slot.clone());
                }
                verdict
            };
            match verdict {
                Verdict::Admitted => {}
                Verdict::Parked => {
                    ShardMetrics::add(&self.metrics.admission_parked_total, 1);
                    self.arm_park_timer();
                    return None;
                }
                Verdict::Refused(Refusal::Pool) => {
                    self.count_rejection(model, Reason::B2);
                    return Some(Decision::PoolFull);
                }
                Verdict::Refused(Refusal::KeyShare) => {
                    self.count_rejection(model, Reason::B4Occupancy);
                    return Some(Decision::KeyShare);
                }
            }
        }
        match slot {
            None => Some(Decision::Reserved),
            Some(route) => self.slot_at_owner(ticket, model, &route),
        }
    }

    /// The capacity part at the owner, for a ticket that passed (or skipped) the pool gates.
    fn slot_at_owner(&self, ticket: Ticket, model: ModelId, route: &RouteAsk) -> Option<Decision> {
        let acquired = match self.routes.borrow_mut().get_mut(&model) {
            Some(routes) => routes.acquire_from(ticket, route),
            None => Acquire::NoAgents,
        };
        let decision = match acquired {
            Acquire::Granted(grant) => Decision::Granted(grant),
            Acquire::Queued => {
                // Counted where the queue is: on the owner shard.
                ShardMetrics::add(&self.metrics.queued_total, 1);
                return None;
            }
            Acquire::QueueFull => Decision::QueueFull,
            Acquire::NoAgents => Decision::NoAgents,
        };
        if !matches!(decision, Decision::Granted(_)) {
            self.release_reservation_at_owner(model, ticket);
        }
        Some(decision)
    }

    /// The model's engine signals averaged over its agents, for B3.
    fn pool_signals(&self, model: ModelId) -> crate::policy::Signals {
        let engine = self
            .routes
            .borrow()
            .get(&model)
            .map(|routes| routes.pool_signals())
            .unwrap_or_default();
        crate::policy::Signals::of_engine(&engine)
    }

    fn healthy_agents(&self, model: ModelId) -> u32 {
        self.routes
            .borrow()
            .get(&model)
            .map_or(0, |routes| routes.agent_count() as u32)
    }

    fn pool_limits(&self, model: ModelId, policy: &ModelPolicy) -> Limits {
        Limits::new(
            self.settings.admit_fraction,
            policy.admit_budget_tokens,
            u64::from(policy.max_inflight),
            self.healthy_agents(model),
        )
    }

    /// Admits the parked requests of `model` that fit now (after a release, a true-up, a new
    /// agent or an expiry) and decides each.
    fn retry_parked(&self, model: ModelId) {
        let decided = {
            let mut pools = self.pools.borrow_mut();
            let Some(owned) = pools.get_mut(&model) else {
                return;
            };
            if owned.pool.parked_len() == 0 {
                return;
            }
            let limits = self.pool_limits(model, &owned.policy);
            let now = self.now_millis();
            owned
                .pool
                .admit_parked(now, &limits)
                .into_iter()
                .map(|(ticket, result)| {
                    let slot = owned.parked_for_slot.remove(&ticket).flatten();
                    (ticket, result, slot)
                })
                .collect::<Vec<_>>()
        };
        for (ticket, result, slot) in decided {
            let decision = match result {
                Err(_) => {
                    self.count_rejection(model, Reason::B4Occupancy);
                    Some(Decision::KeyShare)
                }
                Ok(()) => match slot {
                    None => Some(Decision::Reserved),
                    Some(route) => self.slot_at_owner(ticket, model, &route),
                },
            };
            if let Some(decision) = decision {
                self.decide(model, ticket, decision);
            }
        }
    }

    /// Refuses parked requests whose park timeout passed; returns the next deadline, if any.
    fn expire_parked(&self) -> Option<Millis> {
        let now = self.now_millis();
        let mut expired = Vec::new();
        let mut models = Vec::new();
        for (model, owned) in self.pools.borrow_mut().iter_mut() {
            for ticket in owned.pool.expire_parked(now) {
                owned.parked_for_slot.remove(&ticket);
                expired.push((*model, ticket));
            }
            models.push(*model);
        }
        for (model, ticket) in expired {
            self.count_rejection(model, Reason::B2);
            self.decide(model, ticket, Decision::PoolFull);
        }
        for model in models {
            self.retry_parked(model);
        }
        self.pools
            .borrow()
            .values()
            .filter_map(|owned| owned.pool.next_park_deadline())
            .min()
    }

    /// Runs a timer task while anything is parked on this shard.
    fn arm_park_timer(self: &Rc<Self>) {
        if self.park_timer.replace(true) {
            return;
        }
        let shard = self.clone();
        monoio::spawn(async move {
            while let Some(next) = shard.expire_parked() {
                // At least once a second: the limits follow the healthy replicas, and replicas
                // that joined since are used (seed, "After the wake").
                let wait = next
                    .0
                    .saturating_sub(shard.now_millis().0)
                    .clamp(1, PARK_RECHECK_MS);
                monoio::time::sleep(Duration::from_millis(wait)).await;
            }
            shard.park_timer.set(false);
        });
    }

    // ----- hold at zero -----

    /// Holds a request for `model`, asleep on this site, until an agent for it registers or
    /// `until` (its hold budget) passes. The returned [`Pending`] keeps the request in the
    /// model's pending demand until it is dropped: when the request gets a slot, or ends.
    /// Dropping the future (the client left) withdraws the hold.
    pub async fn hold(
        self: &Rc<Self>,
        model: ModelId,
        key: Option<KeyId>,
        client: Option<ClientId>,
        until: Instant,
    ) -> Result<Pending, HoldEnd> {
        if !self.settings.held_total.take() {
            return Err(HoldEnd::Full);
        }
        let ticket = self.new_ticket();
        let owner = owner_of_model(model, self.count);
        // From here the guard gives the place back and tells the owner, on every path.
        let pending = Pending {
            shard: self.clone(),
            ticket,
            model,
            holds_place: true,
        };
        if owner == self.id
            && let Some(answer) = self.hold_at_owner(ticket, model, key, client)
        {
            return pending.answered(answer);
        }
        // Taken back out by `pending` on every early exit.
        let answer = Self::await_answer(&self.hold_waiting, ticket);
        let message = ShardToShard::Hold {
            ticket,
            model,
            key,
            client,
        };
        if owner != self.id && !self.send_request(owner, message) {
            return Err(HoldEnd::MeshFull);
        }
        let wait = until.saturating_duration_since(Instant::now());
        // The router's drain ending ends a hold too: its model cannot wake here any more.
        match race(monoio::time::timeout(wait, answer), self.lifecycle.ending()).await {
            Either::Left(Ok(Ok(answer))) => pending.answered(answer),
            // The owner dropped the waiter without an answer: cannot happen while the shard
            // runs; treat it as the budget ending.
            Either::Left(Ok(Err(_)) | Err(_)) => Err(HoldEnd::Expired),
            Either::Right(()) => Err(HoldEnd::ShuttingDown),
        }
    }

    /// The owner's side of [`Shard::hold`]: `None` when the request is now held.
    fn hold_at_owner(
        &self,
        ticket: Ticket,
        model: ModelId,
        key: Option<KeyId>,
        client: Option<ClientId>,
    ) -> Option<HoldAnswer> {
        if self.healthy_agents(model) > 0 {
            // An agent registered since the requester looked: nothing to wait for.
            return Some(HoldAnswer::Awake);
        }
        match self.holds.borrow_mut().hold(ticket, model, key, client) {
            Ok(()) => None,
            Err(crate::hold::HoldRefusal::Full) => Some(HoldAnswer::Full),
        }
    }

    /// Releases every request held for `model` (an agent for it registered), oldest first.
    fn wake_held(&self, model: ModelId) {
        let woken = self.holds.borrow().held_for(model);
        if !woken.is_empty() {
            let snapshot = self.snapshot();
            tracing::info!(
                shard = self.id,
                model = snapshot.name_of(model).unwrap_or("?"),
                released = woken.len(),
                "model awake: releasing its held requests"
            );
        }
        for ticket in woken {
            self.holds.borrow_mut().release(ticket);
            self.answer_hold(ticket, HoldAnswer::Awake);
        }
    }

    fn answer_hold(&self, ticket: Ticket, answer: HoldAnswer) {
        let requester = usize::from(ticket.shard);
        if requester == self.id {
            self.hold_answered(ticket.sequence, answer);
        } else {
            self.send_or_defer(
                requester,
                ShardToShard::HoldAnswered {
                    sequence: ticket.sequence,
                    answer,
                },
            );
        }
    }

    fn hold_answered(&self, sequence: u64, answer: HoldAnswer) {
        if let Some(waiter) = self.hold_waiting.borrow_mut().remove(&sequence) {
            let _ = waiter.send(answer);
        }
    }

    fn leave_hold(&self, ticket: Ticket, model: ModelId) {
        self.hold_waiting.borrow_mut().remove(&ticket.sequence);
        let owner = owner_of_model(model, self.count);
        if owner == self.id {
            self.holds.borrow_mut().finish(ticket);
        } else {
            self.send_or_defer(owner, ShardToShard::HoldLeave { ticket, model });
        }
    }

    // ----- cross-site redirect -----

    /// Spends a redirect token: true the first time this router sees its nonce, false after
    /// (single use). The nonce's owner shard keeps the spent set, so every shard agrees; `None`
    /// when the owner could not be asked before `deadline`.
    pub async fn spend_redirect_token(
        self: &Rc<Self>,
        nonce: [u8; 16],
        expires_unix_ms: i64,
        deadline: Instant,
    ) -> Option<bool> {
        let owner = usize::from(nonce[0]) % self.count;
        if owner == self.id {
            return Some(self.spend_at_owner(nonce, expires_unix_ms));
        }
        let ticket = self.new_ticket();
        let answer = Self::await_answer(&self.spend_waiting, ticket);
        let message = ShardToShard::SpendToken {
            ticket,
            nonce,
            expires_unix_ms,
        };
        if !self.send_request(owner, message) {
            self.spend_waiting.borrow_mut().remove(&ticket.sequence);
            return None;
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let fresh = monoio::time::timeout(wait, answer).await;
        self.spend_waiting.borrow_mut().remove(&ticket.sequence);
        fresh.ok().and_then(Result::ok)
    }

    fn spend_at_owner(&self, nonce: [u8; 16], expires_unix_ms: i64) -> bool {
        let now = crate::api::authenticate::now_unix_ms();
        self.spent_tokens
            .borrow_mut()
            .spend(nonce, expires_unix_ms, now)
    }

    /// Counts an admission refusal decided on this shard (B1 on the requester, B2/B3/B4 share on
    /// the model's owner, per-key limits on the quota owner's answer).
    pub fn count_rejection(&self, model: ModelId, reason: Reason) {
        count_per_model(&self.rejections, model, reason);
    }

    /// Counts how the policy routed one request.
    pub fn count_policy_outcome(&self, model: ModelId, outcome: PolicyOutcome) {
        count_per_model(&self.policy_outcomes, model, outcome);
    }

    /// Withdraws a waiting ticket: its waiter goes, and the owner drops it from the park and
    /// capacity queues and releases its reservation. A grant already on its way finds no waiter
    /// and is released by `resolve`.
    fn withdraw(&self, ticket: Ticket, owner: usize, model: ModelId) {
        self.waiting.borrow_mut().remove(&ticket.sequence);
        if owner == self.id {
            self.cancel_at_owner(ticket, model);
        } else {
            self.send_or_defer(owner, ShardToShard::Cancel { ticket, model });
        }
    }

    fn cancel_at_owner(&self, ticket: Ticket, model: ModelId) {
        if let Some(routes) = self.routes.borrow_mut().get_mut(&model) {
            routes.cancel(ticket);
        }
        if let Some(owned) = self.pools.borrow_mut().get_mut(&model)
            && owned.pool.cancel_parked(ticket)
        {
            owned.parked_for_slot.remove(&ticket);
        }
        self.release_reservation_at_owner(model, ticket);
    }

    fn release(&self, model: ModelId, grant: Grant, ticket: Ticket) {
        let owner = owner_of_model(model, self.count);
        if owner == self.id {
            self.release_reservation_at_owner(model, ticket);
            let grants = match self.routes.borrow_mut().get_mut(&model) {
                Some(routes) => routes.release(grant),
                None => Vec::new(),
            };
            self.deliver(model, grants);
        } else {
            self.send_or_defer(
                owner,
                ShardToShard::Release {
                    model,
                    grant,
                    ticket,
                },
            );
        }
    }

    fn release_reservation(&self, model: ModelId, ticket: Ticket) {
        let owner = owner_of_model(model, self.count);
        if owner == self.id {
            self.release_reservation_at_owner(model, ticket);
        } else {
            self.send_or_defer(owner, ShardToShard::ReleaseReservation { model, ticket });
        }
    }

    fn release_reservation_at_owner(&self, model: ModelId, ticket: Ticket) {
        let released = self
            .pools
            .borrow_mut()
            .get_mut(&model)
            .is_some_and(|owned| owned.pool.release(self.now_millis(), ticket));
        if released {
            self.retry_parked(model);
        }
    }

    fn update_occupancy(&self, model: ModelId, ticket: Ticket, update: OccupancyUpdate) {
        let owner = owner_of_model(model, self.count);
        if owner != self.id {
            self.send_or_defer(
                owner,
                ShardToShard::Occupancy {
                    model,
                    ticket,
                    update,
                },
            );
            return;
        }
        let now = self.now_millis();
        let shrunk = match self.pools.borrow_mut().get_mut(&model) {
            None => false,
            Some(owned) => match update {
                OccupancyUpdate::Output(tokens) => {
                    owned.pool.grow(now, ticket, tokens);
                    false
                }
                OccupancyUpdate::ExactInput(tokens) => {
                    owned.pool.true_up(now, ticket, tokens);
                    true
                }
            },
        };
        if shrunk {
            self.retry_parked(model);
        }
    }

    /// Hands grants made by this shard (as owner) to their requesters.
    fn deliver(&self, model: ModelId, grants: Vec<(Ticket, Grant)>) {
        for (ticket, grant) in grants {
            self.decide(model, ticket, Decision::Granted(grant));
        }
    }

    /// The routing steps of `model` under the current snapshot's policy.
    fn steps_of(&self, model: ModelId) -> Arc<dyn StepFilter> {
        match self.snapshot.borrow().policy_of(model) {
            Some(policy) => policy.clone(),
            None => Arc::new(AnyAgent),
        }
    }

    fn decide(&self, model: ModelId, ticket: Ticket, decision: Decision) {
        let requester = usize::from(ticket.shard);
        if requester == self.id {
            self.resolve(model, ticket.sequence, decision);
        } else {
            self.send_or_defer(
                requester,
                ShardToShard::Decided {
                    sequence: ticket.sequence,
                    decision,
                    model,
                },
            );
        }
    }

    /// A decision for one of this shard's tickets. A grant or reservation nobody waits for any
    /// more goes back.
    fn resolve(&self, model: ModelId, sequence: u64, decision: Decision) {
        let waiter = self.waiting.borrow_mut().remove(&sequence);
        let undelivered = match waiter {
            Some(waiter) => waiter.send(decision).err(),
            None => Some(decision),
        };
        let ticket = Ticket {
            shard: self.id as u16,
            sequence,
        };
        match undelivered {
            Some(Decision::Granted(grant)) => self.release(model, grant, ticket),
            Some(Decision::Reserved) => self.release_reservation(model, ticket),
            _ => {}
        }
    }

    /// Reaps reservations whose release was lost and drops idle occupancy state; run every few
    /// minutes.
    pub fn cleanup_pools(&self) {
        let now = self.now_millis();
        let mut reaped = 0;
        self.pools.borrow_mut().retain(|_, owned| {
            reaped += owned.pool.reap(now, self.settings.reaper.after_ms);
            !owned.pool.is_idle(now)
        });
        if reaped > 0 {
            tracing::warn!(
                shard = self.id,
                reaped,
                "released occupancy reservations whose release was lost"
            );
            ShardMetrics::add(&self.metrics.admission_reaped_total, reaped as u64);
        }
    }

    /// Hands this shard its end of the audit log (start-up, before it accepts).
    pub fn set_audit(&self, sender: crate::audit::AuditSender) {
        *self.audit.borrow_mut() = Some(sender);
    }

    /// A request is over: it counts in its key's tenant series (success for a 2xx answer, failure
    /// for anything else) and leaves its audit record.
    pub fn request_finished(
        &self,
        request: &crate::api::ClientRequest,
        keys: &KeyRegistry,
        facts: &crate::api::RequestFacts,
        status: u16,
    ) {
        if let (Some(key), Some(model)) = (facts.key.and_then(|key| keys.get(key)), facts.model_id)
        {
            self.tenants.borrow_mut().finished(
                key.key_id,
                model,
                facts.agent,
                Some(status),
                || {
                    Some((
                        crate::shard::tenants::KeyLabels::of(key),
                        self.deployment_of(facts.agent),
                    ))
                },
            );
        }
        self.audit(request, keys, facts, status);
    }

    /// Writes the request's audit record (observability reference, "Audit record format").
    fn audit(
        &self,
        request: &crate::api::ClientRequest,
        keys: &KeyRegistry,
        facts: &crate::api::RequestFacts,
        status: u16,
    ) {
        use crate::audit::{
            AuditKey, AuditRecord, Shown, SourceIp, Timestamp, error_code_for_status,
        };
        let mut audit = self.audit.borrow_mut();
        let Some(sender) = audit.as_mut() else {
            return;
        };
        let key = facts.key.and_then(|key| keys.get(key));
        let latency = request.received_at.elapsed();
        let peers = self.agent_peers.borrow();
        let agent_id = match (facts.provider, facts.agent) {
            (Some(provider), _) => provider,
            (None, Some(agent)) => peers.get(&agent).map_or("", |profile| &profile.peer_id),
            (None, None) => "",
        };
        let error_code = match facts.error_code {
            Some(code) if status >= 400 => code,
            _ => error_code_for_status(status),
        };
        sender.record(&AuditRecord {
            log_type: "audit",
            level: AuditRecord::level_of(status),
            trace_id: "",
            request_id: request.request_id_str(),
            tenant_id: key.map_or("", |key| key.owner.as_str()),
            key_id: Shown(AuditKey::of(key)),
            model: facts
                .model
                .as_deref()
                .and_then(|model| std::str::from_utf8(model).ok())
                .unwrap_or(""),
            status_code: status,
            latency_ms: latency.as_millis() as u64,
            input_tokens: facts.input_tokens,
            output_tokens: facts.output_tokens,
            agent_id,
            error_code,
            source_ip: SourceIp(request.peer),
            ts: Timestamp(std::time::SystemTime::now() - latency),
        });
    }

    /// The `deployment_id` label of a request served by `agent`: what the agent registered;
    /// `unset` when no agent served it (refused before routing, answered by a provider) or the
    /// agent registered none.
    pub fn deployment_of(&self, agent: Option<AgentId>) -> Arc<str> {
        let peers = self.agent_peers.borrow();
        match agent.and_then(|agent| peers.get(&agent)) {
            Some(profile) if !profile.deployment_id.is_empty() => (*profile.deployment_id).into(),
            _ => crate::shard::tenants::UNSET.into(),
        }
    }

    /// `hivenet_routing_requests_routed_total`: the request got a slot on `agent`.
    pub fn count_routed(&self, key: &KeyRecord, model: ModelId, agent: AgentId) {
        self.tenants
            .borrow_mut()
            .routed(key.tenant_id, model, agent, || {
                let peers = self.agent_peers.borrow();
                let profile = peers.get(&agent)?;
                Some(crate::shard::tenants::RoutedSeries {
                    tenant_id: key.owner.as_str().into(),
                    model,
                    engine: (*profile.engine).into(),
                    region: (*profile.region).into(),
                })
            });
    }

    /// Counts tokens a request used against its key's tenant series (resolving the key's labels
    /// only when the series is new; a key gone in a reload is not counted). `agent`: the one
    /// that served it, `None` for a provider's answer.
    pub fn count_tenant_tokens(
        &self,
        key: KeyId,
        model: ModelId,
        agent: Option<AgentId>,
        input: u64,
        output: u64,
    ) {
        self.tenants
            .borrow_mut()
            .tokens(key, model, agent, input, output, || {
                let labels = crate::shard::tenants::KeyLabels::of(self.keys().get(key)?);
                Some((labels, self.deployment_of(agent)))
            });
    }

    /// The admission state this shard owns, for `/metrics`.
    pub fn admission_report(&self) -> AdmissionReport {
        let pools = self
            .pools
            .borrow()
            .iter()
            .map(|(model, owned)| {
                let limits = self.pool_limits(*model, &owned.policy);
                PoolReport {
                    model: *model,
                    occupancy_tokens: owned.pool.tokens(),
                    budget_tokens: limits.budget_tokens,
                    inflight: owned.pool.inflight(),
                    max_inflight: limits.max_inflight,
                }
            })
            .collect();
        AdmissionReport {
            pools,
            rejections: per_model_counts(&self.rejections.borrow()),
            policy_outcomes: per_model_counts(&self.policy_outcomes.borrow()),
        }
    }

    fn millis_at(&self, instant: Instant) -> Millis {
        Millis(instant.saturating_duration_since(self.started).as_millis() as u64)
    }

    fn send_or_defer(&self, to: usize, message: ShardToShard) {
        let mut deferred = self.deferred.borrow_mut();
        if !deferred.is_empty() {
            deferred.push_back((to, message));
            return;
        }
        if let Err(full) = self.mesh.borrow_mut().send_returning(to, message) {
            ShardMetrics::add(&self.metrics.mesh_full_total, 1);
            deferred.push_back((to, full));
        }
    }

    fn flush_deferred(&self) {
        let mut deferred = self.deferred.borrow_mut();
        let mut mesh = self.mesh.borrow_mut();
        while let Some((to, message)) = deferred.pop_front() {
            if let Err(message) = mesh.send_returning(to, message) {
                deferred.push_front((to, message));
                break;
            }
        }
    }

    // ----- quotas -----

    fn now_millis(&self) -> Millis {
        Millis(self.started.elapsed().as_millis() as u64)
    }

    fn today() -> Day {
        utc_today()
    }

    /// Hands the quota holders this shard owns the daily totals persisted before a restart, and
    /// turns on reporting changed totals (`HIVENET_ROUTER_QUOTA_BACKEND=badger`). Call before the
    /// shard accepts connections.
    pub fn restore_daily(&self, restore: crate::shard::quotas::DailyRestore) {
        self.quotas.borrow_mut().restore(restore);
    }

    fn quota_owner(&self, tenant: TenantId) -> usize {
        owner_of_tenant(tenant, self.count)
    }

    /// The quota phase: asks the key's quota owner to check and charge the request. The returned
    /// hold settles (or gives back) exactly once.
    pub async fn admit_quota(
        self: &Rc<Self>,
        key: &KeyRecord,
        model: ModelContext,
        charge: Charge,
        deadline: Instant,
    ) -> Result<QuotaHold, QuotaRefusal> {
        let tenant = key.tenant_id;
        let hold = |admitted: Admitted| QuotaHold {
            shard: self.clone(),
            key: key.key_id,
            tenant,
            admission: admitted.admission,
            estimate_input_tokens: 0,
            remaining_requests: admitted.remaining_requests,
            remaining_tokens: admitted.remaining_tokens,
        };
        if !crate::shard::quotas::is_limited(key) {
            return Ok(hold(Admitted::default()));
        }
        let owner = self.quota_owner(tenant);
        if owner == self.id {
            let keys = self.keys();
            let snapshot = self.snapshot();
            return self
                .quotas
                .borrow_mut()
                .admit(
                    self.now_millis(),
                    Self::today(),
                    &keys,
                    &snapshot,
                    key.key_id,
                    &model,
                    charge,
                )
                .map(hold)
                .map_err(QuotaRefusal::Limit);
        }
        let ticket = self.new_ticket();
        let sequence = ticket.sequence;
        let answer = Self::await_answer(&self.quota_waiting, ticket);
        let message = ShardToShard::QuotaAdmit {
            ticket,
            key: key.key_id,
            model,
            charge,
        };
        if !self.send_request(owner, message) {
            self.quota_waiting.borrow_mut().remove(&sequence);
            return Err(QuotaRefusal::MeshFull);
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match monoio::time::timeout(wait, answer).await {
            Ok(Ok(result)) => result.map(hold),
            Ok(Err(_)) | Err(_) => {
                // A late admission finds no waiter and is given back by `quota_decided`.
                self.quota_waiting.borrow_mut().remove(&sequence);
                Err(QuotaRefusal::Timeout)
            }
        }
    }

    fn quota_release(&self, tenant: TenantId, release: Release) {
        let owner = self.quota_owner(tenant);
        if owner == self.id {
            self.apply_quota_release(release);
        } else {
            self.send_or_defer(owner, ShardToShard::QuotaRelease(release));
        }
    }

    fn apply_quota_release(&self, release: Release) {
        let (now, day) = (self.now_millis(), Self::today());
        let mut quotas = self.quotas.borrow_mut();
        match release {
            Release::Settle {
                tenant,
                admission,
                usage,
                delivery,
            } => {
                let _ = quotas.settle(now, day, tenant, admission, usage, delivery);
            }
            Release::Cancel { tenant, admission } => quotas.cancel(tenant, admission),
        }
    }

    fn quota_decided(&self, sequence: u64, tenant: TenantId, result: QuotaAnswer) {
        let waiter = self.quota_waiting.borrow_mut().remove(&sequence);
        let unwanted = match waiter {
            Some(waiter) => waiter.send(result).err(),
            None => Some(result),
        };
        if let Some(Ok(Admitted {
            admission: Some(admission),
            ..
        })) = unwanted
        {
            self.quota_release(tenant, Release::Cancel { tenant, admission });
        }
    }

    /// Settles a non-streamed answer on the quota owner before delivery (auth reference, "Token-
    /// budget enforcement": output that no longer fits the day's budget is refused, the input
    /// charge stays). `None`: nothing to refuse on (holder gone, or no answer within `wait`, in
    /// which case the settlement still happens and the answer is delivered).
    async fn settle_buffered(
        self: &Rc<Self>,
        tenant: TenantId,
        admission: Admission,
        usage: Usage,
        wait: Duration,
    ) -> Option<crate::limits::Settlement> {
        let owner = self.quota_owner(tenant);
        if owner == self.id {
            return self.quotas.borrow_mut().settle(
                self.now_millis(),
                Self::today(),
                tenant,
                admission,
                usage,
                Delivery::Buffered,
            );
        }
        let ticket = self.new_ticket();
        let answer = Self::await_answer(&self.settle_waiting, ticket);
        let sent = self.mesh.borrow_mut().send_returning(
            owner,
            ShardToShard::QuotaSettle {
                ticket,
                tenant,
                admission,
                usage,
            },
        );
        if let Err(message) = sent {
            // Ring full: settle as delivered rather than lose the charge.
            self.settle_waiting.borrow_mut().remove(&ticket.sequence);
            ShardMetrics::add(&self.metrics.mesh_full_total, 1);
            if let ShardToShard::QuotaSettle {
                tenant, admission, ..
            } = message
            {
                self.send_or_defer(
                    owner,
                    ShardToShard::QuotaRelease(Release::Settle {
                        tenant,
                        admission,
                        usage,
                        delivery: Delivery::Streamed,
                    }),
                );
            }
            return None;
        }
        match monoio::time::timeout(wait, answer).await {
            Ok(Ok(settlement)) => settlement,
            _ => {
                self.settle_waiting.borrow_mut().remove(&ticket.sequence);
                None
            }
        }
    }

    /// Drops idle quota holders; run every few minutes.
    pub fn cleanup_quotas(&self) {
        self.quotas
            .borrow_mut()
            .cleanup(self.now_millis(), Self::today());
    }

    // ----- inbound messages -----

    fn on_mesh(self: &Rc<Self>, message: ShardToShard) {
        match message {
            ShardToShard::QuotaAdmit {
                ticket,
                key,
                model,
                charge,
            } => {
                let keys = self.keys();
                let snapshot = self.snapshot();
                let tenant = keys
                    .get(key)
                    .map_or(TenantId::DEFAULT, |record| record.tenant_id);
                let result = self
                    .quotas
                    .borrow_mut()
                    .admit(
                        self.now_millis(),
                        Self::today(),
                        &keys,
                        &snapshot,
                        key,
                        &model,
                        charge,
                    )
                    .map_err(QuotaRefusal::Limit);
                self.send_or_defer(
                    usize::from(ticket.shard),
                    ShardToShard::QuotaDecided {
                        sequence: ticket.sequence,
                        tenant,
                        result,
                    },
                );
            }
            ShardToShard::QuotaDecided {
                sequence,
                tenant,
                result,
            } => self.quota_decided(sequence, tenant, result),
            ShardToShard::QuotaRelease(release) => self.apply_quota_release(release),
            ShardToShard::QuotaSettle {
                ticket,
                tenant,
                admission,
                usage,
            } => {
                let settlement = self.quotas.borrow_mut().settle(
                    self.now_millis(),
                    Self::today(),
                    tenant,
                    admission,
                    usage,
                    Delivery::Buffered,
                );
                self.send_or_defer(
                    usize::from(ticket.shard),
                    ShardToShard::QuotaSettled {
                        sequence: ticket.sequence,
                        settlement,
                    },
                );
            }
            ShardToShard::QuotaSettled {
                sequence,
                settlement,
            } => {
                if let Some(waiter) = self.settle_waiting.borrow_mut().remove(&sequence) {
                    let _ = waiter.send(settlement);
                }
            }
            ShardToShard::Acquire {
                ticket,
                model,
                pool,
                slot,
            } => {
                if let Some(decision) = self.admit_at_owner(ticket, model, pool, slot) {
                    self.decide(model, ticket, decision);
                }
            }
            ShardToShard::Cancel { ticket, model } => self.cancel_at_owner(ticket, model),
            ShardToShard::Release {
                model,
                grant,
                ticket,
            } => self.release(model, grant, ticket),
            ShardToShard::ReleaseReservation { model, ticket } => {
                self.release_reservation_at_owner(model, ticket)
            }
            ShardToShard::Occupancy {
                model,
                ticket,
                update,
            } => self.update_occupancy(model, ticket, update),
            ShardToShard::Decided {
                sequence,
                decision,
                model,
            } => self.resolve(model, sequence, decision),
            ShardToShard::Hold {
                ticket,
                model,
                key,
                client,
            } => {
                if let Some(answer) = self.hold_at_owner(ticket, model, key, client) {
                    self.answer_hold(ticket, answer);
                }
            }
            ShardToShard::HoldAnswered { sequence, answer } => self.hold_answered(sequence, answer),
            ShardToShard::HoldLeave { ticket, .. } => self.holds.borrow_mut().finish(ticket),
            ShardToShard::SpendToken {
                ticket,
                nonce,
                expires_unix_ms,
            } => {
                let fresh = self.spend_at_owner(nonce, expires_unix_ms);
                self.send_or_defer(
                    usize::from(ticket.shard),
                    ShardToShard::TokenSpent {
                        sequence: ticket.sequence,
                        fresh,
                    },
                );
            }
            ShardToShard::TokenSpent { sequence, fresh } => {
                if let Some(waiter) = self.spend_waiting.borrow_mut().remove(&sequence) {
                    let _ = waiter.send(fresh);
                }
            }
        }
    }

    fn on_control(self: &Rc<Self>, message: ControlToShard) {
        match message {
            ControlToShard::Snapshot(snapshot) => {
                *self.snapshot.borrow_mut() = snapshot;
                // Policies may have changed: every owned model routes by its current steps.
                let models: Vec<ModelId> = self.routes.borrow().keys().copied().collect();
                for model in models {
                    let steps = self.steps_of(model);
                    let grants = match self.routes.borrow_mut().get_mut(&model) {
                        Some(routes) => routes.set_steps(steps),
                        None => Vec::new(),
                    };
                    self.deliver(model, grants);
                }
            }
            ControlToShard::Keys(keys) => *self.keys.borrow_mut() = keys,
            ControlToShard::AdminAccess(access) => *self.admin_access.borrow_mut() = access,
            ControlToShard::AgentUp {
                agent,
                generation,
                models,
                capacity,
                profile,
            } => {
                self.agent_peers.borrow_mut().insert(agent, profile.clone());
                for model in self.owned(&models) {
                    let steps = self.steps_of(model);
                    let grants = self
                        .routes
                        .borrow_mut()
                        .entry(model)
                        .or_insert_with(|| {
                            let mut routes = ModelRoutes::new(self.settings.queue_depth);
                            let _ = routes.set_steps(steps);
                            routes
                        })
                        .agent_up(agent, generation, capacity, profile.clone());
                    self.deliver(model, grants);
                    // A new replica raises the pool limits: parked requests may fit.
                    self.retry_parked(model);
                    // Hold at zero: the model is awake; its held requests continue.
                    self.wake_held(model);
                }
            }
            ControlToShard::AgentDown { agent, models } => {
                self.agent_peers.borrow_mut().remove(&agent);
                self.tenants.borrow_mut().forget_agent(agent);
                for model in self.owned(&models) {
                    let failed = {
                        let mut routes = self.routes.borrow_mut();
                        let Some(state) = routes.get_mut(&model) else {
                            continue;
                        };
                        let failed = state.agent_down(agent);
                        if state.agent_count() == 0 && state.is_idle() {
                            routes.remove(&model);
                        }
                        failed
                    };
                    for ticket in failed {
                        self.decide(model, ticket, Decision::NoAgents);
                    }
                }
            }
            ControlToShard::Signal {
                agent,
                models,
                in_flight,
                engine,
            } => {
                for model in self.owned(&models) {
                    let grants = match self.routes.borrow_mut().get_mut(&model) {
                        Some(routes) => routes.signal(agent, in_flight, engine),
                        None => Vec::new(),
                    };
                    self.deliver(model, grants);
                }
            }
            ControlToShard::Tunnel {
                agent,
                socket,
                permit,
            } => {
                monoio::spawn(crate::tunnel::client::run(
                    self.clone(),
                    agent,
                    self.new_tunnel_generation(),
                    socket,
                    permit,
                ));
            }
            ControlToShard::SecureTunnel { socket, permit } => {
                monoio::spawn(crate::tunnel::client::run_secure(
                    self.clone(),
                    self.new_tunnel_generation(),
                    socket,
                    permit,
                ));
            }
            ControlToShard::Report(reply) => {
                let queues = self
                    .routes
                    .borrow()
                    .iter()
                    .map(|(model, routes)| (*model, routes.queue_len() as u32))
                    .collect();
                let pending_demand = self.holds.borrow().demand().collect();
                let _ = reply.send(crate::shard::messages::ShardReport {
                    queues,
                    pending_demand,
                    admission: self.admission_report(),
                    tenants: self.tenants.borrow().report(),
                });
            }
            ControlToShard::ReportDaily(reply) => {
                let totals = self.quotas.borrow_mut().take_changed_daily_totals();
                if let Err(totals) = reply.send(totals) {
                    // The flush gave up waiting: report these again next time.
                    self.quotas.borrow_mut().requeue_daily_totals(totals);
                }
            }
            ControlToShard::Drain => {
                tracing::info!(shard = self.id, "draining: no new connections or requests");
                self.lifecycle.drain();
            }
            ControlToShard::End => {
                tracing::info!(shard = self.id, "ending the requests still in flight");
                self.lifecycle.end();
            }
            ControlToShard::CloseTunnel { agent } => {
                if self.tunnels.borrow_mut().remove(&agent).is_some() {
                    ShardMetrics::gauge(&self.metrics.tunnels_open, -1);
                }
            }
        }
    }

    /// Tells this tunnel's end from an earlier one's to the same agent.
    fn new_tunnel_generation(&self) -> u64 {
        let generation = self.next_tunnel_generation.get();
        self.next_tunnel_generation.set(generation + 1);
        generation
    }

    fn owned(&self, models: &[ModelId]) -> Vec<ModelId> {
        models
            .iter()
            .copied()
            .filter(|model| owner_of_model(*model, self.count) == self.id)
            .collect()
    }

    // ----- tunnels (called by the tunnel client task) -----

    pub async fn tunnel_up(&self, agent: AgentId, tunnel: Tunnel) {
        if self.tunnels.borrow_mut().insert(agent, tunnel).is_none() {
            ShardMetrics::gauge(&self.metrics.tunnels_open, 1);
        }
        let _ = self
            .to_control
            .send(ShardToControl::TunnelUp {
                agent,
                shard: self.id,
            })
            .await;
    }

    pub async fn tunnel_down(&self, agent: AgentId, generation: u64) {
        let current = self
            .tunnels
            .borrow()
            .get(&agent)
            .is_some_and(|tunnel| tunnel.generation == generation);
        if current {
            self.tunnels.borrow_mut().remove(&agent);
            ShardMetrics::gauge(&self.metrics.tunnels_open, -1);
            let _ = self
                .to_control
                .send(ShardToControl::TunnelDown {
                    agent,
                    shard: self.id,
                })
                .await;
        }
    }

    // ----- background tasks -----

    /// Applies control-core messages until the control core goes away.
    pub async fn run_control_inbox(self: Rc<Self>, mut inbox: mpsc::Receiver<ControlToShard>) {
        while let Some(message) = inbox.recv().await {
            self.on_control(message);
        }
    }

    /// Applies other shards' mesh messages, forever.
    pub async fn run_mesh(self: Rc<Self>) {
        use monoio::io::AsyncReadRent;
        let (socket, sleeper) = self.mesh.borrow_mut().waiter().into_parts();
        let mut bell = match monoio::net::UnixStream::from_std(socket) {
            Ok(bell) => bell,
            Err(error) => {
                tracing::error!(shard = self.id, %error, "mesh doorbell unusable; this shard cannot hear other shards");
                return;
            }
        };
        let mut rung = vec![0u8; 64];
        let mut inbound = Vec::with_capacity(MESH_DRAIN_BUDGET);
        loop {
            self.flush_deferred();
            self.mesh
                .borrow_mut()
                .drain(MESH_DRAIN_BUDGET, |_, message| inbound.push(message));
            let handled = inbound.len();
            for message in inbound.drain(..) {
                self.on_mesh(message);
            }
            if handled == MESH_DRAIN_BUDGET || !self.deferred.borrow().is_empty() {
                // More may be queued (or a ring was full): let other tasks run, then continue.
                monoio::time::sleep(Duration::from_micros(50)).await;
                continue;
            }
            // Raise the flag, then look once more: a message pushed before the flag was visible
            // rang no bell and must not wait for the next one.
            sleeper.sleep();
            if self.mesh.borrow().has_inbound() {
                sleeper.wake();
                continue;
            }
            let (read, buffer) = bell.read(rung).await;
            rung = buffer;
            sleeper.wake();
            if matches!(read, Ok(0) | Err(_)) {
                tracing::error!(
                    shard = self.id,
                    "mesh doorbell closed; this shard stops hearing other shards"
                );
                return;
            }
        }
    }
}

/// Per-model counters a shard keeps for `/metrics` (admission refusals, policy outcomes).
type PerModelCounts<K> = RefCell<IdMap<(ModelId, K), u64>>;

fn count_per_model<K: Copy + Eq + std::hash::Hash>(
    counts: &PerModelCounts<K>,
    model: ModelId,
    kind: K,
) {
    *counts.borrow_mut().entry((model, kind)).or_insert(0) += 1;
}

fn per_model_counts<K: Copy>(counts: &IdMap<(ModelId, K), u64>) -> Vec<(ModelId, K, u64)> {
    counts
        .iter()
        .map(|(&(model, kind), &count)| (model, kind, count))
        .collect()
}

/// A queued acquire; dropped while armed, it withdraws its ticket.
struct Waiting<'a> {
    shard: &'a Shard,
    ticket: Ticket,
    owner: usize,
    model: ModelId,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shard.withdraw(self.ticket, self.owner, self.model);
        }
    }
}

/// A held agent slot (and the request's occupancy reservation, if it has one). Dropping it
/// releases both to the model's owner, exactly once.
/// Why a request was not released by a wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// A hold limit is reached (per model, per key and model, or in total).
    Full,
    /// The hold budget ran out before an agent for the model registered.
    Expired,
    /// The mesh ring to the model's owner is full.
    MeshFull,
    /// The router's drain ended (SIGTERM) while the request was held.
    ShuttingDown,
}

/// A request's entry in its model's hold book (hold at zero): held, then, once a wake released
/// it, still counted in the pending demand until it gets a slot. Dropping it leaves the book.
pub struct Pending {
    shard: Rc<Shard>,
    ticket: Ticket,
    model: ModelId,
    /// Still held: counts against `--wake-hold-max-total`.
    holds_place: bool,
}

impl Pending {
    fn answered(mut self, answer: HoldAnswer) -> Result<Pending, HoldEnd> {
        match answer {
            HoldAnswer::Awake => {
                self.give_back_place();
                Ok(self)
            }
            HoldAnswer::Full => Err(HoldEnd::Full),
        }
    }

    fn give_back_place(&mut self) {
        if std::mem::take(&mut self.holds_place) {
            self.shard.settings.held_total.give_back();
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.give_back_place();
        self.shard.leave_hold(self.ticket, self.model);
    }
}

pub struct Slot {
    shard: Rc<Shard>,
    pub model: ModelId,
    pub agent: AgentId,
    /// The agent's stay in the model's pool that granted the slot.
    generation: Generation,
    /// The policy step that chose the agent (0: the primary `routing_policy`).
    pub step: u8,
    ticket: Ticket,
    /// The owner holds an occupancy reservation under `ticket`.
    reserved: bool,
}

impl Slot {
    /// Whether the request holds occupancy that streamed output should grow.
    pub fn is_reserved(&self) -> bool {
        self.reserved
    }

    /// Tells the owner how much output has streamed, or the exact input once known.
    pub fn update_occupancy(&self, update: OccupancyUpdate) {
        if self.reserved {
            self.shard.update_occupancy(self.model, self.ticket, update);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let grant = Grant {
            agent: self.agent,
            generation: self.generation,
            step: self.step,
        };
        self.shard.release(self.model, grant, self.ticket);
    }
}

/// Occupancy reserved at the model's owner, before the request has a slot. Dropping it while
/// armed releases it; [`Shard::acquire`] with [`Admit::Reserved`] hands it to the slot.
pub struct Reservation {
    shard: Rc<Shard>,
    model: ModelId,
    ticket: Ticket,
    armed: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.armed {
            self.shard.release_reservation(self.model, self.ticket);
        }
    }
}

/// A request's quota charge, held until the request ends. [`QuotaHold::settle`] charges exact
/// usage; dropping it unsettled (a later refusal, a client that left before forwarding) gives the
/// token charges back. Either reaches the quota owner exactly once.
pub struct QuotaHold {
    shard: Rc<Shard>,
    /// The request's key, for the tenant counters.
    pub key: KeyId,
    tenant: TenantId,
    admission: Option<Admission>,
    /// Charged as input when the response carries no usage.
    estimate_input_tokens: u64,
    /// What the key had left at admission: `X-RateLimit-Remaining-*` on the response.
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
}

impl QuotaHold {
    /// Takes over the token phase's charge (a second visit to the quota owner) so this one hold
    /// settles or gives back everything the request was charged.
    pub fn absorb(&mut self, mut tokens: QuotaHold) {
        debug_assert!(
            self.admission.is_none(),
            "a request charged its tokens twice"
        );
        self.admission = tokens.admission.take();
        self.remaining_tokens = tokens.remaining_tokens;
    }

    pub fn set_estimate(&mut self, input_tokens: u64) {
        self.estimate_input_tokens = input_tokens;
    }

    /// Settles with the response's exact usage; without one (an error answer, a stream cut
    /// short), the input estimate stands and no output is charged.
    pub fn settle_usage(&mut self, usage: Option<crate::usage::Usage>, delivery: Delivery) {
        let usage = match usage {
            Some(usage) => Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
            },
            None => Usage {
                input_tokens: self.estimate_input_tokens,
                output_tokens: 0,
            },
        };
        self.settle(usage, delivery);
    }

    /// Settles a non-streamed answer before it is delivered. False when its output no longer
    /// fits the key's daily budget: the caller refuses it with `token_limit_exceeded` (the input
    /// charge stays, the output is not charged). Without a daily budget or exact usage this is
    /// [`QuotaHold::settle_usage`] and the answer is delivered.
    pub async fn settle_buffered(
        &mut self,
        usage: Option<crate::usage::Usage>,
        wait: Duration,
    ) -> bool {
        let (Some(usage), true) = (
            usage,
            self.admission.as_ref().is_some_and(Admission::has_daily),
        ) else {
            self.settle_usage(usage, Delivery::Buffered);
            return true;
        };
        let admission = self.admission.take().expect("checked above");
        let usage = Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        };
        let settlement = self
            .shard
            .settle_buffered(self.tenant, admission, usage, wait)
            .await;
        settlement.is_none_or(|settlement| settlement.output_fit)
    }

    pub fn settle(&mut self, usage: Usage, delivery: Delivery) {
        if let Some(admission) = self.admission.take() {
            self.shard.quota_release(
                self.tenant,
                Release::Settle {
                    tenant: self.tenant,
                    admission,
                    usage,
                    delivery,
                },
            );
        }
    }
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            self.shard.quota_release(
                self.tenant,
                Release::Cancel {
                    tenant: self.tenant,
                    admission,
                },
            );
        }
    }
}
