//! The `PUT /admin/sibling-map` document on the wire: the body as it arrives (bounded arrays,
//! unknown fields refused), its validation into a [`super::SiblingMap`]'s parts, and the map
//! written back for `GET /admin/sibling-map`. The rules are the parent module's doc.
//!
//! Owns: the bounds of a body ([`MAX_SITES`] and the other `MAX_` constants), what validation
//! needs from start-up ([`MapRules`]) and why a push is refused ([`MapError`]).
//!
//! Must not: decide where a request goes; that is the parent's [`super::SiblingMap`].

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::placement::{Kind, Placement, Site};

/// Most sites a map may list. Bounds the memory of a push before it is refused.
pub const MAX_SITES: usize = 1024;
/// Most placements a map may hold.
pub const MAX_PLACEMENTS: usize = 65_536;
/// Longest site id, in bytes.
pub const MAX_SITE_ID_BYTES: usize = 128;
/// Longest model name, in bytes.
pub const MAX_MODEL_BYTES: usize = 256;
/// Longest site URL, in bytes; it ends up in every `Location` header sent to the site.
pub const MAX_URL_BYTES: usize = 2048;
/// Longest placement hold budget (seed `hold-at-zero.md`, "The `hold_budget` placement field").
pub const MAX_HOLD_BUDGET: Duration = Duration::from_secs(3600);

/// What start-up knows that validation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapRules {
    /// This router's `--site-id`.
    pub local_site: String,
    /// Domains a sibling's URL must be in (the domain itself or a subdomain of it). Empty: no
    /// sibling URL is accepted.
    pub allowed_domains: Vec<String>,
}

/// Why a map push was refused; the text is the reason the `400` body shows and names the
/// offending entry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MapError {
    #[error("body is not a sibling map: {0}")]
    Json(String),
    #[error("{0} is required: an array, possibly empty")]
    MissingArray(&'static str),
    #[error("{field} has {count} entries, at most {max}")]
    TooMany {
        field: &'static str,
        count: usize,
        max: usize,
    },
    /// An entry of the wrong shape: a missing or unknown field, or a value of the wrong type.
    #[error("{at}: {reason}")]
    Entry { at: String, reason: String },
    #[error("sites[{index}].id: {id:?} {reason}")]
    BadSiteId {
        index: usize,
        id: String,
        reason: &'static str,
    },
    #[error("sites[{index}].id: {id:?} is already the id of sites[{first}]")]
    DuplicateSite {
        index: usize,
        id: String,
        first: usize,
    },
    #[error("sites[{index}].url: {url:?} {reason}")]
    BadUrl {
        index: usize,
        url: String,
        reason: &'static str,
    },
    #[error("sites[{index}].url: host {host:?} is not an allowed domain or a subdomain of one")]
    DomainNotAllowed { index: usize, host: String },
    #[error("placements[{index}].model: {reason}")]
    BadModel { index: usize, reason: &'static str },
    #[error("placements[{index}].kind: {kind:?} is not one of chat, embedding, rerank")]
    BadKind { index: usize, kind: String },
    #[error("placements[{index}].site: {site:?} is neither a listed site nor the local site")]
    UnknownSite { index: usize, site: String },
    #[error("placements[{index}].hold_budget: {text:?} {reason}")]
    BadHoldBudget {
        index: usize,
        text: String,
        reason: &'static str,
    },
    #[error(
        "placements[{index}]: model {model:?}, kind {kind} on site {site:?} is already placed by placements[{first}]"
    )]
    DuplicatePlacement {
        index: usize,
        model: String,
        kind: &'static str,
        site: String,
        first: usize,
    },
    #[error("generated_at: {0:?} is not an RFC 3339 time")]
    BadGeneratedAt(String),
    #[error("fresh_for: {text:?} {reason}")]
    BadFreshFor { text: String, reason: &'static str },
    #[error("{present} is set without {missing}: the freshness window needs both")]
    HalfFreshness {
        present: &'static str,
        missing: &'static str,
    },
}

