//! The sibling map: the sites of a deployment, where each model is placed (which site serves it,
//! for which endpoint kind, whether it may be held there at zero), the warm hints the map writer
//! computed, and the redirect decision built on them ([`SiblingMap::choose_site`]).
//!
//! Pure logic: no I/O, no clock (callers pass `now`). A map is immutable once parsed; a push
//! replaces it whole, and any invalid value rejects the whole push (`400` with the
//! [`MapError`] text), so a half-valid map is never active.
//!
//! # The `PUT /admin/sibling-map` body
//!
//! ```json
//! {
//!   "sites": [{"id": "site-fr-1", "url": "https://fr1.example.com"}],
//!   "placements": [
//!     {"model": "llama-3-70b", "kind": "chat", "site": "site-fr-1",
//!      "scale_from_zero": true, "hold_budget": "240s", "warm": false}
//!   ],
//!   "generated_at": "2026-11-29T20:00:00Z",
//!   "fresh_for": "60s"
//! }
//! ```
//!
//! Unknown fields are refused at every level.
//!
//! - `sites` (required array, may be empty, at most [`MAX_SITES`]): `id` is 1 to
//!   [`MAX_SITE_ID_BYTES`] bytes of `[A-Za-z0-9._-]`, unique. `url` is `http://` or `https://`,
//!   a host with an optional port, and an optional path prefix; no user info, query or fragment;
//!   a trailing slash is trimmed. Except for the local site (whose URL is never a redirect
//!   target), the host must be one of the start-up's allowed domains or a subdomain of one,
//!   compared without letter case: `a.b.example.com` is under `example.com`, `badexample.com` is
//!   not.
//! - `placements` (required array, may be empty, at most [`MAX_PLACEMENTS`]): `model` is 1 to
//!   [`MAX_MODEL_BYTES`] bytes; `kind` is `chat` (`/v1/chat/completions`, `/v1/messages`),
//!   `embedding` (`/v1/embeddings`) or `rerank` (`/v1/rerank`); `site` is a listed site id or the
//!   local site's id. `scale_from_zero` (default `false`) lets the site hold requests for the
//!   model while it is asleep. `hold_budget` (optional Go duration, `0 < d <= 1h`) overrides the
//!   hold budget flag for that placement; it is checked on every placement but only used with
//!   `scale_from_zero`. `warm` (optional) is the map writer's hint that the model is running
//!   (`true`) or asleep (`false`) there; absent means unknown. One placement per
//!   (model, kind, site).
//! - `generated_at` (optional RFC 3339) and `fresh_for` (optional Go duration `> 0`) come
//!   together: the `warm` hints are trusted from `generated_at` until `generated_at + fresh_for`.
//!
//! # Invariants of a parsed map
//!
//! Site ids are unique and every placement's site is a listed site or the local site; no two
//! placements share (model, kind, site); every hold budget is in `(0, 1h]`; the freshness window
//! is either complete or absent. The redirect decision only ever returns a listed site other than
//! the local site, so its URL passed the domain check.

use std::collections::HashMap;
use std::time::Duration;

use sha2::{Digest, Sha256};

mod document;
mod placement;
pub use document::{
    MAX_HOLD_BUDGET, MAX_MODEL_BYTES, MAX_PLACEMENTS, MAX_SITE_ID_BYTES, MAX_SITES, MAX_URL_BYTES,
    MapError, MapRules,
};
use document::{
    RawMap, WireMap, WirePlacement, WireSite, go_duration, parse_placements, parse_sites,
    parse_window, rfc3339_utc,
};
pub use placement::{Kind, Placement, Site};

/// Size of a caller's home set: the sites a key is redirected to for a model.
pub const HOME_SET_SIZE: usize = 2;

/// Domain separation for the rendezvous score, so the hash means only this (version it if the
/// score ever changes: every router of every site must compute the same home set).
const HOME_SET_DOMAIN: &[u8] = b"hivenet-router/home-set/v1\0";

