//! The dynamic client-key registry behind `/admin/api-keys/*`, as plain data.
//!
//! Owns: the request and response bodies of the dynamic-key admin endpoints (shapes as in
//! `use-the-api-admin-endpoints.mdx`), the registry entries, the registry version, and the rules
//! every write must pass.
//!
//! Must not: do I/O or read the clock; keep raw keys (entries carry hashes, and responses always
//! show `key_hash: ""`); change anything when a write is refused.
//!
//! Invariants: every stored entry passed the same rules as a static key (see
//! `config::validate_settings`) plus the cross-config serverless check against the limits given
//! with the write; no two ids share a hash; at most [`MAX_KEYS`] entries; the version only moves
//! up in byte-wise (lexical) order. A refused write returns an error and leaves the registry, its
//! version and its generation exactly as they were.
//!
//! Versions are opaque strings chosen by the caller (e.g. `rev_00000042`, see [`format_version`]).
//! A version lower than the current one is stale (409); an equal one is accepted (replay). The
//! registry also counts successful writes in [`DynamicRegistry::generation`], which the control
//! core can use to publish snapshots in order.
//!
//! Body parsing refuses unknown fields (a misspelt `allowed_models` would otherwise silently
//! grant every model); `id` in a `PUT` body is accepted and ignored, because the URL is the source
//! of truth for the entry id.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::config::{
    Problem, Problems, QuotaSpec, ServerlessLimits, Sink, parse_rfc3339_unix_ms, validate_settings,
};
use super::key_hash::KeyHash;
use super::keys::{KeyInput, KeyRecord, KeyRegistry, KeySource, LiveRegistry, MAX_KEYS};

/// Longest accepted entry id, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// `PUT /admin/api-keys/{id}` body limit (bytes), from the admin reference.
pub const PUT_BODY_BYTES_MAX: usize = 1_048_576;
/// `POST /admin/api-keys/replace` body limit (bytes), from the admin reference.
pub const REPLACE_BODY_BYTES_MAX: usize = 16_777_216;

/// `rev_` and eight zero-padded digits, a version format whose lexical order is numeric order up
/// to 10^8 (the reference's example format).
pub fn format_version(revision: u64) -> String {
    format!("rev_{revision:08}")
}

// ---------------------------------------------------------------------------------------------
// Bodies.
// ---------------------------------------------------------------------------------------------

/// `PUT /admin/api-keys/{id}` request body. The whole entry is replaced.
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PutKeyRequest {
    /// Required; must not sort below the registry's version.
    #[serde(default)]
    pub version: String,
    /// Ignored: the URL id is the entry id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// 64 hex digits, normalised to lowercase. Required.
    #[serde(default)]
    pub key_hash: String,
    #[serde(default)]
    pub key_preview: String,
    /// Tenant identifier. Required.
    #[serde(default)]
    pub owner: String,
    /// Required.
    #[serde(default)]
    pub name: String,
    /// Required: whether the key may authenticate.
    pub enabled: bool,
    /// RFC 3339; empty: no expiry.
    #[serde(default)]
    pub expires_at: String,
    /// Empty: unrestricted.
    #[serde(default)]
    pub allowed_models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaSpec>,
    /// `0` is unset, otherwise in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_occupancy_share: Option<f64>,
}

impl fmt::Debug for PutKeyRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PutKeyRequest")
            .field("version", &self.version)
            .field("key_preview", &self.key_preview)
            .finish_non_exhaustive()
    }
}

impl PutKeyRequest {
    pub fn from_json(body: &[u8]) -> Result<PutKeyRequest, DynamicError> {
        if body.len() > PUT_BODY_BYTES_MAX {
            return Err(DynamicError::BodyTooLarge {
                limit_bytes: PUT_BODY_BYTES_MAX,
            });
        }
        crate::base::doc_guard::from_json(body)
            .map_err(|error| DynamicError::BadBody(error.message))
    }

