//! [`KeyLimits`]: every bucket configured for one quota holder, and the order its checks run in.
//!
//! Order (seed `admission-control.md`, "Gate order"): the request-per-minute check runs right
//! after authentication ([`KeyLimits::admit_request`]); B1-B3 and the B4 occupancy share run in
//! the admission module; then [`KeyLimits::admit_tokens`] runs the rest of B4 in the seed's order
//! ("per-key occupancy share, output-rate state, and input tokens per minute") and the daily
//! token admission last. ITPM is "charged from the shared input estimate before the daily
//! budget", so an ITPM refusal spends no daily tokens; when the daily budget refuses, the ITPM
//! charge is given back, so a refused request spends no token bucket.
//!
//! The RPM unit is not given back when a later check refuses: the seed places the RPM check
//! before the gates, as a limit on requests made (it also protects `count_tokens`, which skips
//! every token gate), and its "release on later rejection" rule names occupancy reservations only.
//!
//! Shapes (auth-yaml reference): a flat quota has one RPM and one daily budget for every model,
//! plus B4 ITPM/OTPM buckets that are "independent for each key-and-model combination" (seed,
//! B4); a `quota.per_model` quota has, per listed model, an RPM per healthy replica and a daily
//! budget, and refuses unlisted models ("Strict enumeration").

use super::bucket::Bucket;
use super::daily::DailyAdmission;
use super::rate::RateDecision;
use super::share::Share;
use super::{
    BurstSeconds, DailyBudget, Day, LIMIT_MAX, LimitExceeded, LimitsConfigError, Millis,
    RejectionKind, RequestRate, TOKEN_RATE_MODELS_MAX, TokenRate,
};
use crate::base::ids::ModelId;

/// The flat quota shape: one budget for every model the key may call. `0` disables a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlatQuota {
    /// Requests per minute, shared by every model.
    pub requests_per_minute: u64,
    /// Tokens (input + output) per UTC day, shared by every model.
    pub tokens_per_day: u64,
    /// B4 (serverless models only): input tokens per minute, per model.
    pub input_tokens_per_minute: u64,
    /// B4 (serverless models only): output tokens per minute, per model.
    pub output_tokens_per_minute: u64,
}

/// One `quota.per_model` entry. `0` disables a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelQuota {
    pub model: ModelId,
    /// Requests per minute per healthy replica serving the model.
    pub requests_per_minute_per_replica: u64,
    /// Tokens per UTC day for this model; does not scale with replicas.
    pub tokens_per_day: u64,
}

/// A key's quota, already parsed and validated by the auth loader (shapes not mixed, no negative
/// values), with model names resolved to ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyQuota {
    Flat(FlatQuota),
    PerModel(Vec<ModelQuota>),
}

/// What the router knows about the requested model at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelContext {
    pub model: ModelId,
    /// Healthy replicas serving the model now, for a per-model RPM.
    pub healthy_replicas: u32,
    /// The model's effective policy has `mode: serverless`: B4 token rates run.
    pub serverless: bool,
}

/// The request's one input estimate and its declared maximum output
/// (`max_completion_tokens`, else `max_tokens`; `None` when undeclared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    pub input_tokens: u64,
    pub max_output_tokens: Option<u64>,
}

/// Exact usage after the response (backend usage, or estimates where the backend gave none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UsedTokens {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// How the response reached (or will reach) the client; decides what settling charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Already delivered (a stream): every token is charged, even past the daily budget.
    Streamed,
    /// Not yet delivered (non-streaming): output that no longer fits the daily budget is refused
    /// and not charged to it; the caller answers `429 token_limit_exceeded`.
    Buffered,
    /// Served by a provider fallback: no OTPM charge, no daily output, no input correction
    /// (seed, "Provider fallback accounting").
    Provider,
}

/// The RPM phase passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAdmission {
    /// For `X-RateLimit-Remaining-Requests`; `None` when the key has no finite RPM here.
    pub remaining_requests: Option<u64>,
}

/// What the token phase charged; hand it back to [`KeyLimits::settle`] or [`KeyLimits::cancel`].
/// Only what settling needs: it travels with the request (in its quota guard and, when the
/// key's owner is another shard, in three mesh messages), so what the headers need stays in
/// [`TokenAdmission`].
#[must_use = "a token charge must be settled or cancelled"]
#[derive(Debug, PartialEq, Eq)]
pub struct TokenCharge {
    model: ModelId,
    serverless: bool,
    /// Tokens taken from the model's ITPM bucket (0 when none).
    input_rate_tokens: u64,
    daily: Option<DailyAdmission>,
}

