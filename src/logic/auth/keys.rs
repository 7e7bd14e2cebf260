//! The key registry the shards read: an immutable snapshot mapping a presented key to its
//! [`KeyRecord`] and per-key [`KeyId`].
//!
//! Owns: key-ID and tenant-ID derivation, the lookup ([`KeyRegistry::authenticate`]) and the
//! credential extraction from the two client headers. Keys are hashed by
//! [`super::key_hash::KeyHash`].
//!
//! Must not: keep a raw key, log one, or show a hash in `Debug` (only the preview shows), read the
//! clock (callers pass `now_unix_ms`), or be mutated after it is built (writers build a new one).
//!
//! # Key IDs
//!
//! Every key gets its own [`KeyId`]: the buckets and occupancy state that belong to a key (B4
//! input/output tokens per minute, occupancy share) are keyed by it, so no two keys share them.
//! The reference documents an older implementation in which every static key had an empty key ID
//! and fell back to one `anonymous` ID, so all static keys shared those buckets; this closes that
//! gap. IDs are derived, not counted, so they are the same after a reload or a restart:
//!
//! - static key: `SHA-256("hivenet-router/key-id/static/v1\0" ‖ key_hash)`;
//! - dynamic key: `SHA-256("hivenet-router/key-id/dynamic/v1\0" ‖ registry id)`, so rotating a
//!   dynamic key's hash under the same id keeps its buckets, as in the reference;
//!
//! and the ID is the first 32-bit window of that digest that is non-zero and not yet taken,
//! assigning keys in digest order (then a linear probe, which a bounded registry always ends).
//! A key's ID changes only if a key added later collides with it on 32 bits and sorts first: with
//! n keys that chance is about n / 2^32 per added key. `KeyId(0)` is never derived: it is the
//! anonymous key of `api.mode: none`.
//!
//! Flat quotas (`requests_per_minute`, `tokens_per_day`) are documented as shared by every key of
//! one owner; [`TenantId`] is derived from the owner string the same way so limits can key those
//! buckets by a small integer too.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::config::{AuthConfig, KeySettings, ModelAccess};
use super::key_hash::KeyHash;
use crate::base::ids::PositionTable;

mod assign;
mod chunks;
mod live;

pub use assign::MAX_KEYS;
pub(crate) use assign::assign_ids;
use chunks::Chunks;
pub(crate) use live::LiveRegistry;

pub use crate::base::ids::{KeyId, TenantId};

/// The tenant recorded for `api.mode: none` (as the reference's overview says).
pub const ANONYMOUS_OWNER: &str = "default";

const STATIC_KEY_DOMAIN: &[u8] = b"hivenet-router/key-id/static/v1\0";
const DYNAMIC_KEY_DOMAIN: &[u8] = b"hivenet-router/key-id/dynamic/v1\0";
const TENANT_DOMAIN: &[u8] = b"hivenet-router/tenant-id/v1\0";

fn derivation_digest(domain: &[u8], input: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(domain);
    hasher.update(input);
    hasher.finalize().into()
}

/// Where a key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `api.mode: none`.
    Anonymous,
    /// `api.keys[index]` of `auth.yaml`.
    Static { index: usize },
    /// The dynamic registry entry with this id.
    Dynamic { id: String },
}

/// One client key as the request path sees it. Holds the hash, never the raw key; `Debug` shows
/// the preview and IDs only.
///
/// A registry holds one per key, loaded or not, so its size is what an idle key costs (bounded
/// by [`KeyRecord::SIZE_MAX`]): strings are boxed slices, not `String`s, and the expiry is one
/// `i64`.
#[derive(Clone, PartialEq)]
pub struct KeyRecord {
    pub key_id: KeyId,
    pub tenant_id: TenantId,
    pub source: KeySource,
    pub preview: Box<str>,
    pub name: Box<str>,
    /// The tenant: flat quota scope, metrics and audit label. One allocation per owner, shared
    /// by its keys and by every metric series labelled with it.
    pub owner: Arc<str>,
    /// First instant (Unix ms) at which the key stops authenticating; [`NEVER_EXPIRES`]: never.
    /// Read it through [`KeyRecord::expires_at_unix_ms`].
    expires_at_unix_ms: i64,
    /// Dynamic keys can be disabled; static and anonymous keys are always enabled.
    pub enabled: bool,
    pub settings: KeySettings,
    pub(crate) hash: KeyHash,
}

