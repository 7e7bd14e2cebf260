//! The models a shard owns (`model id % shards`): each one's routes (agents, capacity queue),
//! occupancy (B2 budget, B4 shares, parked tickets) and hold book (hold at zero).
//!
//! Pure: no I/O, no clock, no channel. Time comes in as [`Millis`]; an answer for the ticket
//! being served is returned, and answers for other tickets (a grant after a release, a parked
//! ticket that now fits, held requests a new agent wakes) go to the [`Effects`] the caller
//! delivers.

use std::sync::Arc;

use crate::base::clock::Millis;
use crate::base::ids::{AgentId, KeyId, ModelId, Ticket};
use crate::logic::admission::Reason;
use crate::logic::admission::occupancy::{
    Claim, Limits, Occupancy, Refusal, ShareCredits, Verdict,
};
use crate::logic::credits::BudgetKind;
use crate::logic::hold::{ClientId, HoldBook, HoldLimits, HoldRefusal};
use crate::logic::policy::ModelPolicy;
use crate::logic::routing::{
    Acquire, AnyAgent, Ask, EngineSignals, Grant, ModelRoutes, StepFilter,
    prefix::{PrefixSettings, PrefixStats},
};
use crate::logic::snapshot::RoutingSnapshot;
use crate::router::shard::IdMap;
use crate::router::shard::owner::wallets::{CreditCap, CreditHolding, CreditNews, ModelWallets};
use crate::router::shard::owner::{AgentJoin, Answer, Effects, QueueMove};

/// What a model's owner finally answers to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Granted(Grant),
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
    /// B2 would park the request, which asked to be told instead ([`PoolRequest::bounce_park`]);
    /// it holds nothing here.
    WouldPark,
}

impl Decision {
    /// What the pool gates answer for `refusal`: B2's budget, or the key's B4 share (in use, or
    /// never credited in time on this router).
    fn refused_by(refusal: Refusal) -> Decision {
        match refusal {
            Refusal::Budget => Decision::PoolFull,
            Refusal::KeyShare | Refusal::ShortOfShareCredits => Decision::KeyShare,
        }
    }

    /// The admission gate that refused, for `hivenet_admission_rejections_total`.
    fn gate(self) -> Option<Reason> {
        match self {
            Decision::Shed => Some(Reason::B3),
            Decision::PoolFull | Decision::PoolTooSmall => Some(Reason::B2),
            Decision::KeyShare => Some(Reason::B4Occupancy),
            Decision::Granted(_)
            | Decision::Reserved
            | Decision::QueueFull
            | Decision::NoAgents
            | Decision::WouldPark => None,
        }
    }
}

/// What a model's owner answers to a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldAnswer {
    /// An agent serves the model now (it was there already, or it just registered): go on.
    Awake,
    /// A per-model hold limit is reached: `503 model_waking` at once.
    Full,
}

/// A pool admission on its way to the owner: B3, then B2 (parking until `park_until`), then the
/// B4 share.
#[derive(Debug, Clone)]
pub struct PoolRequest {
    pub claim: Claim,
    pub policy: Arc<ModelPolicy>,
    /// Park until then when B2 does not fit; `None`: refuse at once (park timeout 0).
    pub park_until: Option<Millis>,
    /// Refuse at once a request larger than the pool's whole budget instead of parking it (a
    /// request released by a wake parks up to its hold budget, too long to wait for nothing).
    pub refuse_oversize: bool,
    /// Where B2 would park the request, answer [`Decision::WouldPark`] and hold nothing: the
    /// requester charged its token phase ahead of these gates (`api::plan`), and gives it back
    /// before it parks, as the gate order has it.
    pub bounce_park: bool,
}

/// A change to a reservation while its request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OccupancyUpdate {
    /// Output tokens streamed so far.
    Output(u64),
    /// The backend's exact input count.
    ExactInput(u64),
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

/// One model's occupancy on its owner, with the latest policy seen for it.
struct ModelOccupancy {
    occupancy: Occupancy,
    policy: Arc<ModelPolicy>,
    /// Parked tickets, and the slot each asked for as well (`None`: a reservation only).
    parked_for_slot: IdMap<Ticket, Option<Ask>>,
    /// This router's credits for the model's budgets, when the routers of a site share them.
    wallets: Option<ModelWallets>,
}

impl ModelOccupancy {
    /// (tokens, requests) in flight here.
    fn in_use(&self) -> (u64, u64) {
        (self.occupancy.tokens(), self.occupancy.inflight())
    }

