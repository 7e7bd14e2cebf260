//! B2 pool occupancy and the B4 per-key occupancy share, for one model, on the model's owner
//! shard (seed `admission-control.md`, "B2: pool occupancy" and "B4: serverless key limits").
//!
//! Pure logic: no clock (the owner passes its monotonic [`Millis`]), no I/O. The owner keeps one
//! [`Occupancy`] per model it owns, evaluates every admission against the [`Limits`] of that moment
//! (the policy's per-replica values scaled by the healthy replicas, recomputed per request), and
//! applies the growth, exact-input true-up and release of each reservation as they arrive.
//!
//! A reservation is named by the request's [`Ticket`], which is unique per request; every
//! operation on a ticket the pool does not hold is a no-op, so a release that arrives twice (a
//! cancel racing a release) cannot take occupancy from another request.
//!
//! Invariants:
//! - `tokens` is the sum of every held reservation's `input + output`, `inflight` their count,
//!   and `by_key[k]` the sum over the reservations of key `k` (absent when zero); the proptest at
//!   the bottom checks that any interleaving returns all three to zero when nothing is held.
//! - A request that does not fit B2 parks behind every request already parked (FIFO: a small
//!   request never overtakes a large one that waits), until it fits, its park deadline passes, or
//!   it is cancelled; a parked request holds no occupancy.
//! - The B4 share is checked only after B2 fits and refuses at once (it never parks). When the
//!   routers of a site share the budgets, the share is also held to this router's credits for
//!   the key ([`ShareCredits`]): a request within the share but short of those credits waits
//!   for a refill like a request short of B2's credits (it parks, within its park timeout),
//!   and is refused at once once the site's share is known to be in use.

use std::collections::{HashMap, VecDeque};

use crate::base::ids::KeyId;
use crate::base::ids::Ticket;
use crate::logic::credits::wallet::{Allowance, Cap};
use crate::logic::limits::Millis;

/// Occupancy state that has held nothing for this long is dropped (seed, "Idle-state cleanup").
pub const IDLE_DROP_MS: u64 = 15 * 60 * 1000;

/// The effective limits of one model's pool at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// `floor(admit_fraction × admit_budget_tokens × healthy)`; 0: no token budget.
    pub budget_tokens: u64,
    /// `max_inflight × healthy`; 0: no request backstop.
    pub max_inflight: u64,
    /// `admit_budget_tokens × healthy`, the base of the B4 share (no admit fraction); 0: no share.
    pub share_base_tokens: u64,
    /// When the routers of a site share the budgets (`credits`): this router's credits for the
    /// token budget and for the request backstop. Admission keeps within them as well.
    pub credits: Option<SiteCredits>,
}

/// This router's credits for a model's two budgets, under the cap of the moment
/// (`credits::wallet::Allowance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SiteCredits {
    pub tokens: Allowance,
    pub requests: Allowance,
}

impl Limits {
    /// The pool limits for a model's per-replica policy values and its healthy replicas now
    /// (floored at one, seed: "keeps the gate active when no healthy replica is reported").
    pub fn new(
        admit_fraction: f64,
        admit_budget_tokens: u64,
        max_inflight: u64,
        healthy: u32,
    ) -> Limits {
        let healthy = u64::from(healthy.max(1));
        let share_base_tokens = admit_budget_tokens.saturating_mul(healthy);
        Limits {
            budget_tokens: (admit_fraction * share_base_tokens as f64).floor() as u64,
            max_inflight: max_inflight.saturating_mul(healthy),
            share_base_tokens,
            credits: None,
        }
    }

    /// Whether B2 has anything to check.
    pub fn is_active(&self) -> bool {
        self.budget_tokens > 0 || self.max_inflight > 0
    }

    /// Whether a request of this footprint fits the budget of an empty pool: one that does not
    /// can only fit once more replicas join.
    pub fn could_ever_fit(&self, footprint: &Footprint) -> bool {
        self.budget_tokens == 0 || footprint.tokens() <= self.budget_tokens
    }
}

/// A request's initial footprint: the input estimate plus the declared maximum output (0 when
/// undeclared; the reservation then grows as output streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    pub input_tokens: u64,
    pub declared_output_tokens: u64,
}

impl Footprint {
    pub fn tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.declared_output_tokens)
    }
}

/// One admission asked of the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    pub ticket: Ticket,
    pub footprint: Footprint,
    pub key: KeyId,
    /// The key's `max_occupancy_share` on a serverless model; 0: no B4 share check.
    pub share: f64,
}

