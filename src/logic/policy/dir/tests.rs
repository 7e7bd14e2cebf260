//! Directory loading: `_default` precedence, ownership conflicts resolved oldest file first,
//! partial failures at start-up, and the conservative reload rules.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::*;

const DIR: &str = "/etc/policies";

fn file(name: &str, age_seconds: u64, text: &str) -> DirFile {
    DirFile {
        file_name: name.to_owned(),
        // Larger age: older file.
        modified: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_seconds),
        text: Ok(text.to_owned()),
    }
}

fn named_text(models: &[&str], engine: &str) -> String {
    format!(
        "models: [{}]\nrouting_policy:\n  match: {{engine: {engine}}}\n  strategy: least-loaded\n",
        models.join(", ")
    )
}

const DEFAULT: &str = "max_inflight: 7\nrouting_policy:\n  strategy: least-loaded\n";

fn context() -> PolicyContext {
    PolicyContext::default()
}

fn startup(files: &[DirFile]) -> Result<DirOutcome, PolicyError> {
    apply(
        Path::new(DIR),
        &PolicySet::built_in(&context()),
        &DirState::default(),
        files,
        Phase::Startup,
        &context(),
    )
}

fn reload(previous: &DirOutcome, files: &[DirFile]) -> DirOutcome {
    apply(
        Path::new(DIR),
        &previous.set,
        &previous.state,
        files,
        Phase::Reload,
        &context(),
    )
    .expect("a reload never fails")
}

fn engine_of(set: &PolicySet, model: &str) -> Option<String> {
    set.effective(model)
        .primary
        .filter
        .engine
        .as_deref()
        .map(str::to_owned)
}

#[test]
fn default_and_named_files_load() {
    let outcome = startup(&[
        file("_default.yaml", 10, DEFAULT),
        file(
            "llama-family.yaml",
            10,
            &named_text(&["llama-8b", "llama-70b"], "vllm"),
        ),
        file("embeddings.yml", 10, &named_text(&["bge-m3"], "infinity")),
        file("notes.txt", 10, "not a policy"),
        file("README", 10, ""),
    ])
    .unwrap();
    let set = &outcome.set;
    assert_eq!(set.global().policy.max_inflight, 7);
    assert_eq!(
        set.global().origin,
        Origin::File(Path::new(DIR).join("_default.yaml"))
    );
    assert_eq!(
        set.named().keys().collect::<Vec<_>>(),
        ["embeddings", "llama-family"]
    );
    assert_eq!(engine_of(set, "llama-70b").as_deref(), Some("vllm"));
    assert_eq!(engine_of(set, "bge-m3").as_deref(), Some("infinity"));
    assert_eq!(set.effective("other").max_inflight, 7);
    assert!(outcome.refused.is_empty(), "{:?}", outcome.refused);
}

#[test]
fn default_models_are_ignored_and_yaml_wins_over_yml() {
    let outcome = startup(&[
        file(
            "_default.yml",
            10,
            "routing_policy:\n  strategy: least-loaded\n",
        ),
        file("_default.yaml", 10, &format!("models: [x]\n{DEFAULT}")),
    ])
    .unwrap();
    assert_eq!(outcome.set.global().policy.max_inflight, 7);
    assert!(outcome.set.global().models().is_empty());
    assert!(outcome.set.named().is_empty());
    assert_eq!(outcome.refused.len(), 1, "{:?}", outcome.refused);
}

#[test]
fn an_invalid_default_stops_start_up() {
    let error = startup(&[file("_default.yaml", 10, "routing_policy: {}\n")]).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("/etc/policies/_default.yaml"), "{message}");
    assert!(
        message.contains("routing_policy.strategy: is required"),
        "{message}"
    );
    let unreadable = DirFile {
        text: Err("permission denied".into()),
        ..file("_default.yaml", 10, "")
    };
    assert!(startup(&[unreadable]).is_err());
}

#[test]
fn broken_named_files_are_skipped_and_the_rest_load() {
    let outcome = startup(&[
        file("good.yaml", 10, &named_text(&["a"], "vllm")),
        file("typo.yaml", 10, "models: [b]\nrouting_policy:\n  strategy: least-loaded\n  exclude_if:\n    sucess_rate: {lt: 0.9}\n"),
        file("nomodels.yaml", 10, "routing_policy:\n  strategy: least-loaded\n"),
        file("broken.yaml", 10, "models: [c\n"),
    ])
    .unwrap();
    assert_eq!(outcome.set.named().keys().collect::<Vec<_>>(), ["good"]);
    assert_eq!(outcome.refused.len(), 3, "{:?}", outcome.refused);
    let all = outcome.refused.join("\n");
    assert!(
        all.contains("/etc/policies/typo.yaml") && all.contains("sucess_rate"),
        "{all}"
    );
    assert!(
        all.contains("/etc/policies/nomodels.yaml") && all.contains("models"),
        "{all}"
    );
    assert!(all.contains("/etc/policies/broken.yaml"), "{all}");
}

