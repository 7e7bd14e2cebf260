//! Proves that the registry authenticates by hash, tells missing, unknown, expired and disabled
//! keys apart, gives every key its own stable ID, and never shows a key in `Debug`.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::logic::auth::config::AuthConfig;

const STATIC_COMPLETE: &str = include_str!("../../../../tests/fixtures/auth/static-complete.yaml");

/// 2026-07-27T12:00:00Z
const NOW_MS: i64 = 1_785_153_600_000;
/// 2027-01-01T00:00:00Z: the beta key (expires 31-12-2026) stops here.
const BETA_END_MS: i64 = 1_798_761_600_000;

fn static_registry() -> KeyRegistry {
    KeyRegistry::from_config(&AuthConfig::from_yaml(STATIC_COMPLETE).unwrap())
}

#[test]
fn known_key_authenticates_with_its_record() {
    let registry = static_registry();
    assert_eq!(registry.mode(), RegistryMode::Static);
    assert_eq!(registry.len(), 3);
    let AuthOutcome::Authenticated { key_id, key } =
        registry.authenticate(Some(b"sk-hivenet-production"), NOW_MS)
    else {
        panic!("production key should authenticate");
    };
    assert_eq!(key.key_id, key_id);
    assert_eq!(&*key.owner, "acme-corp");
    assert_eq!(key.source, KeySource::Static { index: 0 });
    assert_ne!(key_id, KeyId::ANONYMOUS);
    assert_eq!(
        registry.get(key_id).map(|record| &*record.preview),
        Some("sk-...prod")
    );
    assert_eq!(key.audit_key_id(), key_id.to_string());
    assert_eq!(key.audit_key_id().len(), 8);
}

#[test]
fn missing_and_unknown_keys() {
    let registry = static_registry();
    assert_eq!(registry.authenticate(None, NOW_MS), AuthOutcome::Missing);
    assert_eq!(
        registry.authenticate(Some(b""), NOW_MS),
        AuthOutcome::Missing
    );
    assert_eq!(
        registry.authenticate(Some(b"sk-hivenet-nope"), NOW_MS),
        AuthOutcome::Unknown
    );
    // The hash itself is not a credential.
    let hash_as_key = KeyHash::of_raw_key(b"sk-hivenet-production").to_hex();
    assert_eq!(
        registry.authenticate(Some(hash_as_key.as_bytes()), NOW_MS),
        AuthOutcome::Unknown
    );
}

#[test]
fn static_key_is_valid_through_its_last_day_then_expired() {
    let registry = static_registry();
    assert!(matches!(
        registry.authenticate(Some(b"sk-hivenet-beta"), BETA_END_MS - 1),
        AuthOutcome::Authenticated { .. }
    ));
    let AuthOutcome::Expired { key } = registry.authenticate(Some(b"sk-hivenet-beta"), BETA_END_MS)
    else {
        panic!("beta key should be expired at midnight after its last day");
    };
    assert_eq!(&*key.preview, "sk-...beta");
    assert_eq!(key.expires_at_unix_ms(), Some(BETA_END_MS));
}

#[test]
fn open_mode_authenticates_everyone_as_the_anonymous_key() {
    let registry = KeyRegistry::open();
    for presented in [None, Some(&b"anything"[..]), Some(&b""[..])] {
        let AuthOutcome::Authenticated { key_id, key } = registry.authenticate(presented, NOW_MS)
        else {
            panic!("open mode authenticates");
        };
        assert_eq!(key_id, KeyId::ANONYMOUS);
        assert_eq!(&*key.owner, ANONYMOUS_OWNER);
        assert_eq!(key.tenant_id, TenantId::DEFAULT);
        assert!(key.allows("any-model"));
    }
    assert_eq!(
        registry.get(KeyId::ANONYMOUS).unwrap().key_id,
        KeyId::ANONYMOUS
    );
    let none = AuthConfig::from_yaml("api:\n  mode: none\n").unwrap();
    assert_eq!(KeyRegistry::from_config(&none).mode(), RegistryMode::Open);
}