/// The active sibling map. See the module docs for the body it is parsed from and its invariants.
#[derive(Debug, Clone, PartialEq)]
pub struct SiblingMap {
    sites: Vec<Site>,
    placements: Vec<Placement>,
    generated_at_unix_ms: Option<i64>,
    fresh_for: Option<Duration>,
    /// Site id -> index in `sites`.
    site_index: HashMap<String, usize>,
    /// Per kind (indexed by `Kind as usize`): model -> indexes in `placements`, in push order.
    by_model: [HashMap<String, Vec<usize>>; 3],
}

/// The question [`SiblingMap::choose_site`] answers: where should this request go?
#[derive(Debug, Clone, Copy)]
pub struct RedirectAsk<'a> {
    /// This router's `--site-id`; never a candidate.
    pub local_site: &'a str,
    /// Stable identity of the caller for rendezvous hashing: the dynamic key's registry id, or ""
    /// for auth mode none.
    pub key: &'a str,
    pub model: &'a str,
    pub kind: Kind,
    /// The site the request was redirected from (excluded from candidates), if any.
    pub came_from: Option<&'a str>,
    /// Whether this site may hold the request (the map places (model, kind) here with
    /// scale_from_zero).
    pub holdable_here: bool,
    pub now_unix_ms: i64,
}

/// One site of a caller's home set, with its placement for the asked (model, kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HomeMember<'a> {
    pub site: &'a Site,
    pub placement: &'a Placement,
    /// Rendezvous score; higher ranks first.
    pub score: u64,
}

impl HomeMember<'_> {
    /// Ranks `self` before `other`: higher score first, ties by site id.
    fn ranks_before(&self, other: &HomeMember<'_>) -> bool {
        self.score > other.score || (self.score == other.score && self.site.id < other.site.id)
    }
}

/// A caller's home set for a model: the [`HOME_SET_SIZE`] best-scored candidate sites, best
/// first. Fixed size, so computing it per request allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HomeSet<'a> {
    members: [Option<HomeMember<'a>>; HOME_SET_SIZE],
}

impl<'a> HomeSet<'a> {
    /// The members, best first.
    pub fn iter(&self) -> impl Iterator<Item = &HomeMember<'a>> {
        self.members.iter().flatten()
    }

    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.members[0].is_none()
    }

    /// Keeps `candidate` if it ranks among the best [`HOME_SET_SIZE`].
    fn offer(&mut self, candidate: HomeMember<'a>) {
        let mut carried = candidate;
        for slot in &mut self.members {
            match slot {
                None => {
                    *slot = Some(carried);
                    return;
                }
                Some(member) if carried.ranks_before(member) => {
                    std::mem::swap(member, &mut carried);
                }
                Some(_) => {}
            }
        }
    }
}

impl SiblingMap {
    /// Parses and validates a `PUT /admin/sibling-map` body. Any invalid value rejects the whole
    /// map.
    pub fn parse(body: &[u8], rules: &MapRules) -> Result<SiblingMap, MapError> {
        let raw: RawMap = crate::base::doc_guard::from_json(body)
            .map_err(|error| MapError::Json(error.message))?;
        let raw_sites = raw.sites.ok_or(MapError::MissingArray("sites"))?;
        let raw_placements = raw.placements.ok_or(MapError::MissingArray("placements"))?;
        for (field, count, max) in [
            ("sites", raw_sites.count, MAX_SITES),
            ("placements", raw_placements.count, MAX_PLACEMENTS),
        ] {
            if count > max {
                return Err(MapError::TooMany { field, count, max });
            }
        }
        let (sites, site_index) = parse_sites(raw_sites.entries, rules)?;
        let placements = parse_placements(raw_placements.entries, &site_index, rules)?;
        let (generated_at_unix_ms, fresh_for) = parse_window(raw.generated_at, raw.fresh_for)?;

        let mut by_model: [HashMap<String, Vec<usize>>; 3] = Default::default();
        for (index, placement) in placements.iter().enumerate() {
            by_model[placement.kind as usize]
                .entry(placement.model.clone())
                .or_default()
                .push(index);
        }
        Ok(SiblingMap {
            sites,
            placements,
            generated_at_unix_ms,
            fresh_for,
            site_index,
            by_model,
        })
    }

