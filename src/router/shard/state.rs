//! One shard: what it owns ([`Owner`]), what its requests wait for, and its view of the
//! configuration. Single-threaded: plain `RefCell`/`Cell`, no lock and no shared atomic;
//! `RefCell` borrows never cross an `.await`.
//!
//! The owner side is pure (`shard::owner`); this type runs it on the real clock and delivers
//! what it decides. The requester side is in `shard::visit` (one visit path), what a request
//! holds in `shard::guards`, the control and mesh inboxes in `shard::inbox`, mesh sending in
//! `shard::outbox`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::base::ids::{AgentId, ModelId};
use crate::logic::admission::{PolicyOutcome, Reason};
use crate::logic::auth::admin::AdminAccess;
use crate::logic::auth::keys::KeyRegistry;
use crate::logic::limits::BurstSeconds;
use crate::logic::snapshot::RoutingSnapshot;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::IdMap;
use crate::router::shard::mesh::Endpoint;
use crate::router::shard::messages::AdmissionReport;
use crate::router::shard::messages::{ShardToControl, ShardToShard};
use crate::router::shard::outbox::Outbox;
use crate::router::shard::owner::{Effects, Owner, OwnerSettings};

/// A reservation untouched this long lost its release (every request path releases on drop, and
/// streams refresh theirs as output flows), so the reaper gives it back.
pub const RESERVATION_REAP_MS: u64 = 30 * 60 * 1000;

/// Per-shard settings (copied into each shard at start-up).
#[derive(Debug, Clone)]
pub struct ShardSettings {
    pub queue_depth: usize,
    /// `prefix-aware` ranking's thresholds and index bound (`--prefix-*`).
    pub prefix: crate::logic::routing::prefix::PrefixSettings,
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
    pub provider: Option<crate::router::provider::ProviderPool>,
    /// Hold at zero: the `--wake-*` flags.
    pub hold: crate::logic::hold::HoldSettings,
    /// Hold at zero: `--wake-hold-max-total`, counted across the shards.
    pub held_total: Arc<crate::logic::hold::HeldTotal>,
    /// Cross-site redirect: this site, when `--site-id` is set.
    pub site: Option<Arc<crate::router::config::RedirectSite>>,
    /// `--sync-store valkey`: redirect tokens are spent once for the whole site.
    pub site_tokens: Option<crate::router::shard::redirect_claims::SiteTokens>,
    /// `GET /ready` (`router::readiness`), shared with the control and sync cores.
    pub readiness: Arc<crate::router::readiness::Readiness>,
    /// `--sync-store valkey`: where wallets that ran short ask the sync core for a refill.
    pub credit_refills:
        Option<tokio::sync::mpsc::Sender<crate::router::shard::owner::wallets::Refill>>,
    /// TLS on the tunnel (`--p2p-tls-cert`): this shard terminates the TLS of its tunnels.
    pub tunnel_tls: Option<Arc<crate::net::tunnel::tls::TunnelSecurity>>,
    /// What the clients of one shard may hold (connections, body bytes, resets).
    pub client_limits: crate::router::shard::clients::ClientLimits,
    /// The occupancy reaper (`--admission-reap-interval`, `--admission-reap-after`).
    pub reaper: crate::router::config::ReaperSettings,
    /// Client connections move to the shard that owns their key (`shard::handoff`); `None` with
    /// one shard or `--connection-handoff off`.
    pub handoff: Option<crate::router::shard::handoff::Loads>,
}

/// The router's handle on one agent tunnel.
#[derive(Clone)]
pub struct Tunnel {
    pub send: crate::net::tunnel::upstream::Sender,
    pub generation: u64,
}

