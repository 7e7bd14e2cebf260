//! Proves that `auth.yaml` parses as the reference documents it and that every rule the reference
//! lists refuses a bad file with a message naming the key and the field.

use super::*;

const STATIC_COMPLETE: &str = include_str!("../../../../tests/fixtures/auth/static-complete.yaml");
const DYNAMIC_COMPLETE: &str =
    include_str!("../../../../tests/fixtures/auth/dynamic-complete.yaml");
const MINIMAL_STATIC: &str = include_str!("../../../../tests/fixtures/auth/minimal-static.yaml");
const SERVERLESS_KEY: &str = include_str!("../../../../tests/fixtures/auth/serverless-key.yaml");

const HASH_A: &str = "c773551628285ca853851af86361e424ddd134a982ce8182ee8af72aa7204d4f";
const HASH_B: &str = "ffd18212c230d58590b9ceac5629bd1277662262979828c5e1838b0ccb5b8c90";

/// A file with one static key whose entry lines (indented under the list item) are `body`.
fn one_key(body: &str) -> String {
    format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{HASH_A}\"\n      key_preview: \"sk-...abc\"\n{body}"
    )
}

const METADATA: &str = "      metadata:\n        name: n\n        owner: o\n";

fn problems(text: &str) -> Vec<String> {
    match AuthConfig::from_yaml(text) {
        Err(ConfigError::Invalid(problems)) => problems.iter().map(ToString::to_string).collect(),
        other => panic!("expected validation problems, got {other:?}"),
    }
}

