//! What a shard owns, as pure state machines: the models whose id maps to it ([`Models`]), the
//! quota holders of the tenants whose id maps to it ([`Quotas`]), and the redirect tokens whose
//! nonce maps to it ([`SpentTokens`]).
//!
//! A request asks an owner through a [`Visit`] and gets one [`Answer`]; what it holds there it
//! gives back with a [`Notice`]. [`Owner::serve`] and [`Owner::notice`] are the owner's whole
//! side, whether the requester is this shard (called inline) or another (over the mesh): no
//! operation is written twice.
//!
//! Pure: no I/O, no channel, no clock. Time comes in through a [`Clock`] that is read only when
//! an operation needs it; an answer for the visiting ticket is returned, answers for other
//! tickets (grants after a release, parked tickets that fit now, held requests a new agent wakes)
//! are left in [`Effects`] for the caller to deliver. Unit tests and proptests drive it in
//! virtual time (`tests.rs`).

pub mod models;
pub mod quotas;
#[cfg(test)]
mod tests;
pub mod wallets;

use std::sync::Arc;

use crate::base::clock::{Clock, Day, Millis};
use crate::base::ids::{AgentId, Generation, KeyId, ModelId, TenantId, Ticket};
use crate::logic::admission::Reason;
use crate::logic::auth::keys::KeyRegistry;
use crate::logic::hold::{ClientId, HoldLimits};
use crate::logic::limits::{BurstSeconds, Delivery, ModelContext, Settlement, UsedTokens};
use crate::logic::routing::{AgentProfile, Ask, EngineSignals, Grant};
use crate::logic::sibling::token::SpentTokens;
use crate::logic::snapshot::RoutingSnapshot;

pub use models::{Decision, HoldAnswer, Models, OccupancyUpdate, PoolReport, PoolRequest};
pub use quotas::{Admitted, Charge, QuotaAdmission, Quotas, Release};

/// What the quota owner answers: an admission to settle later, or the limit that refused.
pub type QuotaAnswer = Result<Admitted, crate::logic::limits::LimitExceeded>;

/// A request's question to one owner.
#[derive(Debug)]
pub enum Visit {
    /// Pass the pool gates (`pool`, reserving occupancy under the ticket) and/or find an agent
    /// slot (`slot`: from this step on, avoiding these agents).
    Acquire {
        model: ModelId,
        pool: Option<PoolRequest>,
        slot: Option<Ask>,
    },
    /// Hold the request until an agent for `model` registers (hold at zero), counting it in the
    /// model's pending demand and against the per-model hold limits.
    Hold {
        model: ModelId,
        key: Option<KeyId>,
        client: Option<ClientId>,
    },
    /// Check (and charge) the key's limits for one request.
    Quota {
        tenant: TenantId,
        key: KeyId,
        model: ModelContext,
        charge: Charge,
    },
    /// Settle a non-streamed answer before it is delivered: does its output still fit the daily
    /// budget?
    Settle {
        tenant: TenantId,
        admission: QuotaAdmission,
        usage: UsedTokens,
    },
    /// Spend a redirect token (single use per router).
    SpendToken {
        nonce: [u8; 16],
        expires_unix_ms: i64,
    },
}

impl Visit {
    /// The shard that answers this visit.
    pub fn owner(&self, shards: usize) -> usize {
        match self {
            Visit::Acquire { model, .. } | Visit::Hold { model, .. } => model.owner(shards),
            Visit::Quota { tenant, .. } | Visit::Settle { tenant, .. } => tenant.owner(shards),
            Visit::SpendToken { nonce, .. } => token_owner(nonce, shards),
        }
    }

    /// What the owner must be told when the visitor stops waiting (timeout, client gone), so the
    /// ticket holds no queue place and no occupancy there. A hold is left by its `Pending`
    /// guard; the other visits hold nothing while unanswered.
    pub fn withdrawal(&self, ticket: Ticket) -> Option<Notice> {
        match *self {
            Visit::Acquire { model, .. } => Some(Notice::Cancel { ticket, model }),
            _ => None,
        }
    }
}

/// An owner's one answer to a [`Visit`].
#[derive(Debug)]
pub enum Answer {
    /// To an acquire (`model` lets an unwanted grant go back).
    Decided {
        model: ModelId,
        decision: Decision,
    },
    Held(HoldAnswer),
    Quota {
        tenant: TenantId,
        result: QuotaAnswer,
    },
    /// `None`: the holder is gone; deliver.
    Settled(Option<Settlement>),
    /// Whether the token was fresh (first use).
    TokenSpent(bool),
}

impl Answer {
    pub fn decided(model: ModelId, decision: Decision) -> Answer {
        Answer::Decided { model, decision }
    }