pub struct Shard {
    pub id: usize,
    pub count: usize,
    pub settings: ShardSettings,
    pub metrics: Arc<ShardMetrics>,
    snapshot: RefCell<Arc<RoutingSnapshot>>,
    keys: RefCell<Arc<KeyRegistry>>,
    admin_access: RefCell<Arc<AdminAccess>>,
    /// The models, quota holders and redirect nonces this shard owns.
    pub(super) owner: RefCell<Owner>,
    /// What the owner decided besides its direct answers; delivered after every owner call.
    pub(super) effects: RefCell<Effects>,
    /// This shard's requests waiting for an owner's answer, and their deadlines.
    pub(super) waiters: RefCell<crate::router::shard::waiters::Waiters>,
    next_sequence: Cell<u64>,
    tunnels: RefCell<IdMap<AgentId, Tunnel>>,
    next_tunnel_generation: Cell<u64>,
    pub(super) outbox: RefCell<Outbox>,
    /// Whether the park timer task runs.
    pub(super) park_timer: Cell<bool>,
    /// Refusals decided on the requester (B1, per-key limits), by model and gate; the owner
    /// counts its own.
    rejections: PerModelCounts<Reason>,
    /// How the policy routed this shard's requests, by model.
    policy_outcomes: PerModelCounts<PolicyOutcome>,
    /// The tenant series and audit records of the requests this shard served.
    pub accounting: crate::router::accounting::Accounting,
    /// How long tickets waited in the capacity queues of the models this shard owns.
    pub(super) queue_waits: RefCell<crate::router::shard::queue_waits::QueueWaits>,
    pub(super) to_control: crate::router::shard::queues::ToControl,
    /// What this shard's clients hold: connections, body bytes, resets per source.
    pub clients: Rc<crate::router::shard::clients::ClientGuard>,
    /// Draining and ending on SIGTERM.
    pub lifecycle: crate::router::shard::lifecycle::Lifecycle,
}

