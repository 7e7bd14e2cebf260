//! `auth.yaml`: the file model exactly as `security-auth-yaml-reference.mdx` documents it, and
//! its validation into an [`AuthConfig`].
//!
//! Owns: the serde shapes of the file ([`AuthFile`] and below, unknown fields refused), the
//! per-key settings shared with dynamic keys ([`KeySettings`]: allowlist, quota shape, occupancy
//! share) and their rules, the static date format, and the cross-config serverless check
//! ([`ServerlessLimits`], filled by the policy module).
//!
//! Must not: read files, the environment or the clock. The caller passes text and limits.
//!
//! Invariants of a validated [`AuthConfig`]: every key has a well-formed, unique hash, a non-empty
//! name and owner, valid dates with `expires_at >= created_at`, non-negative limits, one quota
//! shape, and an occupancy share that is unset or in (0, 1]. Validation reports every problem it
//! finds, each naming the key (`api.keys[i] (preview)`) and the field.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use super::key_hash::KeyHash;

// ---------------------------------------------------------------------------------------------
// The file as written.
// ---------------------------------------------------------------------------------------------

/// The whole `auth.yaml`. Both sections are optional; an absent `api` means `mode: none`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    #[serde(default, deserialize_with = "null_as_default")]
    pub api: ApiSection,
    #[serde(default, deserialize_with = "null_as_default")]
    pub admin: AdminSection,
}

/// `api`: protects `/v1/*`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    /// Default `none` (the reference's default when nothing is configured).
    #[serde(default)]
    pub mode: ApiMode,
    /// Static client keys; used only with `mode: api-key`. A bare `keys:` (null) is empty.
    #[serde(default, deserialize_with = "null_as_default")]
    pub keys: Vec<StaticKeyEntry>,
}

/// `api.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApiMode {
    /// No client credentials; every request is the anonymous key.
    #[default]
    #[serde(rename = "none")]
    None,
    /// Static keys from `api.keys`.
    #[serde(rename = "api-key")]
    ApiKey,
    /// The in-memory registry managed through `/admin/api-keys/*`.
    #[serde(rename = "dynamic")]
    Dynamic,
}

impl ApiMode {
    /// Parses `HIVENET_ROUTER_AUTH_MODE` (used only when no auth file is configured).
    pub fn parse(text: &str) -> Option<ApiMode> {
        match text.trim() {
            "" | "none" => Some(ApiMode::None),
            "api-key" => Some(ApiMode::ApiKey),
            "dynamic" => Some(ApiMode::Dynamic),
            _ => None,
        }
    }
}

/// `admin`: protects `/admin/*`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// `None` when the section or its `mode` is omitted; see `admin::resolve`.
    #[serde(default)]
    pub mode: Option<AdminMode>,
}

/// `admin.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminMode {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "api-key")]
    ApiKey,
}

/// One item of `api.keys`, as written. Required fields default to empty here so that a missing
/// one is reported by validation with the key's name, not by the parser.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticKeyEntry {
    /// SHA-256 of the raw key, 64 lowercase hex digits. Required.
    #[serde(default, deserialize_with = "null_as_default")]
    pub key_hash: String,
    /// Masked value for logs and operators; never used to authenticate.
    #[serde(default, deserialize_with = "null_as_default")]
    pub key_preview: String,
    /// Required.
    #[serde(default)]
    pub metadata: Option<MetadataEntry>,
    /// Exact, case-sensitive model allowlist; empty or omitted: unrestricted.
    #[serde(default, deserialize_with = "null_as_default")]
    pub models: Vec<String>,
    /// Flat or per-model quota; omitted: unlimited.
    #[serde(default)]
    pub quota: Option<QuotaSpec>,
    /// Fraction of the replica-scaled occupancy capacity (serverless B4); `0` is unset.
    #[serde(default)]
    pub max_occupancy_share: Option<f64>,
}

/// `metadata` of a static key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataEntry {
    /// Human-readable label. Required, non-empty.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// Tenant identity: quota buckets keyed by owner, metrics, audit. Required, non-empty.
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner: String,
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    /// `DD-MM-YYYY`; informational.
    #[serde(default, deserialize_with = "null_as_default")]
    pub created_at: String,
    /// `DD-MM-YYYY`, the last valid UTC day; empty: never expires.
    #[serde(default, deserialize_with = "null_as_default")]
    pub expires_at: String,
}

