//! Proves the dynamic registry's admin semantics (add, update, read, list, delete, replace,
//! versions) and that every refused write leaves the registry exactly as it was.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::logic::auth::config::ModelAccess;
use crate::logic::auth::keys::{AuthOutcome, KeyId, RegistryMode};

const REPLACE_EXAMPLE: &str = include_str!("../../../../tests/fixtures/auth/replace-request.json");
const PUT_EXAMPLE: &str = include_str!("../../../../tests/fixtures/auth/put-request.json");
const GET_EXAMPLE: &str = include_str!("../../../../tests/fixtures/auth/get-response.json");

/// 2026-07-27T12:00:00Z
const NOW_MS: i64 = 1_785_153_600_000;

fn put_body(version: &str, raw_key: &str) -> PutKeyRequest {
    PutKeyRequest::from_json(
        serde_json::json!({
            "version": version,
            "key_hash": crate::logic::auth::key_hash::hash_key_hex(raw_key),
            "key_preview": "sk-...x",
            "owner": "tenant",
            "name": "a key",
            "enabled": true,
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap()
}

fn with(mut body: PutKeyRequest, change: impl FnOnce(&mut PutKeyRequest)) -> PutKeyRequest {
    change(&mut body);
    body
}

fn none() -> ServerlessLimits {
    ServerlessLimits::none()
}

#[test]
fn reference_put_example_adds_a_key_that_authenticates() {
    let mut registry = DynamicRegistry::new();
    let body = PutKeyRequest::from_json(PUT_EXAMPLE.as_bytes()).unwrap();
    registry.put("acme-prod", body, &none()).unwrap();
    assert_eq!(registry.version(), "rev_00000002");
    assert_eq!(registry.generation(), 1);

    let snapshot = registry.snapshot();
    let AuthOutcome::Authenticated { key_id, key } =
        snapshot.authenticate(Some(b"sk-hivenet-secret"), NOW_MS)
    else {
        panic!("dynamic key should authenticate");
    };
    assert_ne!(key_id, KeyId::ANONYMOUS);
    assert_eq!(key.audit_key_id(), "acme-prod");
    assert_eq!(
        key.authorize("meta-llama/Llama-3.1-8B-Instruct"),
        ModelAccess::Allowed
    );
    assert_eq!(key.authorize("other"), ModelAccess::Forbidden);
    // Expires at the exact RFC 3339 instant.
    assert!(matches!(
        snapshot.authenticate(Some(b"sk-hivenet-secret"), 1_798_761_600_000),
        AuthOutcome::Expired { .. }
    ));
    assert!(matches!(
        snapshot.authenticate(Some(b"sk-hivenet-secret"), 1_798_761_600_000 - 1),
        AuthOutcome::Authenticated { .. }
    ));
}

#[test]
fn reference_replace_example_and_read_back_shapes() {
    let mut registry = DynamicRegistry::new();
    let count = registry
        .replace(
            ReplaceRequest::from_json(REPLACE_EXAMPLE.as_bytes()).unwrap(),
            &none(),
        )
        .unwrap();
    assert_eq!(count, 1);
    assert_eq!(
        serde_json::to_value(ReplaceResponse { ok: true, count }).unwrap(),
        serde_json::json!({"ok": true, "count": 1})
    );
    assert_eq!(
        serde_json::to_value(registry.version_response()).unwrap(),
        serde_json::json!({"version": "rev_00000004", "count": 1})
    );
    let list = serde_json::to_value(registry.list()).unwrap();
    assert_eq!(
        list,
        serde_json::json!({
            "count": 1,
            "keys": [{
                "id": "acme-prod",
                "key_hash": "",
                "key_preview": "sk-...KJ4",
                "owner": "acme-corp",
                "name": "Acme production key",
                "enabled": true,
                "expires_at": "2027-01-01T00:00:00Z",
                "allowed_models": ["meta-llama/Llama-3.1-8B-Instruct"],
                "quota": {"requests_per_minute": 1000, "tokens_per_day": 1000000}
            }]
        })
    );
    // The empty key (SHA-256 of "") of the example authenticates only when presented; an empty
    // credential is "missing", never a match.
    assert_eq!(
        registry.snapshot().authenticate(Some(b""), NOW_MS),
        AuthOutcome::Missing
    );
}

#[test]
fn get_response_round_trips_the_reference_example() {
    let expected: serde_json::Value = serde_json::from_str(GET_EXAMPLE).unwrap();
    let parsed: GetResponse = serde_json::from_value(expected.clone()).unwrap();
    assert_eq!(serde_json::to_value(&parsed).unwrap(), expected);

    let mut registry = DynamicRegistry::new();
    let mut entry = parsed.key.clone();
    entry.key_hash = crate::logic::auth::key_hash::hash_key_hex("k");
    registry
        .replace(
            ReplaceRequest {
                version: "v1".into(),
                keys: vec![entry],
            },
            &none(),
        )
        .unwrap();
    assert_eq!(
        serde_json::to_value(registry.get("acme-prod").unwrap()).unwrap(),
        expected
    );
}

#[test]
fn unknown_id_is_not_found() {
    let registry = DynamicRegistry::new();
    let error = registry.get("acme-prod").unwrap_err();
    assert_eq!(error.status(), 404);
    assert_eq!(
        serde_json::to_value(error.response()).unwrap(),
        serde_json::json!({"error": "key not found: acme-prod"})
    );
    assert_eq!(
        serde_json::to_value(ErrorResponse::not_active()).unwrap(),
        serde_json::json!({"error": "dynamic key registry not active"})
    );
}

#[test]
fn versions_lower_are_stale_equal_and_higher_accepted() {
    let mut registry = DynamicRegistry::new();
    registry
        .put("a", put_body("rev_00000003", "ka"), &none())
        .unwrap();
    let before = registry.clone();
    let error = registry
        .put("b", put_body("rev_00000002", "kb"), &none())
        .unwrap_err();
    assert_eq!(error.status(), 409);
    assert_eq!(
        serde_json::to_value(error.response()).unwrap(),
        serde_json::json!({"error": "stale version", "current_version": "rev_00000003"})
    );
    assert_eq!(registry, before);
    registry
        .put("b", put_body("rev_00000003", "kb"), &none())
        .unwrap(); // replay allowed
    registry
        .put("c", put_body("rev_00000004", "kc"), &none())
        .unwrap();
    assert_eq!(registry.version(), "rev_00000004");
    assert_eq!(registry.len(), 3);
    assert_eq!(
        registry.put("d", put_body("", "kd"), &none()),
        Err(DynamicError::VersionRequired)
    );
    assert_eq!(format_version(42), "rev_00000042");
}

#[test]
fn update_replaces_the_whole_entry_and_rotation_keeps_the_key_id() {
    let mut registry = DynamicRegistry::new();
    registry
        .put("app", put_body("v1", "old-key"), &none())
        .unwrap();
    let old_id = match registry.snapshot().authenticate(Some(b"old-key"), NOW_MS) {
        AuthOutcome::Authenticated { key_id, .. } => key_id,
        other => panic!("{other:?}"),
    };
    registry
        .put("app", put_body("v2", "new-key"), &none())
        .unwrap();
    let snapshot = registry.snapshot();
    assert_eq!(
        snapshot.authenticate(Some(b"old-key"), NOW_MS),
        AuthOutcome::Unknown
    );
    match snapshot.authenticate(Some(b"new-key"), NOW_MS) {
        AuthOutcome::Authenticated { key_id, .. } => assert_eq!(key_id, old_id),
        other => panic!("{other:?}"),
    }
    assert_eq!(registry.len(), 1);
    // The old hash is free again for another id.
    registry
        .put("other", put_body("v3", "old-key"), &none())
        .unwrap();
}

#[test]
fn disabled_key_does_not_authenticate() {
    let mut registry = DynamicRegistry::new();
    registry
        .put(
            "app",
            with(put_body("v1", "k"), |body| body.enabled = false),
            &none(),
        )
        .unwrap();
    assert!(matches!(
        registry.snapshot().authenticate(Some(b"k"), NOW_MS),
        AuthOutcome::Disabled { .. }
    ));
    assert!(!registry.list().keys[0].enabled);
}

#[test]
fn delete_is_idempotent_and_needs_a_version() {
    let mut registry = DynamicRegistry::new();
    registry.put("app", put_body("v1", "k"), &none()).unwrap();
    assert_eq!(
        registry.delete("app", None),
        Err(DynamicError::VersionRequired)
    );
    assert!(matches!(
        registry.delete("app", Some("v0")),
        Err(DynamicError::Stale { .. })
    ));
    assert_eq!(registry.len(), 1);
    registry.delete("app", Some("v2")).unwrap();
    registry.delete("app", Some("v2")).unwrap();
    registry.delete("never-existed", Some("v3")).unwrap();
    assert!(registry.is_empty());
    assert_eq!(
        registry.snapshot().authenticate(Some(b"k"), NOW_MS),
        AuthOutcome::Unknown
    );
    // The hash may now go to another id.
    registry.put("other", put_body("v4", "k"), &none()).unwrap();
}

#[test]
fn one_hash_cannot_belong_to_two_ids() {
    let mut registry = DynamicRegistry::new();
    registry.put("a", put_body("v1", "k"), &none()).unwrap();
    let before = registry.clone();
    let error = registry.put("b", put_body("v2", "k"), &none()).unwrap_err();
    assert_eq!(error.status(), 400);
    assert_eq!(
        error.to_string(),
        "invalid key entry: key b: key_hash: already belongs to key a; delete that entry first"
    );
    assert_eq!(registry, before);
    // The id that holds the hash may write its entry again (an update keeps its key).
    registry.put("a", put_body("v3", "k"), &none()).unwrap();
    registry.put("b", put_body("v4", "other"), &none()).unwrap();
    let error = registry
        .put("a", put_body("v5", "other"), &none())
        .unwrap_err();
    assert!(
        error.to_string().contains("already belongs to key b"),
        "{error}"
    );
}

#[test]
fn hashes_are_normalised_to_lowercase() {
    let mut registry = DynamicRegistry::new();
    let body = with(put_body("v1", "k"), |body| {
        body.key_hash = body.key_hash.to_uppercase()
    });
    registry.put("a", body, &none()).unwrap();
    assert!(matches!(
        registry.snapshot().authenticate(Some(b"k"), NOW_MS),
        AuthOutcome::Authenticated { .. }
    ));
}

#[test]
fn invalid_writes_are_refused_with_a_reason_and_change_nothing() {
    let mut registry = DynamicRegistry::new();
    registry
        .put("keep", put_body("v5", "keep-key"), &none())
        .unwrap();
    let cases: Vec<(PutKeyRequest, &str)> = vec![
        (
            with(put_body("v6", "k"), |b| b.key_hash.clear()),
            "key x: key_hash: is required",
        ),
        (
            with(put_body("v6", "k"), |b| b.key_hash = "abc".into()),
            "key_hash: must be exactly 64 hex digits",
        ),
        (
            with(put_body("v6", "k"), |b| b.owner.clear()),
            "key x: owner: must not be empty",
        ),
        (
            with(put_body("v6", "k"), |b| b.name = " ".into()),
            "key x: name: must not be empty",
        ),
        (
            with(put_body("v6", "k"), |b| b.expires_at = "01-01-2027".into()),
            "expires_at: \"01-01-2027\" is not an RFC 3339 timestamp",
        ),
        (
            with(put_body("v6", "k"), |b| b.max_occupancy_share = Some(1.5)),
            "max_occupancy_share: must be 0 (unset) or in (0, 1]",
        ),
        (
            with(put_body("v6", "k"), |b| {
                b.quota = Some(QuotaSpec {
                    output_tokens_per_minute: Some(-1),
                    ..QuotaSpec::default()
                })
            }),
            "quota.output_tokens_per_minute: must not be negative",
        ),
        (
            with(put_body("v6", "k"), |b| {
                b.quota = Some(QuotaSpec {
                    tokens_per_day: Some(5),
                    per_model: Some(BTreeMap::new()),
                    ..QuotaSpec::default()
                })
            }),
            "quota: mixes flat fields (tokens_per_day) with per_model",
        ),
        (
            with(put_body("v6", "k"), |b| {
                b.allowed_models = vec![String::new()]
            }),
            "allowed_models[0]: must not be empty",
        ),
    ];
    for (body, expected) in cases {
        let before = registry.clone();
        let error = registry.put("x", body, &none()).unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(error.to_string().contains(expected), "{expected}: {error}");
        assert_eq!(registry, before, "{expected}");
    }
    let long_id = "i".repeat(MAX_ID_BYTES + 1);
    assert!(
        registry
            .put(&long_id, put_body("v6", "k"), &none())
            .is_err()
    );
    assert!(registry.put("", put_body("v6", "k"), &none()).is_err());
    assert_eq!(registry.version(), "v5");
    assert_eq!(registry.generation(), 1);
}

#[test]
fn writes_enforce_the_cross_config_serverless_invariant() {
    let limits = ServerlessLimits {
        global_max_input_tokens: Some(131_072),
        models: BTreeMap::new(),
    };
    let mut registry = DynamicRegistry::new();
    let low = with(put_body("v1", "k"), |b| {
        b.quota = Some(QuotaSpec {
            input_tokens_per_minute: Some(100_000),
            ..QuotaSpec::default()
        })
    });
    let error = registry.put("a", low.clone(), &limits).unwrap_err();
    assert_eq!(error.status(), 400);
    assert!(
        error
            .to_string()
            .contains("100000 is below max_input_tokens 131072"),
        "{error}"
    );
    assert!(registry.is_empty());
    // Without serverless policies the same key is fine, and a later policy that would break it
    // is caught by the reverse check.
    registry.put("a", low, &none()).unwrap();
    assert!(registry.check_serverless(&limits).is_err());
    assert_eq!(registry.check_serverless(&none()), Ok(()));
}

#[test]
fn replace_validates_everything_before_swapping() {
    let mut registry = DynamicRegistry::new();
    registry
        .put("keep", put_body("v1", "keep-key"), &none())
        .unwrap();
    let before = registry.clone();
    let good = |id: &str, raw_key: &str| DynamicKeyEntry {
        id: id.into(),
        key_hash: crate::logic::auth::key_hash::hash_key_hex(raw_key),
        key_preview: String::new(),
        owner: "o".into(),
        name: "n".into(),
        enabled: true,
        expires_at: String::new(),
        allowed_models: Vec::new(),
        max_occupancy_share: None,
        quota: None,
    };
    let cases = vec![
        (
            vec![good("a", "1"), good("a", "2")],
            "keys[1] (a): id: duplicates keys[0]",
        ),
        (
            vec![good("a", "1"), good("b", "1")],
            "keys[1] (b): key_hash: duplicates the hash of key a",
        ),
        (vec![good("", "1")], "keys[0] (<no id>): id: is required"),
        (
            vec![
                good("a", "1"),
                DynamicKeyEntry {
                    owner: String::new(),
                    ..good("b", "2")
                },
            ],
            "keys[1] (b): owner: must not be empty",
        ),
    ];
    for (keys, expected) in cases {
        let error = registry
            .replace(
                ReplaceRequest {
                    version: "v2".into(),
                    keys,
                },
                &none(),
            )
            .unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(error.to_string().contains(expected), "{expected}: {error}");
        assert_eq!(registry, before);
    }
    let count = registry
        .replace(
            ReplaceRequest {
                version: "v2".into(),
                keys: vec![good("a", "1"), good("b", "2")],
            },
            &none(),
        )
        .unwrap();
    assert_eq!(count, 2);
    let snapshot = registry.snapshot();
    assert_eq!(
        snapshot.authenticate(Some(b"keep-key"), NOW_MS),
        AuthOutcome::Unknown
    );
    assert!(matches!(
        snapshot.authenticate(Some(b"2"), NOW_MS),
        AuthOutcome::Authenticated { .. }
    ));
    // An empty replace empties the registry.
    registry
        .replace(
            ReplaceRequest {
                version: "v3".into(),
                keys: vec![],
            },
            &none(),
        )
        .unwrap();
    assert!(registry.is_empty());
}

#[test]
fn bodies_refuse_unknown_fields_and_missing_enabled() {
    let error = PutKeyRequest::from_json(br#"{"version":"v","key_hash":"","owner":"o","name":"n","enabled":true,"alowed_models":[]}"#)
        .unwrap_err();
    assert!(error.to_string().contains("alowed_models"), "{error}");
    assert_eq!(error.status(), 400);
    let error = PutKeyRequest::from_json(br#"{"version":"v","owner":"o","name":"n"}"#).unwrap_err();
    assert!(error.to_string().contains("enabled"), "{error}");
    assert!(PutKeyRequest::from_json(b"not json").is_err());
    // `id` in a PUT body is accepted and the URL id wins.
    let mut registry = DynamicRegistry::new();
    let body = with(put_body("v1", "k"), |b| b.id = Some("body-id".into()));
    registry.put("url-id", body, &none()).unwrap();
    assert!(registry.get("url-id").is_ok());
    assert!(registry.get("body-id").is_err());
    let big = vec![b' '; PUT_BODY_BYTES_MAX + 1];
    assert_eq!(
        PutKeyRequest::from_json(&big),
        Err(DynamicError::BodyTooLarge {
            limit_bytes: PUT_BODY_BYTES_MAX
        })
    );
}

#[test]
fn debug_never_shows_hashes() {
    let body = put_body("v1", "k");
    let hash = body.key_hash.clone();
    let mut registry = DynamicRegistry::new();
    registry.put("a", body.clone(), &none()).unwrap();
    for text in [
        format!("{body:?}"),
        format!("{registry:?}"),
        format!("{:?}", registry.list()),
        format!("{:?}", registry.snapshot()),
    ] {
        assert!(!text.contains(&hash[..12]), "{text}");
    }
}

/// One random admin operation; some valid, some not.
#[derive(Debug, Clone)]
enum Operation {
    Put {
        id: u8,
        key: u8,
        owner: u8,
        version: u8,
        bad: bool,
    },
    Delete {
        id: u8,
        version: u8,
    },
    Replace {
        entries: Vec<(u8, u8)>,
        version: u8,
    },
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        (0u8..6, 0u8..6, 0u8..3, 0u8..20, any::<bool>()).prop_map(
            |(id, key, owner, version, bad)| Operation::Put {
                id,
                key,
                owner,
                version,
                bad,
            }
        ),
        (0u8..6, 0u8..20).prop_map(|(id, version)| Operation::Delete { id, version }),
        (proptest::collection::vec((0u8..6, 0u8..6), 0..5), 0u8..20)
            .prop_map(|(entries, version)| Operation::Replace { entries, version }),
    ]
}

/// The entry a replace body carries for `(id, key)`: owners, expiries and quotas vary with the
/// key, so the answers' round trip covers them.
fn replace_entry(id: u8, key: u8) -> DynamicKeyEntry {
    DynamicKeyEntry {
        id: format!("id-{id}"),
        key_hash: crate::logic::auth::key_hash::hash_key_hex(&format!("key-{key}")),
        key_preview: format!("sk-...{key}"),
        owner: format!("o{}", key % 3),
        name: "n".into(),
        enabled: key % 4 != 3,
        expires_at: if key.is_multiple_of(2) {
            String::new()
        } else {
            "2027-01-01T01:00:00+01:00".into()
        },
        allowed_models: if key.is_multiple_of(3) {
            Vec::new()
        } else {
            vec!["m2".into(), "m1".into()]
        },
        max_occupancy_share: None,
        quota: (key % 2 == 1).then(|| QuotaSpec {
            requests_per_minute: Some(0),
            tokens_per_day: Some(i64::from(key) * 1000),
            ..QuotaSpec::default()
        }),
    }
}

#[test]
fn every_field_of_a_replace_entry_comes_back_as_supplied() {
    let mut registry = DynamicRegistry::new();
    let keys: Vec<DynamicKeyEntry> = (0..6).map(|key| replace_entry(key, key)).collect();
    let request = ReplaceRequest {
        version: format_version(1),
        keys: keys.clone(),
    };
    assert_eq!(registry.replace(request, &none()), Ok(6));
    for entry in keys {
        let answered = registry.get(&entry.id).unwrap().key;
        assert_eq!(
            answered,
            DynamicKeyEntry {
                key_hash: String::new(),
                ..entry
            }
        );
    }
}

proptest! {
    /// Every refused write leaves the registry unchanged; every accepted one moves the version
    /// up; no two ids ever share a hash; the admin answers give back every accepted entry as
    /// supplied (hash blanked); and the shards' snapshot, kept write by write, equals the one
    /// built from the accepted entries at once.
    #[test]
    fn refused_writes_change_nothing(operations in proptest::collection::vec(operation(), 1..40)) {
        let mut registry = DynamicRegistry::new();
        // The accepted entries, as supplied.
        let mut accepted: BTreeMap<String, DynamicKeyEntry> = BTreeMap::new();
        for operation in operations {
            let before = registry.clone();
            let result = match &operation {
                Operation::Put { id, key, owner, version, bad } => {
                    let body = with(put_body(&format_version(u64::from(*version)), &format!("key-{key}")), |b| {
                        b.owner = format!("o{owner}");
                        if *bad {
                            b.max_occupancy_share = Some(-1.0);
                        }
                    });
                    let id = format!("id-{id}");
                    let (_, entry) = body.clone().into_entry(&id);
                    registry.put(&id, body, &none()).map(|_| {
                        accepted.insert(id, entry);
                    })
                }
                Operation::Delete { id, version } => {
                    let id = format!("id-{id}");
                    registry.delete(&id, Some(&format_version(u64::from(*version)))).map(|_| {
                        accepted.remove(&id);
                    })
                }
                Operation::Replace { entries, version } => {
                    let keys: Vec<DynamicKeyEntry> =
                        entries.iter().map(|(id, key)| replace_entry(*id, *key)).collect();
                    let request = ReplaceRequest {
                        version: format_version(u64::from(*version)),
                        keys: keys.clone(),
                    };
                    registry.replace(request, &none()).map(|_| {
                        accepted = keys.into_iter().map(|entry| (entry.id.clone(), entry)).collect();
                    })
                }
            };
            match result {
                Err(_) => prop_assert_eq!(&registry, &before),
                Ok(()) => {
                    prop_assert!(registry.version() >= before.version());
                    prop_assert_eq!(registry.generation(), before.generation() + 1);
                }
            }
            let answered: Vec<DynamicKeyEntry> = accepted
                .values()
                .map(|entry| DynamicKeyEntry { key_hash: String::new(), ..entry.clone() })
                .collect();
            prop_assert_eq!(&registry.list().keys, &answered);
            let hashes: std::collections::HashSet<&str> =
                accepted.values().map(|entry| entry.key_hash.as_str()).collect();
            prop_assert_eq!(hashes.len(), registry.len());
            let snapshot = registry.snapshot();
            for (id, entry) in &accepted {
                let hash = KeyHash::parse_hex(&entry.key_hash).unwrap();
                prop_assert_eq!(registry.live.registry_id_of_hash(&hash), Some(id.as_str()));
            }
            prop_assert_eq!(snapshot.len(), registry.len());
            for key in 0..6u8 {
                let raw_key = format!("key-{key}");
                let hash = crate::logic::auth::key_hash::hash_key_hex(&raw_key);
                let held = accepted.values().find(|entry| entry.key_hash == hash);
                let authenticated = matches!(
                    snapshot.authenticate(Some(raw_key.as_bytes()), NOW_MS),
                    AuthOutcome::Authenticated { .. }
                );
                prop_assert_eq!(held.is_some_and(|entry| entry.enabled), authenticated);
            }
            let built = KeyRegistry::build(
                RegistryMode::Dynamic,
                accepted
                    .values()
                    .map(|entry| {
                        let mut problems = Vec::new();
                        let mut sink = Sink::new(entry.id.clone(), &mut problems);
                        validate_entry(entry.clone(), &none(), &mut sink).unwrap().key
                    })
                    .collect(),
            );
            snapshot.assert_same_keys(&built);
            built.assert_same_keys(&snapshot);
        }
    }
}