/// The top-level body. `sites` and `placements` are options so their absence gets its own error.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMap {
    pub(super) sites: Option<Capped<MAX_SITES>>,
    pub(super) placements: Option<Capped<MAX_PLACEMENTS>>,
    pub(super) generated_at: Option<String>,
    pub(super) fresh_for: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSite {
    pub(super) id: String,
    pub(super) url: String,
}

/// `kind` and `hold_budget` stay text here so their errors can name the placement.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlacement {
    pub(super) model: String,
    pub(super) kind: String,
    pub(super) site: String,
    #[serde(default)]
    pub(super) scale_from_zero: bool,
    pub(super) hold_budget: Option<String>,
    pub(super) warm: Option<bool>,
}

/// A JSON array kept up to `MAX` entries; entries past it are skipped unparsed and only counted,
/// so an oversized push costs no memory beyond the cap before it is refused. Entries stay JSON
/// values so each is decoded on its own and its error names its index.
pub(super) struct Capped<const MAX: usize> {
    pub(super) entries: Vec<serde_json::Value>,
    pub(super) count: usize,
}

impl<'de, const MAX: usize> Deserialize<'de> for Capped<MAX> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CappedVisitor<const MAX: usize>;

        impl<'de, const MAX: usize> Visitor<'de> for CappedVisitor<MAX> {
            type Value = Capped<MAX>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("an array")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Capped<MAX>, A::Error> {
                let mut entries = Vec::new();
                let mut count = 0;
                loop {
                    let more = if count < MAX {
                        match seq.next_element::<serde_json::Value>()? {
                            Some(value) => {
                                entries.push(value);
                                true
                            }
                            None => false,
                        }
                    } else {
                        seq.next_element::<IgnoredAny>()?.is_some()
                    };
                    if !more {
                        return Ok(Capped { entries, count });
                    }
                    count += 1;
                }
            }
        }

        deserializer.deserialize_seq(CappedVisitor::<MAX>)
    }
}

/// Decodes one array entry; a shape error names `field[index]`.
pub(super) fn entry<T: de::DeserializeOwned>(
    field: &'static str,
    index: usize,
    value: serde_json::Value,
) -> Result<T, MapError> {
    serde_json::from_value(value).map_err(|error| MapError::Entry {
        at: format!("{field}[{index}]"),
        reason: error.to_string(),
    })
}

/// Checks the sites; returns them with the index of their ids.
pub(super) fn parse_sites(
    entries: Vec<serde_json::Value>,
    rules: &MapRules,
) -> Result<(Vec<Site>, HashMap<String, usize>), MapError> {
    let mut sites = Vec::with_capacity(entries.len());
    let mut site_index: HashMap<String, usize> = HashMap::with_capacity(entries.len());
    for (index, value) in entries.into_iter().enumerate() {
        let raw: RawSite = entry("sites", index, value)?;
        if let Err(reason) = check_site_id(&raw.id) {
            return Err(MapError::BadSiteId {
                index,
                id: raw.id,
                reason,
            });
        }
        if let Some(&first) = site_index.get(&raw.id) {
            return Err(MapError::DuplicateSite {
                index,
                id: raw.id,
                first,
            });
        }
        let (url, host) = match normalize_url(&raw.url) {
            Ok(parts) => parts,
            Err(reason) => {
                return Err(MapError::BadUrl {
                    index,
                    url: raw.url,
                    reason,
                });
            }
        };
        // The local site's URL is never a redirect target, so any well-formed one will do.
        if raw.id != rules.local_site && !under_allowed_domain(host, &rules.allowed_domains) {
            return Err(MapError::DomainNotAllowed {
                index,
                host: host.to_owned(),
            });
        }
        let url = url.to_owned();
        site_index.insert(raw.id.clone(), index);
        sites.push(Site { id: raw.id, url });
    }
    Ok((sites, site_index))
}