    fn into_entry(self, id: &str) -> (String, DynamicKeyEntry) {
        (
            self.version,
            DynamicKeyEntry {
                id: id.to_owned(),
                key_hash: self.key_hash,
                key_preview: self.key_preview,
                owner: self.owner,
                name: self.name,
                enabled: self.enabled,
                expires_at: self.expires_at,
                allowed_models: self.allowed_models,
                quota: self.quota,
                max_occupancy_share: self.max_occupancy_share,
            },
        )
    }
}

/// One registry entry: an item of a replace body, and (with `key_hash` blanked) of the list and
/// read responses.
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicKeyEntry {
    /// Stable control-service identifier. Required in a replace body.
    #[serde(default)]
    pub id: String,
    /// In requests: 64 hex digits. In responses: always `""`.
    #[serde(default)]
    pub key_hash: String,
    #[serde(default)]
    pub key_preview: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub name: String,
    pub enabled: bool,
    #[serde(default)]
    pub expires_at: String,
    #[serde(default)]
    pub allowed_models: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_occupancy_share: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaSpec>,
}

impl fmt::Debug for DynamicKeyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicKeyEntry")
            .field("id", &self.id)
            .field("key_preview", &self.key_preview)
            .finish_non_exhaustive()
    }
}

/// `POST /admin/api-keys/replace` request body.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceRequest {
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub keys: Vec<DynamicKeyEntry>,
}

impl ReplaceRequest {
    pub fn from_json(body: &[u8]) -> Result<ReplaceRequest, DynamicError> {
        if body.len() > REPLACE_BODY_BYTES_MAX {
            return Err(DynamicError::BodyTooLarge {
                limit_bytes: REPLACE_BODY_BYTES_MAX,
            });
        }
        crate::base::doc_guard::from_json(body)
            .map_err(|error| DynamicError::BadBody(error.message))
    }
}

/// `{"ok": true}`: `PUT` and `DELETE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OkResponse {
    pub ok: bool,
}

/// `{"ok": true, "count": n}`: replace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceResponse {
    pub ok: bool,
    pub count: usize,
}

/// `GET /admin/api-keys/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionResponse {
    pub version: String,
    pub count: usize,
}

/// `GET /admin/api-keys`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListResponse {
    pub count: usize,
    pub keys: Vec<DynamicKeyEntry>,
}

/// `GET /admin/api-keys/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GetResponse {
    pub key: DynamicKeyEntry,
}

/// The admin endpoints' simple error body `{"error": "..."}`; a stale version adds
/// `current_version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
}

impl ErrorResponse {
    /// The 501 body when the router is not in dynamic mode.
    pub fn not_active() -> ErrorResponse {
        ErrorResponse {
            error: "dynamic key registry not active".into(),
            current_version: None,
        }
    }
}

/// Why a dynamic-registry request was refused. The registry is unchanged in every case.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DynamicError {
    #[error("invalid JSON body: {0}")]
    BadBody(String),
    #[error("request body over {limit_bytes} bytes")]
    BodyTooLarge { limit_bytes: usize },
    #[error("version is required")]
    VersionRequired,
    #[error("stale version")]
    Stale { current_version: String },
    #[error("invalid key entry: {0}")]
    Invalid(Problems),
    #[error("the registry would hold {count} keys, over the limit of {MAX_KEYS}")]
    TooManyKeys { count: usize },
    #[error("key not found: {0}")]
    NotFound(String),
}

impl DynamicError {
    /// HTTP status, per the admin reference.
    pub fn status(&self) -> u16 {
        match self {
            DynamicError::Stale { .. } => 409,
            DynamicError::NotFound(_) => 404,
            _ => 400,
        }
    }

