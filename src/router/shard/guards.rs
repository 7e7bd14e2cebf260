//! What a request holds at an owner, as values that give it back when dropped: a [`Slot`]
//! (an agent slot, and its occupancy reservation), a [`Reservation`] (occupancy before a slot),
//! a [`Pending`] (its place in a hold book) and a [`QuotaCharge`] (its key's quota charge). Each
//! reaches the owner exactly once, on every path: success, refusal, timeout, a client that left.

use std::rc::Rc;
use std::time::Duration;

use crate::base::ids::{AgentId, Generation, KeyId, ModelId, TenantId, Ticket};
use crate::logic::limits::{Delivery, UsedTokens};
use crate::logic::routing::Grant;
use crate::router::shard::owner::{
    Admitted, HoldAnswer, Notice, Observed, OccupancyUpdate, QuotaAdmission, Release,
};
use crate::router::shard::state::Shard;
use crate::wire::http::prompt::PromptShape;

/// A held agent slot (and the request's occupancy reservation, if it has one). Dropping it
/// releases both to the model's owner, exactly once.
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
    /// Exact input usage to train the model's estimator with, sent with the release.
    observed: std::cell::Cell<Option<Observed>>,
}

impl Slot {
    pub(super) fn new(
        shard: Rc<Shard>,
        model: ModelId,
        grant: Grant,
        ticket: Ticket,
        reserved: bool,
    ) -> Slot {
        Slot {
            shard,
            model,
            agent: grant.agent,
            generation: grant.generation,
            step: grant.step,
            ticket,
            reserved,
            observed: std::cell::Cell::new(None),
        }
    }

    /// The backend reported `exact_input_tokens` for the prompt `shape` of a complete answer:
    /// the model's owner learns from it when the slot is released (its estimator is the
    /// router's one for the model).
    pub fn observe(&self, shape: PromptShape, exact_input_tokens: u64) {
        self.observed.set(Some(Observed {
            shape,
            exact_input_tokens,
        }));
    }

    /// Whether the request holds occupancy that streamed output should grow.
    pub fn is_reserved(&self) -> bool {
        self.reserved
    }

    /// Tells the owner how much output has streamed, or the exact input once known.
    pub fn update_occupancy(&self, update: OccupancyUpdate) {
        if self.reserved {
            self.shard.notify(Notice::Occupancy {
                model: self.model,
                ticket: self.ticket,
                update,
            });
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shard.notify(Notice::Release {
            model: self.model,
            grant: Grant {
                agent: self.agent,
                generation: self.generation,
                step: self.step,
            },
            ticket: self.ticket,
            observed: self.observed.take(),
        });
    }
}

/// Occupancy reserved at the model's owner, before the request has a slot. Dropping it while
/// armed releases it; `Shard::acquire` with `Admit::Reserved` hands it to the slot.
pub struct Reservation {
    shard: Rc<Shard>,
    model: ModelId,
    ticket: Ticket,
    armed: bool,
}

impl Reservation {
    pub(super) fn new(shard: Rc<Shard>, model: ModelId, ticket: Ticket) -> Reservation {
        Reservation {
            shard,
            model,
            ticket,
            armed: true,
        }
    }

    pub(super) fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// The slot granted under this ticket now answers for the reservation.
    pub(super) fn hand_over(mut self) {
        self.armed = false;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.armed {
            self.shard.notify(Notice::ReleaseReservation {
                model: self.model,
                ticket: self.ticket,
            });
        }
    }
}

/// Why a request was not released by a wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEnd {
    /// A hold limit is reached (per model, per key and model, or in total).
    Full,
    /// The hold budget ran out before an agent for the model registered.
    Expired,
    /// This shard's messages to other shards are backed up (`Unanswered::MeshFull`).
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
    /// A request that took a place under `--wake-hold-max-total` and is about to visit the
    /// model's owner.
    pub(super) fn new(shard: Rc<Shard>, ticket: Ticket, model: ModelId) -> Pending {
        Pending {
            shard,
            ticket,
            model,
            holds_place: true,
        }
    }

    pub(super) fn answered(mut self, answer: HoldAnswer) -> Result<Pending, HoldEnd> {
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
        self.shard.notify(Notice::HoldLeave {
            ticket: self.ticket,
            model: self.model,
        });
    }
}