    /// What an answer that found nobody waiting leaves to give back: a grant, a reservation, a
    /// quota charge.
    pub fn unwanted(self, ticket: Ticket) -> Option<Notice> {
        match self {
            Answer::Decided {
                model,
                decision: Decision::Granted(grant),
            } => Some(Notice::Release {
                model,
                grant,
                ticket,
                observed: None,
            }),
            Answer::Decided {
                model,
                decision: Decision::Reserved,
            } => Some(Notice::ReleaseReservation { model, ticket }),
            Answer::Quota {
                tenant,
                result:
                    Ok(Admitted {
                        admission: Some(admission),
                        ..
                    }),
            } => Some(Notice::Quota(Release::Cancel { tenant, admission })),
            _ => None,
        }
    }
}

/// A complete answer's exact input usage, for the model's estimator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    pub shape: crate::wire::http::prompt::PromptShape,
    pub exact_input_tokens: u64,
}

/// One-way news from a requester to an owner: the request gives back what it held.
#[derive(Debug)]
pub enum Notice {
    /// The request gave up waiting; whatever the ticket holds or waits for at the owner goes.
    Cancel { ticket: Ticket, model: ModelId },
    /// The request is finished with its slot and its reservation; `observed`, the exact input
    /// of a complete answer, trains the model's estimator.
    Release {
        model: ModelId,
        grant: Grant,
        ticket: Ticket,
        observed: Option<Observed>,
    },
    /// The request ends before it got a slot; its reservation goes.
    ReleaseReservation { model: ModelId, ticket: Ticket },
    /// A reserved request's output so far, or its exact input.
    Occupancy {
        model: ModelId,
        ticket: Ticket,
        update: OccupancyUpdate,
    },
    /// The request leaves the hold book (it got a slot, was answered, or its client left).
    HoldLeave { ticket: Ticket, model: ModelId },
    /// The request is over: charge exact usage, or give back.
    Quota(Release),
}

impl Notice {
    /// The shard this notice is for.
    pub fn owner(&self, shards: usize) -> usize {
        match self {
            Notice::Cancel { model, .. }
            | Notice::Release { model, .. }
            | Notice::ReleaseReservation { model, .. }
            | Notice::Occupancy { model, .. }
            | Notice::HoldLeave { model, .. } => model.owner(shards),
            Notice::Quota(Release::Settle { tenant, .. } | Release::Cancel { tenant, .. }) => {
                tenant.owner(shards)
            }
        }
    }
}

/// The models of `models` that `shard` owns.
fn owned_by(shard: usize, shards: usize, models: &[ModelId]) -> impl Iterator<Item = ModelId> + '_ {
    models
        .iter()
        .copied()
        .filter(move |model| model.owner(shards) == shard)
}

/// The shard that keeps a redirect token's nonce.
pub fn token_owner(nonce: &[u8; 16], shards: usize) -> usize {
    usize::from(nonce[0]) % shards
}

/// What an owner operation leaves for its caller besides its direct answer; the shard delivers
/// and empties it after every operation. Bound: one operation decides at most the tickets that
/// wait at this owner (queued, parked or held, each bounded by `--queue-depth`, the park
/// deadline and the hold limits), each once.
#[derive(Debug, Default)]
pub struct Effects {
    /// Answers for tickets other than the one served, in the order they were decided.
    pub answers: Vec<(Ticket, Answer)>,
    /// Tickets parked (B2), for `hivenet_admission_parked_total`; something to expire later.
    pub parked: u64,
    /// Tickets that entered or left a model's capacity queue, in order: the requester's shard
    /// counts `hivenet_shard_queued_total` and times `hivenet_queue_wait_seconds` from them (pure
    /// logic reads no clock). At most two per ticket.
    pub queue: Vec<QueueMove>,
    /// Models that woke with held requests, and how many each released (for the log).
    pub woke: Vec<(ModelId, usize)>,
    /// Wallets that ran short: refills for the sync core to ask the pool for. At most one per
    /// budget (two per owned model) is outstanding: a wallet asks again only once answered.
    pub refills: Vec<wallets::Refill>,
}

impl Effects {
    pub fn answer(&mut self, ticket: Ticket, answer: Answer) {
        self.answers.push((ticket, answer));
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
            && self.parked == 0
            && self.queue.is_empty()
            && self.woke.is_empty()
            && self.refills.is_empty()
    }
}

/// A ticket entering or leaving a model's capacity queue (granted, cancelled, or failed because
/// the model's last agent left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueMove {
    Entered(ModelId, Ticket),
    Left(ModelId, Ticket),
}

/// An agent joining a model's pool: who, its stay, its slots and what step filters see of it.
#[derive(Debug, Clone)]
pub struct AgentJoin {
    pub agent: AgentId,
    pub generation: Generation,
    pub capacity: u32,
    pub profile: Arc<AgentProfile>,
}