    /// `base` with this router's credits, when routers share the budgets.
    fn limits(&self, base: Limits, sharing: Option<Sharing>) -> Limits {
        match (&self.wallets, sharing) {
            (Some(wallets), Some(sharing)) => wallets.limit(base, sharing.cap(), sharing.live),
            _ => base,
        }
    }
}

/// This router's credits for a key's B4 share of a model with `wallets`, for admission: exact
/// across the routers of a site, as B2's budgets are (`None`: no site, the share is this
/// router's alone).
fn share_lookup(
    wallets: &Option<ModelWallets>,
    sharing: Option<Sharing>,
) -> impl Fn(KeyId, u64) -> Option<ShareCredits> + '_ {
    move |key, limit| match (wallets, sharing) {
        (Some(wallets), Some(sharing)) => {
            Some(wallets.share_credits(key, limit, sharing.cap(), sharing.live))
        }
        _ => None,
    }
}

/// How the routers of the site share the occupancy budgets now (from the sync core's rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sharing {
    cap: CreditCap,
    /// [`CreditCap::Closed`] until the store answers, whatever the rounds say meanwhile.
    closed: bool,
    /// Live routers, this one included (an unacknowledged grant keeps to budget ÷ live).
    live: u32,
    /// Routers that may be admitting (live and silent, or those last seen while the store is
    /// unreachable).
    routers: u32,
}

impl Sharing {
    /// The cap admission holds the wallets to now.
    fn cap(self) -> CreditCap {
        if self.closed {
            CreditCap::Closed
        } else {
            self.cap
        }
    }
}

/// Everything this shard owns about its models.
pub struct Models {
    queue_depth: usize,
    /// `prefix-aware` ranking's thresholds and index bound, for every model's routes.
    prefix_settings: PrefixSettings,
    /// `HIVENET_ROUTER_ADMIT_FRACTION`: the share of `admit_budget_tokens` B2 admits.
    admit_fraction: f64,
    routes: IdMap<ModelId, ModelRoutes>,
    occupancy: IdMap<ModelId, ModelOccupancy>,
    holds: HoldBook,
    /// Refusals decided here, by model and gate.
    rejections: IdMap<(ModelId, Reason), u64>,
    /// `None`: this router's budgets are its own (no shared store).
    sharing: Option<Sharing>,
    /// The input estimate's ratios of the models owned here, learned from exact usage (the
    /// router's one ratio per model; `Owner::learn` publishes them).
    pub estimator: crate::logic::admission::estimator::Estimator,
}

impl Models {
    pub fn new(queue_depth: usize, admit_fraction: f64, hold_limits: HoldLimits) -> Models {
        Models {
            queue_depth,
            prefix_settings: PrefixSettings::default(),
            admit_fraction,
            routes: IdMap::default(),
            occupancy: IdMap::default(),
            holds: HoldBook::new(hold_limits),
            rejections: IdMap::default(),
            sharing: None,
            estimator: crate::logic::admission::estimator::Estimator::default(),
        }
    }

    /// `prefix-aware` steps rank by `settings`.
    pub fn with_prefix_settings(mut self, settings: PrefixSettings) -> Models {
        self.prefix_settings = settings;
        self
    }

    // ----- a request's visits -----

