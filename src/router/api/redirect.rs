//! Cross-site redirect on the request path (`docs/cross-site-redirect.md`).
//!
//! Leaving: a request for a model not served here, that a sibling site in the map serves, gets
//! `307` to that site's URL for the same path, with a signed, expiring, single-use redirect token
//! in the query (clients drop `Authorization` on a cross-origin redirect). The site is chosen by
//! `sibling::map::SiblingMap::choose_site` (the caller's home set); a request already redirected
//! twice is not redirected again.
//!
//! Arriving: a request carrying a token is authenticated by it instead of by its credentials —
//! the token must verify under one of this site's redirect secrets, be unexpired, be meant for
//! this site, name a key this site knows (enabled, unexpired), name the model the body asks for,
//! and be spent for the first time on this router. The key's limits then apply as usual.

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::logic::auth::keys::{KeyRecord, KeyRegistry, KeySource};
use crate::logic::sibling::map::{Kind, RedirectAsk, SiblingMap};
use crate::logic::sibling::token::{self, RedirectClaims};
use crate::logic::snapshot::{ModelEntry, RoutingSnapshot};
use crate::router::api::forward::Outcome;
use crate::router::api::request::ClientRequest;
use crate::router::api::sink::Sink;
use crate::router::config::RedirectSite;
use crate::router::error::Rejection;
use crate::router::shard::state::Shard;
use crate::wire::http::route::Route;

/// A redirected request is not redirected again after this many hops.
pub const MAX_HOPS: u8 = 2;

/// How long an arriving request may wait for its token to be spent.
const SPEND_TIMEOUT: Duration = Duration::from_secs(2);

/// The redirect token in the request's query, when this router takes part in redirects.
pub fn arriving_token<'r>(shard: &Shard, request: &'r ClientRequest) -> Option<&'r str> {
    shard.settings.site.as_ref()?;
    token::from_target(&request.target)
}

/// Authenticates a request by its redirect token (see the module docs); the token is spent.
pub async fn authenticate<'k>(
    shard: &Rc<Shard>,
    site: &RedirectSite,
    keys: &'k KeyRegistry,
    token_text: &str,
    now_unix_ms: i64,
) -> Result<(&'k KeyRecord, RedirectClaims), Rejection> {
    let claims = token::verify(&site.secrets, token_text, now_unix_ms).map_err(|error| {
        tracing::debug!(%error, "redirect token refused");
        crate::router::api::refusal::redirect_token(&error)
    })?;
    if claims.to_site != site.id {
        return Err(Rejection::unauthorized(
            "redirect token was issued for another site",
        ));
    }
    let key = crate::router::api::authenticate::outcome(
        keys.authenticate_vouched(&claims.key, now_unix_ms),
    )?;
    let deadline = Instant::now() + SPEND_TIMEOUT;
    let fresh = match shard
        .spend_redirect_token(claims.nonce, claims.expires_unix_ms, deadline)
        .await
    {
        Some(fresh) => fresh,
        None => return Err(Rejection::queue_full()),
    };
    // Used here already, or, while the store answers, anywhere in the site.
    let fresh = fresh
        && match &shard.settings.site_tokens {
            Some(tokens) => {
                let ttl_ms = (claims.expires_unix_ms - now_unix_ms).max(1) as u64;
                match tokens.spend(claims.nonce, ttl_ms).await.accepts() {
                    Some(fresh) => fresh,
                    None => return Err(Rejection::redirect_token_unchecked()),
                }
            }
            None => true,
        };
    if fresh {
        Ok((key, claims))
    } else {
        Err(Rejection::unauthorized("redirect token was already used"))
    }
}

/// The arriving token must be for the model the body asks for.
pub fn check_model(claims: &RedirectClaims, model: &str) -> Result<(), Outcome> {
    if claims.model == model {
        Ok(())
    } else {
        Err(Rejection::unauthorized("redirect token was issued for another model").into())
    }
}

/// What a sibling site is told about the caller: the key every site knows it by.
fn vouched_key(key: &KeyRecord) -> String {
    match &key.source {
        KeySource::Dynamic { id } => id.clone(),
        KeySource::Anonymous => String::new(),
        // Start-up refuses `--site-id` with static keys; name the derived ID all the same.
        KeySource::Static { .. } => key.key_id.to_string(),
    }
}

/// Where to send a request whose model has no healthy agent here (`found` is its routing entry,
/// if any; `holdable_here`: this site may hold it), when this router takes part in redirects and
/// has a map: the `Location` of the
/// sibling, with its token. `None`: serve it here (hold it, or fail as usual).
#[allow(clippy::too_many_arguments)]
pub fn elsewhere(
    shard: &Shard,
    snapshot: &RoutingSnapshot,
    found: Option<&ModelEntry>,
    holdable_here: bool,
    key: &KeyRecord,
    model: &str,
    route: Route,
    arrival: Option<&RedirectClaims>,
) -> Option<String> {
    if found.is_some_and(|entry| entry.healthy_agents > 0) {
        return None;
    }
    let (site, map) = (shard.settings.site.as_ref()?, snapshot.siblings.as_ref()?);
    location(
        site,
        map,
        key,
        model,
        route,
        holdable_here,
        arrival,
        crate::router::api::authenticate::now_unix_ms(),
    )
}

/// The `307` itself: `Location` and a small JSON body naming it.
pub async fn answer<S: Sink>(sink: &mut S, location: &str) -> Result<u16, Outcome> {
    let mut body = Vec::with_capacity(location.len() + 16);
    body.extend_from_slice(b"{\"location\":");
    crate::wire::http::response::put_json_string(&mut body, location);
    body.push(b'}');
    sink.respond(
        307,
        "application/json",
        &[("location", location.as_bytes())],
        &body,
    )
    .await
    .map(|()| 307)
    .map_err(|_| Outcome::Gone)
}

/// The redirect decision for a request with no healthy agent here: the `Location` value, or
/// `None` to serve (hold, or fail) here.
#[allow(clippy::too_many_arguments)]
fn location(
    site: &RedirectSite,
    map: &SiblingMap,
    key: &KeyRecord,
    model: &str,
    route: Route,
    holdable_here: bool,
    arrival: Option<&RedirectClaims>,
    now_unix_ms: i64,
) -> Option<String> {
    let hops = arrival.map_or(0, |claims| claims.hops);
    if hops >= MAX_HOPS {
        return None;
    }
    let vouched = vouched_key(key);
    let target = map.choose_site(&RedirectAsk {
        local_site: &site.id,
        key: &vouched,
        model,
        kind: Kind::of_capability(route.capability()),
        came_from: arrival.map(|claims| claims.from_site.as_str()),
        holdable_here,
        now_unix_ms,
    })?;
    let claims = RedirectClaims {
        key: vouched,
        model: model.to_owned(),
        hops: hops + 1,
        from_site: site.id.clone(),
        to_site: target.id.clone(),
        expires_unix_ms: now_unix_ms + token::TOKEN_TTL.as_millis() as i64,
        nonce: fastrand::u128(..).to_be_bytes(),
    };
    let signed = token::sign(&site.secrets, &claims);
    Some(token::location(&target.url, route.upstream_path(), &signed))
}