/// The token phase passed: the charge, and what is left for the response's headers.
#[must_use = "a token charge must be settled or cancelled"]
#[derive(Debug, PartialEq, Eq)]
pub struct TokenAdmission {
    pub charge: TokenCharge,
    /// For `X-RateLimit-Remaining-Requests` (filled by [`KeyLimits::admit`]).
    pub remaining_requests: Option<u64>,
    /// For `X-RateLimit-Remaining-Tokens`; `None` without a finite daily budget.
    pub remaining_tokens: Option<u64>,
}

impl TokenCharge {
    /// Whether a daily budget was charged: a non-streamed answer must then be checked against
    /// it before delivery.
    pub fn has_daily(&self) -> bool {
        self.daily.is_some()
    }
}

/// What settling decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// False when a [`Delivery::Buffered`] output did not fit the daily budget: answer
    /// `429 token_limit_exceeded` with `X-RateLimit-Remaining-Tokens: 0` and discard the body.
    pub output_fit: bool,
    pub remaining_tokens: Option<u64>,
}

#[derive(Debug, Clone)]
struct ModelLimits {
    model: ModelId,
    requests: Option<RequestRate>,
    daily: Option<DailyBudget>,
}

/// `Flat` is inline: most keys have flat limits, and their admissions read them without a
/// pointer to follow; a per-model key pays the difference (about 240 bytes) once per key.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
enum Shape {
    Flat {
        requests: Option<RequestRate>,
        daily: Option<DailyBudget>,
    },
    /// Sorted by model id, no duplicates.
    PerModel(Box<[ModelLimits]>),
}

#[derive(Debug, Clone)]
struct ModelTokenRates {
    model: ModelId,
    input: Option<TokenRate>,
    output: Option<TokenRate>,
}

impl ModelTokenRates {
    fn is_full(&self, now: Millis) -> bool {
        self.input.as_ref().is_none_or(|rate| rate.is_full(now))
            && self.output.as_ref().is_none_or(|rate| rate.is_full(now))
    }
}

/// Names one of a key's buckets for the sync round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketRef {
    /// The flat RPM (`model: None`) or a per-model RPM.
    Requests {
        model: Option<ModelId>,
    },
    InputTokens {
        model: ModelId,
    },
    OutputTokens {
        model: ModelId,
    },
    /// The flat daily budget (`model: None`) or a per-model one, for `day`.
    Daily {
        model: Option<ModelId>,
        day: Day,
    },
}

/// Every bucket configured for one quota holder (see the module doc for order and shapes).
#[derive(Debug, Clone)]
pub struct KeyLimits {
    shape: Shape,
    /// B4 per-model token rates (flat shape only; 0 disables).
    input_tokens_per_minute: u64,
    output_tokens_per_minute: u64,
    /// Created on a model's first serverless request, bounded by [`TOKEN_RATE_MODELS_MAX`],
    /// dropped by [`KeyLimits::compact`] once full again.
    token_rates: Vec<ModelTokenRates>,
}

fn check_limit(field: &'static str, value: u64) -> Result<u64, LimitsConfigError> {
    if value > LIMIT_MAX {
        return Err(LimitsConfigError::TooLarge { field, value });
    }
    Ok(value)
}

fn daily_rejection(model: ModelId, shortfall: super::daily::DailyShortfall) -> LimitExceeded {
    let kind = if shortfall.because_of_max_output {
        RejectionKind::DailyTokensForMaxOutput
    } else {
        RejectionKind::DailyTokens
    };
    LimitExceeded {
        kind,
        model,
        limit: shortfall.limit,
        remaining: shortfall.remaining,
        reset_seconds: None,
        retry_after_seconds: kind.retry_after_seconds(),
        remaining_requests: None,
    }
}

fn not_in_quota(model: ModelId) -> LimitExceeded {
    LimitExceeded {
        kind: RejectionKind::ModelNotInQuota,
        model,
        limit: 0,
        remaining: 0,
        reset_seconds: None,
        retry_after_seconds: None,
        remaining_requests: None,
    }
}