    /// The active map as JSON for `GET /admin/sibling-map`: the shape of the `PUT` body, with the
    /// URLs as normalized, durations as Go strings (`"240s"`) and `generated_at` in RFC 3339 UTC.
    /// Parsing it again with the same rules gives the same map.
    pub fn to_json(&self) -> Vec<u8> {
        let wire = WireMap {
            sites: self
                .sites
                .iter()
                .map(|site| WireSite {
                    id: &site.id,
                    url: &site.url,
                })
                .collect(),
            placements: self
                .placements
                .iter()
                .map(|placement| WirePlacement {
                    model: &placement.model,
                    kind: placement.kind,
                    site: &placement.site,
                    scale_from_zero: placement.scale_from_zero,
                    hold_budget: placement.hold_budget.map(go_duration),
                    warm: placement.warm,
                })
                .collect(),
            generated_at: self.generated_at_unix_ms.map(rfc3339_utc),
            fresh_for: self.fresh_for.map(go_duration),
        };
        // Plain structs of strings, bools and an enum: serializing them cannot fail.
        serde_json::to_vec(&wire).expect("a sibling map always serializes")
    }

    /// The listed sites, in push order.
    pub fn sites(&self) -> &[Site] {
        &self.sites
    }

    /// The placements, in push order.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// The listed site with this id.
    pub fn site(&self, id: &str) -> Option<&Site> {
        self.site_index.get(id).map(|&index| &self.sites[index])
    }

    /// The placement of (model, kind) on `site`.
    pub fn placement(&self, model: &str, kind: Kind, site: &str) -> Option<&Placement> {
        self.placements_of(model, kind)
            .find(|placement| placement.site == site)
    }

    /// When `local_site` has a placement for (model, kind) with scale_from_zero: `Some` of its
    /// hold budget (`None` inside: use the `--wake-hold-budget` default). Else `None`: the
    /// request may not be held here.
    pub fn hold_here(&self, local_site: &str, model: &str, kind: Kind) -> Option<Option<Duration>> {
        self.placement(model, kind, local_site)
            .filter(|placement| placement.scale_from_zero)
            .map(|placement| placement.hold_budget)
    }

    /// Every (model, kind) placed on `local_site` with scale_from_zero, in push order: the
    /// `hivenet_pending_demand` series that exist (at 0 when nothing is held).
    pub fn held_here(&self, local_site: &str) -> Vec<(&str, Kind)> {
        self.placements
            .iter()
            .filter(|placement| placement.site == local_site && placement.scale_from_zero)
            .map(|placement| (placement.model.as_str(), placement.kind))
            .collect()
    }

    /// Whether the warm hints are fresh at `now_unix_ms`:
    /// `generated_at <= now < generated_at + fresh_for`; false when the map has no window.
    pub fn hints_fresh(&self, now_unix_ms: i64) -> bool {
        let (Some(generated_at_unix_ms), Some(fresh_for)) =
            (self.generated_at_unix_ms, self.fresh_for)
        else {
            return false;
        };
        // In nanoseconds and i128, so a sub-millisecond window and the far future are exact.
        let start_ns = i128::from(generated_at_unix_ms) * 1_000_000;
        let now_ns = i128::from(now_unix_ms) * 1_000_000;
        let end_ns = start_ns + fresh_for.as_nanos() as i128;
        start_ns <= now_ns && now_ns < end_ns
    }