    /// The pool gates (when asked), then a slot (when asked). `None`: the ticket waits, parked
    /// or queued, and its answer comes later through `effects`.
    pub fn acquire(
        &mut self,
        now: Millis,
        ticket: Ticket,
        model: ModelId,
        pool: Option<PoolRequest>,
        slot: Option<Ask>,
        effects: &mut Effects,
    ) -> Option<Decision> {
        if let Some(request) = pool {
            // B3: the pool's averaged engine signals against `shed_if`; missing signals pass.
            if !request.policy.shed_if.is_empty()
                && request.policy.shed_if.fails(&self.pool_signals(model))
            {
                return Some(self.refused(model, Decision::Shed));
            }
            let base = self.limits(model, &request.policy);
            if request.refuse_oversize && !base.could_ever_fit(&request.claim.footprint) {
                return Some(self.refused(model, Decision::PoolTooSmall));
            }
            let sharing = self.sharing;
            let owned = self
                .occupancy
                .entry(model)
                .or_insert_with(|| ModelOccupancy {
                    occupancy: Occupancy::new(now),
                    policy: request.policy.clone(),
                    parked_for_slot: IdMap::default(),
                    wallets: sharing.map(|_| ModelWallets::new(now)),
                });
            owned.policy = request.policy;
            let limits = owned.limits(base, sharing);
            let would_park = request.park_until.is_some_and(|until| until > now);
            let park_until = request.park_until.filter(|_| !request.bounce_park);
            let verdict = owned.occupancy.admit(
                now,
                &limits,
                request.claim,
                park_until,
                &share_lookup(&owned.wallets, sharing),
            );
            let claim = request.claim;
            if let (Some(wallets), Some(sharing)) = (owned.wallets.as_mut(), sharing) {
                if verdict == Verdict::Admitted {
                    wallets.touch(now, Some(claim.key));
                } else if claim.share > 0.0 {
                    // Short of B2's credits, of the key's share, or both: ask for what it needs
                    // of each (the share's pool is not asked when the share is in use).
                    let used = owned.occupancy.key_tokens(claim.key);
                    wallets.share_short(
                        now,
                        model,
                        claim.key,
                        claim.share,
                        &base,
                        used,
                        claim.footprint.tokens(),
                        sharing.cap(),
                        &mut effects.refills,
                    );
                }
                if verdict != Verdict::Admitted && base.is_active() {
                    let in_use = (owned.occupancy.tokens(), owned.occupancy.inflight());
                    let footprint = request.claim.footprint.tokens();
                    wallets.short(
                        model,
                        &base,
                        in_use,
                        (footprint, 1),
                        sharing.cap,
                        &mut effects.refills,
                    );
                }
            }
            match verdict {
                Verdict::Admitted => {}
                Verdict::Parked => {
                    owned.parked_for_slot.insert(ticket, slot);
                    effects.parked += 1;
                    return None;
                }
                Verdict::Refused(Refusal::Budget | Refusal::ShortOfShareCredits)
                    if request.bounce_park && would_park =>
                {
                    return Some(Decision::WouldPark);
                }
                Verdict::Refused(refusal) => {
                    return Some(self.refused(model, Decision::refused_by(refusal)));
                }
            }
        }
        match slot {
            None => Some(Decision::Reserved),
            Some(ask) => self.slot(now, ticket, model, &ask, effects),
        }
    }

    /// The ticket gave up waiting: it leaves the park and capacity queues, and its reservation
    /// goes.
    pub fn cancel(&mut self, now: Millis, ticket: Ticket, model: ModelId, effects: &mut Effects) {
        if let Some(routes) = self.routes.get_mut(&model)
            && routes.cancel(ticket)
        {
            effects.queue.push(QueueMove::Left(model, ticket));
        }
        if let Some(owned) = self.occupancy.get_mut(&model)
            && owned.occupancy.cancel_parked(ticket)
        {
            owned.parked_for_slot.remove(&ticket);
        }
        self.release_reservation(now, model, ticket, effects);
    }

    /// The request is finished with its slot and its reservation.
    pub fn release(
        &mut self,
        now: Millis,
        model: ModelId,
        grant: Grant,
        ticket: Ticket,
        effects: &mut Effects,
    ) {
        self.release_reservation(now, model, ticket, effects);
        if let Some(routes) = self.routes.get_mut(&model) {
            let grants = routes.release(grant);
            deliver(model, grants, effects);
        }
    }

    /// The request's reservation goes (it ends before it got a slot). Idempotent per ticket.
    pub fn release_reservation(
        &mut self,
        now: Millis,
        model: ModelId,
        ticket: Ticket,
        effects: &mut Effects,
    ) {
        let released = self.occupancy.get_mut(&model).is_some_and(|owned| {
            let released = owned.occupancy.release(now, ticket);
            if let (Some(key), Some(wallets)) = (released, owned.wallets.as_mut()) {
                wallets.touch(now, Some(key));
            }
            released.is_some()
        });
        if released {
            self.retry_parked(now, model, effects);
        }
    }

    /// A reserved request's output so far, or its exact input.
    pub fn update_occupancy(
        &mut self,
        now: Millis,
        model: ModelId,
        ticket: Ticket,
        update: OccupancyUpdate,
        effects: &mut Effects,
    ) {
        let Some(owned) = self.occupancy.get_mut(&model) else {
            return;
        };
        match update {
            OccupancyUpdate::Output(tokens) => owned.occupancy.grow(now, ticket, tokens),
            OccupancyUpdate::ExactInput(tokens) => {
                owned.occupancy.true_up(now, ticket, tokens);
                self.retry_parked(now, model, effects);
            }
        }
    }