fn parse_error(text: &str) -> (String, Option<usize>) {
    match AuthConfig::from_yaml(text) {
        Err(ConfigError::Parse { message, line }) => (message, line),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn complete_static_example_loads() {
    let config = AuthConfig::from_yaml(STATIC_COMPLETE).unwrap();
    assert_eq!(config.api_mode, ApiMode::ApiKey);
    assert_eq!(config.admin_mode, Some(AdminMode::ApiKey));
    assert_eq!(config.keys.len(), 3);

    let production = &config.keys[0];
    assert_eq!(
        production.hash,
        KeyHash::of_raw_key(b"sk-hivenet-production")
    );
    assert_eq!(production.owner, "acme-corp");
    assert_eq!(production.expires_at, None);
    assert_eq!(
        production.settings.quota(),
        &Quota::Flat(FlatQuota {
            requests_per_minute: 1000,
            tokens_per_day: 5_000_000,
            input_tokens_per_minute: 262_144,
            output_tokens_per_minute: 32_768,
        })
    );
    assert_eq!(production.settings.max_occupancy_share(), Some(0.25));
    assert!(production.settings.allows("anything"));

    let beta = &config.keys[1];
    assert_eq!(beta.expires_at, CivilDate::parse_dd_mm_yyyy("31-12-2026"));
    assert_eq!(
        beta.settings.authorize("meta-llama/Llama-3.1-8B-Instruct"),
        ModelAccess::Allowed
    );
    assert_eq!(beta.settings.authorize("other"), ModelAccess::Forbidden);
    assert_eq!(beta.settings.max_occupancy_share(), None);

    let multi = &config.keys[2];
    let Quota::PerModel(per_model) = multi.settings.quota() else {
        panic!("per-model quota expected");
    };
    assert_eq!(per_model.len(), 3);
    assert_eq!(
        per_model["Qwen/Qwen3.6-35B"],
        PerModelQuota {
            requests_per_minute_per_replica: 5,
            tokens_per_day: 2_000_000
        }
    );
    assert_eq!(per_model["BAAI/bge-m3"].tokens_per_day, 0);
    assert_eq!(
        multi.settings.authorize("BAAI/bge-m3"),
        ModelAccess::Allowed
    );
    assert_eq!(
        multi.settings.authorize("unlisted-model"),
        ModelAccess::NoQuotaDeclared
    );
}

#[test]
fn complete_dynamic_example_loads_without_keys() {
    let config = AuthConfig::from_yaml(DYNAMIC_COMPLETE).unwrap();
    assert_eq!(config.api_mode, ApiMode::Dynamic);
    assert_eq!(config.admin_mode, Some(AdminMode::ApiKey));
    assert!(config.keys.is_empty());
}

#[test]
fn minimal_and_seed_examples_load() {
    let minimal = AuthConfig::from_yaml(MINIMAL_STATIC).unwrap();
    assert_eq!(minimal.keys[0].preview, "sk-...KJ4");
    let serverless = AuthConfig::from_yaml(SERVERLESS_KEY).unwrap();
    assert_eq!(serverless.admin_mode, None);
    assert_eq!(
        serverless.keys[0].settings.max_occupancy_share(),
        Some(0.25)
    );
}

#[test]
fn empty_file_and_top_level_structure_default_to_none() {
    let empty = AuthConfig::from_yaml("").unwrap();
    assert_eq!(empty, AuthConfig::none());
    let both_none = AuthConfig::from_yaml("api:\n  mode: none\n\nadmin:\n  mode: none\n").unwrap();
    assert_eq!(both_none.api_mode, ApiMode::None);
    assert_eq!(both_none.admin_mode, Some(AdminMode::None));
}

#[test]
fn malformed_yaml_is_refused_with_its_line() {
    let (message, line) = parse_error("api:\n  mode: api-key\n  keys:\n    - key_hash: \"abc\n");
    assert!(line.is_some(), "{message}");
    let error =
        AuthConfig::from_yaml("api:\n  mode: none\nadmin:\n  mode: \"none\n  x: y\n").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("auth.yaml could not be parsed: "),
        "{error}"
    );
    assert!(error.to_string().contains(" line "), "{error}");
    assert!(
        matches!(error, ConfigError::Parse { line: Some(_), .. }),
        "{error}"
    );
}

#[test]
fn unknown_fields_are_refused_everywhere() {
    for (text, field) in [
        ("apl:\n  mode: none\n".to_owned(), "apl"),
        ("api:\n  mode: none\n  kyes: []\n".to_owned(), "kyes"),
        ("admin:\n  mode: none\n  keys: x\n".to_owned(), "keys"),
        (one_key(&format!("{METADATA}      model: [a]\n")), "model"),
        (
            one_key("      metadata:\n        name: n\n        owner: o\n        expire: x\n"),
            "expire",
        ),
        (
            one_key(&format!(
                "{METADATA}      quota:\n        requests_per_hour: 5\n"
            )),
            "requests_per_hour",
        ),
        (
            one_key(&format!(
                "{METADATA}      quota:\n        per_model:\n          m:\n            rpm: 1\n"
            )),
            "rpm",
        ),
    ] {
        let (message, line) = parse_error(&text);
        assert!(message.contains(field), "{field}: {message}");
        assert!(line.is_some(), "{field}: {message}");
    }
}

#[test]
fn unknown_modes_are_refused() {
    let (message, _) = parse_error("api:\n  mode: apikey\n");
    assert!(message.contains("apikey"), "{message}");
    let (message, _) = parse_error("admin:\n  mode: dynamic\n");
    assert!(message.contains("dynamic"), "{message}");
}

#[test]
fn non_numeric_limits_are_refused() {
    let (message, _) = parse_error(&one_key(&format!(
        "{METADATA}      quota:\n        requests_per_minute: lots\n"
    )));
    assert!(message.contains("requests_per_minute"), "{message}");
    let (message, _) = parse_error(&one_key(&format!(
        "{METADATA}      quota:\n        tokens_per_day: 1.5\n"
    )));
    assert!(message.contains("tokens_per_day"), "{message}");
    let (message, _) = parse_error(&one_key(&format!(
        "{METADATA}      max_occupancy_share: half\n"
    )));
    assert!(message.contains("max_occupancy_share"), "{message}");
}

#[test]
fn negative_limits_are_refused_naming_key_and_field() {
    for field in [
        "requests_per_minute",
        "tokens_per_day",
        "input_tokens_per_minute",
        "output_tokens_per_minute",
    ] {
        let found = problems(&one_key(&format!(
            "{METADATA}      quota:\n        {field}: -5\n"
        )));
        assert_eq!(
            found,
            vec![format!(
                "api.keys[0] (sk-...abc): quota.{field}: must not be negative (got -5); use 0 for unlimited"
            )]
        );
    }
    let found = problems(&one_key(&format!(
        "{METADATA}      quota:\n        per_model:\n          m:\n            requests_per_minute_per_replica: -1\n            tokens_per_day: 0\n"
    )));
    assert_eq!(found.len(), 1);
    assert!(
        found[0]
            .contains("quota.per_model.m.requests_per_minute_per_replica: must not be negative")
    );
}

#[test]
fn zero_limits_mean_unlimited_and_are_accepted() {
    let config = AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}      quota:\n        requests_per_minute: 0\n        tokens_per_day: 0\n"
    )))
    .unwrap();
    assert_eq!(
        config.keys[0].settings.quota(),
        &Quota::Flat(FlatQuota::default())
    );
}