    pub fn response(&self) -> ErrorResponse {
        ErrorResponse {
            error: self.to_string(),
            current_version: match self {
                DynamicError::Stale { current_version } => Some(current_version.clone()),
                _ => None,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The registry.
// ---------------------------------------------------------------------------------------------

/// What the registry keeps of an entry beyond the shards' record of its key (hash, preview,
/// owner, name, enabled, expiry instant, validated settings): the fields the admin API answers
/// as supplied. Each key's strings are kept once, in the record.
#[derive(Clone, PartialEq)]
struct Stored {
    expires_at: Box<str>,
    allowed_models: Box<[String]>,
    max_occupancy_share: Option<f64>,
    quota: Option<Box<QuotaSpec>>,
}

/// An entry that passed the rules: the record's fields, and what else it keeps.
struct Validated {
    key: KeyInput,
    stored: Stored,
}

/// The dynamic key registry. Lives on the control core; readers get [`KeyRegistry`] snapshots.
#[derive(Clone, Default, PartialEq)]
pub struct DynamicRegistry {
    version: String,
    generation: u64,
    /// By id. The shards' snapshot (`live`) holds the rest of each entry, and finds which id
    /// holds a hash: a set of hashes here cost every key about 43 bytes more.
    entries: BTreeMap<String, Stored>,
    /// The shards' snapshot of `entries`, changed with each write rather than built again.
    live: LiveRegistry,
}

impl fmt::Debug for DynamicRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicRegistry")
            .field("version", &self.version)
            .field("generation", &self.generation)
            .field("count", &self.entries.len())
            .finish()
    }
}

impl DynamicRegistry {
    /// Empty, version `""`: dynamic state is memory-only and starts empty after every restart.
    pub fn new() -> DynamicRegistry {
        DynamicRegistry::default()
    }

    /// The last accepted version (`""` before the first write).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Successful writes so far.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `GET /admin/api-keys/version`.
    pub fn version_response(&self) -> VersionResponse {
        VersionResponse {
            version: self.version.clone(),
            count: self.entries.len(),
        }
    }

    /// `GET /admin/api-keys`: enabled and disabled entries, by id, hashes blanked.
    pub fn list(&self) -> ListResponse {
        ListResponse {
            count: self.entries.len(),
            keys: self
                .entries
                .iter()
                .map(|(id, stored)| self.public_entry(id, stored))
                .collect(),
        }
    }

    /// `GET /admin/api-keys/{id}`.
    pub fn get(&self, id: &str) -> Result<GetResponse, DynamicError> {
        self.entries
            .get(id)
            .map(|stored| GetResponse {
                key: self.public_entry(id, stored),
            })
            .ok_or_else(|| DynamicError::NotFound(id.to_owned()))
    }

    /// `PUT /admin/api-keys/{id}`: add or replace the whole entry.
    pub fn put(
        &mut self,
        id: &str,
        request: PutKeyRequest,
        limits: &ServerlessLimits,
    ) -> Result<(), DynamicError> {
        let (version, entry) = request.into_entry(id);
        self.check_version(&version)?;
        let mut problems = Vec::new();
        let validated = {
            let mut sink = Sink::new(format!("key {}", display_id(id)), &mut problems);
            let validated = validate_entry(entry, limits, &mut sink);
            let holder = validated
                .as_ref()
                .and_then(|validated| self.live.registry_id_of_hash(&validated.key.hash));
            if let Some(holder) = holder.filter(|holder| *holder != id) {
                sink.push(
                    "key_hash",
                    format!("already belongs to key {holder}; delete that entry first"),
                );
            }
            validated
        };
        let Some(Validated { key, stored }) = validated.filter(|_| problems.is_empty()) else {
            return Err(DynamicError::Invalid(Problems(problems)));
        };
        if !self.entries.contains_key(id) && self.entries.len() >= MAX_KEYS {
            return Err(DynamicError::TooManyKeys {
                count: self.entries.len() + 1,
            });
        }
        // Validated: apply.
        self.live.put(key);
        self.entries.insert(id.to_owned(), stored);
        self.commit(version);
        Ok(())
    }

    /// `DELETE /admin/api-keys/{id}?version=...`: idempotent; an absent id is success.
    pub fn delete(&mut self, id: &str, version: Option<&str>) -> Result<(), DynamicError> {
        let version = version.unwrap_or("");
        self.check_version(version)?;
        if self.entries.remove(id).is_some() {
            self.live.remove(id);
        }
        self.commit(version.to_owned());
        Ok(())
    }

    /// `POST /admin/api-keys/replace`: validates every entry, then swaps the whole registry.
    /// Returns the new count.
    pub fn replace(
        &mut self,
        request: ReplaceRequest,
        limits: &ServerlessLimits,
    ) -> Result<usize, DynamicError> {
        self.check_version(&request.version)?;
        if request.keys.len() > MAX_KEYS {
            return Err(DynamicError::TooManyKeys {
                count: request.keys.len(),
            });
        }
        let mut problems = Vec::new();
        let mut entries = Vec::with_capacity(request.keys.len());
        // Position in `entries` of the entry holding each hash.
        let mut holder_of_hash: HashMap<KeyHash, usize> = HashMap::new();
        let mut first_index_of_id: HashMap<String, usize> = HashMap::new();
        for (index, entry) in request.keys.into_iter().enumerate() {
            let id = entry.id.clone();
            let mut sink = Sink::new(
                format!("keys[{index}] ({})", display_id(&id)),
                &mut problems,
            );
            if let Some(first) = first_index_of_id.get(&id) {
                sink.push("id", format!("duplicates keys[{first}]"));
                continue;
            }
            first_index_of_id.insert(id.clone(), index);
            let Some(validated) = validate_entry(entry, limits, &mut sink) else {
                continue;
            };
            if let Some(holder) = holder_of_hash.get(&validated.key.hash) {
                let (owner_id, _): &(String, Validated) = &entries[*holder];
                sink.push("key_hash", format!("duplicates the hash of key {owner_id}"));
                continue;
            }
            holder_of_hash.insert(validated.key.hash, entries.len());
            entries.push((id, validated));
        }
        if !problems.is_empty() {
            return Err(DynamicError::Invalid(Problems(problems)));
        }
        // Built from the sorted entries at once, the map's nodes are full; inserted one by one
        // in the body's order they were about two-thirds full.
        entries.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
        let (keys, stored): (Vec<KeyInput>, Vec<(String, Stored)>) = entries
            .into_iter()
            .map(|(id, validated)| (validated.key, (id, validated.stored)))
            .unzip();
        self.live = LiveRegistry::build(keys);
        self.entries = BTreeMap::from_iter(stored);
        self.commit(request.version);
        Ok(self.entries.len())
    }

    /// The cross-config serverless check over every entry, for a policy reload (which is refused
    /// when it would invalidate an existing key).
    pub fn check_serverless(&self, limits: &ServerlessLimits) -> Result<(), Problems> {
        let mut problems = Vec::new();
        for id in self.entries.keys() {
            let mut sink = Sink::new(format!("key {}", display_id(id)), &mut problems);
            self.record(id).settings.check_serverless(limits, &mut sink);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Problems(problems))
        }
    }

    /// The snapshot the shards read: shared, not built, per call.
    pub fn snapshot(&self) -> Arc<KeyRegistry> {
        self.live.snapshot()
    }

    /// The shards' record of the entry with this id.
    fn record(&self, id: &str) -> &KeyRecord {
        self.live
            .record(id)
            .expect("every entry has its record in the snapshot")
    }

    /// The entry as the admin API shows it: as supplied, with a blank hash.
    fn public_entry(&self, id: &str, stored: &Stored) -> DynamicKeyEntry {
        let record = self.record(id);
        DynamicKeyEntry {
            id: id.to_owned(),
            key_hash: String::new(),
            key_preview: record.preview.to_string(),
            owner: record.owner.to_string(),
            name: record.name.to_string(),
            enabled: record.enabled,
            expires_at: stored.expires_at.to_string(),
            allowed_models: stored.allowed_models.to_vec(),
            max_occupancy_share: stored.max_occupancy_share,
            quota: stored.quota.as_deref().cloned(),
        }
    }

    fn check_version(&self, version: &str) -> Result<(), DynamicError> {
        if version.is_empty() {
            return Err(DynamicError::VersionRequired);
        }
        // Byte-wise order, the reference's "lexicographic" comparison.
        if version < self.version.as_str() {
            return Err(DynamicError::Stale {
                current_version: self.version.clone(),
            });
        }
        Ok(())
    }

    fn commit(&mut self, version: String) {
        debug_assert!(version >= self.version);
        self.version = version;
        self.generation += 1;
    }
}

fn display_id(id: &str) -> &str {
    if id.is_empty() { "<no id>" } else { id }
}

/// The rules of a dynamic entry: the static-key rules (hash, owner, name, limits, quota shape,
/// share) with RFC 3339 expiry, plus the cross-config serverless check.
fn validate_entry(
    entry: DynamicKeyEntry,
    limits: &ServerlessLimits,
    sink: &mut Sink<'_>,
) -> Option<Validated> {
    let before = sink.list.len();
    if entry.id.is_empty() {
        sink.push("id", "is required");
    } else if entry.id.len() > MAX_ID_BYTES {
        sink.push("id", format!("is longer than {MAX_ID_BYTES} bytes"));
    } else if entry.id.chars().any(char::is_control) {
        sink.push("id", "must not contain control characters");
    }
    let hash = if entry.key_hash.is_empty() {
        sink.push("key_hash", "is required");
        None
    } else {
        let hash = KeyHash::parse_hex(&entry.key_hash);
        if hash.is_none() {
            sink.push(
                "key_hash",
                format!(
                    "must be exactly 64 hex digits (the SHA-256 of the raw key), got {} characters",
                    entry.key_hash.chars().count()
                ),
            );
        }
        hash
    };
    if entry.owner.trim().is_empty() {
        sink.push("owner", "must not be empty");
    }
    if entry.name.trim().is_empty() {
        sink.push("name", "must not be empty");
    }
    let expires_at_unix_ms = if entry.expires_at.is_empty() {
        None
    } else {
        let parsed = parse_rfc3339_unix_ms(&entry.expires_at);
        if parsed.is_none() {
            sink.push(
                "expires_at",
                format!("{:?} is not an RFC 3339 timestamp", entry.expires_at),
            );
        }
        parsed
    };
    let settings = validate_settings(
        "allowed_models",
        &entry.allowed_models,
        entry.quota.as_ref(),
        entry.max_occupancy_share,
        sink,
    );
    if let Some(settings) = &settings {
        settings.check_serverless(limits, sink);
    }
    if sink.list.len() != before {
        return None;
    }
    // The hex hash is never shown again (answers blank it): only its 32 bytes are kept.
    Some(Validated {
        key: KeyInput {
            source: KeySource::Dynamic { id: entry.id },
            hash: hash?,
            preview: entry.key_preview,
            name: entry.name,
            owner: entry.owner,
            expires_at_unix_ms,
            enabled: entry.enabled,
            settings: settings?,
        },
        stored: Stored {
            expires_at: entry.expires_at.into_boxed_str(),
            allowed_models: entry.allowed_models.into_boxed_slice(),
            max_occupancy_share: entry.max_occupancy_share,
            quota: entry.quota.map(Box::new),
        },
    })
}

/// Problems as a flat list (for logs and tests).
pub fn problem_list(error: &DynamicError) -> &[Problem] {
    match error {
        DynamicError::Invalid(problems) => &problems.0,
        _ => &[],
    }
}

#[cfg(test)]
mod tests;
