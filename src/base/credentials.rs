//! Agent credentials: the JWT an agent signs with the site's shared secret to authenticate, and the
//! session token the router issues back. Both are HS256 via `jsonwebtoken`; errors never carry the
//! secret or the token text.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Audience of the agent's authentication JWT.
pub const AUTH_AUDIENCE: &str = "hivenet-router";
/// Audience of router-issued session tokens; a session token cannot be replayed as an auth token.
pub const SESSION_AUDIENCE: &str = "hivenet-router-session";
/// Lifetime of the JWT an agent presents to authenticate.
pub const AUTH_TOKEN_TTL: Duration = Duration::from_secs(300);
/// Default of `--agent-token-max-lifetime`: the longest an agent's authentication JWT may be valid
/// for. `hivenet-agent` signs five-minute tokens; an hour also equals the default session TTL, so
/// a token captured on the wire buys no more than a session would.
pub const AUTH_TOKEN_MAX_LIFETIME_DEFAULT: Duration = Duration::from_secs(3600);
/// Clock skew allowed on `exp`.
const LEEWAY_SECONDS: u64 = 5;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// Agent peer ID.
    pub sub: String,
    pub aud: String,
    /// Issued at; optional in tokens presented to the router (the lifetime then counts from now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    pub exp: u64,
    /// Session serial for session tokens (unique per router process), 0 for auth tokens.
    #[serde(default)]
    pub sid: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("token signature or format is invalid")]
    Invalid,
    #[error("token has expired")]
    Expired,
    #[error("token was issued for another purpose")]
    WrongAudience,
    #[error("the shared secret is empty")]
    EmptySecret,
    #[error(
        "token is valid for {lifetime_seconds} s, longer than the {max_seconds} s maximum (--agent-token-max-lifetime)"
    )]
    LifetimeTooLong {
        lifetime_seconds: u64,
        max_seconds: u64,
    },
}

/// The site's shared HS256 secret. Debug output never shows it.
#[derive(Clone)]
pub struct Secret {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    pub fn new(raw: &[u8]) -> Result<Secret, TokenError> {
        if raw.is_empty() {
            return Err(TokenError::EmptySecret);
        }
        Ok(Secret {
            encoding: EncodingKey::from_secret(raw).map_err(|_| TokenError::EmptySecret)?,
            decoding: DecodingKey::from_secret(raw).map_err(|_| TokenError::EmptySecret)?,
        })
    }

    /// Reads `--jwt-secret-file` if given (it wins), else `HIVENET_ROUTER_JWT_SECRET`. Trailing
    /// newlines in the file are not part of the secret.
    pub fn from_file_or_env(file: Option<&std::path::Path>) -> anyhow::Result<Secret> {
        let raw = match file {
            Some(path) => {
                let text = std::fs::read(path).map_err(|error| {
                    anyhow::anyhow!("cannot read --jwt-secret-file {}: {error}", path.display())
                })?;
                let end = text
                    .iter()
                    .rposition(|byte| !byte.is_ascii_whitespace())
                    .map_or(0, |index| index + 1);
                text[..end].to_vec()
            }
            None => std::env::var("HIVENET_ROUTER_JWT_SECRET")
                .map_err(|_| {
                    anyhow::anyhow!(
                        "the shared agent secret is required: pass --jwt-secret-file or set HIVENET_ROUTER_JWT_SECRET"
                    )
                })?
                .into_bytes(),
        };
        Secret::new(&raw).map_err(|error| anyhow::anyhow!("{error}"))
    }

    pub fn sign(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .expect("HS256 signing with an in-memory key cannot fail")
    }

    pub fn verify(&self, token: &str, audience: &str) -> Result<Claims, TokenError> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[audience]);
        validation.leeway = LEEWAY_SECONDS;
        validation.set_required_spec_claims(&["exp", "sub", "aud"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation)
            .map(|data| data.claims)
            .map_err(|error| match error.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
                jsonwebtoken::errors::ErrorKind::InvalidAudience => TokenError::WrongAudience,
                _ => TokenError::Invalid,
            })
    }

    /// Verifies an agent's authentication JWT ([`AUTH_AUDIENCE`]) and refuses one valid for
    /// longer than `max_lifetime`: `exp - iat` when it says when it was issued, `exp - now` when
    /// not, and never more than `max_lifetime` from now (a future `iat` cannot stretch it).
    pub fn verify_auth(
        &self,
        token: &str,
        now: SystemTime,
        max_lifetime: Duration,
    ) -> Result<Claims, TokenError> {
        let claims = self.verify(token, AUTH_AUDIENCE)?;
        check_lifetime(&claims, unix_seconds(now), max_lifetime.as_secs())?;
        Ok(claims)
    }

    /// The JWT an agent presents to `Authenticate`.
    pub fn auth_token(&self, peer_id: &str, now: SystemTime) -> String {
        let iat = unix_seconds(now);
        self.sign(&Claims {
            sub: peer_id.to_owned(),
            aud: AUTH_AUDIENCE.to_owned(),
            iat: Some(iat),
            exp: iat + AUTH_TOKEN_TTL.as_secs(),
            sid: 0,
        })
    }
}

