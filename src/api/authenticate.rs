//! Phase "authenticate": the client's API key (`Authorization: Bearer`, or `x-api-key`) against
//! the shard's key-registry snapshot, once per request, turned into the key's record.
//!
//! The raw key is hashed once and compared by hash in constant time (`auth::keys`); it is never
//! logged or kept. Model authorisation (403 `model_forbidden`, strict per-model quota) runs after
//! the body's `model` is known.

use crate::api::ClientRequest;
use crate::auth::config::ModelAccess;
use crate::auth::keys::{AuthOutcome, KeyRecord, KeyRegistry, presented_key};
use crate::error::Rejection;

/// Missing, unknown, expired or disabled keys are all 401; the expired one says so, because an
/// operator rotating keys needs to tell it apart from a typo.
pub fn authenticate<'r>(
    registry: &'r KeyRegistry,
    request: &ClientRequest,
    now_unix_ms: i64,
) -> Result<&'r KeyRecord, Rejection> {
    let presented = presented_key(
        request.authorization.as_deref(),
        request.x_api_key.as_deref(),
    );
    outcome(registry.authenticate(presented, now_unix_ms))
}

/// The 401 of each failed outcome, or the key.
pub fn outcome(outcome: AuthOutcome<'_>) -> Result<&KeyRecord, Rejection> {
    match outcome {
        AuthOutcome::Authenticated { key, .. } => Ok(key),
        AuthOutcome::Missing => Err(Rejection::unauthorized(
            "an API key is required: send Authorization: Bearer <key> or x-api-key",
        )),
        AuthOutcome::Unknown => Err(Rejection::unauthorized("invalid API key")),
        AuthOutcome::Expired { key } => {
            tracing::debug!(preview = %key.preview, "expired API key presented");
            Err(Rejection::unauthorized("API key has expired"))
        }
        AuthOutcome::Disabled { key } => {
            tracing::debug!(preview = %key.preview, "disabled API key presented");
            Err(Rejection::unauthorized("API key is disabled"))
        }
    }
}

/// May this key use `model`?
pub fn authorize_model(key: &KeyRecord, model: &str) -> Result<(), Rejection> {
    match key.authorize(model) {
        ModelAccess::Allowed => Ok(()),
        ModelAccess::Forbidden => Err(Rejection::model_forbidden(model)),
        ModelAccess::NoQuotaDeclared => Err(Rejection::no_quota_declared(model)),
    }
}

/// Wall-clock milliseconds for key expiry; the one clock read of this phase.
pub fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}
