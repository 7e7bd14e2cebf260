//! Policy YAML (`policy`): a global or named routing-policy document (`--policy-file`, the
//! policy directory, `PUT /admin/policy*`), parsed, validated and compiled, then installed in a
//! policy set as the router does.
//!
//! Asserts:
//! - nothing panics, whatever the text;
//! - round trip: a compiled document shown as JSON (`GET /admin/policy*`) and sent back (`PUT`)
//!   compiles to the same policy and the same document;
//! - a compiled named document's models resolve to its policy in a policy set, and the serverless
//!   limits derived from the set are readable by the auth check.
#![no_main]

use std::sync::Arc;

use hivenet_router::logic::policy::compile::{self, PolicyContext, Role};
use hivenet_router::logic::policy::set::{Origin, PolicyEntry, PolicySet};
use libfuzzer_sys::fuzz_target;

const NAME: &str = "fuzzed";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let context = PolicyContext::default();
    for role in [Role::Global, Role::Named(NAME)] {
        let Ok(compiled) = compile::compile_text("fuzz", text, role, &context) else {
            continue;
        };
        let json = serde_json::to_string(&compiled.document).expect("a document serializes");
        let again = compile::compile_text("fuzz", &json, role, &context)
            .unwrap_or_else(|error| panic!("the shown document {json} is refused: {error}"));
        assert_eq!(
            again.policy, compiled.policy,
            "the policy changed through {json}"
        );
        assert_eq!(again.document, compiled.document);

        let entry = PolicyEntry::new(compiled, Origin::Api);
        let base = PolicySet::built_in(&context);
        let set = match role {
            Role::Global => base.replace_global(entry),
            Role::Named(name) => {
                let models = entry.models().to_vec();
                let policy = entry.policy.clone();
                let set = base
                    .put_named(name, entry)
                    .expect("an empty set has no owner");
                for model in &models {
                    assert!(Arc::ptr_eq(&set.effective(model), &policy));
                    assert_eq!(set.owner_of(model), Some(name));
                }
                set.remove_named(name)
            }
        };
        let limits = set.serverless_limits();
        let _ = limits.effective("fuzz-model");
    }
});
