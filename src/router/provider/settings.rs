//! Provider credentials and endpoints, read once at start-up, and the policy-side
//! `fallback_provider` block checked against them.
//!
//! Owns: [`ProviderSettings`] (the two API keys and the two base URLs), what the provider client
//! needs of a [`ProviderEngine`] (its key variable, its endpoint, its `processed_by` value; the
//! enum and its policy spelling are `logic::policy`'s), [`ProviderConfig`] and its
//! [`validate`](ProviderConfig::validate). Pure: the environment is read through a lookup
//! function, so tests pass a map; [`ProviderSettings::from_env`] is the one caller of `std::env`.
//!
//! Invariants: an API key is never empty when present, and never appears in `Debug` output or
//! logs ([`ApiKey`] redacts itself). A base URL is `http` or `https`, has a host, and carries no
//! query; the endpoint path is appended to its path with exactly one `/` between them.

use std::fmt;

use thiserror::Error;

use crate::logic::policy::ProviderEngine;

/// `HIVENET_ROUTER_OPENAI_API_KEY`: the OpenAI credential (reference, "Configure credentials").
pub const OPENAI_API_KEY_VARIABLE: &str = "HIVENET_ROUTER_OPENAI_API_KEY";
/// `HIVENET_ROUTER_ANTHROPIC_API_KEY`: the Anthropic credential.
pub const ANTHROPIC_API_KEY_VARIABLE: &str = "HIVENET_ROUTER_ANTHROPIC_API_KEY";
/// `HIVENET_ROUTER_OPENAI_BASE_URL`: our addition, so tests and proxies can stand in for OpenAI.
pub const OPENAI_BASE_URL_VARIABLE: &str = "HIVENET_ROUTER_OPENAI_BASE_URL";
/// `HIVENET_ROUTER_ANTHROPIC_BASE_URL`: our addition, as above for Anthropic.
pub const ANTHROPIC_BASE_URL_VARIABLE: &str = "HIVENET_ROUTER_ANTHROPIC_BASE_URL";

const OPENAI_BASE_URL_DEFAULT: &str = "https://api.openai.com";
const ANTHROPIC_BASE_URL_DEFAULT: &str = "https://api.anthropic.com";

/// What the provider client needs of an engine, beside its policy spelling.
impl ProviderEngine {
    /// The `processed_by` value every successful answer carries.
    pub fn processed_by(self) -> &'static str {
        match self {
            ProviderEngine::OpenAi => "provider:openai",
            ProviderEngine::Anthropic => "provider:anthropic",
        }
    }

    /// The environment variable holding this provider's API key.
    pub fn key_variable(self) -> &'static str {
        match self {
            ProviderEngine::OpenAi => OPENAI_API_KEY_VARIABLE,
            ProviderEngine::Anthropic => ANTHROPIC_API_KEY_VARIABLE,
        }
    }

    /// The endpoint the adapter posts to, below the base URL.
    pub fn endpoint_path(self) -> &'static str {
        match self {
            ProviderEngine::OpenAi => "/v1/chat/completions",
            ProviderEngine::Anthropic => "/v1/messages",
        }
    }
}

/// A policy's `fallback_provider` block: which provider, and the model sent to it in place of
/// the client's. Parsing the policy is the policy module's job; this is the plain result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub engine: ProviderEngine,
    /// The provider's model name, sent verbatim; it need not be served by any agent.
    pub model: String,
}

/// Why a `fallback_provider` block was refused (reference, "Configure provider fallback").
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("fallback_provider.engine {0:?} is not a supported provider (openai, anthropic)")]
    EngineUnsupported(String),
    #[error("fallback_provider.model is empty")]
    ModelEmpty,
    #[error(
        "fallback_provider.engine {engine} needs {variable}, which is not configured; set it and restart the router"
    )]
    KeyMissing {
        engine: ProviderEngine,
        variable: &'static str,
    },
}

impl ProviderConfig {
    /// Builds the block from the policy's two strings (a missing field is the policy parser's
    /// to report). Refuses an unsupported engine and an empty model; keys are checked by
    /// [`validate`](ProviderConfig::validate).
    pub fn new(engine: &str, model: &str) -> Result<ProviderConfig, ConfigError> {
        let engine = ProviderEngine::parse(engine)
            .ok_or_else(|| ConfigError::EngineUnsupported(engine.to_owned()))?;
        if model.trim().is_empty() {
            return Err(ConfigError::ModelEmpty);
        }
        Ok(ProviderConfig {
            engine,
            model: model.to_owned(),
        })
    }