#[test]
fn duplicate_hashes_are_refused() {
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{HASH_A}\"\n{METADATA}    - key_hash: \"{HASH_B}\"\n{METADATA}    - key_hash: \"{HASH_A}\"\n      key_preview: dup\n{METADATA}"
    );
    assert_eq!(
        problems(&text),
        vec!["api.keys[2] (dup): key_hash: duplicates the hash of api.keys[0]".to_owned()]
    );
}

#[test]
fn bad_hash_formats_are_refused() {
    let upper = HASH_A.to_ascii_uppercase();
    let cases = [
        ("", "key_hash: is required"),
        ("<sha256-hash>", "key_hash: must be 64 hex digits"),
        ("abc123", "got 6 characters"),
        (&HASH_A[..63], "got 63 characters"),
        (&upper, "must be lowercase hex"),
    ];
    for (hash, expected) in cases {
        let text =
            format!("api:\n  mode: api-key\n  keys:\n    - key_hash: \"{hash}\"\n{METADATA}");
        let found = problems(&text);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("api.keys[0]: "), "{}", found[0]);
        assert!(found[0].contains(expected), "{hash}: {}", found[0]);
    }
    let non_hex = "g".repeat(64);
    let text = format!("api:\n  mode: api-key\n  keys:\n    - key_hash: \"{non_hex}\"\n{METADATA}");
    assert!(problems(&text)[0].contains("must be 64 hex digits"));
}

#[test]
fn metadata_is_required_with_name_and_owner() {
    assert_eq!(
        problems(&one_key("")),
        vec!["api.keys[0] (sk-...abc): metadata: is required (with name and owner)".to_owned()]
    );
    assert_eq!(
        problems(&one_key(
            "      metadata:\n        name: \"\"\n        owner: \"  \"\n"
        )),
        vec![
            "api.keys[0] (sk-...abc): metadata.name: must not be empty".to_owned(),
            "api.keys[0] (sk-...abc): metadata.owner: must not be empty".to_owned(),
        ]
    );
}

#[test]
fn bad_dates_are_refused() {
    for (field, value) in [
        ("expires_at", "2026-12-31"),
        ("expires_at", "31-02-2026"),
        ("expires_at", "29-02-2027"),
        ("expires_at", "1-1-2027"),
        ("expires_at", "32-01-2027"),
        ("created_at", "27/07/2026"),
        ("created_at", "00-07-2026"),
    ] {
        let found = problems(&one_key(&format!(
            "{METADATA}        {field}: \"{value}\"\n"
        )));
        assert_eq!(
            found,
            vec![format!(
                "api.keys[0] (sk-...abc): metadata.{field}: \"{value}\" is not a valid DD-MM-YYYY date"
            )]
        );
    }
    // Leap day and unquoted scalars are fine.
    AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}        expires_at: 29-02-2028\n"
    )))
    .unwrap();
    // Empty expiry means no expiry.
    let config =
        AuthConfig::from_yaml(&one_key(&format!("{METADATA}        expires_at: \"\"\n"))).unwrap();
    assert_eq!(config.keys[0].expires_at_unix_ms(), None);
}

