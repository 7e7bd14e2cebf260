//! Client and administrator authentication: the `auth.yaml` model, the key registry the shards
//! read, the dynamic key registry the admin API writes, and the admin-access rules.
//!
//! # Key components
//!
//! - [`config`]: `auth.yaml` parsed with unknown fields refused, then validated into an
//!   [`config::AuthConfig`]; the per-key settings (allowlist, quota shape, occupancy share) and
//!   their rules are shared with dynamic keys; the cross-config serverless check takes a
//!   [`config::ServerlessLimits`] the policy module fills.
//! - [`key_hash`]: the SHA-256 of a raw key ([`key_hash::KeyHash`]), the only form a key is kept
//!   in, and the "hash a key" helper.
//! - [`keys`]: the immutable [`keys::KeyRegistry`] snapshot a shard asks "who is this?" — one
//!   SHA-256 of the presented key, one map lookup, one constant-time compare — and the per-key
//!   [`keys::KeyId`] the limits are keyed by.
//! - [`dynamic`]: the `/admin/api-keys/*` registry as plain data; every write is validated and
//!   either applies whole or leaves the registry as it was.
//! - [`admin`]: who may call `/admin/*` (admin keys from the environment, the insecure override,
//!   dynamic-mode elevation).
//!
//! # Architecture
//!
//! Pure logic only: no sockets, no runtime, no clock. Time comes in as `now_unix_ms`; environment
//! values come in as arguments. The control core parses, validates and builds a `KeyRegistry`;
//! shards swap that snapshot in and only read it.
//!
//! # Error handling
//!
//! Configuration and admin-write errors are values listing every problem, each naming the key
//! (by index and preview, or by registry id) and the field. Request-time outcomes
//! ([`keys::AuthOutcome`], [`keys::ModelAccess`]) are plain enums; the one error module maps them to
//! 401 / 403 / 429.
//!
//! # Performance
//!
//! Authentication costs one SHA-256 of the presented key and one hash-map probe; model
//! authorisation is a binary search in a sorted allowlist. Neither allocates.
//!
//! Raw keys are never stored; `Debug` of anything key-related shows only the preview.

pub mod admin;
pub mod config;
pub mod dynamic;
pub mod key_hash;
pub mod keys;