    /// Refuses a block whose model is empty or whose provider has no API key loaded at start-up.
    /// Policy reloads call this too: keys are never re-read after start-up.
    pub fn validate(&self, settings: &ProviderSettings) -> Result<(), ConfigError> {
        if self.model.trim().is_empty() {
            return Err(ConfigError::ModelEmpty);
        }
        if settings.api_key(self.engine).is_none() {
            return Err(ConfigError::KeyMissing {
                engine: self.engine,
                variable: self.engine.key_variable(),
            });
        }
        Ok(())
    }
}

/// A provider API key. `Debug` prints `<redacted>`; the value leaves only in the auth header.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// `None` for an empty or all-blank value: a variable set to nothing counts as not set.
    pub fn new(value: &str) -> Option<ApiKey> {
        let value = value.trim();
        (!value.is_empty()).then(|| ApiKey(value.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("ApiKey(<redacted>)")
    }
}

/// Scheme, authority and optional path prefix of a provider's API, e.g. `https://api.openai.com`
/// or `http://127.0.0.1:8888` (tests) or `https://proxy.internal/openai` (a gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// Path prefix without a trailing `/`; empty for none.
    path_prefix: String,
}

impl BaseUrl {
    pub fn parse(text: &str) -> Result<BaseUrl, &'static str> {
        let uri: http::Uri = text.trim().parse().map_err(|_| "is not a valid URL")?;
        let scheme = uri
            .scheme()
            .cloned()
            .ok_or("has no scheme (http:// or https://)")?;
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            return Err("must use http or https");
        }
        let authority = uri.authority().cloned().ok_or("has no host")?;
        if authority.host().is_empty() {
            return Err("has no host");
        }
        if uri.query().is_some() {
            return Err("must not carry a query");
        }
        let path_prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(BaseUrl {
            scheme,
            authority,
            path_prefix,
        })
    }

    /// The full URI of `path` (which starts with `/`) under this base.
    pub fn join(&self, path: &str) -> http::Uri {
        let path_and_query = format!("{}{path}", self.path_prefix);
        http::Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .expect("a validated scheme and authority with a '/'-led path form a URI")
    }

    pub fn is_https(&self) -> bool {
        self.scheme == http::uri::Scheme::HTTPS
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{}://{}{}",
            self.scheme, self.authority, self.path_prefix
        )
    }
}

/// Start-up configuration of provider fallback. Scope: the whole router process; read once,
/// never reloaded (the reference: restart after adding, removing or rotating a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSettings {
    /// `HIVENET_ROUTER_OPENAI_API_KEY`; `None` when unset or empty. Default: unset.
    pub openai_api_key: Option<ApiKey>,
    /// `HIVENET_ROUTER_ANTHROPIC_API_KEY`; `None` when unset or empty. Default: unset.
    pub anthropic_api_key: Option<ApiKey>,
    /// `HIVENET_ROUTER_OPENAI_BASE_URL`. Default `https://api.openai.com`.
    pub openai_base_url: BaseUrl,
    /// `HIVENET_ROUTER_ANTHROPIC_BASE_URL`. Default `https://api.anthropic.com`.
    pub anthropic_base_url: BaseUrl,
}

/// A provider environment variable that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{variable} {reason}")]
pub struct SettingsError {
    pub variable: &'static str,
    pub reason: &'static str,
}

impl ProviderSettings {
    /// Reads the four variables from the process environment.
    pub fn from_env() -> Result<ProviderSettings, SettingsError> {
        ProviderSettings::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the four variables through `lookup` (name to value; `None` when unset).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<ProviderSettings, SettingsError> {
        let key = |variable: &str| lookup(variable).as_deref().and_then(ApiKey::new);
        let base_url = |variable: &'static str, default: &str| {
            let value = lookup(variable).filter(|value| !value.trim().is_empty());
            BaseUrl::parse(value.as_deref().unwrap_or(default))
                .map_err(|reason| SettingsError { variable, reason })
        };
        Ok(ProviderSettings {
            openai_api_key: key(OPENAI_API_KEY_VARIABLE),
            anthropic_api_key: key(ANTHROPIC_API_KEY_VARIABLE),
            openai_base_url: base_url(OPENAI_BASE_URL_VARIABLE, OPENAI_BASE_URL_DEFAULT)?,
            anthropic_base_url: base_url(ANTHROPIC_BASE_URL_VARIABLE, ANTHROPIC_BASE_URL_DEFAULT)?,
        })
    }

    pub fn api_key(&self, engine: ProviderEngine) -> Option<&ApiKey> {
        match engine {
            ProviderEngine::OpenAi => self.openai_api_key.as_ref(),
            ProviderEngine::Anthropic => self.anthropic_api_key.as_ref(),
        }
    }