#[test]
fn expiry_before_creation_is_refused_and_equal_is_allowed() {
    let found = problems(&one_key(&format!(
        "{METADATA}        created_at: \"27-07-2026\"\n        expires_at: \"26-07-2026\"\n"
    )));
    assert_eq!(
        found,
        vec!["api.keys[0] (sk-...abc): metadata.expires_at: 26-07-2026 is before metadata.created_at 27-07-2026".to_owned()]
    );
    AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}        created_at: \"27-07-2026\"\n        expires_at: \"27-07-2026\"\n"
    )))
    .unwrap();
}

#[test]
fn static_expiry_covers_the_whole_named_utc_day() {
    let config = AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}        expires_at: \"01-01-2027\"\n"
    )))
    .unwrap();
    // 2027-01-02T00:00:00Z
    assert_eq!(config.keys[0].expires_at_unix_ms(), Some(1_798_848_000_000));
    assert_eq!(
        CivilDate::from_unix_ms(1_798_848_000_000 - 1),
        CivilDate::parse_dd_mm_yyyy("01-01-2027").unwrap()
    );
}

#[test]
fn occupancy_share_bounds() {
    for ok in ["0", "1", "1.0", "0.000001", "0.4"] {
        AuthConfig::from_yaml(&one_key(&format!(
            "{METADATA}      max_occupancy_share: {ok}\n"
        )))
        .unwrap();
    }
    for bad in ["1.0001", "-0.1", "2", ".nan", ".inf"] {
        let found = problems(&one_key(&format!(
            "{METADATA}      max_occupancy_share: {bad}\n"
        )));
        assert_eq!(found.len(), 1, "{bad}");
        assert!(
            found[0].contains("max_occupancy_share: must be 0 (unset) or in (0, 1]"),
            "{bad}: {}",
            found[0]
        );
    }
}

#[test]
fn mixing_quota_shapes_is_refused() {
    let found = problems(&one_key(&format!(
        "{METADATA}      quota:\n        requests_per_minute: 100\n        input_tokens_per_minute: 5\n        per_model:\n          model-a:\n            requests_per_minute_per_replica: 10\n            tokens_per_day: 100000\n"
    )));
    assert_eq!(
        found,
        vec!["api.keys[0] (sk-...abc): quota: mixes flat fields (requests_per_minute, input_tokens_per_minute) with per_model; choose one shape".to_owned()]
    );
}

#[test]
fn per_model_must_be_complete_and_non_empty() {
    assert_eq!(
        problems(&one_key(&format!(
            "{METADATA}      quota:\n        per_model: {{}}\n"
        ))),
        vec!["api.keys[0] (sk-...abc): quota.per_model: must list at least one model".to_owned()]
    );
    assert_eq!(
        problems(&one_key(&format!(
            "{METADATA}      quota:\n        per_model:\n          model-a:\n            requests_per_minute_per_replica: 10\n"
        ))),
        vec!["api.keys[0] (sk-...abc): quota.per_model.model-a.tokens_per_day: is required (use 0 for unlimited)".to_owned()]
    );
    assert_eq!(
        problems(&one_key(&format!(
            "{METADATA}      quota:\n        per_model:\n          \"\":\n            requests_per_minute_per_replica: 1\n            tokens_per_day: 1\n"
        ))),
        vec!["api.keys[0] (sk-...abc): quota.per_model: has an empty model name".to_owned()]
    );
}

#[test]
fn per_model_quota_is_the_allowlist_and_overrides_models() {
    let config = AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}      models: [model-a, model-b]\n      quota:\n        per_model:\n          model-a:\n            requests_per_minute_per_replica: 10\n            tokens_per_day: 100000\n"
    )))
    .unwrap();
    let settings = &config.keys[0].settings;
    assert_eq!(settings.authorize("model-a"), ModelAccess::Allowed);
    assert_eq!(settings.authorize("model-b"), ModelAccess::NoQuotaDeclared);
    assert!(!settings.allows("model-b"));
}