#[test]
fn dynamic_mode_config_starts_with_an_empty_registry() {
    let config = AuthConfig::from_yaml("api:\n  mode: dynamic\n").unwrap();
    let registry = KeyRegistry::from_config(&config);
    assert_eq!(registry.mode(), RegistryMode::Dynamic);
    assert_eq!(
        registry.authenticate(Some(b"k"), NOW_MS),
        AuthOutcome::Unknown
    );
    assert_eq!(registry.authenticate(None, NOW_MS), AuthOutcome::Missing);
}

#[test]
fn every_static_key_has_its_own_id_and_the_same_one_after_a_reload() {
    let first = static_registry();
    let ids: HashSet<KeyId> = first.iter().map(|key| key.key_id).collect();
    assert_eq!(ids.len(), 3);
    assert!(!ids.contains(&KeyId::ANONYMOUS));

    // Reload with the keys reordered and one removed: surviving keys keep their IDs.
    let text = STATIC_COMPLETE.replace("- key_hash: \"c77355", "- key_hash: \"C77355");
    assert!(
        AuthConfig::from_yaml(&text).is_err(),
        "uppercase hash refused"
    );
    let mut config = AuthConfig::from_yaml(STATIC_COMPLETE).unwrap();
    config.keys.remove(0);
    config.keys.reverse();
    let second = KeyRegistry::from_config(&config);
    for key in second.iter() {
        let before = first.iter().find(|old| old.hash == key.hash).unwrap();
        assert_eq!(before.key_id, key.key_id);
        assert_eq!(before.tenant_id, key.tenant_id);
    }
}

#[test]
fn keys_of_one_owner_share_a_tenant_id() {
    let text = STATIC_COMPLETE.replace("owner: \"beta-team\"", "owner: \"acme-corp\"");
    let registry = KeyRegistry::from_config(&AuthConfig::from_yaml(&text).unwrap());
    let tenants: Vec<TenantId> = registry.iter().map(|key| key.tenant_id).collect();
    assert_eq!(tenants[0], tenants[1]);
    assert_ne!(tenants[0], tenants[2]);
    // One allocation of the owner's name, which every series labelled with it clones.
    let owners: Vec<&Arc<str>> = registry.iter().map(|key| &key.owner).collect();
    assert!(Arc::ptr_eq(owners[0], owners[1]));
    assert!(!Arc::ptr_eq(owners[0], owners[2]));
    assert_ne!(
        registry.iter().next().unwrap().key_id,
        registry.iter().nth(1).unwrap().key_id
    );
}

#[test]
fn model_authorisation_through_the_record() {
    let registry = static_registry();
    let AuthOutcome::Authenticated { key, .. } =
        registry.authenticate(Some(b"sk-hivenet-multi"), NOW_MS)
    else {
        panic!()
    };
    assert_eq!(key.authorize("Qwen/Qwen3.6-27B"), ModelAccess::Allowed);
    assert_eq!(
        key.authorize("meta-llama/Llama-3.1-8B-Instruct"),
        ModelAccess::NoQuotaDeclared
    );
    let AuthOutcome::Authenticated { key, .. } =
        registry.authenticate(Some(b"sk-hivenet-beta"), NOW_MS)
    else {
        panic!()
    };
    assert_eq!(key.authorize("Qwen/Qwen3.6-27B"), ModelAccess::Forbidden);
    assert!(key.allows("meta-llama/Llama-3.1-8B-Instruct"));
}

#[test]
fn debug_shows_the_preview_and_never_the_hash() {
    let registry = static_registry();
    let hash_hex = KeyHash::of_raw_key(b"sk-hivenet-production").to_hex();
    for text in [
        format!("{registry:?}"),
        format!("{:?}", registry.iter().next().unwrap()),
        format!(
            "{:?}",
            registry.authenticate(Some(b"sk-hivenet-production"), NOW_MS)
        ),
        format!("{:?}", KeyHash::of_raw_key(b"sk-hivenet-production")),
    ] {
        assert!(!text.contains(&hash_hex[..12]), "{text}");
        assert!(!text.contains("sk-hivenet-production"), "{text}");
        let first_byte = KeyHash::of_raw_key(b"sk-hivenet-production").0;
        assert!(
            !text.contains(&format!("[{}, {}", first_byte[0], first_byte[1])),
            "{text}"
        );
    }
    assert!(format!("{:?}", registry.iter().next().unwrap()).contains("sk-...prod"));
}