    pub fn base_url(&self, engine: ProviderEngine) -> &BaseUrl {
        match engine {
            ProviderEngine::OpenAi => &self.openai_base_url,
            ProviderEngine::Anthropic => &self.anthropic_base_url,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> Result<ProviderSettings, SettingsError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        ProviderSettings::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_point_at_the_real_providers_without_keys() {
        let settings = settings(&[]).unwrap();
        assert_eq!(settings.openai_api_key, None);
        assert_eq!(settings.anthropic_api_key, None);
        assert_eq!(
            settings
                .base_url(ProviderEngine::OpenAi)
                .join("/v1/chat/completions"),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            settings
                .base_url(ProviderEngine::Anthropic)
                .join("/v1/messages"),
            "https://api.anthropic.com/v1/messages"
        );
    }

    #[test]
    fn base_urls_keep_a_path_prefix_and_drop_trailing_slashes() {
        let settings = settings(&[
            (OPENAI_BASE_URL_VARIABLE, "http://127.0.0.1:8888/"),
            (
                ANTHROPIC_BASE_URL_VARIABLE,
                "https://gateway.internal/anthropic/",
            ),
        ])
        .unwrap();
        assert_eq!(
            settings.openai_base_url.join("/v1/chat/completions"),
            "http://127.0.0.1:8888/v1/chat/completions"
        );
        assert!(!settings.openai_base_url.is_https());
        assert_eq!(
            settings.anthropic_base_url.join("/v1/messages"),
            "https://gateway.internal/anthropic/v1/messages"
        );
    }

    #[test]
    fn bad_base_urls_are_refused_naming_the_variable() {
        for bad in [
            "ftp://host",
            "127.0.0.1:8888",
            "http://host/?a=b",
            "not a url",
        ] {
            let error = settings(&[(OPENAI_BASE_URL_VARIABLE, bad)]).unwrap_err();
            assert_eq!(error.variable, OPENAI_BASE_URL_VARIABLE, "{bad}");
        }
    }

    #[test]
    fn empty_keys_count_as_unset_and_are_trimmed() {
        let settings = settings(&[
            (OPENAI_API_KEY_VARIABLE, "  "),
            (ANTHROPIC_API_KEY_VARIABLE, " sk-ant \n"),
        ])
        .unwrap();
        assert_eq!(settings.openai_api_key, None);
        assert_eq!(settings.anthropic_api_key.unwrap().expose(), "sk-ant");
    }

    #[test]
    fn keys_never_show_in_debug_output() {
        let settings = settings(&[(OPENAI_API_KEY_VARIABLE, "sk-secret-value")]).unwrap();
        let text = format!("{settings:?}");
        assert!(!text.contains("sk-secret-value"), "{text}");
        assert!(text.contains("<redacted>"));
    }

    #[test]
    fn engines_parse_lowercase_only() {
        assert_eq!(
            ProviderEngine::parse("openai"),
            Some(ProviderEngine::OpenAi)
        );
        assert_eq!(
            ProviderEngine::parse("anthropic"),
            Some(ProviderEngine::Anthropic)
        );
        assert_eq!(ProviderEngine::parse("OpenAI"), None);
        assert_eq!(ProviderEngine::parse("gemini"), None);
        assert_eq!(
            ProviderEngine::Anthropic.processed_by(),
            "provider:anthropic"
        );
    }

    #[test]
    fn new_refuses_unknown_engines_and_empty_models() {
        assert_eq!(
            ProviderConfig::new("openai", "gpt-4o-mini"),
            Ok(ProviderConfig {
                engine: ProviderEngine::OpenAi,
                model: "gpt-4o-mini".into()
            })
        );
        let unsupported = ProviderConfig::new("OpenAI", "m").unwrap_err();
        assert_eq!(
            unsupported.to_string(),
            "fallback_provider.engine \"OpenAI\" is not a supported provider (openai, anthropic)"
        );
        assert_eq!(
            ProviderConfig::new("anthropic", ""),
            Err(ConfigError::ModelEmpty)
        );
    }

    #[test]
    fn validate_refuses_a_provider_without_its_key() {
        let settings = settings(&[(OPENAI_API_KEY_VARIABLE, "sk-1")]).unwrap();
        let openai = ProviderConfig {
            engine: ProviderEngine::OpenAi,
            model: "gpt-4o-mini".into(),
        };
        assert_eq!(openai.validate(&settings), Ok(()));
        let anthropic = ProviderConfig {
            engine: ProviderEngine::Anthropic,
            model: "claude-3-5-haiku-latest".into(),
        };
        let error = anthropic.validate(&settings).unwrap_err();
        assert_eq!(
            error.to_string(),
            "fallback_provider.engine anthropic needs HIVENET_ROUTER_ANTHROPIC_API_KEY, which is \
             not configured; set it and restart the router"
        );
        let empty_model = ProviderConfig {
            engine: ProviderEngine::OpenAi,
            model: " ".into(),
        };
        assert_eq!(
            empty_model.validate(&settings),
            Err(ConfigError::ModelEmpty)
        );
    }
}