#[test]
fn allowlist_is_exact_and_case_sensitive() {
    let config = AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}      models:\n        - \"meta-llama/Llama-3.1-8B-Instruct\"\n        - \"BAAI/bge-m3\"\n"
    )))
    .unwrap();
    let settings = &config.keys[0].settings;
    assert!(settings.allows("BAAI/bge-m3"));
    assert_eq!(settings.authorize("baai/bge-m3"), ModelAccess::Forbidden);
    assert_eq!(
        settings.authorize("meta-llama/Llama-3.1-8B"),
        ModelAccess::Forbidden
    );
    assert_eq!(
        problems(&one_key(&format!("{METADATA}      models: [a, \"\"]\n"))),
        vec!["api.keys[0] (sk-...abc): models[1]: must not be empty".to_owned()]
    );
}

#[test]
fn mode_and_key_list_must_agree() {
    assert_eq!(
        problems("api:\n  mode: api-key\n"),
        vec!["api: keys: must list at least one key when mode is api-key".to_owned()]
    );
    assert_eq!(problems("api:\n  mode: api-key\n  keys:\n").len(), 1);
    let dynamic =
        format!("api:\n  mode: dynamic\n  keys:\n    - key_hash: \"{HASH_A}\"\n{METADATA}");
    assert!(problems(&dynamic)[0].starts_with("api: keys: must be empty when mode is dynamic"));
}

#[test]
fn keys_are_ignored_in_mode_none() {
    let text = "api:\n  mode: none\n  keys:\n    - key_hash: \"not-a-hash\"\n";
    assert!(AuthConfig::from_yaml(text).unwrap().keys.is_empty());
}

#[test]
fn every_problem_is_reported_not_only_the_first() {
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"bad\"\n      key_preview: one\n      metadata:\n        name: \"\"\n        owner: o\n    - key_hash: \"{HASH_B}\"\n      key_preview: two\n      metadata:\n        name: n\n        owner: o\n        expires_at: nope\n      max_occupancy_share: 3\n"
    );
    let found = problems(&text);
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found[0].starts_with("api.keys[0] (one): key_hash"));
    assert!(found[1].starts_with("api.keys[0] (one): metadata.name"));
    assert!(found[2].starts_with("api.keys[1] (two): metadata.expires_at"));
    assert!(found[3].starts_with("api.keys[1] (two): max_occupancy_share"));
    let error = AuthConfig::from_yaml(&text).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("auth.yaml is invalid: api.keys[0] (one): key_hash")
    );
}

#[test]
fn serverless_input_rate_must_cover_max_input_tokens_of_reachable_models() {
    let config = AuthConfig::from_yaml(SERVERLESS_KEY).unwrap(); // ITPM 262144, unrestricted
    assert_eq!(config.check_serverless(&ServerlessLimits::none()), Ok(()));

    let mut limits = ServerlessLimits {
        global_max_input_tokens: Some(262_144),
        models: BTreeMap::new(),
    };
    assert_eq!(config.check_serverless(&limits), Ok(())); // equal is enough
    limits.global_max_input_tokens = Some(262_145);
    let found = config.check_serverless(&limits).unwrap_err();
    assert_eq!(
        found.to_string(),
        "api.keys[0] (sk-hivenet-...abcd): quota.input_tokens_per_minute: 262144 is below max_input_tokens 262145 of serverless global policy; one maximal request could never be admitted"
    );
    // max_input_tokens 0 disables B1 and so the constraint.
    limits.global_max_input_tokens = Some(0);
    assert_eq!(config.check_serverless(&limits), Ok(()));
    // A named serverless model is reachable by an unrestricted key.
    limits.global_max_input_tokens = None;
    limits.models.insert("big".into(), Some(1_000_000));
    assert!(config.check_serverless(&limits).is_err());
    // A reserved named model is not checked.
    limits.models.insert("big".into(), None);
    assert_eq!(config.check_serverless(&limits), Ok(()));
}