/// `quota`, the same shape in `auth.yaml` and in dynamic key bodies. Limits are read as signed
/// integers so that a negative value gets a message naming the key and field rather than a
/// parser error. Absent fields stay absent when a dynamic entry is echoed back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Requests per minute, continuously refilling; `0`: unlimited. Scope: the owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<i64>,
    /// Chat tokens (input + output) per UTC day; `0`: unlimited. Scope: the owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<i64>,
    /// Serverless input tokens per minute (B4); `0`: unlimited. Scope: key and model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens_per_minute: Option<i64>,
    /// Serverless output tokens per minute (B4); `0`: unlimited. Scope: key and model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_minute: Option<i64>,
    /// Per-model limits; its model names become the key's allowlist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_model: Option<BTreeMap<String, PerModelQuotaSpec>>,
}

/// One `quota.per_model` entry as written; both fields are required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerModelQuotaSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute_per_replica: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<i64>,
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// Validated settings shared by static and dynamic keys.
// ---------------------------------------------------------------------------------------------

/// A key's quota after validation. Every limit is `0` for unlimited.
#[derive(Debug, Clone, PartialEq)]
pub enum Quota {
    /// One budget for every model the owner may call.
    Flat(FlatQuota),
    /// A budget per model; also the key's effective allowlist (strict enumeration).
    PerModel(BTreeMap<String, PerModelQuota>),
}

impl Default for Quota {
    fn default() -> Self {
        Quota::Flat(FlatQuota::default())
    }
}

/// Flat limits; `0` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlatQuota {
    pub requests_per_minute: u64,
    pub tokens_per_day: u64,
    pub input_tokens_per_minute: u64,
    pub output_tokens_per_minute: u64,
}

/// Per-model limits; `0` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerModelQuota {
    /// Multiplied by the healthy replicas serving the model; the check is skipped at zero replicas.
    pub requests_per_minute_per_replica: u64,
    /// Absolute daily budget for this owner and model; does not scale with replicas.
    pub tokens_per_day: u64,
}

/// What a key may do with a model it names in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelAccess {
    Allowed,
    /// Outside the explicit allowlist: `403 model_forbidden`.
    Forbidden,
    /// The key uses `quota.per_model` and this model has no entry: `429 rate_limit_exceeded`,
    /// "no quota declared for model <model> on this API key".
    NoQuotaDeclared,
}

/// Access and limits of one key, static or dynamic, after validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeySettings {
    /// Sorted and deduplicated; empty: unrestricted. Ignored when `quota` is per-model. A boxed
    /// slice, not a `Vec`: every key of a registry holds one (see `KeyRecord`'s size bound).
    allowed_models: Box<[String]>,
    quota: Quota,
    /// `0.0` is unset; otherwise in (0, 1].
    max_occupancy_share: f64,
}

impl KeySettings {
    /// Unrestricted and unlimited (the anonymous key of `api.mode: none`).
    pub fn unrestricted() -> KeySettings {
        KeySettings::default()
    }

    /// Model authorisation. `quota.per_model` takes precedence over the allowlist: its names are
    /// the only models the key may use, and others get [`ModelAccess::NoQuotaDeclared`].
    pub fn authorize(&self, model: &str) -> ModelAccess {
        if let Quota::PerModel(per_model) = &self.quota {
            return if per_model.contains_key(model) {
                ModelAccess::Allowed
            } else {
                ModelAccess::NoQuotaDeclared
            };
        }
        if self.allowed_models.is_empty()
            || self
                .allowed_models
                .binary_search_by(|allowed| allowed.as_str().cmp(model))
                .is_ok()
        {
            ModelAccess::Allowed
        } else {
            ModelAccess::Forbidden
        }
    }

    /// Whether the model is visible to the key (`GET /v1/models`) and usable by it.
    pub fn allows(&self, model: &str) -> bool {
        self.authorize(model) == ModelAccess::Allowed
    }

    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The explicit allowlist (sorted); empty: unrestricted.
    pub fn allowed_models(&self) -> &[String] {
        &self.allowed_models
    }

    /// `None` when unset (`0`).
    pub fn max_occupancy_share(&self) -> Option<f64> {
        (self.max_occupancy_share > 0.0).then_some(self.max_occupancy_share)
    }

    /// The flat quota's `input_tokens_per_minute`; `0` when unset or per-model (a per-model
    /// quota cannot carry one). Only a key with a nonzero one can fail the serverless check.
    pub(crate) fn input_tokens_per_minute(&self) -> u64 {
        match &self.quota {
            Quota::Flat(flat) => flat.input_tokens_per_minute,
            Quota::PerModel(_) => 0,
        }
    }

