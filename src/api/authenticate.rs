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

pub use crate::clock::now_unix_ms;

/// What a request head says about its credentials, for [`on_head`].
#[derive(Debug, Clone, Copy)]
pub struct HeadCredentials<'h> {
    pub route: crate::api::Route,
    /// The request target (path and query): an arriving redirect token rides in the query.
    pub target: &'h [u8],
    pub authorization: Option<&'h [u8]>,
    pub x_api_key: Option<&'h [u8]>,
}

/// The authenticate phase run on the head alone, before a body is read: a request whose
/// credentials cannot pass is refused without the router holding its body (issue 10: 100
/// unauthenticated 5 MiB bodies once took a router from 37 MB to 656 MB). What passes here is
/// authenticated again, fully, once the body is in (the registry may change meanwhile, and a
/// redirect token is only spent there).
pub fn on_head(
    shard: &crate::shard::state::Shard,
    head: HeadCredentials<'_>,
    now_unix_ms: i64,
) -> Result<(), Rejection> {
    use crate::api::Route;
    match head.route {
        Route::Health => Ok(()),
        Route::Admin => {
            // Admin keys come only as `Authorization: Bearer` (`api::admin`).
            let presented = crate::auth::keys::bearer_token(head.authorization);
            if shard.admin_access().authorize(presented) {
                Ok(())
            } else {
                Err(Rejection::unauthorized("unauthorized"))
            }
        }
        _ => {
            if let Some(site) = &shard.settings.site
                && let Some(token) = crate::sibling::token::from_target(head.target)
            {
                return crate::sibling::token::verify(&site.secrets, token, now_unix_ms)
                    .map(|_| ())
                    .map_err(|_| Rejection::unauthorized("redirect token is invalid"));
            }
            let presented = presented_key(head.authorization, head.x_api_key);
            outcome(shard.keys().authenticate(presented, now_unix_ms)).map(|_| ())
        }
    }
}