/// The stored expiry of a key that never expires: no clock reaches it (year 292 million).
const NEVER_EXPIRES: i64 = i64::MAX;

impl fmt::Debug for KeyRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRecord")
            .field("key_id", &self.key_id)
            .field("preview", &self.preview)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl KeyRecord {
    /// The most bytes one record takes in the registry, its strings' heap blocks aside. Checked
    /// by a test; raising it raises what every loaded key costs.
    pub const SIZE_MAX: usize = 192;

    /// First instant (Unix ms) at which the key stops authenticating; `None`: never.
    pub fn expires_at_unix_ms(&self) -> Option<i64> {
        (self.expires_at_unix_ms != NEVER_EXPIRES).then_some(self.expires_at_unix_ms)
    }

    /// Model authorisation; see [`KeySettings::authorize`].
    pub fn authorize(&self, model: &str) -> ModelAccess {
        self.settings.authorize(model)
    }

    /// Whether the key may see and use `model`.
    pub fn allows(&self, model: &str) -> bool {
        self.settings.allows(model)
    }

    /// The id written to audit records: the registry id of a dynamic key, the derived key ID
    /// (8 hex digits) of a static key, empty for the anonymous key.
    pub fn audit_key_id(&self) -> String {
        match &self.source {
            KeySource::Anonymous => String::new(),
            KeySource::Static { .. } => self.key_id.to_string(),
            KeySource::Dynamic { id } => id.clone(),
        }
    }

    /// The registry id of a dynamic key.
    fn registry_id(&self) -> Option<&str> {
        match &self.source {
            KeySource::Dynamic { id } => Some(id),
            _ => None,
        }
    }

    /// What the registry was built from, to build it again.
    fn to_input(&self) -> KeyInput {
        KeyInput {
            source: self.source.clone(),
            hash: self.hash,
            preview: self.preview.to_string(),
            name: self.name.to_string(),
            owner: self.owner.to_string(),
            expires_at_unix_ms: self.expires_at_unix_ms(),
            enabled: self.enabled,
            settings: self.settings.clone(),
        }
    }

    fn anonymous() -> KeyRecord {
        KeyRecord {
            key_id: KeyId::ANONYMOUS,
            tenant_id: TenantId::DEFAULT,
            source: KeySource::Anonymous,
            preview: Box::default(),
            name: "anonymous".into(),
            owner: ANONYMOUS_OWNER.into(),
            expires_at_unix_ms: NEVER_EXPIRES,
            enabled: true,
            settings: KeySettings::unrestricted(),
            hash: KeyHash([0; 32]),
        }
    }
}

/// What the registry says about a request's credentials.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AuthOutcome<'a> {
    Authenticated {
        key_id: KeyId,
        key: &'a KeyRecord,
    },
    /// No credential presented (and the mode needs one): 401.
    Missing,
    /// No key with that hash: 401.
    Unknown,
    /// A known key past its expiry: 401 with its own message. The record is for the log line
    /// (preview only).
    Expired {
        key: &'a KeyRecord,
    },
    /// A dynamic key with `enabled: false`: 401.
    Disabled {
        key: &'a KeyRecord,
    },
}

/// Which credential scheme the registry enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryMode {
    /// Every request is the anonymous key.
    Open,
    Static,
    Dynamic,
}

/// An immutable snapshot of the client keys. Build a new one to change it.
#[derive(Debug, Clone)]
pub struct KeyRegistry {
    /// Unique per build and per change in this process (a clone keeps it: same keys): what a quota holder
    /// compares to know whether its key's quota may have changed.
    version: u64,
    mode: RegistryMode,
    /// In copy-on-write chunks: a dynamic-key write copies the chunk it changes, and the shards
    /// keep reading the snapshot before it ([`LiveRegistry`]).
    records: Chunks<KeyRecord>,
    // Positions in `records`, looked up several times per request.
    by_hash: PositionTable,
    by_key_id: PositionTable,
    /// Dynamic keys by registry id (a redirected request names its key by it).
    by_registry_id: PositionTable,
    anonymous: KeyRecord,
}