    /// The caller's home set for (model, kind): of the candidate sites — every listed site other
    /// than `ask.local_site` and `ask.came_from` that has a placement for (model, kind), with or
    /// without scale_from_zero — the [`HOME_SET_SIZE`] with the highest rendezvous score
    /// ([`home_score`]), ties broken by site id. Only `key`, `model`, `kind`, `local_site` and
    /// `came_from` of `ask` matter.
    ///
    /// Rendezvous hashing keeps a key on the same sites while the map changes: adding a site
    /// either leaves the home set as it was or brings the new site into it, and removing a site
    /// outside the home set changes nothing. Every router of every site computes the same set.
    pub fn home_set(&self, ask: &RedirectAsk<'_>) -> HomeSet<'_> {
        let mut home = HomeSet::default();
        for placement in self.placements_of(ask.model, ask.kind) {
            if placement.site == ask.local_site || ask.came_from == Some(placement.site.as_str()) {
                continue;
            }
            // Only the local site may be placed without being listed, and it is skipped above
            // unless the caller names another local site; unlisted, it has no URL to go to.
            let Some(site) = self.site(&placement.site) else {
                continue;
            };
            home.offer(HomeMember {
                site,
                placement,
                score: home_score(ask.key, ask.model, ask.kind, &site.id),
            });
        }
        home
    }

    /// The redirect decision: the sibling site to answer `307` to, or `None` (do not redirect:
    /// serve, hold or fail here).
    ///
    /// Seed (`hold-at-zero.md`, "How a request is handled", step 2): "If the sibling map lists
    /// another site in the request's scope that serves the model, the router answers 307 to it.
    /// The one exception: while the map's hints are fresh, every sibling in the caller's home set
    /// (the two sites a key is redirected to for a model) is cold and the model may be held here,
    /// the request is not redirected, because a cold sibling is no faster than waking the model
    /// here. A warm sibling outside the home set does not prevent this."
    ///
    /// 1. The candidates are the listed sites other than this site and `came_from` that have a
    ///    placement for (model, kind) — any placement, held at zero or not: they serve the model.
    /// 2. No candidate: `None`.
    /// 3. The home set is the two best candidates by rendezvous score ([`SiblingMap::home_set`]).
    /// 4. While the hints are fresh ([`SiblingMap::hints_fresh`]), if the request may be held here
    ///    (`holdable_here`) and every home-set member is cold (`warm: false`; an absent `warm` is
    ///    unknown, not cold): `None`, so the request is held here. Warm sites outside the home set
    ///    are not looked at.
    /// 5. Otherwise, while the hints are fresh: the first home-set member, by score, that is warm
    ///    (`warm: true`), else the best-scored member. With stale or no hints: the best-scored
    ///    member. Stale hints are ignored, not trusted: a key keeps going to its first home site.
    ///
    /// Hop limits are the caller's: it does not ask once the request has been redirected twice.
    pub fn choose_site(&self, ask: &RedirectAsk<'_>) -> Option<&Site> {
        let home = self.home_set(ask);
        let best = home.iter().next()?;
        if !self.hints_fresh(ask.now_unix_ms) {
            return Some(best.site);
        }
        if ask.holdable_here
            && home
                .iter()
                .all(|member| member.placement.warm == Some(false))
        {
            return None;
        }
        let warm = home
            .iter()
            .find(|member| member.placement.warm == Some(true));
        Some(warm.unwrap_or(best).site)
    }

    /// The placements of (model, kind), in push order.
    fn placements_of(&self, model: &str, kind: Kind) -> impl Iterator<Item = &Placement> {
        self.by_model[kind as usize]
            .get(model)
            .into_iter()
            .flatten()
            .map(|&index| &self.placements[index])
    }
}

/// The rendezvous score of `site` for a caller and (model, kind): the first 8 bytes, big-endian,
/// of SHA-256 over `"hivenet-router/home-set/v1\0" key \0 model \0 kind \0 site`. Deterministic
/// across processes and versions of this router (a change must bump the domain prefix).
pub fn home_score(key: &str, model: &str, kind: Kind, site_id: &str) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(HOME_SET_DOMAIN);
    hasher.update(key.as_bytes());
    hasher.update([0]);
    hasher.update(model.as_bytes());
    hasher.update([0]);
    hasher.update(kind.as_str().as_bytes());
    hasher.update([0]);
    hasher.update(site_id.as_bytes());
    let digest: [u8; 32] = hasher.finalize().into();
    let [b0, b1, b2, b3, b4, b5, b6, b7, ..] = digest;
    u64::from_be_bytes([b0, b1, b2, b3, b4, b5, b6, b7])
}

#[cfg(test)]
mod tests;
