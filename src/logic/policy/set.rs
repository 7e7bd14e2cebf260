//! The active policies: one global policy and the named per-model documents, with each model's
//! effective policy precomputed.
//!
//! Selection (policy reference, "Policy selection"): a model listed by a named document uses that
//! document's policy, whole — nothing is inherited from or merged with the global policy; every
//! other model uses the global policy.
//!
//! A [`PolicySet`] is immutable once built and shared as `Arc<PolicySet>`: every change (reload,
//! admin write) builds a new set from the current one, so a reader never sees half a change.
//!
//! Invariants: a model belongs to at most one named document; `effective` never fails (a model
//! no document names gets the global policy, and there is always one, at worst the built-in).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use crate::logic::auth::config::ServerlessLimits;

use super::compile::{Compiled, Mode, ModelPolicy, PolicyContext};
use super::document::PolicyDocument;

/// Where the active version of a document came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Nothing configured.
    BuiltIn,
    /// `--policy-file`, or a file of `--policy-model-dir`.
    File(PathBuf),
    /// `PUT /admin/policy*`; kept in memory only, gone at restart.
    Api,
}

/// One active document: its compiled policy, the document as `GET /admin/policy*` shows it, and
/// where it came from.
#[derive(Debug, Clone)]
pub struct PolicyEntry {
    pub policy: Arc<ModelPolicy>,
    pub document: Arc<PolicyDocument>,
    pub origin: Origin,
}

impl PolicyEntry {
    pub fn new(compiled: Compiled, origin: Origin) -> PolicyEntry {
        PolicyEntry {
            policy: Arc::new(compiled.policy),
            document: Arc::new(compiled.document),
            origin,
        }
    }

    /// The models a named entry claims (empty for the global entry).
    pub fn models(&self) -> &[String] {
        &self.document.models
    }
}

/// A model is already claimed by another named document (admin API: `409`; files: the later
/// file is skipped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model {model:?} already belongs to named policy {owner:?}")]
pub struct OwnershipConflict {
    pub model: String,
    pub owner: String,
}

/// The global policy, the named documents, and each named model's effective policy.
#[derive(Debug, Clone)]
pub struct PolicySet {
    global: PolicyEntry,
    named: BTreeMap<String, PolicyEntry>,
    /// Every model some named document lists → that document's policy.
    by_model: HashMap<Box<str>, Arc<ModelPolicy>>,
}

impl PolicySet {
    /// Only the built-in global policy.
    pub fn built_in(context: &PolicyContext) -> PolicySet {
        PolicySet::with_global_only(PolicyEntry {
            policy: Arc::new(ModelPolicy::built_in(context)),
            document: Arc::new(PolicyDocument::built_in()),
            origin: Origin::BuiltIn,
        })
    }

    /// `global` and no named documents.
    pub fn with_global_only(global: PolicyEntry) -> PolicySet {
        PolicySet {
            global,
            named: BTreeMap::new(),
            by_model: HashMap::new(),
        }
    }

    // ----- queries -----

    /// The effective policy of `model` (exact, case-sensitive name). Costs one hash lookup and one
    /// reference-count increment; [`PolicySet::effective_ref`] avoids the increment.
    pub fn effective(&self, model: &str) -> Arc<ModelPolicy> {
        self.by_model
            .get(model)
            .unwrap_or(&self.global.policy)
            .clone()
    }

    /// [`PolicySet::effective`] without touching the reference count, for a caller that holds the
    /// set for the duration of its use.
    pub fn effective_ref(&self, model: &str) -> &ModelPolicy {
        self.by_model.get(model).unwrap_or(&self.global.policy)
    }

    pub fn global(&self) -> &PolicyEntry {
        &self.global
    }

    /// Named documents by name.
    pub fn named(&self) -> &BTreeMap<String, PolicyEntry> {
        &self.named
    }