/// The owner settings every shard is built with.
#[derive(Debug, Clone, Copy)]
pub struct OwnerSettings {
    pub shard: usize,
    pub shards: usize,
    pub queue_depth: usize,
    pub admit_fraction: f64,
    pub hold_limits: HoldLimits,
    pub rpm_burst: BurstSeconds,
    pub prefix: crate::logic::routing::prefix::PrefixSettings,
}

/// Everything one shard owns, and its view of the configuration it decides against.
pub struct Owner {
    shard: usize,
    shards: usize,
    pub models: Models,
    pub quotas: Quotas,
    spent_tokens: SpentTokens,
    keys: Arc<KeyRegistry>,
    snapshot: Arc<RoutingSnapshot>,
}

impl Owner {
    pub fn new(settings: OwnerSettings, keys: Arc<KeyRegistry>) -> Owner {
        Owner {
            shard: settings.shard,
            shards: settings.shards,
            models: Models::new(
                settings.queue_depth,
                settings.admit_fraction,
                settings.hold_limits,
            )
            .with_prefix_settings(settings.prefix),
            quotas: Quotas::new(settings.rpm_burst),
            spent_tokens: SpentTokens::new(),
            keys,
            snapshot: RoutingSnapshot::empty(),
        }
    }

    /// The sync round, step 1: the usage this shard's quota holders admitted since the last call.
    pub fn take_usage(&mut self, out: &mut Vec<quotas::BucketUsage>) {
        self.quotas.take_usage(out);
    }

    /// The sync round, step 1 too: the rate buckets low enough to anchor to the site's level.
    pub fn anchor_views(&self, now: Millis, out: &mut Vec<quotas::BucketView>) {
        self.quotas.anchor_views(now, out);
    }

    /// This router's part of every limit from now on (the sync core, each round): the rate
    /// limits' share, and whether occupancy credits count or each router keeps to its share of
    /// the budgets alone.
    pub fn set_share(&mut self, share: crate::logic::limits::Share) {
        self.quotas.set_share(share);
        let (reachable, live, routers) = match share {
            crate::logic::limits::Share::Whole => (true, 1, 1),
            crate::logic::limits::Share::Shared { live, silent, .. } => (true, live, live + silent),
            crate::logic::limits::Share::Alone { routers, .. } => (false, routers, routers),
        };
        self.models.set_credit_cap(reachable, live, routers);
    }

    /// The sync round, step 2: subtract what other routers admitted from the holders this shard
    /// owns (usage of other shards' tenants is skipped).
    ///
    /// Walks the whole round on every shard (each finds the owner of each key): one hash lookup per
    /// bucket, once per sync interval.
    pub fn apply_remote(&mut self, now: Millis, day: Day, remote: &quotas::RemoteUsage) {
        let (shards, shard) = (self.shards, self.shard);
        if remote.replay {
            self.quotas.replay(
                now,
                day,
                &self.keys,
                &self.snapshot,
                &remote.batches,
                |tenant| tenant.owner(shards) == shard,
                remote.unsettle,
            );
        } else {
            for batch in &remote.batches {
                for usage in &batch.usage {
                    // A key this router does not know (routers with different key files) is
                    // skipped.
                    let Some(record) = self.keys.get(usage.key) else {
                        continue;
                    };
                    if record.tenant_id.owner(shards) == shard {
                        self.quotas.apply_remote(
                            now,
                            day,
                            &self.keys,
                            &self.snapshot,
                            usage,
                            batch.age_ms,
                        );
                    }
                }
            }
        }
        for anchor in &remote.anchors {
            let Some(record) = self.keys.get(anchor.key) else {
                continue;
            };
            if record.tenant_id.owner(self.shards) == self.shard {
                self.quotas.anchor(now, &self.keys, anchor);
            }
        }
    }

    /// Daily totals read back at start-up (disk database) or from the shared store (see
    /// [`Quotas::restore`]).
    pub fn restore_daily(&mut self, restore: quotas::DailyRestore) {
        self.quotas.restore(&self.snapshot, restore);
    }