    /// The cross-config serverless invariant (seed "Validation and derived defaults", rule 3):
    /// a nonzero `input_tokens_per_minute` must be at least `max_input_tokens` of every
    /// serverless model the key can reach. Rules 1 and 2 are checked when the settings are built.
    pub(crate) fn check_serverless(&self, limits: &ServerlessLimits, sink: &mut Sink<'_>) {
        let itpm = self.input_tokens_per_minute();
        if itpm == 0 {
            return;
        }
        let mut check = |label: &str, max_input_tokens: u64| {
            if max_input_tokens > 0 && itpm < max_input_tokens {
                sink.push(
                    "quota.input_tokens_per_minute",
                    format!(
                        "{itpm} is below max_input_tokens {max_input_tokens} of serverless {label}; \
                         one maximal request could never be admitted"
                    ),
                );
            }
        };
        if self.allowed_models.is_empty() {
            if let Some(max) = limits.global_max_input_tokens {
                check("global policy", max);
            }
            for (model, max) in &limits.models {
                if let Some(max) = max {
                    check(&format!("model {model}"), *max);
                }
            }
        } else {
            for model in &self.allowed_models {
                if let Some(max) = limits.effective(model) {
                    check(&format!("model {model}"), max);
                }
            }
        }
    }
}

/// The serverless side of the routing policies, as far as key validation needs it: the hook the
/// policy module fills (seed "Validation and derived defaults"). Only what the cross-config check
/// reads: each effective policy's `max_input_tokens` when its `mode` is `serverless`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerlessLimits {
    /// `max_input_tokens` of the global policy when it is `mode: serverless` (`0`: no cap);
    /// `None` when the global policy is `reserved`. Applies to every model no named policy covers.
    pub global_max_input_tokens: Option<u64>,
    /// Models named by per-model policies: `Some(max_input_tokens)` when their effective policy is
    /// serverless, `None` when reserved (which overrides a serverless global policy).
    pub models: BTreeMap<String, Option<u64>>,
}

impl ServerlessLimits {
    /// No serverless policy anywhere: the cross-config check passes trivially.
    pub fn none() -> ServerlessLimits {
        ServerlessLimits::default()
    }

    /// `max_input_tokens` of the effective policy for `model` when it is serverless.
    pub fn effective(&self, model: &str) -> Option<u64> {
        match self.models.get(model) {
            Some(named) => *named,
            None => self.global_max_input_tokens,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Problems.
// ---------------------------------------------------------------------------------------------

/// One validation problem: which key (or section), which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `api`, `api.keys[2] (sk-...beta)`, `key acme-prod`, ...
    pub subject: String,
    /// Field path inside the subject, e.g. `quota.requests_per_minute`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.subject, self.field, self.message)
    }
}

/// Every problem found, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn first(&self) -> Option<&Problem> {
        self.0.first()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter()
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Collects problems for one subject.
pub(crate) struct Sink<'a> {
    pub(crate) subject: String,
    pub(crate) list: &'a mut Vec<Problem>,
}

impl<'a> Sink<'a> {
    pub(crate) fn new(subject: String, list: &'a mut Vec<Problem>) -> Sink<'a> {
        Sink { subject, list }
    }

    pub(crate) fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.list.push(Problem {
            subject: self.subject.clone(),
            field: field.into(),
            message: message.into(),
        });
    }
}

/// Why `auth.yaml` was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML, or not this schema (unknown field, wrong type, unknown mode).
    /// The message names the field path and the line and column.
    #[error("auth.yaml could not be parsed: {message}")]
    Parse {
        message: String,
        /// 1-based, when the parser knows it.
        line: Option<usize>,
    },
    /// Parsed, but breaks one or more rules.
    #[error("auth.yaml is invalid: {0}")]
    Invalid(Problems),
}

// ---------------------------------------------------------------------------------------------
// Validated configuration.
// ---------------------------------------------------------------------------------------------

/// A validated `auth.yaml`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthConfig {
    pub api_mode: ApiMode,
    /// As written; `admin::resolve` applies defaults and dynamic-mode elevation.
    pub admin_mode: Option<AdminMode>,
    /// Static keys in file order; empty unless `api_mode` is `ApiKey`.
    pub keys: Vec<StaticKey>,
}