#[test]
fn serverless_check_only_covers_models_an_allowlisted_key_reaches() {
    let config = AuthConfig::from_yaml(&one_key(&format!(
        "{METADATA}      models: [small]\n      quota:\n        input_tokens_per_minute: 1000\n"
    )))
    .unwrap();
    let mut limits = ServerlessLimits::none();
    limits.models.insert("big".into(), Some(100_000));
    limits.models.insert("small".into(), Some(1000));
    assert_eq!(config.check_serverless(&limits), Ok(()));
    // `small` has no named policy and falls under a serverless global policy.
    limits.models.remove("small");
    limits.global_max_input_tokens = Some(4096);
    let found = config.check_serverless(&limits).unwrap_err();
    assert!(
        found.to_string().contains("of serverless model small"),
        "{found}"
    );
    // An unset ITPM is never checked.
    let unlimited = AuthConfig::from_yaml(&one_key(METADATA)).unwrap();
    assert_eq!(unlimited.check_serverless(&limits), Ok(()));
}

#[test]
fn keeping_only_serverless_checked_keys_keeps_the_check() {
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{HASH_A}\"\n      key_preview: \"sk-...a\"\n{METADATA}      quota:\n        input_tokens_per_minute: 1000\n    - key_hash: \"{HASH_B}\"\n      key_preview: \"sk-...b\"\n{METADATA}      quota:\n        requests_per_minute: 10\n"
    );
    let config = AuthConfig::from_yaml(&text).unwrap();
    let mut kept = config.clone();
    kept.retain_serverless_checked();
    assert_eq!(kept.keys.len(), 1);
    assert_eq!(kept.keys[0].preview, "sk-...a");
    let mut limits = ServerlessLimits::none();
    for max in [None, Some(1000), Some(1001)] {
        limits.global_max_input_tokens = max;
        assert_eq!(
            kept.check_serverless(&limits),
            config.check_serverless(&limits)
        );
    }
    assert!(kept.check_serverless(&limits).is_err());
}

#[test]
fn static_key_debug_shows_only_the_preview() {
    let config = AuthConfig::from_yaml(STATIC_COMPLETE).unwrap();
    let debug = format!("{config:?}");
    assert!(debug.contains("sk-...prod"));
    assert!(!debug.contains(&HASH_A[..16]), "{debug}");
    assert!(
        !debug.to_lowercase().contains("c7 75 51") && !debug.contains("199, 117"),
        "{debug}"
    );
}

#[test]
fn api_mode_env_values() {
    assert_eq!(ApiMode::parse("dynamic"), Some(ApiMode::Dynamic));
    assert_eq!(ApiMode::parse(""), Some(ApiMode::None));
    assert_eq!(ApiMode::parse("api-key"), Some(ApiMode::ApiKey));
    assert_eq!(ApiMode::parse("static"), None);
}

#[test]
fn rfc3339_timestamps() {
    assert_eq!(
        parse_rfc3339_unix_ms("2027-01-01T00:00:00Z"),
        Some(1_798_761_600_000)
    );
    assert_eq!(
        parse_rfc3339_unix_ms("2027-01-01T01:00:00.5+01:00"),
        Some(1_798_761_600_500)
    );
    assert_eq!(parse_rfc3339_unix_ms("01-01-2027"), None);
    assert_eq!(parse_rfc3339_unix_ms("2027-01-01"), None);
}

#[test]
fn deeply_nested_files_are_refused_before_parsing() {
    let text = format!(
        "api:\n  mode: none\n  keys: {}{}\n",
        "[".repeat(60_000),
        "]".repeat(60_000)
    );
    let started = std::time::Instant::now();
    let (message, line) = parse_error(&text);
    assert_eq!(message, "nesting deeper than 64 levels (line 3)");
    assert_eq!(line, Some(3));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
}