impl KeyLimits {
    /// Buckets for `quota`, all full, daily budgets starting on `day` at zero.
    pub fn new(
        now: Millis,
        day: Day,
        quota: &KeyQuota,
        burst: BurstSeconds,
    ) -> Result<KeyLimits, LimitsConfigError> {
        match quota {
            KeyQuota::Flat(flat) => {
                let rpm = check_limit("requests_per_minute", flat.requests_per_minute)?;
                let tokens_per_day = check_limit("tokens_per_day", flat.tokens_per_day)?;
                Ok(KeyLimits {
                    shape: Shape::Flat {
                        requests: (rpm > 0).then(|| RequestRate::flat(now, rpm, burst)),
                        daily: (tokens_per_day > 0).then(|| DailyBudget::new(day, tokens_per_day)),
                    },
                    input_tokens_per_minute: check_limit(
                        "input_tokens_per_minute",
                        flat.input_tokens_per_minute,
                    )?,
                    output_tokens_per_minute: check_limit(
                        "output_tokens_per_minute",
                        flat.output_tokens_per_minute,
                    )?,
                    token_rates: Vec::new(),
                })
            }
            KeyQuota::PerModel(entries) => {
                if entries.is_empty() {
                    return Err(LimitsConfigError::EmptyPerModel);
                }
                let mut models = Vec::with_capacity(entries.len());
                for entry in entries {
                    let rpm = check_limit(
                        "requests_per_minute_per_replica",
                        entry.requests_per_minute_per_replica,
                    )?;
                    let tokens_per_day = check_limit("tokens_per_day", entry.tokens_per_day)?;
                    models.push(ModelLimits {
                        model: entry.model,
                        requests: (rpm > 0).then(|| RequestRate::per_replica(now, rpm, burst)),
                        daily: (tokens_per_day > 0).then(|| DailyBudget::new(day, tokens_per_day)),
                    });
                }
                models.sort_unstable_by_key(|limits| limits.model);
                if let Some(pair) = models
                    .windows(2)
                    .find(|pair| pair[0].model == pair[1].model)
                {
                    return Err(LimitsConfigError::DuplicateModel(pair[0].model.0));
                }
                Ok(KeyLimits {
                    shape: Shape::PerModel(models.into_boxed_slice()),
                    input_tokens_per_minute: 0,
                    output_tokens_per_minute: 0,
                    token_rates: Vec::new(),
                })
            }
        }
    }

    /// The same key under a reloaded `quota`, keeping the usage of every bucket both
    /// configurations have (auth.yaml reload: usage and today's totals survive). A bucket the
    /// new quota adds starts full; one it removes is dropped.
    pub fn reconfigured(
        &self,
        now: Millis,
        day: Day,
        quota: &KeyQuota,
        burst: BurstSeconds,
    ) -> Result<KeyLimits, LimitsConfigError> {
        let mut next = KeyLimits::new(now, day, quota, burst)?;
        match (&mut next.shape, &self.shape) {
            (
                Shape::Flat { requests, daily },
                Shape::Flat {
                    requests: previous_requests,
                    daily: previous_daily,
                },
            ) => {
                if let (Some(rate), Some(previous)) = (requests.as_mut(), previous_requests) {
                    rate.inherit(now, previous);
                }
                if let (Some(budget), Some(previous)) = (daily.as_mut(), previous_daily) {
                    budget.inherit(previous);
                }
            }
            (Shape::PerModel(models), Shape::PerModel(previous_models)) => {
                for limits in models.iter_mut() {
                    let Some(previous) = previous_models
                        .iter()
                        .find(|previous| previous.model == limits.model)
                    else {
                        continue;
                    };
                    if let (Some(rate), Some(previous)) =
                        (limits.requests.as_mut(), previous.requests.as_ref())
                    {
                        rate.inherit(now, previous);
                    }
                    if let (Some(budget), Some(previous)) =
                        (limits.daily.as_mut(), previous.daily.as_ref())
                    {
                        budget.inherit(previous);
                    }
                }
            }
            // The shape changed: the buckets are different ones, nothing to carry over.
            _ => {}
        }
        for previous in &self.token_rates {
            if let Ok(Some(index)) = next.token_rates_index(now, previous.model) {
                let rates = &mut next.token_rates[index];
                if let (Some(input), Some(previous)) = (rates.input.as_mut(), &previous.input) {
                    input.inherit(now, previous);
                }
                if let (Some(output), Some(previous)) = (rates.output.as_mut(), &previous.output) {
                    output.inherit(now, previous);
                }
            }
        }
        next.compact(now);
        Ok(next)
    }