#[test]
fn presented_key_from_either_header() {
    assert_eq!(
        presented_key(Some(b"Bearer sk-1"), None),
        Some(&b"sk-1"[..])
    );
    assert_eq!(
        presented_key(Some(b"bearer   sk-1  "), None),
        Some(&b"sk-1"[..])
    );
    assert_eq!(presented_key(Some(b"sk-raw"), None), Some(&b"sk-raw"[..]));
    assert_eq!(
        presented_key(None, Some(b"sk-anthropic")),
        Some(&b"sk-anthropic"[..])
    );
    assert_eq!(
        presented_key(Some(b"Bearer sk-1"), Some(b"sk-2")),
        Some(&b"sk-1"[..])
    );
    assert_eq!(
        presented_key(Some(b"Bearer "), Some(b"sk-2")),
        Some(&b"sk-2"[..])
    );
    assert_eq!(presented_key(Some(b"Bearer"), None), None);
    assert_eq!(presented_key(Some(b"  "), Some(b"")), None);
    assert_eq!(presented_key(None, None), None);
}

#[test]
fn admin_credentials_are_bearer_tokens_only() {
    assert_eq!(bearer_token(Some(b"Bearer adm-1")), Some(&b"adm-1"[..]));
    assert_eq!(
        bearer_token(Some(b"  bEARER   adm-1 ")),
        Some(&b"adm-1"[..])
    );
    // A raw value is a client credential, not an admin one.
    assert_eq!(bearer_token(Some(b"adm-1")), None);
    assert_eq!(bearer_token(Some(b"Basic adm-1")), None);
    assert_eq!(bearer_token(Some(b"Bearer")), None);
    assert_eq!(bearer_token(Some(b"Bearer   ")), None);
    assert_eq!(bearer_token(Some(b"Beareradm-1")), None);
    assert_eq!(bearer_token(None), None);
}

#[test]
fn a_record_stays_within_its_size_bound() {
    // Every loaded key holds one: boxed string slices and an inline expiry keep it in bounds
    // (`String`s and a boxed expiry would make it 224 bytes).
    assert!(
        std::mem::size_of::<KeyRecord>() <= KeyRecord::SIZE_MAX,
        "KeyRecord is {} bytes",
        std::mem::size_of::<KeyRecord>()
    );
}

#[test]
fn a_chunk_of_records_fits_the_allocators_12_kib_size_class() {
    // One chunk is one allocation: the `Arc`'s two counts, then the records. Past 12 KiB,
    // mimalloc's next size class is 14 KiB: 32 bytes more for every loaded key.
    let chunk = 2 * std::mem::size_of::<usize>() + super::chunks::CHUNK * KeyRecord::SIZE_MAX;
    assert!(chunk <= 12 * 1024, "a chunk of records takes {chunk} bytes");
}

#[test]
fn every_key_of_a_large_registry_is_found_by_its_hash_and_by_its_id() {
    let count = 20_000;
    let inputs = (0..count)
        .map(|index| KeyInput {
            source: KeySource::Static { index },
            hash: KeyHash::of_raw_key(format!("sk-many-{index}").as_bytes()),
            preview: format!("p{index}"),
            name: String::new(),
            owner: format!("owner-{}", index % 7),
            expires_at_unix_ms: (index % 2 == 0).then_some(1_000),
            enabled: true,
            settings: KeySettings::unrestricted(),
        })
        .collect();
    let registry = KeyRegistry::build(RegistryMode::Static, inputs);
    assert_eq!(registry.len(), count);
    for index in 0..count {
        let raw_key = format!("sk-many-{index}");
        let key = match registry.authenticate(Some(raw_key.as_bytes()), 999) {
            AuthOutcome::Authenticated { key, .. } => key,
            other => panic!("key {index}: {other:?}"),
        };
        assert_eq!(*key.preview, format!("p{index}"));
        assert_eq!(key.source, KeySource::Static { index });
        assert_eq!(key.expires_at_unix_ms(), (index % 2 == 0).then_some(1_000));
        assert!(std::ptr::eq(registry.get(key.key_id).unwrap(), key));
    }
    assert_eq!(
        registry.authenticate(Some(b"sk-many-absent"), 0),
        AuthOutcome::Unknown
    );
    assert!(registry.get(KeyId(0)).is_none());
}