#[test]
fn the_older_file_claims_a_model_and_the_later_file_is_skipped_whole() {
    let outcome = startup(&[
        file(
            "experimental.yaml",
            5,
            &named_text(&["shared-model", "exp-only"], "sglang"),
        ),
        file(
            "production.yaml",
            50,
            &named_text(&["shared-model"], "vllm"),
        ),
    ])
    .unwrap();
    let set = &outcome.set;
    assert_eq!(set.owner_of("shared-model"), Some("production"));
    // The conflicting file is skipped entirely, including its other model.
    assert_eq!(set.owner_of("exp-only"), None);
    assert!(
        outcome.refused[0].contains("experimental.yaml"),
        "{:?}",
        outcome.refused
    );
    assert!(
        outcome.refused[0].contains("shared-model"),
        "{:?}",
        outcome.refused
    );

    // Equal modification times: the file name breaks the tie.
    let outcome = startup(&[
        file("b.yaml", 10, &named_text(&["m"], "sglang")),
        file("a.yaml", 10, &named_text(&["m"], "vllm")),
    ])
    .unwrap();
    assert_eq!(outcome.set.owner_of("m"), Some("a"));
}

#[test]
fn reload_applies_changes_keeps_previous_on_errors_and_removes_deleted_files() {
    let first = startup(&[
        file("_default.yaml", 100, DEFAULT),
        file("a.yaml", 100, &named_text(&["model-a"], "vllm")),
        file("b.yaml", 100, &named_text(&["model-b"], "vllm")),
        file("c.yaml", 100, &named_text(&["model-c"], "vllm")),
    ])
    .unwrap();

    let second = reload(
        &first,
        &[
            // Unchanged.
            file("_default.yaml", 100, DEFAULT),
            // Valid change.
            file("a.yaml", 1, &named_text(&["model-a"], "sglang")),
            // Invalid change: the previous version stays.
            file(
                "b.yaml",
                1,
                "models: [model-b]\nrouting_policy: {strategy: fastest}\n",
            ),
            // c.yaml deleted; d.yaml new but claims a model of a.
            file("d.yaml", 1, &named_text(&["model-a", "model-d"], "vllm")),
        ],
    );
    let set = &second.set;
    assert_eq!(engine_of(set, "model-a").as_deref(), Some("sglang"));
    assert_eq!(engine_of(set, "model-b").as_deref(), Some("vllm"));
    assert_eq!(set.owner_of("model-c"), None);
    assert_eq!(set.owner_of("model-d"), None);
    assert_eq!(set.named().keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(second.refused.len(), 2, "{:?}", second.refused);
    assert_eq!(second.changes.len(), 2, "{:?}", second.changes);

    // Once the owner lets go of model-a, the refused file loads on the next reload.
    let third = reload(
        &second,
        &[
            file("_default.yaml", 100, DEFAULT),
            file("a.yaml", 0, &named_text(&["other"], "sglang")),
            file("b.yaml", 1, &named_text(&["model-b"], "vllm")),
            file("d.yaml", 1, &named_text(&["model-a", "model-d"], "vllm")),
        ],
    );
    assert_eq!(third.set.owner_of("model-a"), Some("d"));
    assert!(third.refused.is_empty(), "{:?}", third.refused);
}

#[test]
fn reload_keeps_the_global_policy_when_default_breaks_and_reverts_when_it_goes() {
    let first = startup(&[file("_default.yaml", 10, DEFAULT)]).unwrap();
    let broken = reload(&first, &[file("_default.yaml", 1, "routing_policy: {}\n")]);
    assert_eq!(broken.set.global().policy.max_inflight, 7);
    assert_eq!(broken.refused.len(), 1);
    assert!(broken.refused[0].contains("previous global policy stays active"));

    let gone = reload(&broken, &[]);
    assert_eq!(gone.set.global().origin, Origin::BuiltIn);
    assert_eq!(gone.set.global().policy.max_inflight, 0);
}

#[test]
fn unchanged_files_are_not_reapplied_over_admin_changes() {
    let first = startup(&[file("a.yaml", 10, &named_text(&["model-a"], "vllm"))]).unwrap();
    // An admin write replaces the document in memory.
    let admin = crate::logic::policy::compile::compile_text(
        "PUT",
        &named_text(&["model-a"], "ollama"),
        Role::Named("a"),
        &context(),
    )
    .unwrap();
    let edited = DirOutcome {
        set: first
            .set
            .put_named("a", PolicyEntry::new(admin, Origin::Api))
            .unwrap(),
        ..first.clone()
    };
    let after = reload(
        &edited,
        &[file("a.yaml", 10, &named_text(&["model-a"], "vllm"))],
    );
    assert_eq!(engine_of(&after.set, "model-a").as_deref(), Some("ollama"));
    assert!(after.changes.is_empty(), "{:?}", after.changes);
    // Editing the file does reapply it.
    let after = reload(
        &after,
        &[file("a.yaml", 1, &named_text(&["model-a"], "sglang"))],
    );
    assert_eq!(engine_of(&after.set, "model-a").as_deref(), Some("sglang"));
}

#[test]
fn two_files_with_one_name_do_not_both_load() {
    let outcome = startup(&[
        file("a.yaml", 20, &named_text(&["x"], "vllm")),
        file("a.yml", 10, &named_text(&["y"], "vllm")),
    ])
    .unwrap();
    assert_eq!(outcome.set.owner_of("x"), Some("a"));
    assert_eq!(outcome.set.owner_of("y"), None);
    assert_eq!(outcome.refused.len(), 1, "{:?}", outcome.refused);
}