/// The lifetime rule of [`Secret::verify_auth`], on verified claims; times in Unix seconds.
pub fn check_lifetime(claims: &Claims, now: u64, max_seconds: u64) -> Result<(), TokenError> {
    let from_now = claims.exp.saturating_sub(now);
    let declared = claims
        .iat
        .map_or(from_now, |iat| claims.exp.saturating_sub(iat));
    let lifetime_seconds = declared.max(from_now);
    if lifetime_seconds > max_seconds {
        return Err(TokenError::LifetimeTooLong {
            lifetime_seconds,
            max_seconds,
        });
    }
    Ok(())
}

pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_token_verifies_with_same_secret_only() {
        let secret = Secret::new(b"site-secret").unwrap();
        let token = secret.auth_token("12D3KooWtest", SystemTime::now());
        let claims = secret.verify(&token, AUTH_AUDIENCE).unwrap();
        assert_eq!(claims.sub, "12D3KooWtest");
        let other = Secret::new(b"other-secret").unwrap();
        assert_eq!(
            other.verify(&token, AUTH_AUDIENCE),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            secret.verify(&token, SESSION_AUDIENCE),
            Err(TokenError::WrongAudience)
        );
        assert!(!format!("{secret:?}").contains("site-secret"));
    }

    fn claims(iat: Option<u64>, exp: u64) -> Claims {
        Claims {
            sub: "peer".to_owned(),
            aud: AUTH_AUDIENCE.to_owned(),
            iat,
            exp,
            sid: 0,
        }
    }

    #[test]
    fn lifetimes_up_to_the_maximum_pass() {
        const NOW: u64 = 1_800_000_000;
        assert_eq!(
            check_lifetime(&claims(Some(NOW), NOW + 300), NOW, 3600),
            Ok(())
        );
        assert_eq!(
            check_lifetime(&claims(Some(NOW), NOW + 3600), NOW, 3600),
            Ok(())
        );
        assert_eq!(
            check_lifetime(&claims(Some(NOW), NOW + 3601), NOW, 3600),
            Err(TokenError::LifetimeTooLong {
                lifetime_seconds: 3601,
                max_seconds: 3600
            })
        );
        // Issued long ago with a long life: refused even though little of it is left.
        assert!(check_lifetime(&claims(Some(NOW - 86_400), NOW + 60), NOW, 3600).is_err());
        // Without iat the lifetime counts from now.
        assert_eq!(check_lifetime(&claims(None, NOW + 3600), NOW, 3600), Ok(()));
        assert!(check_lifetime(&claims(None, NOW + 3601), NOW, 3600).is_err());
        // A future iat does not make a far-off exp acceptable.
        assert!(check_lifetime(&claims(Some(NOW + 86_400), NOW + 86_700), NOW, 3600).is_err());
    }

    #[test]
    fn verify_auth_applies_the_maximum() {
        let secret = Secret::new(b"site-secret").unwrap();
        let now = SystemTime::now();
        let token = secret.auth_token("peer", now);
        assert!(
            secret
                .verify_auth(&token, now, Duration::from_secs(3600))
                .is_ok()
        );
        let error = secret
            .verify_auth(&token, now, Duration::from_secs(60))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "token is valid for 300 s, longer than the 60 s maximum (--agent-token-max-lifetime)"
        );
        let iat = unix_seconds(now);
        let long = secret.sign(&claims(Some(iat), iat + 30 * 86_400));
        assert!(matches!(
            secret.verify_auth(&long, now, AUTH_TOKEN_MAX_LIFETIME_DEFAULT),
            Err(TokenError::LifetimeTooLong { .. })
        ));
    }

    #[test]
    fn expired_token_is_refused() {
        let secret = Secret::new(b"site-secret").unwrap();
        let past = SystemTime::now() - Duration::from_secs(3600);
        let token = secret.auth_token("peer", past);
        assert_eq!(
            secret.verify(&token, AUTH_AUDIENCE),
            Err(TokenError::Expired)
        );
    }
}