    /// The named document that claims `model`, if any.
    pub fn owner_of(&self, model: &str) -> Option<&str> {
        self.named
            .iter()
            .find(|(_, entry)| entry.models().iter().any(|claimed| claimed == model))
            .map(|(name, _)| name.as_str())
    }

    /// What the cross-config serverless check needs (seed "Validation and derived defaults"):
    /// the global policy's `max_input_tokens` when it is serverless, and for every named model
    /// its effective policy's value when serverless (`None` when reserved, which shields the
    /// model from a serverless global policy).
    pub fn serverless_limits(&self) -> ServerlessLimits {
        let serverless = |policy: &ModelPolicy| {
            (policy.mode == Mode::Serverless).then_some(policy.max_input_tokens)
        };
        ServerlessLimits {
            global_max_input_tokens: serverless(&self.global.policy),
            models: self
                .by_model
                .iter()
                .map(|(model, policy)| (model.to_string(), serverless(policy)))
                .collect(),
        }
    }

    // ----- changes: each returns a new set -----

    /// The same named documents under a new global policy.
    pub fn replace_global(&self, global: PolicyEntry) -> PolicySet {
        PolicySet {
            global,
            named: self.named.clone(),
            by_model: self.by_model.clone(),
        }
    }

    /// Creates or replaces the named document `name`. Refused when another named document
    /// already claims one of its models.
    pub fn put_named(
        &self,
        name: &str,
        entry: PolicyEntry,
    ) -> Result<PolicySet, OwnershipConflict> {
        for model in entry.models() {
            if let Some(owner) = self.owner_of(model)
                && owner != name
            {
                return Err(OwnershipConflict {
                    model: model.clone(),
                    owner: owner.to_owned(),
                });
            }
        }
        let mut named = self.named.clone();
        named.insert(name.to_owned(), entry);
        Ok(self.with_named(named))
    }

    /// Without the named document `name` (unchanged when there is none); its models return to the
    /// global policy.
    pub fn remove_named(&self, name: &str) -> PolicySet {
        let mut named = self.named.clone();
        named.remove(name);
        self.with_named(named)
    }

    fn with_named(&self, named: BTreeMap<String, PolicyEntry>) -> PolicySet {
        let mut by_model = HashMap::new();
        for entry in named.values() {
            for model in entry.models() {
                by_model.insert(Box::from(model.as_str()), entry.policy.clone());
            }
        }
        PolicySet {
            global: self.global.clone(),
            named,
            by_model,
        }
    }
}

/// Longest name accepted for a named document written through the admin API.
pub const POLICY_NAME_MAX_BYTES: usize = 128;