impl Claim {
    fn share_limit(&self, limits: &Limits) -> Option<u64> {
        (self.share > 0.0 && limits.share_base_tokens > 0)
            .then(|| (self.share * limits.share_base_tokens as f64).floor() as u64)
    }
}

/// This router's credits for one key's B4 share, when the routers of a site share the budgets
/// (`credits::wallet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareCredits {
    pub allowance: Allowance,
    /// The key's pool answered that it has nothing more free since this router's last round:
    /// the share is in use on the site, so a request short of credits is refused at once.
    pub spent: bool,
}

/// This router's credits for a key's share (called with the key and its share in tokens), looked
/// up when a claim of that key is decided; `None`: the share is this router's alone (no site).
pub type ShareLookup<'a> = &'a dyn Fn(KeyId, u64) -> Option<ShareCredits>;

/// No site: every share is this router's alone.
pub const ALONE: ShareLookup<'static> = &|_, _| None;

/// What the B4 share says of a claim that fits B2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShareCheck {
    Fits,
    /// The key's share is in use: refused at once.
    InUse,
    /// Within the share, short of this router's credits for it: waits for a refill.
    ShortOfCredits,
}

/// Which gate refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// B2: the model's token budget or request backstop (`429 concurrency_limit_exceeded`).
    Budget,
    /// B4: the key's occupancy share (`429 rate_limit_exceeded`, at once).
    KeyShare,
    /// B4, with a site: within the key's share but short of this router's credits for it, and
    /// not allowed to park for them (`429 rate_limit_exceeded`; a requester that asked to be
    /// told where it would park parks for them instead).
    ShortOfShareCredits,
}

/// What [`Occupancy::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Reserved; release it with [`Occupancy::release`].
    Admitted,
    /// Does not fit B2 now: parked until its deadline (see [`Occupancy::admit_parked`]).
    Parked,
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy)]
struct Held {
    key: KeyId,
    /// Whether this reservation counts towards `by_key` (it asked with a share).
    keyed: bool,
    input: u64,
    output: u64,
    declared_output: u64,
    touched: Millis,
}