/// One validated static key. Holds the key's hash, never the raw key.
#[derive(Clone, PartialEq)]
pub struct StaticKey {
    /// Position in `api.keys`, for messages.
    pub index: usize,
    pub hash: KeyHash,
    pub preview: String,
    pub name: String,
    pub owner: String,
    pub description: String,
    pub created_at: Option<CivilDate>,
    /// The last valid UTC day.
    pub expires_at: Option<CivilDate>,
    pub settings: KeySettings,
}

impl fmt::Debug for StaticKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKey")
            .field("index", &self.index)
            .field("preview", &self.preview)
            .finish_non_exhaustive()
    }
}

impl StaticKey {
    /// The first instant (Unix ms) at which the key no longer authenticates: midnight UTC after
    /// the named day ("valid through the complete named day").
    pub fn expires_at_unix_ms(&self) -> Option<i64> {
        self.expires_at.map(|day| day.next_day_start_unix_ms())
    }
}

impl AuthConfig {
    /// No file: client API open, admin section unset.
    pub fn none() -> AuthConfig {
        AuthConfig::default()
    }

    /// Parses and validates `auth.yaml` text. Reports every rule broken, not just the first.
    /// The cross-config serverless check is separate ([`AuthConfig::check_serverless`]) because
    /// it needs the routing policies.
    pub fn from_yaml(text: &str) -> Result<AuthConfig, ConfigError> {
        // Shape limits first: nesting and alias expansion (`doc_guard`).
        let file: AuthFile =
            crate::base::doc_guard::from_yaml(text).map_err(|error| ConfigError::Parse {
                line: error.line,
                message: error.message,
            })?;
        AuthConfig::from_file(file)
    }