/// Checks the placements against the listed sites.
pub(super) fn parse_placements(
    entries: Vec<serde_json::Value>,
    site_index: &HashMap<String, usize>,
    rules: &MapRules,
) -> Result<Vec<Placement>, MapError> {
    let mut placements: Vec<Placement> = Vec::with_capacity(entries.len());
    let mut first_placed: HashMap<(String, Kind, String), usize> = HashMap::new();
    for (index, value) in entries.into_iter().enumerate() {
        let raw: RawPlacement = entry("placements", index, value)?;
        if raw.model.is_empty() {
            return Err(MapError::BadModel {
                index,
                reason: "is empty",
            });
        }
        if raw.model.len() > MAX_MODEL_BYTES {
            return Err(MapError::BadModel {
                index,
                reason: "is longer than 256 bytes",
            });
        }
        let Some(kind) = Kind::parse(&raw.kind) else {
            return Err(MapError::BadKind {
                index,
                kind: raw.kind,
            });
        };
        if !site_index.contains_key(&raw.site) && raw.site != rules.local_site {
            return Err(MapError::UnknownSite {
                index,
                site: raw.site,
            });
        }
        let hold_budget = match raw.hold_budget {
            None => None,
            Some(text) => match check_hold_budget(&text) {
                Ok(budget) => Some(budget),
                Err(reason) => {
                    return Err(MapError::BadHoldBudget {
                        index,
                        text,
                        reason,
                    });
                }
            },
        };
        let identity = (raw.model, kind, raw.site);
        if let Some(&first) = first_placed.get(&identity) {
            let (model, kind, site) = identity;
            return Err(MapError::DuplicatePlacement {
                index,
                model,
                kind: kind.as_str(),
                site,
                first,
            });
        }
        first_placed.insert(identity.clone(), index);
        let (model, kind, site) = identity;
        placements.push(Placement {
            model,
            kind,
            site,
            scale_from_zero: raw.scale_from_zero,
            hold_budget,
            warm: raw.warm,
        });
    }
    Ok(placements)
}

/// Checks the freshness window of the warm hints: both fields or neither.
pub(super) fn parse_window(
    generated_at: Option<String>,
    fresh_for: Option<String>,
) -> Result<(Option<i64>, Option<Duration>), MapError> {
    let generated_at_unix_ms = match generated_at {
        None => None,
        Some(text) => match crate::logic::auth::config::parse_rfc3339_unix_ms(&text) {
            Some(unix_ms) => Some(unix_ms),
            None => return Err(MapError::BadGeneratedAt(text)),
        },
    };
    let fresh_for = match fresh_for {
        None => None,
        Some(text) => match crate::base::duration::parse(&text) {
            Ok(duration) if duration.is_zero() => {
                return Err(MapError::BadFreshFor {
                    text,
                    reason: "is not greater than 0",
                });
            }
            Ok(duration) => Some(duration),
            Err(_) => {
                return Err(MapError::BadFreshFor {
                    text,
                    reason: "is not a Go duration (e.g. 60s)",
                });
            }
        },
    };
    match (generated_at_unix_ms, fresh_for) {
        (Some(_), None) => Err(MapError::HalfFreshness {
            present: "generated_at",
            missing: "fresh_for",
        }),
        (None, Some(_)) => Err(MapError::HalfFreshness {
            present: "fresh_for",
            missing: "generated_at",
        }),
        window => Ok(window),
    }
}

pub(super) fn check_site_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() {
        return Err("is empty");
    }
    if id.len() > MAX_SITE_ID_BYTES {
        return Err("is longer than 128 bytes");
    }
    if !id
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
    {
        return Err("has a character outside [A-Za-z0-9._-]");
    }
    Ok(())
}

pub(super) fn check_hold_budget(text: &str) -> Result<Duration, &'static str> {
    match crate::base::duration::parse(text) {
        Err(_) => Err("is not a Go duration (e.g. 240s)"),
        Ok(budget) if budget.is_zero() => Err("is not greater than 0"),
        Ok(budget) if budget > MAX_HOLD_BUDGET => Err("is over 1h"),
        Ok(budget) => Ok(budget),
    }
}