    /// Answers a visit for `ticket` now, or `None` when the ticket waits (parked, queued, held)
    /// and its answer will come through [`Effects`].
    pub fn serve(
        &mut self,
        clock: &impl Clock,
        ticket: Ticket,
        visit: Visit,
        effects: &mut Effects,
    ) -> Option<Answer> {
        debug_assert_eq!(
            visit.owner(self.shards),
            self.shard,
            "visit at the wrong owner"
        );
        match visit {
            Visit::Acquire { model, pool, slot } => self
                .models
                .acquire(clock.now(), ticket, model, pool, slot, effects)
                .map(|decision| Answer::decided(model, decision)),
            Visit::Hold { model, key, client } => self
                .models
                .hold(ticket, model, key, client)
                .map(Answer::Held),
            Visit::Quota {
                tenant,
                key,
                model,
                charge,
            } => {
                let result = self.quotas.admit(
                    clock.now(),
                    clock.today(),
                    &self.keys,
                    &self.snapshot,
                    key,
                    &model,
                    charge,
                );
                Some(Answer::Quota { tenant, result })
            }
            Visit::Settle {
                tenant,
                admission,
                usage,
            } => Some(Answer::Settled(self.quotas.settle(
                clock.now(),
                clock.today(),
                tenant,
                admission,
                usage,
                Delivery::Buffered,
            ))),
            Visit::SpendToken {
                nonce,
                expires_unix_ms,
            } => Some(Answer::TokenSpent(self.spent_tokens.spend(
                nonce,
                expires_unix_ms,
                clock.unix_ms(),
            ))),
        }
    }

    /// Applies a requester's notice. Idempotent per ticket: a release that arrives twice (a
    /// cancel racing a release) takes nothing from another request.
    pub fn notice(&mut self, clock: &impl Clock, notice: Notice, effects: &mut Effects) {
        match notice {
            Notice::Cancel { ticket, model } => {
                self.models.cancel(clock.now(), ticket, model, effects)
            }
            Notice::Release {
                model,
                grant,
                ticket,
                observed,
            } => {
                self.models
                    .release(clock.now(), model, grant, ticket, effects);
                if let Some(observed) = observed {
                    self.learn(model, observed);
                }
            }
            Notice::ReleaseReservation { model, ticket } => {
                self.models
                    .release_reservation(clock.now(), model, ticket, effects)
            }
            Notice::Occupancy {
                model,
                ticket,
                update,
            } => self
                .models
                .update_occupancy(clock.now(), model, ticket, update, effects),
            Notice::HoldLeave { ticket, .. } => self.models.leave_hold(ticket),
            Notice::Quota(Release::Settle {
                tenant,
                admission,
                usage,
                delivery,
            }) => {
                let _ = self.quotas.settle(
                    clock.now(),
                    clock.today(),
                    tenant,
                    admission,
                    usage,
                    delivery,
                );
            }
            Notice::Quota(Release::Cancel { tenant, admission }) => {
                self.quotas.cancel(tenant, admission)
            }
        }
    }

    /// Trains `model`'s estimator, the router's one (this shard owns the model), and publishes
    /// its new ratio where every shard reads it.
    fn learn(&mut self, model: ModelId, observed: Observed) {
        let learned =
            self.models
                .estimator
                .observe(model, &observed.shape, observed.exact_input_tokens);
        if let crate::logic::admission::estimator::Observation::Learned {
            tokens_per_byte, ..
        } = learned
            && let Some(published) = self.snapshot.ratio_of(model)
        {
            published.publish(tokens_per_byte);
        }
    }

    // ----- the control core's news -----

    /// A new routing snapshot: owned models route by their current steps.
    pub fn set_snapshot(&mut self, snapshot: Arc<RoutingSnapshot>, effects: &mut Effects) {
        self.snapshot = snapshot;
        self.models.set_steps(&self.snapshot, effects);
    }

    pub fn set_keys(&mut self, keys: Arc<KeyRegistry>) {
        self.keys = keys;
    }

    pub fn snapshot(&self) -> &RoutingSnapshot {
        &self.snapshot
    }

    /// An agent joined the pool of `models`; this shard acts for those it owns.
    pub fn agent_up(
        &mut self,
        now: Millis,
        agent: &AgentJoin,
        models: &[ModelId],
        effects: &mut Effects,
    ) {
        let owned = owned_by(self.shard, self.shards, models);
        self.models
            .agent_up(now, &self.snapshot, agent, owned, effects);
    }

    pub fn agent_down(
        &mut self,
        now: Millis,
        agent: AgentId,
        models: &[ModelId],
        effects: &mut Effects,
    ) {
        let owned = owned_by(self.shard, self.shards, models);
        self.models.agent_down(now, agent, owned, effects);
    }

    pub fn signal(
        &mut self,
        agent: AgentId,
        models: &[ModelId],
        in_flight: u32,
        engine: EngineSignals,
        effects: &mut Effects,
    ) {
        let owned = owned_by(self.shard, self.shards, models);
        self.models.signal(agent, owned, in_flight, engine, effects);
    }

    /// The refusals decided here, by model and gate.
    pub fn rejections(&self) -> impl Iterator<Item = (ModelId, Reason, u64)> + '_ {
        self.models.rejections()
    }
}