    /// Hold at zero: holds the request until an agent for `model` registers. `None`: it is
    /// held; [`HoldAnswer::Awake`] reaches it through `effects` when the model wakes.
    pub fn hold(
        &mut self,
        ticket: Ticket,
        model: ModelId,
        key: Option<KeyId>,
        client: Option<ClientId>,
    ) -> Option<HoldAnswer> {
        if self.healthy_agents(model) > 0 {
            // An agent registered since the requester looked: nothing to wait for.
            return Some(HoldAnswer::Awake);
        }
        match self.holds.hold(ticket, model, key, client) {
            Ok(()) => None,
            Err(HoldRefusal::Full) => Some(HoldAnswer::Full),
        }
    }

    /// The request leaves the hold book (it got a slot, was answered, or its client left).
    pub fn leave_hold(&mut self, ticket: Ticket) {
        self.holds.finish(ticket);
    }

    // ----- the pool's agents -----

    /// An agent joined the pool of `models` (those this shard owns): queued tickets may get it,
    /// parked ones may fit the raised limits, held ones wake.
    pub fn agent_up(
        &mut self,
        now: Millis,
        snapshot: &RoutingSnapshot,
        join: &AgentJoin,
        models: impl Iterator<Item = ModelId>,
        effects: &mut Effects,
    ) {
        for model in models {
            let queue_depth = self.queue_depth;
            let prefix_settings = self.prefix_settings;
            let grants = self
                .routes
                .entry(model)
                .or_insert_with(|| {
                    let mut routes = ModelRoutes::for_model(model, queue_depth)
                        .with_prefix_settings(prefix_settings);
                    let _ = routes.set_steps(steps_of(snapshot, model));
                    routes
                })
                .agent_up(
                    join.agent,
                    join.generation,
                    join.capacity,
                    join.profile.clone(),
                );
            deliver(model, grants, effects);
            self.retry_parked(now, model, effects);
            self.wake_held(model, effects);
        }
    }

    /// An agent left the pool: tickets queued for it alone get `NoAgents` and their
    /// reservations go (as for any acquire that ends without a slot); a model with no agent and
    /// nothing waiting is forgotten.
    pub fn agent_down(
        &mut self,
        now: Millis,
        agent: AgentId,
        models: impl Iterator<Item = ModelId>,
        effects: &mut Effects,
    ) {
        for model in models {
            let Some(routes) = self.routes.get_mut(&model) else {
                continue;
            };
            let failed = routes.agent_down(agent);
            if routes.agent_count() == 0 && routes.is_idle() {
                self.routes.remove(&model);
            }
            for ticket in failed {
                effects.queue.push(QueueMove::Left(model, ticket));
                self.release_reservation(now, model, ticket, effects);
                effects.answer(ticket, Answer::decided(model, Decision::NoAgents));
            }
        }
    }

    /// The agent's own count of requests in flight, from every router, and its engine signals.
    pub fn signal(
        &mut self,
        agent: AgentId,
        models: impl Iterator<Item = ModelId>,
        in_flight: u32,
        engine: EngineSignals,
        effects: &mut Effects,
    ) {
        for model in models {
            if let Some(routes) = self.routes.get_mut(&model) {
                let grants = routes.signal(agent, in_flight, engine);
                deliver(model, grants, effects);
            }
        }
    }

    /// Policies may have changed: every owned model routes by its current steps.
    pub fn set_steps(&mut self, snapshot: &RoutingSnapshot, effects: &mut Effects) {
        for (model, routes) in self.routes.iter_mut() {
            let grants = routes.set_steps(steps_of(snapshot, *model));
            deliver(*model, grants, effects);
        }
    }

    // ----- time passing -----

    /// Refuses parked tickets whose park timeout passed, admits those that fit now; returns the
    /// next park deadline, if anything is still parked.
    pub fn expire_parked(&mut self, now: Millis, effects: &mut Effects) -> Option<Millis> {
        let mut models = Vec::with_capacity(self.occupancy.len());
        let sharing = self.sharing;
        for (model, owned) in self.occupancy.iter_mut() {
            if owned
                .occupancy
                .next_park_deadline()
                .is_some_and(|due| due <= now)
            {
                let healthy = healthy_in(&self.routes, *model);
                let base = pool_limits(self.admit_fraction, &owned.policy, healthy);
                let limits = owned.limits(base, sharing);
                let shares = share_lookup(&owned.wallets, sharing);
                for (ticket, refusal) in owned.occupancy.expire_parked(now, &limits, &shares) {
                    owned.parked_for_slot.remove(&ticket);
                    let decision = Decision::refused_by(refusal);
                    let gate = decision.gate().expect("a refusal has a gate");
                    *self.rejections.entry((*model, gate)).or_insert(0) += 1;
                    effects.answer(ticket, Answer::decided(*model, decision));
                }
            }
            models.push(*model);
        }
        for model in models {
            self.retry_parked(now, model, effects);
        }
        self.next_park_deadline()
    }