    fn model_limits(&mut self, model: ModelId) -> Option<&mut ModelLimits> {
        match &mut self.shape {
            Shape::Flat { .. } => None,
            Shape::PerModel(models) => models
                .binary_search_by_key(&model, |limits| limits.model)
                .ok()
                .map(|index| &mut models[index]),
        }
    }

    /// Whether the key may call `model` at all under its quota (strict enumeration of
    /// `quota.per_model`; a flat quota covers every model).
    pub fn covers(&self, model: ModelId) -> bool {
        match &self.shape {
            Shape::Flat { .. } => true,
            Shape::PerModel(models) => models
                .binary_search_by_key(&model, |limits| limits.model)
                .is_ok(),
        }
    }

    /// The daily budget a [`BucketRef::Daily`] names: the flat one (`None`) or a per-model one.
    /// `None` when the key has no such budget under its current quota.
    fn daily_bucket_mut(&mut self, model: Option<ModelId>) -> Option<&mut DailyBudget> {
        match model {
            None => match &mut self.shape {
                Shape::Flat { daily, .. } => daily.as_mut(),
                Shape::PerModel(_) => None,
            },
            Some(model) => self
                .model_limits(model)
                .and_then(|limits| limits.daily.as_mut()),
        }
    }

    fn daily_mut(&mut self, model: ModelId) -> Option<&mut DailyBudget> {
        match &mut self.shape {
            Shape::Flat { daily, .. } => daily.as_mut(),
            Shape::PerModel(models) => models
                .binary_search_by_key(&model, |limits| limits.model)
                .ok()
                .and_then(|index| models[index].daily.as_mut()),
        }
    }

    /// The request-per-minute check, run right after authentication for every endpoint (chat,
    /// messages, `count_tokens`, embeddings, reranking). Also refuses a model missing from
    /// `quota.per_model`.
    ///
    /// `share`: this router's part of the limit while the routers of a site share it
    /// (`limits::share`; [`Share::Whole`] alone).
    pub fn admit_request(
        &mut self,
        now: Millis,
        model: &ModelContext,
        share: Share,
    ) -> Result<RequestAdmission, LimitExceeded> {
        let (rate, scaled) = match &mut self.shape {
            Shape::Flat { requests, .. } => (requests.as_mut(), false),
            Shape::PerModel(models) => {
                let Ok(index) = models.binary_search_by_key(&model.model, |limits| limits.model)
                else {
                    return Err(not_in_quota(model.model));
                };
                (models[index].requests.as_mut(), true)
            }
        };
        let Some(rate) = rate else {
            return Ok(RequestAdmission {
                remaining_requests: None,
            });
        };
        let decision = if scaled {
            rate.admit_scaled(now, model.healthy_replicas, share)
        } else {
            rate.admit(now, share)
                .map(|remaining| RateDecision::Taken { remaining })
        };
        match decision {
            Ok(RateDecision::Taken { remaining }) => Ok(RequestAdmission {
                remaining_requests: Some(remaining),
            }),
            Ok(RateDecision::Skipped) => Ok(RequestAdmission {
                remaining_requests: None,
            }),
            Err(shortfall) => {
                let mut rejection = LimitExceeded::from_shortfall(
                    RejectionKind::RequestRate,
                    model.model,
                    shortfall,
                );
                rejection.remaining_requests = Some(0);
                Err(rejection)
            }
        }
    }

