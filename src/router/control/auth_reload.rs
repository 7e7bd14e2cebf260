//! Loading `auth.yaml` into a key registry, at start-up and on every change: SIGHUP, or the file's
//! modification time or size changing (checked every [`POLL_INTERVAL`]). An invalid file is
//! refused with a log line naming every problem, and the previous registry stays active.
//!
//! Usage already counted for a key is unaffected by a reload: limits are keyed by the stable
//! `KeyId`, which a reload does not change.
//!
//! Every static key is also checked against the active routing policies (the cross-config
//! serverless invariant, seed "Validation and derived defaults"); a file that breaks it is refused
//! like any invalid file. The check and the install happen under the policy side's static-auth
//! lock, so a concurrent policy change checks against this file or the previous one, never a mix.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::logic::auth::admin::{self, AdminAccess, AdminEnv, AdminError};
use crate::logic::auth::config::{
    AdminMode, ApiMode, AuthConfig, ConfigError, Problems, ServerlessLimits,
};
use crate::logic::auth::keys::KeyRegistry;
use crate::router::control::ControlShared;
use crate::router::shard::messages::ControlToShard;

pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read auth config {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("auth config {path} is invalid: {error}")]
    Invalid { path: String, error: ConfigError },
    #[error("HIVENET_ROUTER_AUTH_MODE must be none, api-key or dynamic, got {0:?}")]
    BadMode(String),
    #[error("HIVENET_ROUTER_AUTH_MODE=api-key needs an auth config file (--auth-config-file)")]
    ApiKeyWithoutFile,
    #[error("{0}")]
    Admin(#[from] AdminError),
    #[error("api.mode changed from {from:?} to {to:?}: restart the router to change modes")]
    ModeChanged { from: ApiMode, to: ApiMode },
    #[error("auth config {path} conflicts with the routing policies: {problems}")]
    Serverless { path: String, problems: Problems },
}

/// What an auth configuration gives the router.
#[derive(Debug)]
pub struct Loaded {
    pub api_mode: ApiMode,
    /// The client keys (empty for `dynamic`: the admin API fills them).
    pub registry: KeyRegistry,
    pub admin: AdminAccess,
    /// The validated file (or the configuration `HIVENET_ROUTER_AUTH_MODE` implies), kept for the
    /// reverse serverless check when policies change: only the keys that check can refuse
    /// ([`AuthConfig::retain_serverless_checked`]); `registry` has them all.
    pub config: AuthConfig,
}

/// Who may call `/admin/*`, from the file's admin section and the environment. Without any admin
/// key and without the insecure override, the admin API fails closed: every call is refused.
pub fn admin_access(
    api_mode: ApiMode,
    admin_mode: Option<AdminMode>,
) -> Result<AdminAccess, AdminError> {
    let keys = std::env::var("HIVENET_ROUTER_ADMIN_API_KEYS").ok();
    let insecure = std::env::var("HIVENET_ROUTER_ALLOW_INSECURE_ADMIN").ok();
    let env = AdminEnv {
        admin_api_keys: keys.as_deref(),
        allow_insecure_admin: insecure.as_deref(),
    };
    match admin::resolve(api_mode, admin_mode, env) {
        Err(AdminError::InsecureNotAllowed) => Ok(AdminAccess::Keys(Vec::new())),
        other => other,
    }
}

/// The keys and admin access for the configured file, or for `HIVENET_ROUTER_AUTH_MODE` when there
/// is none. `limits` are the active routing policies' serverless limits: a static key that breaks
/// the cross-config invariant under them refuses the file.
pub fn load(
    path: Option<&Path>,
    mode_env: Option<&str>,
    limits: &ServerlessLimits,
) -> Result<Loaded, LoadError> {
    let config = match path {
        Some(path) => {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
                path: shown.clone(),
                source,
            })?;
            AuthConfig::from_yaml(&text)
                .map_err(|error| LoadError::Invalid { path: shown, error })?
        }
        None => match ApiMode::parse(mode_env.unwrap_or("")) {
            None => return Err(LoadError::BadMode(mode_env.unwrap_or("").to_owned())),
            Some(ApiMode::None) => AuthConfig::none(),
            Some(ApiMode::ApiKey) => return Err(LoadError::ApiKeyWithoutFile),
            Some(ApiMode::Dynamic) => AuthConfig {
                api_mode: ApiMode::Dynamic,
                ..AuthConfig::none()
            },
        },
    };
    config
        .check_serverless(limits)
        .map_err(|problems| LoadError::Serverless {
            path: path.map_or_else(
                || "(HIVENET_ROUTER_AUTH_MODE)".to_owned(),
                |path| path.display().to_string(),
            ),
            problems,
        })?;
    let admin = admin_access(config.api_mode, config.admin_mode)?;
    // Empty in dynamic mode: the dynamic registry publishes its own snapshots.
    let registry = KeyRegistry::from_config(&config);
    let mut config = config;
    config.retain_serverless_checked();
    Ok(Loaded {
        api_mode: config.api_mode,
        registry,
        admin,
        config,
    })
}