/// A registry as built, with what [`LiveRegistry`] needs to keep it up to date: the digests the
/// key and tenant IDs were assigned from, and the IDs they got (a static registry drops them).
struct Built {
    registry: KeyRegistry,
    key_digests: Vec<[u8; 32]>,
    key_ids: Vec<u32>,
    owner_digests: Vec<[u8; 32]>,
    tenant_ids: Vec<u32>,
}

/// The fields a registry needs from one key, static or dynamic.
#[derive(Clone)]
pub(crate) struct KeyInput {
    pub(crate) source: KeySource,
    pub(crate) hash: KeyHash,
    pub(crate) preview: String,
    pub(crate) name: String,
    pub(crate) owner: String,
    pub(crate) expires_at_unix_ms: Option<i64>,
    pub(crate) enabled: bool,
    pub(crate) settings: KeySettings,
}

impl KeyInput {
    /// The digest the key's ID is derived from: of its registry id for a dynamic key (so a new
    /// hash under the same id keeps the ID), of its hash otherwise.
    fn digest(&self) -> [u8; 32] {
        match &self.source {
            KeySource::Dynamic { id } => dynamic_key_digest(id),
            _ => derivation_digest(STATIC_KEY_DOMAIN, self.hash.to_hex().as_bytes()),
        }
    }

    fn registry_id(&self) -> Option<&str> {
        match &self.source {
            KeySource::Dynamic { id } => Some(id),
            _ => None,
        }
    }

    fn into_record(self, key_id: KeyId, tenant_id: TenantId, owner: Arc<str>) -> KeyRecord {
        debug_assert_eq!(*owner, *self.owner);
        KeyRecord {
            key_id,
            tenant_id,
            source: self.source,
            preview: self.preview.into_boxed_str(),
            name: self.name.into_boxed_str(),
            owner,
            expires_at_unix_ms: self.expires_at_unix_ms.unwrap_or(NEVER_EXPIRES),
            enabled: self.enabled,
            settings: self.settings,
            hash: self.hash,
        }
    }
}

impl KeyRegistry {
    /// `api.mode: none`: every request is the anonymous key ([`KeyId::ANONYMOUS`], owner
    /// `default`, unrestricted, unlimited).
    pub fn open() -> KeyRegistry {
        KeyRegistry::build(RegistryMode::Open, Vec::new())
    }

    /// The registry for a validated `auth.yaml`: static keys for `api-key`, empty for `dynamic`
    /// (the dynamic registry builds its own snapshots), open for `none`.
    pub fn from_config(config: &AuthConfig) -> KeyRegistry {
        use super::config::ApiMode;
        match config.api_mode {
            ApiMode::None => KeyRegistry::open(),
            ApiMode::Dynamic => KeyRegistry::build(RegistryMode::Dynamic, Vec::new()),
            ApiMode::ApiKey => KeyRegistry::build(
                RegistryMode::Static,
                config
                    .keys
                    .iter()
                    .map(|key| KeyInput {
                        source: KeySource::Static { index: key.index },
                        hash: key.hash,
                        preview: key.preview.clone(),
                        name: key.name.clone(),
                        owner: key.owner.clone(),
                        expires_at_unix_ms: key.expires_at_unix_ms(),
                        enabled: true,
                        settings: key.settings.clone(),
                    })
                    .collect(),
            ),
        }
    }

    /// Builds a snapshot. Inputs must have distinct hashes (validation guarantees it; a later
    /// duplicate would be unreachable and is dropped by the assertion in debug builds).
    pub(crate) fn build(mode: RegistryMode, inputs: Vec<KeyInput>) -> KeyRegistry {
        KeyRegistry::build_parts(mode, inputs).registry
    }

