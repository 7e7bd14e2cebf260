//! The requester's side: one path for every visit to an owner, one waiter table, and the
//! request-facing operations built on it (a slot, a reservation, a hold, a quota charge, a
//! redirect token).
//!
//! [`Shard::start_visit`] serves a visit inline when this shard is the owner (the same
//! `Owner::serve` another shard runs when the visit arrives over the mesh), or sends it. An
//! answer that comes at once is returned without a waiter and without a future; otherwise
//! [`Shard::finish_visit`] waits in `waiters` (`shard::waiters`) until the owner answers, the
//! deadline passes or the caller's future is dropped. Whatever way the wait ends without its
//! answer taken, the [`Visiting`] guard takes the waiter out and either gives back what an
//! answer that came meanwhile granted, or tells the owner to withdraw the ticket; an answer
//! that finds no waiter gives back what it granted too ([`Answer::unwanted`]). [`Shard::visit`]
//! is the two in one call. Deadlines are kept by one task per shard
//! ([`Shard::run_visit_deadlines`]), not a timer per wait.

use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::Either;

use crate::base::clock::SystemClock;
use crate::base::ids::{KeyId, ModelId, TenantId, Ticket};
use crate::base::latch::race;
use crate::logic::admission::occupancy::Footprint;
use crate::logic::auth::keys::KeyRecord;
use crate::logic::hold::ClientId;
use crate::logic::limits::{ModelContext, Settlement, UsedTokens};
use crate::logic::policy::ModelPolicy;
use crate::logic::routing::Ask;
use crate::logic::snapshot::ModelEntry;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::guards::HoldEnd;
use crate::router::shard::guards::{Pending, QuotaCharge, Reservation, Slot};
use crate::router::shard::messages::ShardToShard;
use crate::router::shard::owner::{
    Admitted, Answer, Charge, Decision, Notice, PoolRequest, QuotaAdmission, Release, Visit,
};
use crate::router::shard::state::Shard;
use crate::router::shard::waiters::{Delivered, Ended};
use std::sync::Arc;

/// Why a visit ended without an answer.
#[derive(Debug)]
pub enum Unanswered {
    /// This shard's messages to other shards are backed up past
    /// [`outbox::DEFERRED_CONGESTED`](crate::router::shard::outbox::DEFERRED_CONGESTED); the
    /// visit is handed back untouched.
    MeshFull(Visit),
    /// The deadline passed first.
    Timeout,
    /// The router's drain ended first.
    Ending,
    /// The waiter was dropped without an answer (cannot happen while the shard runs).
    Dropped,
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
    /// This shard's messages to other shards are backed up (see [`Unanswered::MeshFull`]).
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
    /// B2 would park a request that asked to be told instead ([`PoolAsk::bounce_park`]): no
    /// refusal, the request gives its tokens back and asks again, parking.
    WouldPark,
}

impl RouteError {
    fn from_decision(decision: Decision) -> RouteError {
        match decision {
            Decision::QueueFull => RouteError::QueueFull,
            Decision::Shed => RouteError::Shed,
            Decision::PoolFull => RouteError::PoolFull,
            Decision::KeyShare => RouteError::KeyShare,
            Decision::PoolTooSmall => RouteError::PoolTooSmall,
            Decision::WouldPark => RouteError::WouldPark,
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
    /// The request's token phase is charged ahead of these gates: where B2 would park it, the
    /// owner answers [`RouteError::WouldPark`] instead (see `api::plan`, "tokens ahead").
    pub bounce_park: bool,
}

/// Why the quota phase refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaRefusal {
    Limit(crate::logic::limits::LimitExceeded),
    /// This shard's messages to other shards are backed up (see [`Unanswered::MeshFull`]).
    MeshFull,
    /// The owner did not answer before the request deadline.
    Timeout,
}

/// A visit once started: answered at once, waiting for its answer, or not sent.
pub(super) enum Started {
    Answered(Answer),
    Waiting(Waiter),
    /// This shard's messages to other shards are backed up (see [`Unanswered::MeshFull`]).
    Unsent(Visit),
}

/// A ticket waiting for its owner's answer (see [`Shard::finish_visit`]); its entry is in
/// `waiters`.
pub(super) struct Waiter {
    ticket: Ticket,
    /// What the owner must be told if the wait ends without an answer.
    withdrawal: Option<Notice>,
}

impl Shard {
    /// One visit to the owner of `visit`: its answer, now or when the owner decides, waiting at
    /// most until `deadline`.
    pub(super) async fn visit(
        self: &Rc<Self>,
        ticket: Ticket,
        visit: Visit,
        deadline: Instant,
    ) -> Result<Answer, Unanswered> {
        match self.start_visit(ticket, visit) {
            Started::Answered(answer) => Ok(answer),
            started => self.finish_visit(started, deadline).await,
        }
    }