    /// The index of `model`'s B4 token-rate buckets, created full on first use. `Ok(None)` when
    /// the key has no token rates.
    fn token_rates_index(
        &mut self,
        now: Millis,
        model: ModelId,
    ) -> Result<Option<usize>, LimitExceeded> {
        if self.input_tokens_per_minute == 0 && self.output_tokens_per_minute == 0 {
            return Ok(None);
        }
        if let Some(index) = self
            .token_rates
            .iter()
            .position(|rates| rates.model == model)
        {
            return Ok(Some(index));
        }
        if self.token_rates.len() >= TOKEN_RATE_MODELS_MAX {
            self.compact(now);
        }
        if self.token_rates.len() >= TOKEN_RATE_MODELS_MAX {
            // Hundreds of models in use by one key within a minute: refuse rather than grow.
            return Err(LimitExceeded {
                kind: RejectionKind::InputTokenRate,
                model,
                limit: self.input_tokens_per_minute,
                remaining: 0,
                reset_seconds: Some(1),
                retry_after_seconds: Some(1),
                remaining_requests: None,
            });
        }
        let input_rate = self.input_tokens_per_minute;
        let output_rate = self.output_tokens_per_minute;
        self.token_rates.push(ModelTokenRates {
            model,
            input: (input_rate > 0).then(|| TokenRate::new(now, input_rate)),
            output: (output_rate > 0).then(|| TokenRate::new(now, output_rate)),
        });
        Ok(Some(self.token_rates.len() - 1))
    }

    /// B4's output-rate state and input tokens per minute (serverless models only), then the
    /// daily token admission. On refusal nothing stays charged. `share` as for
    /// [`KeyLimits::admit_request`]; it limits the input side only.
    pub fn admit_tokens(
        &mut self,
        now: Millis,
        day: Day,
        model: &ModelContext,
        estimate: Estimate,
        share: Share,
    ) -> Result<TokenAdmission, LimitExceeded> {
        if !self.covers(model.model) {
            return Err(not_in_quota(model.model));
        }
        let mut input_rate_tokens = 0;
        let rates_index = if model.serverless {
            self.token_rates_index(now, model.model)?
        } else {
            None
        };
        if let Some(index) = rates_index {
            let rates = &mut self.token_rates[index];
            if let Some(output) = rates.output.as_mut() {
                output.check_not_drained(now).map_err(|shortfall| {
                    LimitExceeded::from_shortfall(
                        RejectionKind::OutputTokenRate,
                        model.model,
                        shortfall,
                    )
                })?;
            }
            if let Some(input) = rates.input.as_mut() {
                input
                    .take(now, estimate.input_tokens, share)
                    .map_err(|shortfall| {
                        LimitExceeded::from_shortfall(
                            RejectionKind::InputTokenRate,
                            model.model,
                            shortfall,
                        )
                    })?;
                input_rate_tokens = estimate.input_tokens;
            }
        }
        let (daily, remaining_tokens) = match self.daily_mut(model.model) {
            None => (None, None),
            Some(budget) => {
                match budget.admit(
                    day,
                    estimate.input_tokens,
                    estimate.max_output_tokens,
                    share,
                ) {
                    Ok(admission) => (Some(admission), Some(budget.remaining(day))),
                    Err(shortfall) => {
                        if let Some(index) = rates_index
                            && let Some(input) = self.token_rates[index].input.as_mut()
                        {
                            input.refund(input_rate_tokens);
                        }
                        return Err(daily_rejection(model.model, shortfall));
                    }
                }
            }
        };
        Ok(TokenAdmission {
            charge: TokenCharge {
                model: model.model,
                serverless: model.serverless,
                input_rate_tokens,
                daily,
            },
            remaining_requests: None,
            remaining_tokens,
        })
    }

    /// Both admit phases, for a caller with no gate in between (a refusal of the token phase
    /// keeps the RPM unit, see the module doc).
    pub fn admit(
        &mut self,
        now: Millis,
        day: Day,
        model: &ModelContext,
        estimate: Estimate,
        share: Share,
    ) -> Result<TokenAdmission, LimitExceeded> {
        let request = self.admit_request(now, model, share)?;
        match self.admit_tokens(now, day, model, estimate, share) {
            Ok(mut admission) => {
                admission.remaining_requests = request.remaining_requests;
                Ok(admission)
            }
            Err(mut rejection) => {
                rejection.remaining_requests = request.remaining_requests;
                Err(rejection)
            }
        }
    }

