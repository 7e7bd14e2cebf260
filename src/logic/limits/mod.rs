//! Per-key limits: request rate, input and output token rates, and the daily token budget, as
//! plain data the owner shard mutates with single-threaded code.
//!
//! This module owns the arithmetic of every per-key bucket and the order in which a key's checks
//! run (seed `admission-control.md`, "Gate order": the request-per-minute check, then B4's
//! output-rate state and input tokens per minute, then daily token admission). It must not read a
//! clock, do I/O, allocate on the admit path of a warmed key, or know about HTTP: the caller passes
//! monotonic time ([`Millis`]) and the UTC day ([`Day`]) in, and gets decisions
//! ([`TokenAdmission`] and its [`TokenCharge`], [`LimitExceeded`], [`Settlement`]) back.
//! `api::refusal` turns a [`LimitExceeded`] into a status, code, envelope and headers.
//!
//! # Key components
//! - [`bucket::Bucket`]: a continuously refilling token bucket in exact integer arithmetic.
//! - [`RequestRate`] (RPM, with `HIVENET_ROUTER_RPM_BURST_SECONDS` and replica scaling) and
//!   [`TokenRate`] (ITPM charged before forwarding, OTPM charged after the response).
//! - [`DailyBudget`]: tokens per UTC day, input admitted from the estimate and trued up, output
//!   deducted after.
//! - [`KeyLimits`]: every bucket configured for one quota holder, with `admit`/`settle`.
//!
//! # Architecture
//! The owner shard keeps one [`KeyLimits`] per quota holder it owns (`shard::owner::quotas`: the
//! key's owner for RPM and daily budgets, the key itself for B4 token rates) and calls, in request
//! order:
//! [`KeyLimits::admit_request`] (before B1), [`KeyLimits::admit_tokens`] (after B1-B3 and the
//! B4 occupancy share), and [`KeyLimits::settle`] once exact usage is known.
//! [`KeyLimits::admit`] does both admit phases for a caller with nothing in between. Every bucket
//! also exposes `take_delta` (usage admitted here since the last sync round) and `apply_remote`
//! (usage other routers admitted), which is all the later sync round needs (seed
//! `run-several-routers.md`, "How it works", steps 1-2).
//!
//! # Invariants
//! - A bucket never holds more than its capacity and never owes more than one capacity: the floor
//!   at minus one capacity bounds how long after-the-fact charges lock a key out to one minute.
//! - Over any stretch of time, admitted requests never exceed capacity + rate x elapsed (the
//!   proptests in `bucket` check this).
//! - A rejected `admit_tokens` leaves every token bucket as it found it.
//!
//! # Error handling
//! Refusals are [`LimitExceeded`] values with `'static` messages; configuration errors are
//! [`LimitsConfigError`].
//!
//! # Performance
//! `benches/admission.rs` measures one admission of a key with RPM, ITPM, OTPM and a daily budget
//! and counts allocations on that path (zero).

pub mod bucket;
mod daily;
mod key;
mod rate;
pub mod share;

pub use bucket::{Bucket, Shortfall};
pub use daily::{DailyAdmission, DailyBudget, DailySettlement, DailyShortfall};
pub use key::{
    BucketRef, Delivery, Estimate, FlatQuota, KeyLimits, KeyQuota, ModelContext, ModelQuota,
    RequestAdmission, Settlement, TokenAdmission, TokenCharge, UsedTokens,
};
pub use rate::{BurstSeconds, BurstSecondsError, RateDecision, RequestRate, TokenRate};
pub use share::Share;

use crate::base::ids::ModelId;

pub use crate::base::clock::{Day, Millis, SECONDS_PER_DAY};

/// Largest configurable limit (per minute or per day) and the largest single charge, in tokens or
/// requests. 2^40 (about 1.1 x 10^12) keeps the fixed-point bucket arithmetic inside `i64`.
pub const LIMIT_MAX: u64 = 1 << 40;