    /// The first half of [`Shard::visit`], without a future: served inline by this shard's
    /// own owner (most visits are answered at once, and need no waiter), or sent to another.
    /// Request paths that run on every request call it directly and await
    /// [`Shard::finish_visit`] only when the answer did not come at once.
    pub(super) fn start_visit(self: &Rc<Self>, ticket: Ticket, visit: Visit) -> Started {
        let owner = visit.owner(self.count);
        let withdrawal = visit.withdrawal(ticket);
        if owner == self.id {
            let answered = {
                let mut owner = self.owner.borrow_mut();
                let mut effects = self.effects.borrow_mut();
                owner.serve(&SystemClock, ticket, visit, &mut effects)
            };
            // The waiter is in place before anything the visit decided for others is delivered.
            let started = match answered {
                Some(answer) => Started::Answered(answer),
                None => {
                    self.waiters.borrow_mut().expect(ticket.sequence);
                    Started::Waiting(Waiter { ticket, withdrawal })
                }
            };
            self.deliver_effects();
            return started;
        }
        if self.outbox.borrow().is_congested() {
            ShardMetrics::add(&self.metrics.mesh_full_total, 1);
            return Started::Unsent(visit);
        }
        self.waiters.borrow_mut().expect(ticket.sequence);
        // A full ring is a burst, not a refusal: the visit waits in the outbox behind what
        // already waits for the owner (`shard::outbox`), and its deadline runs meanwhile.
        let sent = self
            .outbox
            .borrow_mut()
            .send_or_defer_wrapped(owner, visit, |visit| ShardToShard::Visit { ticket, visit });
        match sent {
            Ok(()) => Started::Waiting(Waiter { ticket, withdrawal }),
            Err(visit) => {
                ShardMetrics::add(&self.metrics.mesh_full_total, 1);
                let _ = self.waiters.borrow_mut().abandon(ticket.sequence);
                Started::Unsent(visit)
            }
        }
    }

    /// The second half of [`Shard::visit`]: waits for the answer of a visit that did not get
    /// one at once. If this future is dropped (the client left) or times out, the waiter goes
    /// and the ticket is withdrawn at the owner, or what an answer that came meanwhile granted
    /// is given back.
    pub(super) async fn finish_visit(
        self: &Rc<Self>,
        started: Started,
        deadline: Instant,
    ) -> Result<Answer, Unanswered> {
        let waiter = match started {
            Started::Answered(answer) => return Ok(answer),
            Started::Unsent(visit) => return Err(Unanswered::MeshFull(visit)),
            Started::Waiting(waiter) => waiter,
        };
        let mut visiting = Visiting {
            shard: self,
            ticket: waiter.ticket,
            withdrawal: waiter.withdrawal,
            armed: true,
        };
        let sequence = waiter.ticket.sequence;
        let sweeper = self.waiters.borrow_mut().set_deadline(sequence, deadline);
        if let Some(sweeper) = sweeper {
            sweeper.wake();
        }
        let ended =
            std::future::poll_fn(|context| self.waiters.borrow_mut().poll_end(sequence, context))
                .await;
        match ended {
            Ended::Answered(answer) => {
                visiting.armed = false;
                Ok(answer)
            }
            Ended::Missing => {
                visiting.armed = false;
                Err(Unanswered::Dropped)
            }
            // Still armed: the ticket is withdrawn at the owner.
            Ended::Expired => Err(Unanswered::Timeout),
        }
    }