#[test]
fn colliding_digests_still_get_distinct_non_zero_ids() {
    let mut same = [7u8; 32];
    same[..4].copy_from_slice(&0u32.to_be_bytes()); // first window is the reserved 0
    let digests = vec![same, same, same, [7u8; 32]];
    let ids = assign_ids(&digests);
    let unique: HashSet<u32> = ids.iter().copied().collect();
    assert_eq!(unique.len(), 4);
    assert!(!unique.contains(&0));

    // Nine identical digests exhaust the eight windows and fall back to probing.
    let all_same = vec![[1u8; 32]; 9];
    let ids = assign_ids(&all_same);
    assert_eq!(ids.iter().copied().collect::<HashSet<u32>>().len(), 9);
}

#[test]
fn ids_do_not_depend_on_input_order() {
    let digests: Vec<[u8; 32]> = (0u8..50).map(|n| Sha256::digest([n]).into()).collect();
    let forward = assign_ids(&digests);
    let mut reversed_input = digests.clone();
    reversed_input.reverse();
    let mut backward = assign_ids(&reversed_input);
    backward.reverse();
    assert_eq!(forward, backward);
}

proptest! {
    /// Any set of distinct keys gets distinct non-zero IDs, and a key's ID is the same in any
    /// superset of its set (no 32-bit collisions happen at these sizes), whatever the order.
    #[test]
    fn key_ids_are_unique_and_stable(
        keys in proptest::collection::hash_set("[a-zA-Z0-9]{1,24}", 1..60),
        extra in proptest::collection::hash_set("[a-zA-Z0-9]{25,30}", 0..20),
    ) {
        let base: Vec<String> = keys.into_iter().collect();
        let inputs = |raw_keys: &[String]| -> Vec<KeyInput> {
            raw_keys
                .iter()
                .enumerate()
                .map(|(index, raw_key)| KeyInput {
                    source: KeySource::Static { index },
                    hash: KeyHash::of_raw_key(raw_key.as_bytes()),
                    preview: String::new(),
                    name: raw_key.clone(),
                    owner: format!("owner-{}", index % 3),
                    expires_at_unix_ms: None,
                    enabled: true,
                    settings: KeySettings::unrestricted(),
                })
                .collect()
        };
        let small = KeyRegistry::build(RegistryMode::Static, inputs(&base));
        let ids: HashSet<KeyId> = small.iter().map(|key| key.key_id).collect();
        prop_assert_eq!(ids.len(), base.len());
        prop_assert!(!ids.contains(&KeyId::ANONYMOUS));

        let mut bigger_keys: Vec<String> = extra.into_iter().chain(base.iter().cloned()).collect();
        bigger_keys.reverse();
        let bigger = KeyRegistry::build(RegistryMode::Static, inputs(&bigger_keys));
        for raw_key in &base {
            let AuthOutcome::Authenticated { key_id: small_id, .. } = small.authenticate(Some(raw_key.as_bytes()), 0) else {
                return Err(TestCaseError::fail("key in small registry"));
            };
            let AuthOutcome::Authenticated { key_id: big_id, .. } = bigger.authenticate(Some(raw_key.as_bytes()), 0) else {
                return Err(TestCaseError::fail("key in bigger registry"));
            };
            prop_assert_eq!(small_id, big_id);
        }
    }
}
