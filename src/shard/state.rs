//! What one shard owns, and the code that mutates it. Single-threaded: plain `RefCell`/`Cell`, no
//! lock and no shared atomic. `RefCell` borrows never cross an `.await`.
//!
//! Key components: [`Shard::acquire`] (ask a model's owner for an agent slot, locally or over the
//! mesh, waiting in the owner's capacity queue up to a deadline), [`Slot`] (the held slot; dropping
//! it releases it exactly once, on every path), the control inbox and mesh handlers that apply
//! other cores' messages.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::auth::admin::AdminAccess;
use crate::auth::keys::KeyRegistry;
use crate::auth::keys::{KeyRecord, TenantId};
use crate::limits::{Admission, BurstSeconds, Day, Delivery, Millis, ModelContext, Usage};
use crate::metrics::ShardMetrics;
use crate::routing::{Acquire, AgentId, ModelRoutes, Ticket};
use crate::shard::mesh::Endpoint;
use crate::shard::messages::{ControlToShard, Decision, ShardToControl, ShardToShard};
use crate::shard::quotas::{Admitted, Charge, Quotas, Release};
use crate::shard::snapshot::{ModelEntry, ModelId, RoutingSnapshot};

/// Messages handled per mesh wake-up before the mesh task yields to the shard's other tasks.
const MESH_DRAIN_BUDGET: usize = 256;

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
    routes: RefCell<HashMap<ModelId, ModelRoutes>>,
    tunnels: RefCell<HashMap<AgentId, Tunnel>>,
    waiting: RefCell<HashMap<u64, oneshot::Sender<Decision>>>,
    next_sequence: Cell<u64>,
    next_tunnel_generation: Cell<u64>,
    mesh: RefCell<Endpoint<ShardToShard>>,
    /// Quota holders this shard owns (`tenant % count`).
    quotas: RefCell<Quotas>,
    quota_waiting: RefCell<HashMap<u64, oneshot::Sender<QuotaAnswer>>>,
    /// Origin of the monotonic `Millis` the limits run on.
    started: Instant,
    /// Mesh messages that found their ring full; retried before anything new is drained. Only
    /// releases and decisions land here: they must not be lost.
    deferred: RefCell<VecDeque<(usize, ShardToShard)>>,
    to_control: mpsc::UnboundedSender<ShardToControl>,
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
        to_control: mpsc::UnboundedSender<ShardToControl>,
    ) -> Shard {
        let rpm_burst = settings.rpm_burst;
        Shard {
            id: mesh.shard(),
            count,
            settings,
            metrics,
            snapshot: RefCell::new(RoutingSnapshot::empty()),
            keys: RefCell::new(keys),
            admin_access: RefCell::new(admin_access),
            routes: RefCell::new(HashMap::new()),
            tunnels: RefCell::new(HashMap::new()),
            waiting: RefCell::new(HashMap::new()),
            next_sequence: Cell::new(1),
            next_tunnel_generation: Cell::new(1),
            mesh: RefCell::new(mesh),
            quotas: RefCell::new(Quotas::new(rpm_burst)),
            quota_waiting: RefCell::new(HashMap::new()),
            started: Instant::now(),
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

    /// Hands an `/admin/*` request to the control core. False when the control core is gone.
    pub fn call_control(&self, call: crate::shard::messages::AdminCall) -> bool {
        self.to_control.send(ShardToControl::Admin(call)).is_ok()
    }

    pub fn tunnel(&self, agent: AgentId) -> Option<Tunnel> {
        self.tunnels.borrow().get(&agent).cloned()
    }

    // ----- acquire / release -----

    /// Asks the model's owner for an agent slot, waiting in its capacity queue until `deadline`.
    pub async fn acquire(
        self: &Rc<Self>,
        model: &ModelEntry,
        deadline: Instant,
    ) -> Result<Slot, RouteError> {
        let owner = owner_of_model(model.id, self.count);
        let sequence = self.next_sequence.get();
        self.next_sequence.set(sequence + 1);
        let ticket = Ticket {
            shard: self.id as u16,
            sequence,
        };
        let slot = |agent| Slot {
            shard: self.clone(),
            model: model.id,
            agent,
        };
        if owner == self.id {
            let acquired = match self.routes.borrow_mut().get_mut(&model.id) {
                Some(routes) => routes.acquire(ticket),
                None => Acquire::NoAgents,
            };
            match acquired {
                Acquire::Granted(agent) => return Ok(slot(agent)),
                Acquire::QueueFull => return Err(RouteError::QueueFull),
                Acquire::NoAgents => return Err(RouteError::NoAgents),
                // Counted where the queue is: on the owner shard.
                Acquire::Queued => ShardMetrics::add(&self.metrics.queued_total, 1),
            }
        }
        let (decided, decision) = oneshot::channel();
        self.waiting.borrow_mut().insert(sequence, decided);
        // From here the ticket is queued (locally or at the owner): if this future is dropped
        // (the client left) or times out, the guard withdraws it so it holds no queue place.
        let mut waiting = Waiting {
            shard: self,
            ticket,
            owner,
            model: model.id,
            armed: true,
        };
        if owner != self.id {
            let sent = self.mesh.borrow_mut().send(
                owner,
                ShardToShard::Acquire {
                    ticket,
                    model: model.id,
                },
            );
            if sent.is_err() {
                waiting.armed = false;
                self.waiting.borrow_mut().remove(&sequence);
                ShardMetrics::add(&self.metrics.mesh_full_total, 1);
                return Err(RouteError::MeshFull);
            }
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        let decided = monoio::time::timeout(wait, decision).await;
        if decided.is_ok() {
            // Answered: nothing left to withdraw.
            waiting.armed = false;
        }
        match decided {
            Ok(Ok(Decision::Granted(agent))) => Ok(slot(agent)),
            Ok(Ok(Decision::QueueFull)) => Err(RouteError::QueueFull),
            Ok(Ok(Decision::NoAgents)) | Ok(Err(_)) => Err(RouteError::NoAgents),
            Err(_) => {
                ShardMetrics::add(&self.metrics.queue_timeouts_total, 1);
                Err(RouteError::Timeout)
            }
        }
    }

    /// Withdraws a queued ticket: its waiter goes, and the owner drops it from the queue. A grant
    /// already on its way finds no waiter and is released by `resolve`.
    fn withdraw(&self, ticket: Ticket, owner: usize, model: ModelId) {
        self.waiting.borrow_mut().remove(&ticket.sequence);
        if owner == self.id {
            if let Some(routes) = self.routes.borrow_mut().get_mut(&model) {
                routes.cancel(ticket);
            }
        } else {
            self.send_or_defer(owner, ShardToShard::Cancel { ticket, model });
        }
    }

    fn release(&self, model: ModelId, agent: AgentId) {
        let owner = owner_of_model(model, self.count);
        if owner == self.id {
            let grants = match self.routes.borrow_mut().get_mut(&model) {
                Some(routes) => routes.release(agent),
                None => Vec::new(),
            };
            self.deliver(model, grants);
        } else {
            self.send_or_defer(owner, ShardToShard::Release { model, agent });
        }
    }

    /// Hands grants made by this shard (as owner) to their requesters.
    fn deliver(&self, model: ModelId, grants: Vec<(Ticket, AgentId)>) {
        for (ticket, agent) in grants {
            self.decide(model, ticket, Decision::Granted(agent));
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

    /// A decision for one of this shard's tickets. A grant nobody waits for any more goes back.
    fn resolve(&self, model: ModelId, sequence: u64, decision: Decision) {
        let waiter = self.waiting.borrow_mut().remove(&sequence);
        let undelivered = match waiter {
            Some(waiter) => waiter.send(decision).err(),
            None => Some(decision),
        };
        if let Some(Decision::Granted(agent)) = undelivered {
            self.release(model, agent);
        }
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
        let sequence = self.next_sequence.get();
        self.next_sequence.set(sequence + 1);
        let (answered, answer) = oneshot::channel();
        self.quota_waiting.borrow_mut().insert(sequence, answered);
        let ticket = Ticket {
            shard: self.id as u16,
            sequence,
        };
        let sent = self.mesh.borrow_mut().send(
            owner,
            ShardToShard::QuotaAdmit {
                ticket,
                key: key.key_id,
                model,
                charge,
            },
        );
        if sent.is_err() {
            self.quota_waiting.borrow_mut().remove(&sequence);
            ShardMetrics::add(&self.metrics.mesh_full_total, 1);
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
            } => quotas.settle(now, day, tenant, admission, usage, delivery),
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

    /// Drops idle quota holders; run every few minutes.
    pub fn cleanup_quotas(&self) {
        self.quotas
            .borrow_mut()
            .cleanup(self.now_millis(), Self::today());
    }

    // ----- inbound messages -----

    fn on_mesh(&self, message: ShardToShard) {
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
            ShardToShard::Acquire { ticket, model } => {
                let acquired = match self.routes.borrow_mut().get_mut(&model) {
                    Some(routes) => routes.acquire(ticket),
                    None => Acquire::NoAgents,
                };
                let decision = match acquired {
                    Acquire::Granted(agent) => Decision::Granted(agent),
                    Acquire::QueueFull => Decision::QueueFull,
                    Acquire::NoAgents => Decision::NoAgents,
                    Acquire::Queued => {
                        ShardMetrics::add(&self.metrics.queued_total, 1);
                        return;
                    }
                };
                self.decide(model, ticket, decision);
            }
            ShardToShard::Cancel { ticket, model } => {
                if let Some(routes) = self.routes.borrow_mut().get_mut(&model) {
                    routes.cancel(ticket);
                }
            }
            ShardToShard::Release { model, agent } => self.release(model, agent),
            ShardToShard::Decided {
                sequence,
                decision,
                model,
            } => self.resolve(model, sequence, decision),
        }
    }

    fn on_control(self: &Rc<Self>, message: ControlToShard) {
        match message {
            ControlToShard::Snapshot(snapshot) => *self.snapshot.borrow_mut() = snapshot,
            ControlToShard::Keys(keys) => *self.keys.borrow_mut() = keys,
            ControlToShard::AdminAccess(access) => *self.admin_access.borrow_mut() = access,
            ControlToShard::AgentUp {
                agent,
                models,
                capacity,
            } => {
                for model in self.owned(&models) {
                    let grants = self
                        .routes
                        .borrow_mut()
                        .entry(model)
                        .or_insert_with(|| ModelRoutes::new(self.settings.queue_depth))
                        .agent_up(agent, capacity);
                    self.deliver(model, grants);
                }
            }
            ControlToShard::AgentDown { agent, models } => {
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
            } => {
                for model in self.owned(&models) {
                    let grants = match self.routes.borrow_mut().get_mut(&model) {
                        Some(routes) => routes.signal(agent, in_flight),
                        None => Vec::new(),
                    };
                    self.deliver(model, grants);
                }
            }
            ControlToShard::Tunnel { agent, socket } => {
                let generation = self.next_tunnel_generation.get();
                self.next_tunnel_generation.set(generation + 1);
                monoio::spawn(crate::tunnel::client::run(
                    self.clone(),
                    agent,
                    generation,
                    socket,
                ));
            }
            ControlToShard::ReportQueues(reply) => {
                let queues = self
                    .routes
                    .borrow()
                    .iter()
                    .map(|(model, routes)| (*model, routes.queue_len() as u32))
                    .collect();
                let _ = reply.send(queues);
            }
            ControlToShard::ReportDaily(reply) => {
                let totals = self.quotas.borrow_mut().take_changed_daily_totals();
                if let Err(totals) = reply.send(totals) {
                    // The flush gave up waiting: report these again next time.
                    self.quotas.borrow_mut().requeue_daily_totals(totals);
                }
            }
            ControlToShard::CloseTunnel { agent } => {
                if self.tunnels.borrow_mut().remove(&agent).is_some() {
                    ShardMetrics::gauge(&self.metrics.tunnels_open, -1);
                }
            }
        }
    }

    fn owned(&self, models: &[ModelId]) -> Vec<ModelId> {
        models
            .iter()
            .copied()
            .filter(|model| owner_of_model(*model, self.count) == self.id)
            .collect()
    }

    // ----- tunnels (called by the tunnel client task) -----

    pub fn tunnel_up(&self, agent: AgentId, tunnel: Tunnel) {
        if self.tunnels.borrow_mut().insert(agent, tunnel).is_none() {
            ShardMetrics::gauge(&self.metrics.tunnels_open, 1);
        }
        let _ = self.to_control.send(ShardToControl::TunnelUp {
            agent,
            shard: self.id,
        });
    }

    pub fn tunnel_down(&self, agent: AgentId, generation: u64) {
        let mut tunnels = self.tunnels.borrow_mut();
        if tunnels
            .get(&agent)
            .is_some_and(|tunnel| tunnel.generation == generation)
        {
            tunnels.remove(&agent);
            ShardMetrics::gauge(&self.metrics.tunnels_open, -1);
            let _ = self.to_control.send(ShardToControl::TunnelDown {
                agent,
                shard: self.id,
            });
        }
    }

    // ----- background tasks -----

    /// Applies control-core messages until the control core goes away.
    pub async fn run_control_inbox(
        self: Rc<Self>,
        mut inbox: mpsc::UnboundedReceiver<ControlToShard>,
    ) {
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

/// A held agent slot. Dropping it releases the slot to the model's owner, exactly once.
pub struct Slot {
    shard: Rc<Shard>,
    pub model: ModelId,
    pub agent: AgentId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shard.release(self.model, self.agent);
    }
}

/// A request's quota charge, held until the request ends. [`QuotaHold::settle`] charges exact
/// usage; dropping it unsettled (a later refusal, a client that left before forwarding) gives the
/// token charges back. Either reaches the quota owner exactly once.
pub struct QuotaHold {
    shard: Rc<Shard>,
    tenant: TenantId,
    admission: Option<Admission>,
    /// Charged as input when the response carries no usage.
    estimate_input_tokens: u64,
    /// What the key had left at admission: `X-RateLimit-Remaining-*` on the response.
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
}

impl QuotaHold {
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