    /// Expires the waits of this shard's visits whose deadline passed, forever: sleeps until
    /// the earliest deadline registered, or until a wait registers an earlier one
    /// (`shard::waiters`).
    pub async fn run_visit_deadlines(self: Rc<Self>) {
        let mut due = Vec::new();
        loop {
            let until = std::future::poll_fn(|context| {
                match self.waiters.borrow_mut().next_deadline(context.waker()) {
                    Some(until) => std::task::Poll::Ready(until),
                    None => std::task::Poll::Pending,
                }
            })
            .await;
            let mut sleep = super::timer::sleep_until(until);
            let rearm = std::future::poll_fn(|context| {
                if sleep.as_mut().poll(context).is_ready() {
                    return std::task::Poll::Ready(false);
                }
                if self.waiters.borrow_mut().rearm(until, context.waker()) {
                    return std::task::Poll::Ready(true);
                }
                std::task::Poll::Pending
            })
            .await;
            if rearm {
                continue;
            }
            self.waiters.borrow_mut().expire(Instant::now(), &mut due);
            for waker in due.drain(..) {
                waker.wake();
            }
        }
    }

    /// Tells an owner that a request gives back what it held: applied here when this shard is
    /// the owner, sent (or deferred, never lost) otherwise.
    pub(super) fn notify(self: &Rc<Self>, notice: Notice) {
        let owner = notice.owner(self.count);
        if owner == self.id {
            self.with_owner(|owner, effects| owner.notice(&SystemClock, notice, effects));
        } else {
            self.send_or_defer(owner, ShardToShard::Notice(notice));
        }
    }

    /// Serves a visit that arrived over the mesh; the answer goes back when there is one.
    pub(super) fn serve_remote(self: &Rc<Self>, ticket: Ticket, visit: Visit) {
        let answered =
            self.with_owner(|owner, effects| owner.serve(&SystemClock, ticket, visit, effects));
        if let Some(answer) = answered {
            self.answer(ticket, answer);
        }
    }

    /// An owner's answer for `ticket`: to its waiter here, or over the mesh to its shard.
    pub(super) fn answer(self: &Rc<Self>, ticket: Ticket, answer: Answer) {
        let requester = usize::from(ticket.shard);
        if requester == self.id {
            self.resolve(ticket, answer);
        } else {
            self.send_or_defer(requester, ShardToShard::Answer { ticket, answer });
        }
    }

    /// An answer for one of this shard's tickets. One nobody waits for any more gives back what
    /// it granted.
    pub(super) fn resolve(self: &Rc<Self>, ticket: Ticket, answer: Answer) {
        let answered = self.waiters.borrow_mut().answer(ticket.sequence, answer);
        match answered {
            Delivered::Kept(Some(waiter)) => waiter.wake(),
            Delivered::Kept(None) => {}
            Delivered::Unwanted(answer) => {
                if let Some(notice) = answer.unwanted(ticket) {
                    self.notify(notice);
                }
            }
        }
    }

    pub(super) fn send_or_defer(&self, to: usize, message: ShardToShard) {
        if let Err(overflow) = self.outbox.borrow_mut().send_or_defer(to, message) {
            ShardMetrics::add(&self.metrics.mesh_dropped_total, 1);
            tracing::error!(shard = self.id, to, message = ?overflow.0, "mesh queue overflowing: a message to another shard is dropped");
        }
    }

    // ----- the operations requests use -----

