//! Who may call `/admin/*`: the admin section of `auth.yaml`, the admin keys from
//! `HIVENET_ROUTER_ADMIN_API_KEYS`, the `HIVENET_ROUTER_ALLOW_INSECURE_ADMIN` override, and the
//! elevation dynamic client mode forces.
//!
//! Must not: read the environment (the caller passes the values), keep a raw admin key (they are
//! hashed when resolved), or say in `Debug` anything but how many keys there are.
//!
//! Rules (`security-auth-yaml-reference.mdx`, "admin section" and "Mode combinations"):
//!
//! | `api.mode` | `admin.mode` | admin keys set | result |
//! | --- | --- | --- | --- |
//! | `dynamic` | any or omitted | yes | keys required (auto-elevation) |
//! | `dynamic` | any or omitted | no | refuse to start |
//! | other | `api-key` | yes / no | keys required / refuse to start |
//! | other | `none` | any | open only with the insecure override, else refuse |
//! | other | omitted | yes | keys required (a decision: configured keys are never ignored) |
//! | other | omitted | no | open only with the insecure override, else refuse |
//!
//! Admin keys: comma-separated, surrounding spaces trimmed, empty entries skipped, duplicates
//! refused. A presented key is hashed once and compared with every admin hash in constant time
//! (no early exit), so timing does not tell which entry matched or how many there are.

use std::fmt;

use subtle::ConstantTimeEq;

use super::config::{AdminMode, ApiMode};
use super::key_hash::KeyHash;

/// Environment values the admin rules read, passed in by the caller.
#[derive(Debug, Clone, Copy, Default)]
pub struct AdminEnv<'a> {
    /// `HIVENET_ROUTER_ADMIN_API_KEYS`.
    pub admin_api_keys: Option<&'a str>,
    /// `HIVENET_ROUTER_ALLOW_INSECURE_ADMIN`.
    pub allow_insecure_admin: Option<&'a str>,
}

/// Why admin access could not be set up; the router refuses to start (or keeps the previous
/// configuration on reload).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    #[error(
        "api mode dynamic requires HIVENET_ROUTER_ADMIN_API_KEYS: the admin API controls the client key registry"
    )]
    DynamicWithoutAdminKeys,
    #[error("admin mode api-key requires HIVENET_ROUTER_ADMIN_API_KEYS")]
    ApiKeyWithoutAdminKeys,
    #[error(
        "admin endpoints would be unauthenticated: set admin.mode: api-key with HIVENET_ROUTER_ADMIN_API_KEYS, or HIVENET_ROUTER_ALLOW_INSECURE_ADMIN=true for isolated development only"
    )]
    InsecureNotAllowed,
    #[error("HIVENET_ROUTER_ADMIN_API_KEYS entry {position} duplicates entry {first}")]
    DuplicateAdminKey { position: usize, first: usize },
    #[error("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN must be true or false, got {0:?}")]
    BadInsecureFlag(String),
}

/// The resolved admin access rule.
#[derive(Clone, PartialEq, Eq)]
pub enum AdminAccess {
    /// Insecure override: every caller is an administrator.
    Open,
    /// A presented key must hash to one of these.
    Keys(Vec<KeyHash>),
}

impl fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminAccess::Open => f.write_str("AdminAccess::Open"),
            AdminAccess::Keys(hashes) => write!(f, "AdminAccess::Keys({} keys)", hashes.len()),
        }
    }
}

impl AdminAccess {
    /// Whether the presented credential (see `keys::presented_key`) may call `/admin/*`.
    pub fn authorize(&self, presented: Option<&[u8]>) -> bool {
        match self {
            AdminAccess::Open => true,
            AdminAccess::Keys(hashes) => {
                let Some(raw_key) = presented.filter(|raw_key| !raw_key.is_empty()) else {
                    return false;
                };
                let presented = KeyHash::of_raw_key(raw_key);
                let mut matched = subtle::Choice::from(0u8);
                for hash in hashes {
                    matched |= hash.0.ct_eq(&presented.0);
                }
                matched.into()
            }
        }
    }
}

/// Resolves admin access from the effective client mode, `admin.mode` as written (`None` when
/// omitted or when there is no auth file) and the environment.
pub fn resolve(
    api_mode: ApiMode,
    admin_mode: Option<AdminMode>,
    env: AdminEnv<'_>,
) -> Result<AdminAccess, AdminError> {
    let hashes = parse_admin_keys(env.admin_api_keys.unwrap_or(""))?;
    let effective = match (api_mode, admin_mode) {
        (ApiMode::Dynamic, _) => {
            if hashes.is_empty() {
                return Err(AdminError::DynamicWithoutAdminKeys);
            }
            AdminMode::ApiKey
        }
        (_, Some(mode)) => mode,
        (_, None) if !hashes.is_empty() => AdminMode::ApiKey,
        (_, None) => AdminMode::None,
    };
    match effective {
        AdminMode::ApiKey if hashes.is_empty() => Err(AdminError::ApiKeyWithoutAdminKeys),
        AdminMode::ApiKey => Ok(AdminAccess::Keys(hashes)),
        AdminMode::None => {
            if parse_bool_flag(env.allow_insecure_admin)? {
                Ok(AdminAccess::Open)
            } else {
                Err(AdminError::InsecureNotAllowed)
            }
        }
    }
}