    fn build_parts(mode: RegistryMode, inputs: Vec<KeyInput>) -> Built {
        assert!(inputs.len() <= MAX_KEYS, "registry over MAX_KEYS");
        let key_digests: Vec<[u8; 32]> = inputs.iter().map(KeyInput::digest).collect();
        let key_ids = assign_ids(&key_digests);

        let mut owners: Vec<&str> = inputs.iter().map(|input| input.owner.as_str()).collect();
        owners.sort_unstable();
        owners.dedup();
        let owner_digests: Vec<[u8; 32]> =
            owners.iter().map(|owner| tenant_digest(owner)).collect();
        let tenant_ids = assign_ids(&owner_digests);
        let tenant_of: HashMap<String, (TenantId, Arc<str>)> = owners
            .iter()
            .zip(&tenant_ids)
            .map(|(owner, id)| ((*owner).to_owned(), (TenantId(*id), Arc::from(*owner))))
            .collect();

        let mut registry = KeyRegistry {
            version: next_version(),
            mode,
            records: Chunks::default(),
            // Sized for every key: the tables never grow while the records are added.
            by_hash: PositionTable::with_capacity(inputs.len()),
            by_key_id: PositionTable::with_capacity(inputs.len()),
            by_registry_id: PositionTable::default(),
            anonymous: KeyRecord::anonymous(),
        };
        let mut records = Vec::with_capacity(inputs.len());
        for (input, key_id) in inputs.into_iter().zip(&key_ids) {
            let (tenant_id, owner) = tenant_of[&input.owner].clone();
            records.push(input.into_record(KeyId(*key_id), tenant_id, owner));
        }
        registry.records = Chunks::from_vec(records);
        for at in 0..registry.records.len() {
            registry.index(at);
        }
        Built {
            registry,
            key_digests,
            key_ids,
            owner_digests,
            tenant_ids,
        }
    }

    /// Files the record at `at` in the lookup tables.
    fn index(&mut self, at: usize) {
        let records = &self.records;
        let record = records.get(at);
        debug_assert!(
            self.by_hash
                .find(hash_slot(&record.hash), |other| records.get(other).hash
                    == record.hash)
                .is_none(),
            "duplicate hash reached the registry"
        );
        self.by_hash.insert(hash_slot(&record.hash), at, |other| {
            hash_slot(&records.get(other).hash)
        });
        self.by_key_id
            .insert(key_id_slot(record.key_id), at, |other| {
                key_id_slot(records.get(other).key_id)
            });
        if let KeySource::Dynamic { id } = &record.source {
            self.by_registry_id
                .insert(registry_id_slot(id), at, |other| {
                    registry_id_slot(records.get(other).registry_id().unwrap_or_default())
                });
        }
    }

    /// Takes the record at `at` out of the lookup tables (or, with `to`, files it at `to`).
    fn unindex(&mut self, at: usize, to: Option<usize>) {
        let record = self.records.get(at);
        let refile = |table: &mut PositionTable, hash: u64| match to {
            Some(to) => table.repoint(hash, at, to),
            None => table.remove(hash, at),
        };
        refile(&mut self.by_hash, hash_slot(&record.hash));
        refile(&mut self.by_key_id, key_id_slot(record.key_id));
        if let Some(id) = record.registry_id() {
            refile(&mut self.by_registry_id, registry_id_slot(id));
        }
    }

    /// Adds a record whose key ID, hash and registry id no other record has.
    fn push(&mut self, record: KeyRecord) {
        self.records.push(record);
        self.index(self.records.len() - 1);
        self.version = next_version();
    }

    /// Puts `record` in place of the one at `at`, which has the same key ID and registry id.
    fn replace(&mut self, at: usize, record: KeyRecord) {
        let current = self.records.get(at);
        debug_assert_eq!(current.key_id, record.key_id);
        debug_assert_eq!(current.source, record.source);
        if current.hash != record.hash {
            self.by_hash.remove(hash_slot(&current.hash), at);
            let records = &self.records;
            self.by_hash.insert(hash_slot(&record.hash), at, |other| {
                hash_slot(&records.get(other).hash)
            });
        }
        self.records.set(at, record);
        self.version = next_version();
    }