    /// Asks the model's owner for an agent slot, waiting in its capacity queue until `deadline`;
    /// with [`Admit::Gated`] the owner first runs the pool gates (B3, B2 with parking, the B4
    /// share) in the same visit.
    pub async fn acquire(
        self: &Rc<Self>,
        model: &ModelEntry,
        deadline: Instant,
        admit: Admit,
        route: Ask,
    ) -> Result<Slot, RouteError> {
        let (ticket, pool, reservation) = match admit {
            Admit::Direct => (self.new_ticket(), None, None),
            Admit::Gated(ask) => {
                let ticket = self.new_ticket();
                (ticket, Some(self.pool_request(ticket, ask, deadline)), None)
            }
            Admit::Reserved(reservation) => (reservation.ticket(), None, Some(reservation)),
        };
        let reserved = pool.is_some() || reservation.is_some();
        let visit = Visit::Acquire {
            model: model.id,
            pool,
            slot: Some(route),
        };
        let answered = match self.start_visit(ticket, visit) {
            Started::Answered(answer) => Ok(answer),
            started => self.finish_visit(started, deadline).await,
        };
        match self.decision(answered)? {
            Decision::Granted(grant) => {
                // The slot now answers for the reservation too.
                if let Some(reservation) = reservation {
                    reservation.hand_over();
                }
                Ok(Slot::new(self.clone(), model.id, grant, ticket, reserved))
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
        let visit = Visit::Acquire {
            model: model.id,
            pool: Some(self.pool_request(ticket, ask, deadline)),
            slot: None,
        };
        let answered = match self.start_visit(ticket, visit) {
            Started::Answered(answer) => Ok(answer),
            started => self.finish_visit(started, deadline).await,
        };
        match self.decision(answered)? {
            Decision::Reserved => Ok(Reservation::new(self.clone(), model.id, ticket)),
            other => Err(RouteError::from_decision(other)),
        }
    }

    /// An acquire visit's decision.
    fn decision(&self, answered: Result<Answer, Unanswered>) -> Result<Decision, RouteError> {
        match answered {
            Ok(Answer::Decided { decision, .. }) => Ok(decision),
            Ok(other) => Err(mismatched(other, RouteError::NoAgents)),
            Err(Unanswered::MeshFull(_)) => Err(RouteError::MeshFull),
            Err(Unanswered::Timeout | Unanswered::Ending) => {
                ShardMetrics::add(&self.metrics.queue_timeouts_total, 1);
                Err(RouteError::Timeout)
            }
            Err(Unanswered::Dropped) => Err(RouteError::NoAgents),
        }
    }

    fn pool_request(&self, ticket: Ticket, ask: PoolAsk, deadline: Instant) -> PoolRequest {
        let park = self.settings.admit_park_timeout;
        let park_until = match ask.hold_until {
            Some(until) => Some(until),
            None => (!park.is_zero()).then(|| deadline.min(Instant::now() + park)),
        };
        PoolRequest {
            claim: crate::logic::admission::occupancy::Claim {
                ticket,
                footprint: ask.footprint,
                key: ask.key,
                share: ask.share,
            },
            policy: ask.policy,
            park_until: park_until.map(crate::base::clock::at),
            refuse_oversize: ask.hold_until.is_some(),
            bounce_park: ask.bounce_park,
        }
    }

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
        // From here the guard gives the place back and tells the owner, on every path.
        let pending = Pending::new(self.clone(), ticket, model);
        let visit = Visit::Hold { model, key, client };
        // The router's drain ending ends a hold too: its model cannot wake here any more.
        let answered = match self.start_visit(ticket, visit) {
            Started::Answered(answer) => Ok(answer),
            started => match race(self.finish_visit(started, until), self.lifecycle.ending()).await
            {
                Either::Left(answered) => answered,
                // The wait is dropped: its guard takes the waiter out.
                Either::Right(()) => Err(Unanswered::Ending),
            },
        };
        match answered {
            Ok(Answer::Held(answer)) => pending.answered(answer),
            Ok(other) => Err(mismatched(other, HoldEnd::Expired)),
            Err(Unanswered::MeshFull(_)) => Err(HoldEnd::MeshFull),
            // The owner dropped the waiter without an answer: cannot happen while the shard
            // runs; treat it as the budget ending.
            Err(Unanswered::Timeout | Unanswered::Dropped) => Err(HoldEnd::Expired),
            Err(Unanswered::Ending) => Err(HoldEnd::ShuttingDown),
        }
    }

    /// Spends a redirect token: true the first time this router sees its nonce, false after
    /// (single use). The nonce's owner shard keeps the spent set, so every shard agrees; `None`
    /// when the owner could not be asked before `deadline`.
    pub async fn spend_redirect_token(
        self: &Rc<Self>,
        nonce: [u8; 16],
        expires_unix_ms: i64,
        deadline: Instant,
    ) -> Option<bool> {
        let visit = Visit::SpendToken {
            nonce,
            expires_unix_ms,
        };
        match self.visit(self.new_ticket(), visit, deadline).await {
            Ok(Answer::TokenSpent(fresh)) => Some(fresh),
            Ok(other) => mismatched(other, None),
            Err(_) => None,
        }
    }

    /// The quota phase: asks the key's quota owner to check and charge the request. The returned
    /// charge settles (or is given back) exactly once.
    pub async fn admit_quota(
        self: &Rc<Self>,
        key: &KeyRecord,
        model: ModelContext,
        charge: Charge,
        deadline: Instant,
    ) -> Result<QuotaCharge, QuotaRefusal> {
        let tenant = key.tenant_id;
        let charged =
            |admitted: Admitted| QuotaCharge::new(self.clone(), key.key_id, tenant, admitted);
        if !crate::router::shard::owner::quotas::is_limited(key) {
            return Ok(self.unlimited_quota(key));
        }
        let visit = Visit::Quota {
            tenant,
            key: key.key_id,
            model,
            charge,
        };
        // A late admission finds no waiter and is given back (`Answer::unwanted`).
        let answered = match self.start_visit(self.new_ticket(), visit) {
            Started::Answered(answer) => Ok(answer),
            started => self.finish_visit(started, deadline).await,
        };
        match answered {
            Ok(Answer::Quota { result, .. }) => result.map(charged).map_err(QuotaRefusal::Limit),
            Ok(other) => Err(mismatched(other, QuotaRefusal::Timeout)),
            Err(Unanswered::MeshFull(_)) => Err(QuotaRefusal::MeshFull),
            Err(_) => Err(QuotaRefusal::Timeout),
        }
    }

    /// The quota phase of a key with no limit at all: nothing is visited, charged or settled.
    pub fn unlimited_quota(self: &Rc<Self>, key: &KeyRecord) -> QuotaCharge {
        QuotaCharge::new(self.clone(), key.key_id, key.tenant_id, Admitted::default())
    }

    /// Settles a non-streamed answer on the quota owner before delivery (auth reference, "Token-
    /// budget enforcement": output that no longer fits the day's budget is refused, the input
    /// charge stays). `None`: nothing to refuse on (holder gone, or no answer within `wait`, in
    /// which case the settlement still happens and the answer is delivered).
    pub(super) async fn settle_buffered(
        self: &Rc<Self>,
        tenant: TenantId,
        admission: QuotaAdmission,
        usage: UsedTokens,
        wait: Duration,
    ) -> Option<Settlement> {
        let visit = Visit::Settle {
            tenant,
            admission,
            usage,
        };
        // Answered at once by a local owner (every visit on one shard): no future at all. A
        // wait is boxed: only daily-budget keys settle here, after the response, deep in every
        // request's future, where its state (about 900 bytes) would otherwise widen them all.
        let answered = match self.start_visit(self.new_ticket(), visit) {
            Started::Answered(answer) => Ok(answer),
            started => Box::pin(self.finish_visit(started, Instant::now() + wait)).await,
        };
        match answered {
            Ok(Answer::Settled(settlement)) => settlement,
            Ok(other) => mismatched(other, None),
            Err(Unanswered::MeshFull(Visit::Settle {
                tenant,
                admission,
                usage,
            })) => {
                // Backed up past the congestion mark: settle as delivered rather than lose the
                // charge.
                self.notify(Notice::Quota(Release::Settle {
                    tenant,
                    admission,
                    usage,
                    delivery: crate::logic::limits::Delivery::Streamed,
                }));
                None
            }
            Err(_) => None,
        }
    }
}

/// An answer of another kind than the visit asked for: a bug; logged, and the request gets
/// `fallback`.
fn mismatched<T>(answer: Answer, fallback: T) -> T {
    debug_assert!(
        false,
        "an owner answered {answer:?} to another kind of visit"
    );
    tracing::error!(?answer, "an owner answered another kind of visit");
    fallback
}

/// A visit that waits for its answer; dropped before it took one, it takes its waiter out and
/// gives back what an answer that came meanwhile granted, or withdraws the ticket at the owner.
struct Visiting<'a> {
    shard: &'a Rc<Shard>,
    ticket: Ticket,
    /// `None` for visits that hold nothing while they wait.
    withdrawal: Option<Notice>,
    /// Still waiting: the answer has not been taken (its waiter may still be in the table).
    armed: bool,
}

impl Drop for Visiting<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let answered = self
            .shard
            .waiters
            .borrow_mut()
            .abandon(self.ticket.sequence);
        // The owner answered in the turn the wait was dropped: give back what it granted.
        // Otherwise it still holds the ticket (queued, parked, or about to be served).
        let notice = match answered {
            Some(answer) => answer.unwanted(self.ticket),
            None => self.withdrawal.take(),
        };
        if let Some(notice) = notice {
            self.shard.notify(notice);
        }
    }
}

#[cfg(test)]
mod tests;