/// What identifies a version of the file cheaply: modification time and length.
fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// Reloads on SIGHUP and on file change until the process ends.
pub async fn watch(path: PathBuf, running_mode: ApiMode, shared: Arc<ControlShared>) {
    let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP; auth.yaml reloads on file change only");
            None
        }
    };
    let mut last = stamp(&path);
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    loop {
        let reason = tokio::select! {
            _ = ticker.tick() => {
                let now = stamp(&path);
                if now == last {
                    continue;
                }
                last = now;
                "file changed"
            }
            Some(()) = async {
                match hangups.as_mut() {
                    Some(hangups) => hangups.recv().await,
                    None => std::future::pending().await,
                }
            } => "SIGHUP",
        };
        // Reading and parsing the file happens on a blocking thread: see `control`.
        let (path, shared) = (path.clone(), shared.clone());
        if let Err(error) =
            tokio::task::spawn_blocking(move || reload(&path, running_mode, &shared, reason)).await
        {
            tracing::error!(%error, "auth config reload failed; the previous configuration stays active");
        }
    }
}

/// Reads, checks and installs the file once. Runs on a blocking thread.
fn reload(path: &Path, running_mode: ApiMode, shared: &ControlShared, reason: &str) {
    // Held until the new file is installed: see the module doc.
    let mut static_auth = shared.policies.static_auth();
    let limits = shared.policies.serverless_limits();
    match load(Some(path), None, &limits).and_then(|loaded| {
        // Switching between static and dynamic keys needs a restart; none <-> api-key does not.
        if (loaded.api_mode == ApiMode::Dynamic) == (running_mode == ApiMode::Dynamic) {
            Ok(loaded)
        } else {
            Err(LoadError::ModeChanged {
                from: running_mode,
                to: loaded.api_mode,
            })
        }
    }) {
        Ok(loaded) => {
            *static_auth = Arc::new(loaded.config);
            let admin = Arc::new(loaded.admin);
            shared.broadcast_blocking(|| ControlToShard::AdminAccess(admin.clone()));
            if running_mode == ApiMode::Dynamic {
                // Keys live in the admin-managed registry; the file only configures admin.
                tracing::info!(path = %path.display(), reason, "auth config reloaded (admin section)");
                return;
            }
            tracing::info!(path = %path.display(), reason, keys = loaded.registry.len(), "auth config reloaded");
            let registry = Arc::new(loaded.registry);
            shared.policies.set_static_keys(registry.clone());
            shared.broadcast_blocking(|| ControlToShard::Keys(registry.clone()));
        }
        Err(error) => {
            tracing::error!(reason, %error, "auth config reload refused; the previous configuration stays active");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_without_a_file() {
        let none = ServerlessLimits::none();
        assert!(load(None, None, &none).is_ok());
        assert!(load(None, Some("none"), &none).is_ok());
        assert!(matches!(
            load(None, Some("api-key"), &none),
            Err(LoadError::ApiKeyWithoutFile)
        ));
        assert!(matches!(
            load(None, Some("dynamic"), &none),
            Err(LoadError::Admin(AdminError::DynamicWithoutAdminKeys))
        ));
        assert!(matches!(
            load(None, Some("open"), &none),
            Err(LoadError::BadMode(_))
        ));
    }

    #[test]
    fn invalid_file_names_the_path() {
        let dir = std::env::temp_dir().join(format!("hivenet-auth-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("auth.yaml");
        std::fs::write(&path, "api: [unclosed").unwrap();
        let error = load(Some(&path), None, &ServerlessLimits::none())
            .unwrap_err()
            .to_string();
        assert!(error.contains("auth.yaml"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_are_checked_against_the_serverless_policies() {
        let dir = std::env::temp_dir().join(format!("hivenet-auth-itpm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("auth.yaml");
        std::fs::write(
            &path,
            format!(
                "api:\n  mode: api-key\n  keys:\n    - key_hash: \"{}\"\n      key_preview: sk-...itpm\n      metadata: {{name: n, owner: o}}\n      quota: {{input_tokens_per_minute: 1000}}\n",
                "a".repeat(64)
            ),
        )
        .unwrap();
        assert!(load(Some(&path), None, &ServerlessLimits::none()).is_ok());
        let limits = ServerlessLimits {
            global_max_input_tokens: Some(4096),
            ..ServerlessLimits::none()
        };
        let error = load(Some(&path), None, &limits).unwrap_err().to_string();
        assert!(
            error.contains("conflicts with the routing policies"),
            "{error}"
        );
        assert!(error.contains("input_tokens_per_minute"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