impl Shard {
    pub fn new(
        mesh: Endpoint<ShardToShard>,
        count: usize,
        settings: ShardSettings,
        metrics: Arc<ShardMetrics>,
        keys: Arc<KeyRegistry>,
        admin_access: Arc<AdminAccess>,
        to_control: crate::router::shard::queues::ToControl,
    ) -> Shard {
        let id = mesh.shard();
        let owner = Owner::new(
            OwnerSettings {
                shard: id,
                shards: count,
                queue_depth: settings.queue_depth,
                admit_fraction: settings.admit_fraction,
                hold_limits: settings.hold.limits,
                rpm_burst: settings.rpm_burst,
                prefix: settings.prefix,
            },
            keys.clone(),
        );
        let clients = Rc::new(crate::router::shard::clients::ClientGuard::new(
            settings.client_limits,
        ));
        // Every shard's `Millis` count from one origin: read it before any request is timed.
        let _ = crate::base::clock::origin();
        Shard {
            id,
            count,
            settings,
            metrics,
            snapshot: RefCell::new(RoutingSnapshot::empty()),
            keys: RefCell::new(keys),
            admin_access: RefCell::new(admin_access),
            owner: RefCell::new(owner),
            effects: RefCell::new(Effects::default()),
            waiters: RefCell::default(),
            next_sequence: Cell::new(1),
            tunnels: RefCell::new(IdMap::default()),
            next_tunnel_generation: Cell::new(1),
            outbox: RefCell::new(Outbox::new(mesh)),
            park_timer: Cell::new(false),
            rejections: RefCell::new(IdMap::default()),
            policy_outcomes: RefCell::new(IdMap::default()),
            accounting: crate::router::accounting::Accounting::for_shard(id),
            queue_waits: RefCell::default(),
            clients,
            lifecycle: Default::default(),
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

    /// A new routing snapshot, for requesters and the owner alike.
    pub(super) fn set_snapshot(self: &Rc<Self>, snapshot: Arc<RoutingSnapshot>) {
        *self.snapshot.borrow_mut() = snapshot.clone();
        self.with_owner(|owner, effects| owner.set_snapshot(snapshot, effects));
    }

    /// A new key registry, for requesters and the owner alike.
    pub(super) fn set_keys(&self, keys: Arc<KeyRegistry>) {
        *self.keys.borrow_mut() = keys.clone();
        self.owner.borrow_mut().set_keys(keys);
    }

    pub(super) fn set_admin_access(&self, access: Arc<AdminAccess>) {
        *self.admin_access.borrow_mut() = access;
    }

    /// Hands an `/admin/*` request to the control core; refused at once when its queue is full.
    pub fn call_control(
        &self,
        call: crate::router::shard::messages::AdminCall,
    ) -> Result<(), crate::router::shard::queues::QueueError> {
        self.to_control.try_send(ShardToControl::Admin(call))
    }

    // ----- the owner side, on the real clock -----

    /// Runs one owner operation, then delivers what it decided for other tickets.
    pub(super) fn with_owner<R>(
        self: &Rc<Self>,
        operation: impl FnOnce(&mut Owner, &mut Effects) -> R,
    ) -> R {
        let result = {
            let mut owner = self.owner.borrow_mut();
            let mut effects = self.effects.borrow_mut();
            operation(&mut owner, &mut effects)
        };
        self.deliver_effects();
        result
    }

    /// Hands the owner's decisions to their requesters (here or over the mesh) until none is
    /// left: delivering one may release something, which may decide another.
    #[inline]
    pub(super) fn deliver_effects(self: &Rc<Self>) {
        // Most owner operations decide nothing for others: keep that check at the call site.
        if !self.effects.borrow().is_empty() {
            self.deliver_pending_effects();
        }
    }

    #[inline(never)]
    fn deliver_pending_effects(self: &Rc<Self>) {
        loop {
            let (answers, parked, queue, woke, refills) = {
                let mut effects = self.effects.borrow_mut();
                if effects.is_empty() {
                    return;
                }
                (
                    std::mem::take(&mut effects.answers),
                    std::mem::take(&mut effects.parked),
                    std::mem::take(&mut effects.queue),
                    std::mem::take(&mut effects.woke),
                    std::mem::take(&mut effects.refills),
                )
            };
            if let Some(to_sync) = &self.settings.credit_refills {
                for refill in refills {
                    // A full queue drops the ask: the wallet asks again after the next round.
                    let _ = to_sync.try_send(refill);
                }
            }
            if parked > 0 {
                ShardMetrics::add(&self.metrics.admission_parked_total, parked);
                self.arm_park_timer();
            }
            // Counted and timed where the queue is: on the owner shard.
            if !queue.is_empty() {
                self.count_queue_moves(&queue);
            }
            for (model, released) in woke {
                let snapshot = self.snapshot();
                tracing::info!(
                    shard = self.id,
                    model = snapshot.name_of(model).unwrap_or("?"),
                    released,
                    "model awake: releasing its held requests"
                );
            }
            for (ticket, answer) in answers {
                self.answer(ticket, answer);
            }
        }
    }

    fn count_queue_moves(&self, queue: &[crate::router::shard::owner::QueueMove]) {
        use crate::router::shard::owner::QueueMove;
        let entered = queue
            .iter()
            .filter(|moved| matches!(moved, QueueMove::Entered(..)))
            .count();
        ShardMetrics::add(&self.metrics.queued_total, entered as u64);
        let now = std::time::Instant::now();
        let mut waits = self.queue_waits.borrow_mut();
        for moved in queue {
            waits.record(*moved, now);
        }
    }

    /// Runs a timer task while anything is parked on this shard: parked tickets expire, and are
    /// re-evaluated at least once a second (the limits follow the healthy replicas, and replicas
    /// that joined since are used; seed, "After the wake").
    fn arm_park_timer(self: &Rc<Self>) {
        const PARK_RECHECK_MS: u64 = 1000;
        if self.park_timer.replace(true) {
            return;
        }
        let shard = self.clone();
        monoio::spawn(async move {
            loop {
                let now = crate::base::clock::now();
                let next =
                    shard.with_owner(|owner, effects| owner.models.expire_parked(now, effects));
                let Some(next) = next else { break };
                let wait = now.until(next).clamp(1, PARK_RECHECK_MS);
                monoio::time::sleep(Duration::from_millis(wait)).await;
            }
            shard.park_timer.set(false);
        });
    }

    /// Reaps reservations whose release was lost and drops idle occupancy state; run every few
    /// minutes.
    pub fn cleanup_pools(&self) {
        let now = crate::base::clock::now();
        let reaped = self
            .owner
            .borrow_mut()
            .models
            .reap(now, self.settings.reaper.after_ms);
        if reaped > 0 {
            tracing::warn!(
                shard = self.id,
                reaped,
                "released occupancy reservations whose release was lost"
            );
            ShardMetrics::add(&self.metrics.admission_reaped_total, reaped as u64);
        }
    }

    /// Drops idle quota holders; run every few minutes.
    pub fn cleanup_quotas(&self) {
        let (now, today) = (crate::base::clock::now(), crate::base::clock::utc_today());
        self.owner.borrow_mut().quotas.cleanup(now, today);
    }

    /// Hands the quota holders this shard owns the daily totals persisted before a restart, and
    /// turns on reporting changed totals (`HIVENET_ROUTER_QUOTA_BACKEND=badger`). Call before the
    /// shard accepts connections.
    pub fn restore_daily(&self, restore: crate::router::shard::owner::quotas::DailyRestore) {
        self.owner.borrow_mut().restore_daily(restore);
    }

    /// `--sync-store valkey`: the limits are shared with the other routers of the site from the
    /// first request on. Keys with a daily budget are refused until the sync core has read
    /// today's totals. Call before the shard accepts connections.
    pub fn share_limits(&self, day: crate::logic::limits::Day, share: crate::logic::limits::Share) {
        let mut owner = self.owner.borrow_mut();
        owner.quotas.share_through_store(day);
        let routers = match share {
            crate::logic::limits::Share::Alone { routers, .. } => routers,
            _ => 1,
        };
        owner.models.share_budgets(routers);
        owner.set_share(share);
    }

    /// The next ticket of this shard: names one visit (and what it holds at the owner).
    pub(super) fn new_ticket(&self) -> crate::base::ids::Ticket {
        let sequence = self.next_sequence.get();
        self.next_sequence.set(sequence + 1);
        crate::base::ids::Ticket {
            shard: self.id as u16,
            sequence,
        }
    }

    // ----- counting -----

    /// Counts an admission refusal decided on the requester (B1, and the per-key limits from the
    /// quota owner's answer); the model's owner counts B2, B3 and the B4 share.
    pub fn count_rejection(&self, model: ModelId, reason: Reason) {
        count_per_model(&self.rejections, model, reason);
    }

    /// Counts how the policy routed one request.
    pub fn count_policy_outcome(&self, model: ModelId, outcome: PolicyOutcome) {
        count_per_model(&self.policy_outcomes, model, outcome);
    }

    /// The admission state this shard owns and counted, for `/metrics`.
    pub fn admission_report(&self) -> AdmissionReport {
        let owner = self.owner.borrow();
        let mut rejections = per_model_counts(&self.rejections.borrow());
        rejections.extend(owner.rejections());
        AdmissionReport {
            pools: owner.models.pool_reports(),
            rejections,
            policy_outcomes: per_model_counts(&self.policy_outcomes.borrow()),
        }
    }

    // ----- tunnels (called by the tunnel client task) -----

    pub fn tunnel(&self, agent: AgentId) -> Option<Tunnel> {
        self.tunnels.borrow().get(&agent).cloned()
    }

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

    /// The agent's session ended: drop this shard's tunnel to it.
    pub(super) fn close_tunnel(&self, agent: AgentId) {
        if self.tunnels.borrow_mut().remove(&agent).is_some() {
            ShardMetrics::gauge(&self.metrics.tunnels_open, -1);
        }
    }

    /// Tells a tunnel's end from an earlier one's to the same agent.
    pub fn new_tunnel_generation(&self) -> u64 {
        let generation = self.next_tunnel_generation.get();
        self.next_tunnel_generation.set(generation + 1);
        generation
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
