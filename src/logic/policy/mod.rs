//! Routing and admission policies: the policy YAML of `routing-policy-yaml-reference.mdx`
//! parsed, validated and compiled into plain data the request path can query cheaply.
//!
//! # Key components
//!
//! - [`document`]: the document as written (serde shapes, unknown fields refused) and as the
//!   admin API shows it.
//! - [`compile`]: every value rule, turning a document into a [`ModelPolicy`] (admission limits,
//!   `shed_if`, the primary step, the fallback chain, the provider fallback), or into
//!   [`PolicyError`] listing every problem with its field path.
//! - [`gates`]: metrics, operators, [`Gates::fails`] over [`Signals`] (a missing signal passes).
//! - [`matching`]: static [`Match`] filters over an agent's registered [`AgentFacts`].
//! - [`set`]: [`PolicySet`], the global policy plus named per-model documents, and
//!   [`PolicySet::effective`] (a named document's policy replaces the global one whole).
//! - [`dir`]: what a `--policy-model-dir` listing changes, at start-up and on reload.
//!
//! # Architecture
//!
//! Pure logic: no files, no environment, no clock, no runtime. The control core
//! (`control::policy_reload`, `control::admin_policy`) reads files and admin bodies, calls in
//! here, runs the cross-config key check against [`PolicySet::serverless_limits`], and publishes
//! the new `Arc<PolicySet>`. A set is immutable; every change builds a new one.
//!
//! # Error handling
//!
//! Text that is not a policy is a [`PolicyError::Parse`] with the parser's message (field path,
//! line, column); a well-formed document that breaks rules is a [`PolicyError::Invalid`] listing
//! every problem. Both name their origin (`--policy-file /etc/...`, `policy file ...`,
//! `PUT /admin/policy`). Nothing here panics on input.
//!
//! # Performance
//!
//! [`PolicySet::effective`] is one hash lookup by model name; [`Gates::fails`] and
//! [`Match::matches`] walk at most 16 rules and 6 fields and allocate nothing.
//!
//! # Not wired yet
//!
//! Nothing on the request path reads these types yet: admission gates (B1–B4), `exclude_if`,
//! `match`, fallback steps and provider fallback are wired into the shards separately.

pub mod compile;
pub mod dir;
pub mod document;
pub mod gates;
pub mod matching;
pub mod routing;
pub mod set;

pub use compile::{
    Compiled, GLOBAL_NAME, Mode, ModelPolicy, PRIMARY_STEP, PolicyContext, PolicyError, Problem,
    Problems, ProviderEngine, ProviderFallback, ProviderKeys, Role, Step, Strategy, compile,
    compile_text,
};
pub use document::PolicyDocument;
pub use gates::{Gate, Gates, Metric, Op, Signals, Unit};
pub use matching::{AgentFacts, Match, MatchField};
pub use set::{Origin, OwnershipConflict, PolicyEntry, PolicySet, check_policy_name};