    /// After the response: charge the exact output to the model's OTPM bucket (at most one
    /// minute), correct the daily input to exact usage and charge the daily output.
    pub fn settle(
        &mut self,
        now: Millis,
        day: Day,
        charge: TokenCharge,
        usage: UsedTokens,
        delivery: Delivery,
    ) -> Settlement {
        if delivery == Delivery::Provider {
            return Settlement {
                output_fit: true,
                remaining_tokens: self.daily_mut(charge.model).map(|b| b.remaining(day)),
            };
        }
        if charge.serverless && self.output_tokens_per_minute > 0 {
            // The entry may have been compacted away (it was full): recreate it to charge. If the
            // per-key bound refuses, the charge is dropped rather than growing memory.
            if let Ok(Some(index)) = self.token_rates_index(now, charge.model)
                && let Some(output) = self.token_rates[index].output.as_mut()
            {
                output.charge(now, usage.output_tokens);
            }
        }
        let Some(budget) = self.daily_mut(charge.model) else {
            return Settlement {
                output_fit: true,
                remaining_tokens: None,
            };
        };
        let Some(daily) = charge.daily else {
            return Settlement {
                output_fit: true,
                remaining_tokens: Some(budget.remaining(day)),
            };
        };
        let settled = budget.settle(
            day,
            daily,
            usage.input_tokens,
            usage.output_tokens,
            delivery == Delivery::Buffered,
        );
        Settlement {
            output_fit: settled.output_fit,
            remaining_tokens: Some(settled.remaining),
        }
    }

    /// Give back what the token phase charged, for a request that was admitted but never
    /// forwarded (refused by a later phase, or the client left while it was held).
    pub fn cancel(&mut self, charge: TokenCharge) {
        if charge.input_rate_tokens > 0
            && let Some(rates) = self
                .token_rates
                .iter_mut()
                .find(|rates| rates.model == charge.model)
            && let Some(input) = rates.input.as_mut()
        {
            input.refund(charge.input_rate_tokens);
        }
        if let Some(daily) = charge.daily
            && let Some(budget) = self.daily_mut(charge.model)
        {
            budget.refund(daily);
        }
    }

    /// Drop B4 token-rate buckets that are full again: recreating them full later loses nothing.
    pub fn compact(&mut self, now: Millis) {
        self.token_rates.retain(|rates| !rates.is_full(now));
    }

    /// Nothing worth keeping: every rate bucket is full and every daily budget belongs to a past
    /// day or is unused today. The owner drops idle keys every five minutes (seed, "Idle-state
    /// cleanup") and recreates them full on the next request. Run it after the sync round has
    /// taken the deltas, so no unpublished usage is dropped.
    pub fn is_idle(&self, now: Millis, day: Day) -> bool {
        let shape_idle = match &self.shape {
            Shape::Flat { requests, daily } => {
                requests.as_ref().is_none_or(|rate| rate.is_full(now))
                    && daily.as_ref().is_none_or(|budget| budget.is_idle(day))
            }
            Shape::PerModel(models) => models.iter().all(|limits| {
                limits
                    .requests
                    .as_ref()
                    .is_none_or(|rate| rate.is_full(now))
                    && limits
                        .daily
                        .as_ref()
                        .is_none_or(|budget| budget.is_idle(day))
            }),
        };
        shape_idle && self.token_rates.iter().all(|rates| rates.is_full(now))
    }

    /// Tokens one daily budget counts as used on `day` by every router (for the site's
    /// simulation, `router::sync::simulation`). `None` when the key has no such budget.
    #[cfg(test)]
    pub fn daily_used(&mut self, model: Option<ModelId>, day: Day) -> Option<u64> {
        self.daily_bucket_mut(model).map(|budget| budget.used(day))
    }

    /// The day a daily budget counts (for the site's simulation).
    #[cfg(test)]
    pub fn daily_day(&mut self, model: Option<ModelId>) -> Option<Day> {
        self.daily_bucket_mut(model).map(|budget| budget.day())
    }

    /// Requests the flat RPM bucket holds at `now` (for the site's simulation).
    #[cfg(test)]
    pub fn requests_left(&self, now: Millis) -> Option<i64> {
        match &self.shape {
            Shape::Flat { requests, .. } => requests.as_ref().map(|rate| rate.level(now)),
            Shape::PerModel(_) => None,
        }
    }

    /// Whether the key has a daily budget for `model` (the flat one, or the model's own).
    pub fn has_daily(&mut self, model: ModelId) -> bool {
        self.daily_mut(model).is_some()
    }
}

mod anchors;
mod rounds;

#[cfg(test)]
mod tests;