    /// Validates a parsed file.
    pub fn from_file(file: AuthFile) -> Result<AuthConfig, ConfigError> {
        let mut problems = Vec::new();
        let mut keys = Vec::new();
        match file.api.mode {
            ApiMode::ApiKey if file.api.keys.is_empty() => problems.push(Problem {
                subject: "api".into(),
                field: "keys".into(),
                message: "must list at least one key when mode is api-key".into(),
            }),
            ApiMode::Dynamic if !file.api.keys.is_empty() => problems.push(Problem {
                subject: "api".into(),
                field: "keys".into(),
                message: "must be empty when mode is dynamic (the registry is managed through \
                          /admin/api-keys)"
                    .into(),
            }),
            _ => {}
        }
        // With mode none the keys are parsed (unknown fields still refused) but neither
        // validated nor used, as in the reference implementation.
        if file.api.mode == ApiMode::ApiKey {
            let mut first_index_of_hash: HashMap<KeyHash, usize> = HashMap::new();
            for (index, entry) in file.api.keys.iter().enumerate() {
                let mut sink = Sink::new(static_subject(index, &entry.key_preview), &mut problems);
                if let Some(key) = validate_static_key(index, entry, &mut sink) {
                    if let Some(first) = first_index_of_hash.get(&key.hash) {
                        sink.push(
                            "key_hash",
                            format!("duplicates the hash of api.keys[{first}]"),
                        );
                    } else {
                        first_index_of_hash.insert(key.hash, index);
                        keys.push(key);
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(AuthConfig {
                api_mode: file.api.mode,
                admin_mode: file.admin.mode,
                keys,
            })
        } else {
            Err(ConfigError::Invalid(Problems(problems)))
        }
    }

    /// Drops the static keys [`AuthConfig::check_serverless`] can never refuse (no
    /// `input_tokens_per_minute`): what the control core keeps of the file once the key registry
    /// is built, for the reverse check on policy changes. The registry holds every key; keeping
    /// them all here too doubled the memory of every loaded key. The check's outcome is unchanged.
    pub fn retain_serverless_checked(&mut self) {
        self.keys
            .retain(|key| key.settings.input_tokens_per_minute() > 0);
        self.keys.shrink_to_fit();
    }

    /// The cross-config serverless invariant for every static key (run at start-up and whenever
    /// auth or policy is reloaded).
    pub fn check_serverless(&self, limits: &ServerlessLimits) -> Result<(), Problems> {
        let mut problems = Vec::new();
        for key in &self.keys {
            let mut sink = Sink::new(static_subject(key.index, &key.preview), &mut problems);
            key.settings.check_serverless(limits, &mut sink);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Problems(problems))
        }
    }
}

fn static_subject(index: usize, preview: &str) -> String {
    if preview.is_empty() {
        format!("api.keys[{index}]")
    } else {
        format!("api.keys[{index}] ({preview})")
    }
}

fn validate_static_key(
    index: usize,
    entry: &StaticKeyEntry,
    sink: &mut Sink<'_>,
) -> Option<StaticKey> {
    let before = sink.list.len();
    let hash = parse_static_hash(&entry.key_hash, sink);
    let metadata = entry.metadata.clone().unwrap_or_default();
    if entry.metadata.is_none() {
        sink.push("metadata", "is required (with name and owner)");
    } else {
        if metadata.name.trim().is_empty() {
            sink.push("metadata.name", "must not be empty");
        }
        if metadata.owner.trim().is_empty() {
            sink.push("metadata.owner", "must not be empty");
        }
    }
    let created_at = parse_optional_date("metadata.created_at", &metadata.created_at, sink);
    let expires_at = parse_optional_date("metadata.expires_at", &metadata.expires_at, sink);
    if let (Some(created), Some(expires)) = (created_at, expires_at)
        && expires < created
    {
        sink.push(
            "metadata.expires_at",
            format!(
                "{} is before metadata.created_at {}",
                metadata.expires_at.trim(),
                metadata.created_at.trim()
            ),
        );
    }
    let settings = validate_settings(
        "models",
        &entry.models,
        entry.quota.as_ref(),
        entry.max_occupancy_share,
        sink,
    );
    if sink.list.len() != before {
        return None;
    }
    Some(StaticKey {
        index,
        hash: hash?,
        preview: entry.key_preview.clone(),
        name: metadata.name,
        owner: metadata.owner,
        description: metadata.description,
        created_at,
        expires_at,
        settings: settings?,
    })
}

/// Static hashes must be exactly what `sha256sum` prints: 64 lowercase hex digits. An uppercase
/// hash is refused rather than normalised, as the reference asks for the exact lowercase output.
fn parse_static_hash(text: &str, sink: &mut Sink<'_>) -> Option<KeyHash> {
    if text.is_empty() {
        sink.push("key_hash", "is required");
        return None;
    }
    if text.bytes().any(|byte| byte.is_ascii_uppercase()) && KeyHash::parse_hex(text).is_some() {
        sink.push(
            "key_hash",
            "must be lowercase hex exactly as sha256sum prints it",
        );
        return None;
    }
    match KeyHash::parse_hex(text) {
        Some(hash) => Some(hash),
        None => {
            sink.push(
                "key_hash",
                format!(
                    "must be 64 hex digits (the SHA-256 of the raw key), got {} characters",
                    text.chars().count()
                ),
            );
            None
        }
    }
}

fn parse_optional_date(field: &str, text: &str, sink: &mut Sink<'_>) -> Option<CivilDate> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let date = CivilDate::parse_dd_mm_yyyy(text);
    if date.is_none() {
        sink.push(field, format!("{text:?} is not a valid DD-MM-YYYY date"));
    }
    date
}

fn check_limit(field: &str, value: Option<i64>, sink: &mut Sink<'_>) -> u64 {
    match value {
        Some(value) if value < 0 => {
            sink.push(
                field,
                format!("must not be negative (got {value}); use 0 for unlimited"),
            );
            0
        }
        Some(value) => value as u64,
        None => 0,
    }
}

/// The rules shared by static and dynamic keys: allowlist entries, quota shape and limits,
/// occupancy share. `models_field` is `models` (auth.yaml) or `allowed_models` (admin API).
pub(crate) fn validate_settings(
    models_field: &str,
    models: &[String],
    quota: Option<&QuotaSpec>,
    max_occupancy_share: Option<f64>,
    sink: &mut Sink<'_>,
) -> Option<KeySettings> {
    let before = sink.list.len();
    for (position, model) in models.iter().enumerate() {
        if model.trim().is_empty() {
            sink.push(format!("{models_field}[{position}]"), "must not be empty");
        }
    }
    let mut allowed_models = models.to_vec();
    allowed_models.sort();
    allowed_models.dedup();

    let quota = match quota {
        None => Quota::default(),
        Some(spec) => validate_quota(spec, sink),
    };

    let share = max_occupancy_share.unwrap_or(0.0);
    // Written so that NaN fails too.
    if !(0.0..=1.0).contains(&share) {
        sink.push(
            "max_occupancy_share",
            format!("must be 0 (unset) or in (0, 1], got {share}"),
        );
    }

    (sink.list.len() == before).then_some(KeySettings {
        allowed_models: allowed_models.into_boxed_slice(),
        quota,
        max_occupancy_share: share,
    })
}

fn validate_quota(spec: &QuotaSpec, sink: &mut Sink<'_>) -> Quota {
    let flat = FlatQuota {
        requests_per_minute: check_limit(
            "quota.requests_per_minute",
            spec.requests_per_minute,
            sink,
        ),
        tokens_per_day: check_limit("quota.tokens_per_day", spec.tokens_per_day, sink),
        input_tokens_per_minute: check_limit(
            "quota.input_tokens_per_minute",
            spec.input_tokens_per_minute,
            sink,
        ),
        output_tokens_per_minute: check_limit(
            "quota.output_tokens_per_minute",
            spec.output_tokens_per_minute,
            sink,
        ),
    };
    let Some(per_model_spec) = &spec.per_model else {
        return Quota::Flat(flat);
    };
    let flat_fields: Vec<&str> = [
        ("requests_per_minute", spec.requests_per_minute),
        ("tokens_per_day", spec.tokens_per_day),
        ("input_tokens_per_minute", spec.input_tokens_per_minute),
        ("output_tokens_per_minute", spec.output_tokens_per_minute),
    ]
    .into_iter()
    .filter_map(|(name, value)| value.map(|_| name))
    .collect();
    if !flat_fields.is_empty() {
        sink.push(
            "quota",
            format!(
                "mixes flat fields ({}) with per_model; choose one shape",
                flat_fields.join(", ")
            ),
        );
    }
    if per_model_spec.is_empty() {
        sink.push("quota.per_model", "must list at least one model");
    }
    let mut per_model = BTreeMap::new();
    for (model, entry) in per_model_spec {
        if model.trim().is_empty() {
            sink.push("quota.per_model", "has an empty model name");
            continue;
        }
        let field = |name: &str, value: Option<i64>, sink: &mut Sink<'_>| match value {
            None => {
                sink.push(
                    format!("quota.per_model.{model}.{name}"),
                    "is required (use 0 for unlimited)",
                );
                0
            }
            Some(_) => check_limit(&format!("quota.per_model.{model}.{name}"), value, sink),
        };
        let quota = PerModelQuota {
            requests_per_minute_per_replica: field(
                "requests_per_minute_per_replica",
                entry.requests_per_minute_per_replica,
                sink,
            ),
            tokens_per_day: field("tokens_per_day", entry.tokens_per_day, sink),
        };
        per_model.insert(model.clone(), quota);
    }
    Quota::PerModel(per_model)
}

// ---------------------------------------------------------------------------------------------
// Dates.
// ---------------------------------------------------------------------------------------------

/// A calendar day (UTC) as days since 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CivilDate {
    pub days_since_epoch: i64,
}