    /// Removes the record at `at`; the last record takes its position.
    fn remove(&mut self, at: usize) {
        self.unindex(at, None);
        let last = self.records.len() - 1;
        if at != last {
            self.unindex(last, Some(at));
        }
        self.records.swap_remove(at);
        self.version = next_version();
    }

    /// The registry id of the dynamic key with this hash.
    fn registry_id_of_hash(&self, hash: &KeyHash) -> Option<&str> {
        let at = self
            .by_hash
            .find(hash_slot(hash), |at| self.records.get(at).hash == *hash)?;
        self.records.get(at).registry_id()
    }

    /// The position of the dynamic key with this registry id.
    fn position_of(&self, registry_id: &str) -> Option<usize> {
        self.by_registry_id
            .find(registry_id_slot(registry_id), |at| {
                self.records.get(at).registry_id() == Some(registry_id)
            })
    }

    pub fn mode(&self) -> RegistryMode {
        self.mode
    }

    /// This registry's build number: a later build has a larger one.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Number of keys (the anonymous key is not counted).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &KeyRecord> {
        self.records.iter()
    }

    /// The record of a key ID (the anonymous record for [`KeyId::ANONYMOUS`] in open mode).
    #[inline]
    pub fn get(&self, key_id: KeyId) -> Option<&KeyRecord> {
        if self.mode == RegistryMode::Open && key_id == KeyId::ANONYMOUS {
            return Some(&self.anonymous);
        }
        self.by_key_id
            .find(key_id_slot(key_id), |at| {
                self.records.get(at).key_id == key_id
            })
            .map(|position| self.records.get(position))
    }

    /// A known key is usable when it is enabled and not expired at `now_unix_ms`.
    fn usable(key: &KeyRecord, now_unix_ms: i64) -> AuthOutcome<'_> {
        if !key.enabled {
            return AuthOutcome::Disabled { key };
        }
        if now_unix_ms >= key.expires_at_unix_ms {
            return AuthOutcome::Expired { key };
        }
        AuthOutcome::Authenticated {
            key_id: key.key_id,
            key,
        }
    }

    /// Authenticates a request by the key a sibling site vouched for (cross-site redirect: the
    /// redirect token names the dynamic key's registry id, or no key in auth mode `none`). The
    /// key must exist here too, and be enabled and unexpired, like a presented one.
    pub fn authenticate_vouched(&self, registry_id: &str, now_unix_ms: i64) -> AuthOutcome<'_> {
        if self.mode == RegistryMode::Open {
            return AuthOutcome::Authenticated {
                key_id: KeyId::ANONYMOUS,
                key: &self.anonymous,
            };
        }
        if registry_id.is_empty() {
            return AuthOutcome::Missing;
        }
        let Some(position) = self.position_of(registry_id) else {
            return AuthOutcome::Unknown;
        };
        let key = self.records.get(position);
        Self::usable(key, now_unix_ms)
    }

    /// Authenticates the presented raw key (from [`presented_key`]) at `now_unix_ms`.
    ///
    /// One SHA-256, one map probe, then a constant-time comparison of the stored hash with the
    /// computed one. The probe compares digests of the presented key, which reveal nothing an
    /// attacker can steer towards a stored key, so only the final equality needs to be
    /// constant-time.
    pub fn authenticate(&self, presented: Option<&[u8]>, now_unix_ms: i64) -> AuthOutcome<'_> {
        if self.mode == RegistryMode::Open {
            return AuthOutcome::Authenticated {
                key_id: KeyId::ANONYMOUS,
                key: &self.anonymous,
            };
        }
        let raw_key = match presented {
            Some(raw_key) if !raw_key.is_empty() => raw_key,
            _ => return AuthOutcome::Missing,
        };
        let hash = KeyHash::of_raw_key(raw_key);
        // The probe's equality is not constant-time; the final comparison is.
        let Some(position) = self
            .by_hash
            .find(hash_slot(&hash), |at| self.records.get(at).hash.0 == hash.0)
        else {
            return AuthOutcome::Unknown;
        };
        let key = self.records.get(position);
        if !key.hash.ct_eq(&hash) {
            return AuthOutcome::Unknown;
        }
        Self::usable(key, now_unix_ms)
    }
}