    pub fn next_park_deadline(&self) -> Option<Millis> {
        self.occupancy
            .values()
            .filter_map(|owned| owned.occupancy.next_park_deadline())
            .min()
    }

    /// Releases reservations untouched for `max_idle_ms` (their release was lost) and drops idle
    /// occupancy state; returns how many it released.
    pub fn reap(&mut self, now: Millis, max_idle_ms: u64) -> usize {
        let mut reaped = 0;
        self.occupancy.retain(|_, owned| {
            reaped += owned.occupancy.reap(now, max_idle_ms);
            // Credits still held go back at a round first (a wallet idle for a minute).
            let holds_credits = owned
                .wallets
                .as_ref()
                .is_some_and(|wallets| !wallets.is_empty((0, 0)));
            !owned.occupancy.is_idle(now) || holds_credits
        });
        reaped
    }

    // ----- reports -----

    pub fn pool_reports(&self) -> Vec<PoolReport> {
        self.occupancy
            .iter()
            .map(|(model, owned)| {
                let limits = self.limits(*model, &owned.policy);
                PoolReport {
                    model: *model,
                    occupancy_tokens: owned.occupancy.tokens(),
                    budget_tokens: limits.budget_tokens,
                    inflight: owned.occupancy.inflight(),
                    max_inflight: limits.max_inflight,
                }
            })
            .collect()
    }

    pub fn rejections(&self) -> impl Iterator<Item = (ModelId, Reason, u64)> + '_ {
        self.rejections
            .iter()
            .map(|(&(model, reason), &count)| (model, reason, count))
    }

    /// What `prefix-aware` routing found on every model this shard owns that ranked by it.
    pub fn prefix_stats(&self) -> Vec<(ModelId, PrefixStats)> {
        self.routes
            .iter()
            .map(|(model, routes)| (*model, routes.prefix_stats()))
            .filter(|(_, stats)| *stats != PrefixStats::default())
            .collect()
    }

    /// The capacity-queue length of every model this shard owns.
    pub fn queues(&self) -> Vec<(ModelId, u32)> {
        self.routes
            .iter()
            .map(|(model, routes)| (*model, routes.queue_len() as u32))
            .collect()
    }

    /// Hold at zero: the pending demand of every model with any.
    pub fn pending_demand(&self) -> Vec<(ModelId, u32)> {
        self.holds.demand().collect()
    }

    // ----- inside -----

    /// The capacity part, for a ticket that passed (or skipped) the pool gates.
    fn slot(
        &mut self,
        now: Millis,
        ticket: Ticket,
        model: ModelId,
        ask: &Ask,
        effects: &mut Effects,
    ) -> Option<Decision> {
        let acquired = match self.routes.get_mut(&model) {
            Some(routes) => routes.acquire_from(ticket, ask),
            None => Acquire::NoAgents,
        };
        let decision = match acquired {
            Acquire::Granted(grant) => return Some(Decision::Granted(grant)),
            Acquire::Queued => {
                effects.queue.push(QueueMove::Entered(model, ticket));
                return None;
            }
            Acquire::QueueFull => Decision::QueueFull,
            Acquire::NoAgents => Decision::NoAgents,
        };
        self.release_reservation(now, model, ticket, effects);
        Some(decision)
    }

    /// Admits the parked tickets of `model` that fit now and decides each.
    fn retry_parked(&mut self, now: Millis, model: ModelId, effects: &mut Effects) {
        let healthy = self.healthy_agents(model);
        let sharing = self.sharing;
        let Some(owned) = self.occupancy.get_mut(&model) else {
            return;
        };
        if owned.occupancy.parked_len() == 0 {
            return;
        }
        let base = pool_limits(self.admit_fraction, &owned.policy, healthy);
        let limits = owned.limits(base, sharing);
        let shares = share_lookup(&owned.wallets, sharing);
        let admitted = owned.occupancy.admit_parked(now, &limits, &shares);
        drop(shares);
        if let Some(wallets) = owned.wallets.as_mut()
            && admitted.iter().any(|(_, result)| result.is_ok())
        {
            // A key's share wallet is in use while its requests are (it goes only when idle
            // with nothing in use), so touching the model's is enough here.
            wallets.touch(now, None);
        }
        ask_share_for_head(now, model, base, owned, sharing, effects);
        let admitted: Vec<_> = admitted
            .into_iter()
            .map(|(ticket, result)| {
                let slot = owned.parked_for_slot.remove(&ticket).flatten();
                (ticket, result, slot)
            })
            .collect();
        for (ticket, result, slot) in admitted {
            let decision = match (result, slot) {
                (Err(_), _) => Some(self.refused(model, Decision::KeyShare)),
                (Ok(()), None) => Some(Decision::Reserved),
                (Ok(()), Some(ask)) => self.slot(now, ticket, model, &ask, effects),
            };
            if let Some(decision) = decision {
                effects.answer(ticket, Answer::decided(model, decision));
            }
        }
    }

    /// Releases every request held for `model` (an agent for it registered), oldest first.
    fn wake_held(&mut self, model: ModelId, effects: &mut Effects) {
        let woken = self.holds.held_for(model);
        if woken.is_empty() {
            return;
        }
        effects.woke.push((model, woken.len()));
        for ticket in woken {
            self.holds.release(ticket);
            effects.answer(ticket, Answer::Held(HoldAnswer::Awake));
        }
    }

    fn refused(&mut self, model: ModelId, decision: Decision) -> Decision {
        if let Some(gate) = decision.gate() {
            *self.rejections.entry((model, gate)).or_insert(0) += 1;
        }
        decision
    }

    /// The model's engine signals averaged over its agents, for B3.
    fn pool_signals(&self, model: ModelId) -> crate::logic::policy::Signals {
        let engine = self
            .routes
            .get(&model)
            .map(|routes| routes.pool_signals())
            .unwrap_or_default();
        crate::logic::policy::Signals::of_engine(&engine)
    }

    fn healthy_agents(&self, model: ModelId) -> u32 {
        healthy_in(&self.routes, model)
    }

    fn limits(&self, model: ModelId, policy: &ModelPolicy) -> Limits {
        pool_limits(self.admit_fraction, policy, self.healthy_agents(model))
    }
}