impl Held {
    fn tokens(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

#[derive(Debug, Clone, Copy)]
struct Parked {
    claim: Claim,
    deadline: Millis,
}

/// One model's occupancy.
#[derive(Debug, Default)]
pub struct Occupancy {
    tokens: u64,
    held: HashMap<Ticket, Held>,
    by_key: HashMap<KeyId, u64>,
    parked: VecDeque<Parked>,
    /// Last time something was held or parked here.
    last_busy: Millis,
}

impl Occupancy {
    pub fn new(now: Millis) -> Occupancy {
        Occupancy {
            last_busy: now,
            ..Occupancy::default()
        }
    }

    /// The weighted in-flight token sum (`hivenet_admission_occupancy_tokens`).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Admitted requests holding a reservation (`hivenet_admission_inflight_requests`).
    pub fn inflight(&self) -> u64 {
        self.held.len() as u64
    }

    pub fn parked_len(&self) -> usize {
        self.parked.len()
    }

    /// What the parked requests need together: (tokens of their footprints, requests).
    pub fn parked_need(&self) -> (u64, u64) {
        let tokens = self
            .parked
            .iter()
            .map(|parked| parked.claim.footprint.tokens())
            .sum();
        (tokens, self.parked.len() as u64)
    }

    pub fn holds(&self, ticket: Ticket) -> bool {
        self.held.contains_key(&ticket)
    }

    /// B2 then the B4 share for a new request. With `park_until: None` (park timeout 0) a request
    /// that does not fit is refused at once; otherwise it parks until then.
    pub fn admit(
        &mut self,
        now: Millis,
        limits: &Limits,
        claim: Claim,
        park_until: Option<Millis>,
        shares: ShareLookup,
    ) -> Verdict {
        let refusal = if !self.parked.is_empty() || !self.fits_pool(limits, &claim) {
            // Nobody overtakes a parked request.
            Refusal::Budget
        } else {
            match self.share_check(limits, &claim, shares) {
                ShareCheck::Fits => {
                    self.reserve(now, limits, claim);
                    return Verdict::Admitted;
                }
                ShareCheck::InUse => return Verdict::Refused(Refusal::KeyShare),
                ShareCheck::ShortOfCredits => Refusal::ShortOfShareCredits,
            }
        };
        match park_until {
            Some(deadline) if deadline > now => {
                self.parked.push_back(Parked { claim, deadline });
                self.last_busy = now;
                Verdict::Parked
            }
            _ => Verdict::Refused(refusal),
        }
    }

    /// Parked requests that fit now, in arrival order, each either admitted (reserved) or refused
    /// by its B4 share. Stops at the first that still does not fit B2, or waits for credits for
    /// its key's share. Call after anything that may free room: a release, a true-up, a grant
    /// or a change of limits.
    pub fn admit_parked(
        &mut self,
        now: Millis,
        limits: &Limits,
        shares: ShareLookup,
    ) -> Vec<(Ticket, Result<(), Refusal>)> {
        let mut decided = Vec::new();
        while let Some(head) = self.parked.front() {
            if !self.fits_pool(limits, &head.claim) {
                break;
            }
            let check = self.share_check(limits, &head.claim, shares);
            if check == ShareCheck::ShortOfCredits {
                break;
            }
            let head = self.parked.pop_front().expect("front checked");
            let reserved = match check {
                ShareCheck::Fits => {
                    self.reserve(now, limits, head.claim);
                    Ok(())
                }
                _ => Err(Refusal::KeyShare),
            };
            decided.push((head.claim.ticket, reserved));
        }
        decided
    }

    /// The first parked request, when it fits B2 and waits only for credits for its key's share:
    /// its key, the key's share and what it needs of it (the owner asks that key's pool).
    pub fn head_short_of_share(
        &self,
        limits: &Limits,
        shares: ShareLookup,
    ) -> Option<(KeyId, f64, u64)> {
        let head = self.parked.front()?;
        (self.fits_pool(limits, &head.claim)
            && self.share_check(limits, &head.claim, shares) == ShareCheck::ShortOfCredits)
            .then(|| {
                (
                    head.claim.key,
                    head.claim.share,
                    head.claim.footprint.tokens(),
                )
            })
    }

    /// Parked requests whose deadline has passed, each with the gate that kept it waiting: B2
    /// (`429`, `Retry-After: 1`), or its key's share when it fits B2 but never got credits for
    /// it. The requests behind them may fit now, so call [`Occupancy::admit_parked`] afterwards.
    pub fn expire_parked(
        &mut self,
        now: Millis,
        limits: &Limits,
        shares: ShareLookup,
    ) -> Vec<(Ticket, Refusal)> {
        let (expired, kept): (VecDeque<Parked>, VecDeque<Parked>) =
            std::mem::take(&mut self.parked)
                .into_iter()
                .partition(|parked| parked.deadline <= now);
        self.parked = kept;
        expired
            .into_iter()
            .map(|parked| {
                let refusal = if self.fits_pool(limits, &parked.claim)
                    && self.share_check(limits, &parked.claim, shares) != ShareCheck::Fits
                {
                    Refusal::KeyShare
                } else {
                    Refusal::Budget
                };
                (parked.claim.ticket, refusal)
            })
            .collect()
    }

    /// The earliest park deadline, for the owner's timer.
    pub fn next_park_deadline(&self) -> Option<Millis> {
        self.parked.iter().map(|parked| parked.deadline).min()
    }

    /// Withdraws a parked request (its client left or its request deadline passed). True when it
    /// was parked.
    pub fn cancel_parked(&mut self, ticket: Ticket) -> bool {
        match self
            .parked
            .iter()
            .position(|parked| parked.claim.ticket == ticket)
        {
            Some(index) => {
                self.parked.remove(index);
                true
            }
            None => false,
        }
    }

    /// Output streamed so far by a request without declared output (or beyond it): the
    /// reservation grows to cover it. Never shrinks the declared footprint.
    pub fn grow(&mut self, now: Millis, ticket: Ticket, streamed_output: u64) {
        let Some(held) = self.held.get_mut(&ticket) else {
            return;
        };
        held.touched = now;
        let output = streamed_output.max(held.declared_output);
        if output > held.output {
            let added = output - held.output;
            held.output = output;
            self.tokens = self.tokens.saturating_add(added);
            if held.keyed {
                *self.by_key.entry(held.key).or_insert(0) += added;
            }
        }
    }

    /// The backend reported exact input usage: it replaces the estimate.
    pub fn true_up(&mut self, now: Millis, ticket: Ticket, exact_input: u64) {
        let Some(held) = self.held.get_mut(&ticket) else {
            return;
        };
        held.touched = now;
        let previous = held.input;
        held.input = exact_input;
        let (key, keyed) = (held.key, held.keyed);
        self.tokens = self.tokens - previous + exact_input;
        if keyed {
            let entry = self.by_key.entry(key).or_insert(0);
            *entry = *entry - previous + exact_input;
            if *entry == 0 {
                self.by_key.remove(&key);
            }
        }
    }

    /// The request is over (success, error, timeout or disconnect): the key it was held for.
    /// `None` when the pool did not hold it (released already, or never admitted).
    pub fn release(&mut self, now: Millis, ticket: Ticket) -> Option<KeyId> {
        let held = self.held.remove(&ticket)?;
        self.last_busy = now;
        self.tokens -= held.tokens();
        if held.keyed
            && let Some(entry) = self.by_key.get_mut(&held.key)
        {
            *entry -= held.tokens();
            if *entry == 0 {
                self.by_key.remove(&held.key);
            }
        }
        Some(held.key)
    }

    /// Releases reservations untouched for `max_idle_ms`: they outlived any possible request, so
    /// their release was lost. Returns how many (`hivenet_admission_reaped_total`).
    pub fn reap(&mut self, now: Millis, max_idle_ms: u64) -> usize {
        let stale: Vec<Ticket> = self
            .held
            .iter()
            .filter(|(_, held)| now.0.saturating_sub(held.touched.0) >= max_idle_ms)
            .map(|(ticket, _)| *ticket)
            .collect();
        for ticket in &stale {
            self.release(now, *ticket);
        }
        stale.len()
    }

    /// Nothing held or parked for [`IDLE_DROP_MS`]: the owner may drop this pool.
    pub fn is_idle(&self, now: Millis) -> bool {
        self.held.is_empty()
            && self.parked.is_empty()
            && now.0.saturating_sub(self.last_busy.0) >= IDLE_DROP_MS
    }

    fn fits_pool(&self, limits: &Limits, claim: &Claim) -> bool {
        let footprint = claim.footprint.tokens();
        let tokens_fit = limits.budget_tokens == 0
            || (self.tokens.saturating_add(footprint) <= limits.budget_tokens
                && limits
                    .credits
                    .is_none_or(|credits| credits.tokens.allows(self.tokens, footprint)));
        let count_fits = limits.max_inflight == 0
            || (self.inflight() < limits.max_inflight
                && limits
                    .credits
                    .is_none_or(|credits| credits.requests.allows(self.inflight(), 1)));
        tokens_fit && count_fits
    }

    /// What the key's requests hold here now, against its B4 share.
    pub fn key_tokens(&self, key: KeyId) -> u64 {
        self.by_key.get(&key).copied().unwrap_or(0)
    }

    fn share_check(&self, limits: &Limits, claim: &Claim, shares: ShareLookup) -> ShareCheck {
        let Some(limit) = claim.share_limit(limits) else {
            return ShareCheck::Fits;
        };
        let used = self.key_tokens(claim.key);
        let footprint = claim.footprint.tokens();
        if used.saturating_add(footprint) > limit {
            return ShareCheck::InUse;
        }
        match shares(claim.key, limit) {
            None => ShareCheck::Fits,
            Some(credits) if credits.allowance.allows(used, footprint) => ShareCheck::Fits,
            Some(credits) if credits.spent || credits.allowance.cap != Cap::Credits => {
                // Nothing more to ask for: the site's share is in use, or the store does not
                // answer and this router is at its part of it.
                ShareCheck::InUse
            }
            Some(_) => ShareCheck::ShortOfCredits,
        }
    }

    /// Reserves a claim that fits B2 and its share.
    fn reserve(&mut self, now: Millis, limits: &Limits, claim: Claim) {
        let footprint = claim.footprint.tokens();
        let keyed = claim.share_limit(limits).is_some();
        if keyed && footprint > 0 {
            *self.by_key.entry(claim.key).or_insert(0) += footprint;
        }
        self.tokens = self.tokens.saturating_add(footprint);
        self.last_busy = now;
        let previous = self.held.insert(
            claim.ticket,
            Held {
                key: claim.key,
                keyed,
                input: claim.footprint.input_tokens,
                output: claim.footprint.declared_output_tokens,
                declared_output: claim.footprint.declared_output_tokens,
                touched: now,
            },
        );
        debug_assert!(previous.is_none(), "a ticket reserved twice");
    }
}

#[cfg(test)]
mod tests;