fn parse_admin_keys(text: &str) -> Result<Vec<KeyHash>, AdminError> {
    let mut hashes: Vec<KeyHash> = Vec::new();
    for (position, raw_key) in text
        .split(',')
        .map(str::trim)
        .filter(|raw_key| !raw_key.is_empty())
        .enumerate()
    {
        let hash = KeyHash::of_raw_key(raw_key.as_bytes());
        if let Some(first) = hashes.iter().position(|existing| *existing == hash) {
            return Err(AdminError::DuplicateAdminKey {
                position: position + 1,
                first: first + 1,
            });
        }
        hashes.push(hash);
    }
    Ok(hashes)
}

/// Go's `strconv.ParseBool` spellings, so existing deployments keep working; unset or empty is
/// false.
fn parse_bool_flag(value: Option<&str>) -> Result<bool, AdminError> {
    match value.map(str::trim).unwrap_or("") {
        "" => Ok(false),
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(AdminError::BadInsecureFlag(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(keys: Option<&'a str>, insecure: Option<&'a str>) -> AdminEnv<'a> {
        AdminEnv {
            admin_api_keys: keys,
            allow_insecure_admin: insecure,
        }
    }

    #[test]
    fn api_key_mode_accepts_each_configured_key_and_nothing_else() {
        let access = resolve(
            ApiMode::ApiKey,
            Some(AdminMode::ApiKey),
            env(Some("first-admin-key, second-admin-key"), None),
        )
        .unwrap();
        assert!(access.authorize(Some(b"first-admin-key")));
        assert!(access.authorize(Some(b"second-admin-key")));
        assert!(!access.authorize(Some(b"third")));
        assert!(!access.authorize(Some(b"")));
        assert!(!access.authorize(None));
        assert_eq!(format!("{access:?}"), "AdminAccess::Keys(2 keys)");
    }

    #[test]
    fn api_key_mode_without_keys_fails_closed() {
        for keys in [None, Some(""), Some(" , ,")] {
            assert_eq!(
                resolve(
                    ApiMode::ApiKey,
                    Some(AdminMode::ApiKey),
                    env(keys, Some("true"))
                ),
                Err(AdminError::ApiKeyWithoutAdminKeys)
            );
        }
    }

    #[test]
    fn admin_none_needs_the_insecure_override() {
        assert_eq!(
            resolve(ApiMode::None, Some(AdminMode::None), env(None, None)),
            Err(AdminError::InsecureNotAllowed)
        );
        assert_eq!(
            resolve(
                ApiMode::None,
                Some(AdminMode::None),
                env(None, Some("false"))
            ),
            Err(AdminError::InsecureNotAllowed)
        );
        let open = resolve(
            ApiMode::ApiKey,
            Some(AdminMode::None),
            env(None, Some("true")),
        )
        .unwrap();
        assert_eq!(open, AdminAccess::Open);
        assert!(open.authorize(None));
        assert_eq!(
            resolve(ApiMode::None, Some(AdminMode::None), env(None, Some("yes"))),
            Err(AdminError::BadInsecureFlag("yes".into()))
        );
    }

    #[test]
    fn explicit_admin_none_with_keys_still_needs_the_override() {
        assert_eq!(
            resolve(ApiMode::None, Some(AdminMode::None), env(Some("k"), None)),
            Err(AdminError::InsecureNotAllowed)
        );
    }

    #[test]
    fn omitted_admin_mode_uses_configured_keys_or_fails_closed() {
        let access = resolve(ApiMode::None, None, env(Some("k1"), None)).unwrap();
        assert!(access.authorize(Some(b"k1")));
        assert!(!access.authorize(None));
        assert_eq!(
            resolve(ApiMode::None, None, env(None, None)),
            Err(AdminError::InsecureNotAllowed)
        );
        assert_eq!(
            resolve(ApiMode::None, None, env(None, Some("1"))),
            Ok(AdminAccess::Open)
        );
    }

    #[test]
    fn dynamic_mode_elevates_admin_and_cannot_be_opened() {
        let access = resolve(
            ApiMode::Dynamic,
            Some(AdminMode::None),
            env(Some("k"), Some("true")),
        )
        .unwrap();
        assert!(!access.authorize(None));
        assert!(access.authorize(Some(b"k")));
        for admin_mode in [None, Some(AdminMode::None), Some(AdminMode::ApiKey)] {
            assert_eq!(
                resolve(ApiMode::Dynamic, admin_mode, env(None, Some("true"))),
                Err(AdminError::DynamicWithoutAdminKeys)
            );
        }
    }

    #[test]
    fn duplicate_admin_keys_are_refused() {
        assert_eq!(
            resolve(
                ApiMode::ApiKey,
                Some(AdminMode::ApiKey),
                env(Some("a,b, a"), None)
            ),
            Err(AdminError::DuplicateAdminKey {
                position: 3,
                first: 1
            })
        );
    }
}