/// The first parked request of `owned` waits only for credits for its key's share: ask that
/// key's pool for them (one refill at a time per key, none while the share is in use).
fn ask_share_for_head(
    now: Millis,
    model: ModelId,
    base: Limits,
    owned: &mut ModelOccupancy,
    sharing: Option<Sharing>,
    effects: &mut Effects,
) {
    let Some(sharing) = sharing else {
        return;
    };
    let limits = owned.limits(base, Some(sharing));
    let shares = share_lookup(&owned.wallets, Some(sharing));
    let head = owned.occupancy.head_short_of_share(&limits, &shares);
    drop(shares);
    let Some((key, share, need)) = head else {
        return;
    };
    let used = owned.occupancy.key_tokens(key);
    if let Some(wallets) = owned.wallets.as_mut() {
        let cap = sharing.cap();
        wallets.share_short(
            now,
            model,
            key,
            share,
            &base,
            used,
            need,
            cap,
            &mut effects.refills,
        );
    }
}

/// The pool limits of a model under `policy` with `healthy` agents now.
fn pool_limits(admit_fraction: f64, policy: &ModelPolicy, healthy: u32) -> Limits {
    Limits::new(
        admit_fraction,
        policy.admit_budget_tokens,
        u64::from(policy.max_inflight),
        healthy,
    )
}

/// The agents in `model`'s pool now.
fn healthy_in(routes: &IdMap<ModelId, ModelRoutes>, model: ModelId) -> u32 {
    routes
        .get(&model)
        .map_or(0, |routes| routes.agent_count() as u32)
}

/// Grants made by a model's routes, as answers to their tickets.
fn deliver(model: ModelId, grants: Vec<(Ticket, Grant)>, effects: &mut Effects) {
    for (ticket, grant) in grants {
        effects.queue.push(QueueMove::Left(model, ticket));
        effects.answer(ticket, Answer::decided(model, Decision::Granted(grant)));
    }
}

/// The routing steps of `model` under the snapshot's policy.
fn steps_of(snapshot: &RoutingSnapshot, model: ModelId) -> Arc<dyn StepFilter> {
    match snapshot.policy_of(model) {
        Some(policy) => policy.clone(),
        None => Arc::new(AnyAgent),
    }
}

mod credits;