#[cfg(test)]
impl KeyRegistry {
    /// Panics unless this registry holds the same records as `other`, each found by its hash, its
    /// key ID and its registry id, and its tables file nothing else: for registries built
    /// differently that must agree.
    pub(crate) fn assert_same_keys(&self, other: &KeyRegistry) {
        assert_eq!(self.mode, other.mode);
        assert_eq!(self.len(), other.len());
        let dynamic = self.iter().filter(|key| key.registry_id().is_some());
        assert_eq!(self.by_hash.len(), self.len());
        assert_eq!(self.by_key_id.len(), self.len());
        assert_eq!(self.by_registry_id.len(), dynamic.count());
        for record in other.iter() {
            assert_eq!(self.get(record.key_id), Some(record));
            let by_hash = self.by_hash.find(hash_slot(&record.hash), |at| {
                self.records.get(at).hash == record.hash
            });
            assert_eq!(by_hash.map(|at| self.records.get(at)), Some(record));
            if let Some(id) = record.registry_id() {
                let by_id = self.position_of(id).map(|at| self.records.get(at));
                assert_eq!(by_id, Some(record));
            }
        }
    }
}

/// The table hash of a key hash: its first 8 bytes. A SHA-256 digest is already uniform, and a
/// lookup never inserts, so a client choosing keys cannot lengthen the probes of stored keys.
fn hash_slot(hash: &KeyHash) -> u64 {
    let mut first = [0; 8];
    first.copy_from_slice(&hash.0[..8]);
    u64::from_le_bytes(first)
}

/// The table hash of a key ID. IDs are windows of digests, so uniform in their 32 bits; the
/// multiplication spreads them over the 64 (the table reads both the top and the bottom bits).
fn key_id_slot(key_id: KeyId) -> u64 {
    u64::from(key_id.0).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The table hash of a dynamic key's registry id: seeded once per process. Ids are chosen by
/// the control service, which holds the admin key.
fn registry_id_slot(id: &str) -> u64 {
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(Default::default).hash_one(id)
}

/// Each build and each change of a registry gets the next number.
fn next_version() -> u64 {
    static BUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn dynamic_key_digest(registry_id: &str) -> [u8; 32] {
    derivation_digest(DYNAMIC_KEY_DOMAIN, registry_id.as_bytes())
}

fn tenant_digest(owner: &str) -> [u8; 32] {
    derivation_digest(TENANT_DOMAIN, owner.as_bytes())
}

/// The raw key a client presented: `Authorization: Bearer <key>` (scheme case-insensitive), the
/// raw value of `Authorization` without a scheme (accepted by the reference), else `x-api-key`
/// (Anthropic clients). Surrounding spaces are trimmed; an empty value counts as absent.
pub fn presented_key<'a>(
    authorization: Option<&'a [u8]>,
    x_api_key: Option<&'a [u8]>,
) -> Option<&'a [u8]> {
    let from_authorization = authorization.map(trim_spaces).and_then(|value| {
        let value = match value.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => trim_spaces(&value[7..]),
            _ if value.eq_ignore_ascii_case(b"bearer") => &[],
            _ => value,
        };
        (!value.is_empty()).then_some(value)
    });
    from_authorization.or_else(|| x_api_key.map(trim_spaces).filter(|value| !value.is_empty()))
}

/// The admin credential: only `Authorization: Bearer <key>` (scheme case-insensitive), the one
/// form the admin reference documents. Unlike [`presented_key`], a raw `Authorization` value and
/// `x-api-key` are not admin credentials. Surrounding spaces are trimmed; an empty key is absent.
pub fn bearer_token(authorization: Option<&[u8]>) -> Option<&[u8]> {
    let value = trim_spaces(authorization?);
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = trim_spaces(&value[7..]);
    (!token.is_empty()).then_some(token)
}

fn trim_spaces(value: &[u8]) -> &[u8] {
    value.trim_ascii()
}

#[cfg(test)]
mod tests;