const MILLIS_PER_DAY: i64 = 86_400_000;
/// Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i64 = 2_440_588;

impl CivilDate {
    /// `DD-MM-YYYY`, exactly two, two and four digits.
    pub fn parse_dd_mm_yyyy(text: &str) -> Option<CivilDate> {
        let bytes = text.as_bytes();
        if bytes.len() != 10 || bytes[2] != b'-' || bytes[5] != b'-' {
            return None;
        }
        let digits = |range: std::ops::Range<usize>| -> Option<i32> {
            let part = &text[range];
            part.bytes()
                .all(|byte| byte.is_ascii_digit())
                .then(|| part.parse().ok())
                .flatten()
        };
        let day = u8::try_from(digits(0..2)?).ok()?;
        let month = time::Month::try_from(u8::try_from(digits(3..5)?).ok()?).ok()?;
        let year = digits(6..10)?;
        let date = time::Date::from_calendar_date(year, month, day).ok()?;
        Some(CivilDate {
            days_since_epoch: i64::from(date.to_julian_day()) - UNIX_EPOCH_JULIAN_DAY,
        })
    }

    /// The UTC day containing `unix_ms`.
    pub fn from_unix_ms(unix_ms: i64) -> CivilDate {
        CivilDate {
            days_since_epoch: unix_ms.div_euclid(MILLIS_PER_DAY),
        }
    }

    /// Midnight UTC at the start of the following day, in Unix ms.
    pub fn next_day_start_unix_ms(self) -> i64 {
        (self.days_since_epoch + 1).saturating_mul(MILLIS_PER_DAY)
    }
}

/// An RFC 3339 timestamp (dynamic keys' `expires_at`) as Unix ms.
pub fn parse_rfc3339_unix_ms(text: &str) -> Option<i64> {
    let instant =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(instant.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests;