/// Rules for a named document's name in `PUT /admin/policy/models/{name}`: non-empty, at most
/// [`POLICY_NAME_MAX_BYTES`], no `/` or control characters, and not `_default` (the directory's
/// global policy, written with `PUT /admin/policy`).
pub fn check_policy_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("policy name must not be empty".to_owned());
    }
    if name.len() > POLICY_NAME_MAX_BYTES {
        return Err(format!(
            "policy name is {} bytes, at most {POLICY_NAME_MAX_BYTES}",
            name.len()
        ));
    }
    if name.chars().any(|c| c == '/' || c.is_control()) {
        return Err(format!(
            "policy name {name:?} must not contain '/' or control characters"
        ));
    }
    if name == "_default" {
        return Err(
            "_default is the global policy; use PUT /admin/policy to replace it".to_owned(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::policy::compile::{Role, compile_text};

    fn context() -> PolicyContext {
        PolicyContext::default()
    }

    fn named(name: &str, text: &str) -> PolicyEntry {
        PolicyEntry::new(
            compile_text("test", text, Role::Named(name), &context()).unwrap(),
            Origin::Api,
        )
    }

    fn global(text: &str) -> PolicyEntry {
        PolicyEntry::new(
            compile_text("test", text, Role::Global, &context()).unwrap(),
            Origin::Api,
        )
    }

    #[test]
    fn named_policies_replace_the_global_one_whole() {
        let set = PolicySet::built_in(&context()).replace_global(global(
            "max_inflight: 8\nrouting_policy:\n  match: {engine: vllm}\n  strategy: least-loaded\n",
        ));
        let set = set
            .put_named(
                "llama",
                named(
                    "llama",
                    "models: [llama-8b, llama-70b]\nrouting_policy:\n  strategy: least-loaded\n",
                ),
            )
            .unwrap();
        let llama = set.effective("llama-8b");
        assert_eq!(&*llama.name, "llama");
        // Nothing inherited: no engine filter, no max_inflight.
        assert!(llama.primary.filter.is_empty());
        assert_eq!(llama.max_inflight, 0);
        assert_eq!(&*set.effective("llama-70b").name, "llama");
        // Exact, case-sensitive names; everything else is global.
        let other = set.effective("Llama-8b");
        assert_eq!(&*other.name, "global");
        assert_eq!(other.max_inflight, 8);
        assert_eq!(set.effective_ref("qwen").max_inflight, 8);
        assert_eq!(set.owner_of("llama-70b"), Some("llama"));

        let set = set.remove_named("llama");
        assert_eq!(&*set.effective("llama-8b").name, "global");
        assert!(set.named().is_empty());
        // Removing what is not there changes nothing.
        assert!(set.remove_named("absent").named().is_empty());
    }

    #[test]
    fn a_model_belongs_to_one_named_document() {
        let set = PolicySet::built_in(&context())
            .put_named(
                "production",
                named(
                    "production",
                    "models: [shared-model]\nrouting_policy: {strategy: least-loaded}\n",
                ),
            )
            .unwrap();
        let conflict = set
            .put_named(
                "experimental",
                named(
                    "experimental",
                    "models: [other, shared-model]\nrouting_policy: {strategy: least-loaded}\n",
                ),
            )
            .unwrap_err();
        assert_eq!(
            conflict,
            OwnershipConflict {
                model: "shared-model".into(),
                owner: "production".into()
            }
        );
        // Replacing the owner itself with a different model list is fine.
        let set = set
            .put_named(
                "production",
                named(
                    "production",
                    "models: [shared-model, more]\nrouting_policy: {strategy: least-loaded}\n",
                ),
            )
            .unwrap();
        assert_eq!(set.owner_of("more"), Some("production"));
    }

    #[test]
    fn serverless_limits_follow_the_effective_policy() {
        let set = PolicySet::built_in(&context());
        assert_eq!(set.serverless_limits(), ServerlessLimits::none());
        let set = set
            .replace_global(global(
                "mode: serverless\nmax_input_tokens: 4096\nrouting_policy: {strategy: least-loaded}\n",
            ))
            .put_named(
                "reserved",
                named(
                    "reserved",
                    "models: [a]\nrouting_policy: {strategy: least-loaded}\n",
                ),
            )
            .unwrap()
            .put_named(
                "big",
                named(
                    "big",
                    "models: [b]\nmode: serverless\nmax_input_tokens: 131072\nrouting_policy: {strategy: least-loaded}\n",
                ),
            )
            .unwrap();
        let limits = set.serverless_limits();
        assert_eq!(limits.global_max_input_tokens, Some(4096));
        assert_eq!(limits.effective("a"), None);
        assert_eq!(limits.effective("b"), Some(131072));
        assert_eq!(limits.effective("c"), Some(4096));
    }

    #[test]
    fn admin_names_are_checked() {
        assert!(check_policy_name("gpt-oss").is_ok());
        assert!(check_policy_name("").is_err());
        assert!(check_policy_name("a/b").is_err());
        assert!(check_policy_name("_default").is_err());
        assert!(check_policy_name(&"x".repeat(POLICY_NAME_MAX_BYTES + 1)).is_err());
    }
}
