//! `auth.yaml` (`auth::config`): the file parsed and validated into an `AuthConfig`, then used as
//! the router uses it (model authorisation, expiry, the cross-config serverless check).
//!
//! Asserts:
//! - nothing panics, whatever the text;
//! - a validated config keeps the module's invariants: static keys only in `api-key` mode and at
//!   least one there, unique hashes, a non-empty name and owner, `expires_at >= created_at`, an
//!   occupancy share unset or in (0, 1], an allowlist that is sorted and deduplicated;
//! - every key's settings answer for the models it names and for others.
#![no_main]

use std::collections::{BTreeMap, HashSet};

use hivenet_router::logic::auth::config::{ApiMode, AuthConfig, ModelAccess, Quota, ServerlessLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = AuthConfig::from_yaml(text) else {
        return;
    };
    if config.api_mode == ApiMode::ApiKey {
        assert!(!config.keys.is_empty());
    } else {
        assert!(config.keys.is_empty());
    }
    let mut hashes = HashSet::new();
    for key in &config.keys {
        assert!(hashes.insert(key.hash), "duplicate key hash");
        assert!(!key.name.is_empty() && !key.owner.is_empty());
        if let (Some(created), Some(expires)) = (key.created_at, key.expires_at) {
            assert!(expires >= created);
        }
        let _ = key.expires_at_unix_ms();
        let settings = &key.settings;
        if let Some(share) = settings.max_occupancy_share() {
            assert!(share > 0.0 && share <= 1.0, "occupancy share {share}");
        }
        let allowed = settings.allowed_models();
        assert!(allowed.windows(2).all(|pair| pair[0] < pair[1]));
        let named: Vec<&str> = match settings.quota() {
            Quota::PerModel(per_model) => per_model.keys().map(String::as_str).collect(),
            Quota::Flat(_) => allowed.iter().map(String::as_str).collect(),
        };
        for model in &named {
            assert_eq!(settings.authorize(model), ModelAccess::Allowed);
        }
        let unnamed = "model-named-by-no-key\u{0}";
        let access = settings.authorize(unnamed);
        assert_eq!(
            access == ModelAccess::Allowed,
            named.is_empty() && matches!(settings.quota(), Quota::Flat(_))
        );
    }
    for global in [None, Some(0), Some(4096)] {
        let limits = ServerlessLimits {
            global_max_input_tokens: global,
            models: BTreeMap::from([("llama".to_owned(), Some(8192)), ("qwen".to_owned(), None)]),
        };
        let _ = config.check_serverless(&limits);
    }
});