/// The most models one key keeps B4 token-rate buckets for at once; a bound on memory per key.
/// Full (idle) entries are reclaimed first when it is reached.
pub const TOKEN_RATE_MODELS_MAX: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsConfigError {
    #[error("{field} is {value}, over the largest supported limit of {LIMIT_MAX}")]
    TooLarge { field: &'static str, value: u64 },
    #[error("quota.per_model is empty: list every model the key may call")]
    EmptyPerModel,
    #[error("quota.per_model lists model id {0} twice")]
    DuplicateModel(u32),
}

/// Which limit refused a request. Each kind maps to one documented code and message
/// (`reference-error-codes.mdx`, "rate_limit_exceeded" and "token_limit_exceeded").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionKind {
    /// The request-per-minute bucket is empty. `429 rate_limit_exceeded`, no `Retry-After`.
    RequestRate,
    /// `quota.per_model` does not list the model (strict enumeration). `429 rate_limit_exceeded`.
    ModelNotInQuota,
    /// B4: recent output drained the key's output-token bucket. `Retry-After: 1`.
    OutputTokenRate,
    /// B4: the input estimate does not fit the input-token bucket. `Retry-After: 1`.
    InputTokenRate,
    /// The day's budget cannot cover the estimated input plus the declared maximum output.
    DailyTokensForMaxOutput,
    /// The day's budget cannot cover the estimated input (no output was declared), or is spent.
    DailyTokens,
}

impl RejectionKind {
    pub fn code(self) -> &'static str {
        match self {
            RejectionKind::DailyTokens | RejectionKind::DailyTokensForMaxOutput => {
                "token_limit_exceeded"
            }
            _ => "rate_limit_exceeded",
        }
    }

    /// The documented message. `ModelNotInQuota`'s documented message names the model
    /// ("no quota declared for model X on this API key"); the error layer formats it from
    /// [`LimitExceeded::model`] on that configuration-error path.
    pub fn message(self) -> &'static str {
        match self {
            RejectionKind::RequestRate => "rate limit exceeded",
            RejectionKind::ModelNotInQuota => "no quota declared for this model on this API key",
            RejectionKind::OutputTokenRate => "output token rate exceeded, please retry",
            RejectionKind::InputTokenRate => "input token rate exceeded, please retry",
            RejectionKind::DailyTokensForMaxOutput => {
                "insufficient daily token budget for requested max_tokens"
            }
            RejectionKind::DailyTokens => "daily token budget exhausted",
        }
    }

    /// B4 rejections set `Retry-After: 1`; the ordinary RPM limiter and the daily budget do not
    /// (seed, "B4: serverless key limits", last paragraph).
    pub fn retry_after_seconds(self) -> Option<u32> {
        match self {
            RejectionKind::OutputTokenRate | RejectionKind::InputTokenRate => Some(1),
            _ => None,
        }
    }
}

/// A refusal, as data: no allocation. Header values come straight from it:
/// `X-RateLimit-Remaining-Requests` from `remaining_requests`, `X-RateLimit-Remaining-Tokens` from
/// `remaining` when `kind` is a daily kind, `Retry-After` from `retry_after_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitExceeded {
    pub kind: RejectionKind,
    pub model: ModelId,
    /// The refusing bucket's limit (per minute, or per day), in requests or tokens.
    pub limit: u64,
    /// What the refusing bucket has left, floored at zero.
    pub remaining: u64,
    /// Seconds until the refused amount would fit in the bucket; `None` when it never will by
    /// refilling (an estimate over a minute's capacity) or for daily kinds (the next UTC midnight
    /// is computed by the caller from its wall clock with [`Day::seconds_until_next`]).
    pub reset_seconds: Option<u32>,
    pub retry_after_seconds: Option<u32>,
    /// Requests left in the key's finite RPM bucket, for `X-RateLimit-Remaining-Requests`.
    pub remaining_requests: Option<u64>,
}

impl LimitExceeded {
    /// A daily refusal with nothing left to report (`X-RateLimit-Remaining-Tokens: 0`): a
    /// non-streamed answer whose output no longer fits, or a key whose total cannot be read.
    pub fn daily_spent(model: ModelId) -> LimitExceeded {
        LimitExceeded {
            kind: RejectionKind::DailyTokens,
            model,
            limit: 0,
            remaining: 0,
            reset_seconds: None,
            retry_after_seconds: None,
            remaining_requests: None,
        }
    }

    fn from_shortfall(kind: RejectionKind, model: ModelId, shortfall: Shortfall) -> LimitExceeded {
        LimitExceeded {
            kind,
            model,
            limit: shortfall.limit,
            remaining: shortfall.remaining,
            reset_seconds: shortfall.reset_seconds,
            retry_after_seconds: kind.retry_after_seconds(),
            remaining_requests: None,
        }
    }
}