/// A request's quota charge, held until the request ends. [`QuotaCharge::settle`] charges exact
/// usage; dropping it unsettled (a later refusal, a client that left before forwarding) gives the
/// token charges back. Either reaches the quota owner exactly once.
pub struct QuotaCharge {
    shard: Rc<Shard>,
    /// The request's key, for the tenant counters.
    pub key: KeyId,
    tenant: TenantId,
    admission: Option<QuotaAdmission>,
    /// Charged as input when the response carries no usage.
    estimate_input_tokens: u64,
    /// What the key had left at admission: `X-RateLimit-Remaining-*` on the response.
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
}

impl QuotaCharge {
    pub(super) fn new(
        shard: Rc<Shard>,
        key: KeyId,
        tenant: TenantId,
        admitted: Admitted,
    ) -> QuotaCharge {
        QuotaCharge {
            shard,
            key,
            tenant,
            admission: admitted.admission,
            estimate_input_tokens: 0,
            remaining_requests: admitted.remaining_requests,
            remaining_tokens: admitted.remaining_tokens,
        }
    }

    /// Takes over the token phase's charge (a second visit to the quota owner) so this one charge
    /// settles or gives back everything the request was charged.
    pub fn absorb(&mut self, mut tokens: QuotaCharge) {
        debug_assert!(
            self.admission.is_none(),
            "a request charged its tokens twice"
        );
        self.admission = tokens.admission.take();
        self.remaining_tokens = tokens.remaining_tokens;
    }

    /// The token phase is charged (with the request rate, ahead of the gates, or on its own).
    pub fn charged_tokens(&self) -> bool {
        self.admission.is_some()
    }

    /// Gives the token phase's charge back and keeps the request unit: a token phase charged
    /// ahead of gates that would park the request (`api::plan`) runs again after them.
    pub fn give_back_tokens(&mut self) {
        self.remaining_tokens = None;
        if let Some(admission) = self.admission.take() {
            self.shard.notify(Notice::Quota(Release::Cancel {
                tenant: self.tenant,
                admission,
            }));
        }
    }

    pub fn set_estimate(&mut self, input_tokens: u64) {
        self.estimate_input_tokens = input_tokens;
    }

    /// Settles with the response's exact usage; without one (an error answer, a stream cut
    /// short), the input estimate stands and no output is charged.
    pub fn settle_usage(&mut self, usage: Option<crate::logic::usage::Usage>, delivery: Delivery) {
        let usage = match usage {
            Some(usage) => UsedTokens {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
            },
            None => UsedTokens {
                input_tokens: self.estimate_input_tokens,
                output_tokens: 0,
            },
        };
        self.settle(usage, delivery);
    }

    /// Settles a non-streamed answer before it is delivered. False when its output no longer
    /// fits the key's daily budget: the caller refuses it with `token_limit_exceeded` (the input
    /// charge stays, the output is not charged). Without a daily budget or exact usage this is
    /// [`QuotaCharge::settle_usage`] and the answer is delivered.
    pub async fn settle_buffered(
        &mut self,
        usage: Option<crate::logic::usage::Usage>,
        wait: Duration,
    ) -> bool {
        let (Some(usage), true) = (
            usage,
            self.admission
                .as_ref()
                .is_some_and(QuotaAdmission::has_daily),
        ) else {
            self.settle_usage(usage, Delivery::Buffered);
            return true;
        };
        let admission = self.admission.take().expect("checked above");
        let usage = UsedTokens {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
        };
        let settlement = self
            .shard
            .settle_buffered(self.tenant, admission, usage, wait)
            .await;
        settlement.is_none_or(|settlement| settlement.output_fit)
    }

    pub fn settle(&mut self, usage: UsedTokens, delivery: Delivery) {
        if let Some(admission) = self.admission.take() {
            self.shard.notify(Notice::Quota(Release::Settle {
                tenant: self.tenant,
                admission,
                usage,
                delivery,
            }));
        }
    }
}

impl Drop for QuotaCharge {
    fn drop(&mut self) {
        self.give_back_tokens();
    }
}
