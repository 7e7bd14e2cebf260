//! Phase "authenticate": the client's API key (`Authorization: Bearer`, or `x-api-key`) against
//! the shard's key-registry snapshot, once per request, turned into the key's record.
//!
//! The raw key is hashed once and compared by hash in constant time (`auth::keys`); it is never
//! logged or kept. Model authorisation (403 `model_forbidden`, strict per-model quota) runs after
//! the body's `model` is known.

use crate::logic::auth::keys::{AuthOutcome, KeyRecord, KeyRegistry, presented_key};
use crate::router::api::request::ClientRequest;
use crate::router::error::Rejection;

/// The presented key's record, or its 401 (see `api::refusal::credentials`).
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

/// The 401 of each failed outcome (`api::refusal::credentials`), or the key; an expired or
/// disabled key is logged by its preview.
pub fn outcome(outcome: AuthOutcome<'_>) -> Result<&KeyRecord, Rejection> {
    match &outcome {
        AuthOutcome::Expired { key } => {
            tracing::debug!(preview = %key.preview, "expired API key presented");
        }
        AuthOutcome::Disabled { key } => {
            tracing::debug!(preview = %key.preview, "disabled API key presented");
        }
        _ => {}
    }
    crate::router::api::refusal::credentials(outcome)
}

/// May this key use `model`?
pub fn authorize_model(key: &KeyRecord, model: &str) -> Result<(), Rejection> {
    crate::router::api::refusal::model_access(key.authorize(model), model)
}

pub use crate::base::clock::now_unix_ms;

/// What a request head says about its credentials, for [`on_head`].
#[derive(Debug, Clone, Copy)]
pub struct HeadCredentials<'h> {
    pub route: crate::wire::http::route::Route,
    /// The request target (path and query): an arriving redirect token rides in the query.
    pub target: &'h [u8],
    pub authorization: Option<&'h [u8]>,
    pub x_api_key: Option<&'h [u8]>,
}

/// The authenticate phase run on the head alone, before a body is read: a request whose credentials
/// cannot pass is refused without the router holding its body (held in memory, 100 unauthenticated
/// 5 MiB bodies take a router from 37 MB to 656 MB). What passes here is authenticated again,
/// fully, once the body is in (the registry may change meanwhile, and a redirect token is only
/// spent there).
pub fn on_head(
    shard: &crate::router::shard::state::Shard,
    head: HeadCredentials<'_>,
    now_unix_ms: i64,
) -> Result<(), Rejection> {
    use crate::wire::http::route::Route;
    match head.route {
        Route::Health | Route::Ready => Ok(()),
        Route::Admin => {
            // Admin keys come only as `Authorization: Bearer` (`api::admin`).
            let presented = crate::logic::auth::keys::bearer_token(head.authorization);
            if shard.admin_access().authorize(presented) {
                Ok(())
            } else {
                Err(Rejection::unauthorized("unauthorized"))
            }
        }
        _ => {
            if let Some(site) = &shard.settings.site
                && let Some(token) = crate::logic::sibling::token::from_target(head.target)
            {
                return crate::logic::sibling::token::verify(&site.secrets, token, now_unix_ms)
                    .map(|_| ())
                    .map_err(|_| Rejection::unauthorized("redirect token is invalid"));
            }
            let presented = presented_key(head.authorization, head.x_api_key);
            outcome(shard.keys().authenticate(presented, now_unix_ms)).map(|_| ())
        }
    }
}