/// Checks a site URL and returns it without trailing slashes, with its host (as written; an IPv6
/// literal keeps its brackets).
pub(super) fn normalize_url(url: &str) -> Result<(&str, &str), &'static str> {
    if url.len() > MAX_URL_BYTES {
        return Err("is longer than 2048 bytes");
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("does not start with http:// or https://")?;
    if url.contains('?') {
        return Err("has a query");
    }
    if url.contains('#') {
        return Err("has a fragment");
    }
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.contains('@') {
        return Err("has user info");
    }
    let (host, port) = if let Some(after_bracket) = authority.strip_prefix('[') {
        let close = after_bracket
            .find(']')
            .ok_or("has an unclosed IPv6 bracket")?;
        let literal = &after_bracket[..close];
        if literal.is_empty()
            || !literal
                .bytes()
                .all(|byte| byte.is_ascii_hexdigit() || matches!(byte, b':' | b'.'))
        {
            return Err("has an invalid IPv6 host");
        }
        let after = &after_bracket[close + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err("has text after the IPv6 host"),
        };
        (&authority[..close + 2], port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("has no host");
    }
    if !host.starts_with('[') {
        if !host
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-'))
        {
            return Err("has a host character outside [A-Za-z0-9.-]");
        }
        if host.split('.').any(str::is_empty) {
            return Err("has an empty label in its host");
        }
    }
    if let Some(port) = port
        && !(port.bytes().all(|byte| byte.is_ascii_digit())
            && port.parse::<u16>().is_ok_and(|port| port > 0))
    {
        return Err("has a port outside 1-65535");
    }
    if !path.bytes().all(is_path_byte) {
        return Err("has a path character that is not allowed in a URL");
    }
    let trimmed = url.trim_end_matches('/');
    Ok((trimmed, host))
}

/// RFC 3986 `pchar` and `/` (percent escapes are kept as written).
pub(super) fn is_path_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:@".contains(&byte)
}

/// The host equals an allowed domain or ends with `.` + one, without letter case. A leading or
/// trailing dot on an allowed domain is ignored; an empty one allows nothing.
pub(super) fn under_allowed_domain(host: &str, allowed_domains: &[String]) -> bool {
    allowed_domains.iter().any(|domain| {
        let domain = domain.trim().trim_start_matches('.').trim_end_matches('.');
        if domain.is_empty() {
            return false;
        }
        if host.eq_ignore_ascii_case(domain) {
            return true;
        }
        let (host, domain) = (host.as_bytes(), domain.as_bytes());
        host.len() > domain.len()
            && host[host.len() - domain.len() - 1] == b'.'
            && host[host.len() - domain.len()..].eq_ignore_ascii_case(domain)
    })
}

/// A duration as the Go duration text `parse` reads back exactly: in the largest of s, ms, us and
/// ns that divides it (`240s`, `1500ms`).
pub(super) fn go_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    for (unit_nanos, unit) in [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if nanos.is_multiple_of(unit_nanos) {
            return format!("{}{unit}", nanos / unit_nanos);
        }
    }
    format!("{nanos}ns")
}

/// Unix milliseconds as RFC 3339 in UTC, with milliseconds only when there are some.
pub(super) fn rfc3339_utc(unix_ms: i64) -> String {
    let nanos = i128::from(unix_ms) * 1_000_000;
    // Every value here came from an RFC 3339 text (years 0000-9999), inside `time`'s range.
    let time = time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .expect("generated_at was parsed from RFC 3339, so it is a representable time");
    let millis = unix_ms.rem_euclid(1000);
    let fraction = if millis == 0 {
        String::new()
    } else {
        format!(".{millis:03}")
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}Z",
        time.year(),
        u8::from(time.month()),
        time.day(),
        time.hour(),
        time.minute(),
        time.second()
    )
}

#[derive(Serialize)]
pub(super) struct WireMap<'a> {
    pub(super) sites: Vec<WireSite<'a>>,
    pub(super) placements: Vec<WirePlacement<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) generated_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) fresh_for: Option<String>,
}

#[derive(Serialize)]
pub(super) struct WireSite<'a> {
    pub(super) id: &'a str,
    pub(super) url: &'a str,
}

#[derive(Serialize)]
pub(super) struct WirePlacement<'a> {
    pub(super) model: &'a str,
    pub(super) kind: Kind,
    pub(super) site: &'a str,
    pub(super) scale_from_zero: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) hold_budget: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) warm: Option<bool>,
}
