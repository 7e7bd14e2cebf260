//! Agent credentials: the JWT an agent signs with the site's shared secret to authenticate, and the
//! session token the router issues back. Both are HS256 via `jsonwebtoken`; errors never carry the
//! secret or the token text.
//!
//! An authentication JWT is bound to one router and one use (`base::challenge`): its audience is
//! the router's peer ID and its `nonce` the router nonce it answers, so a token seen by anyone
//! else is good nowhere else and never twice. A session token names the router process that
//! issued it (`rtr`), so it opens no session or tunnel at another router, nor at a later process
//! of the same router.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::base::challenge::ProofKey;

/// Audience of the authentication JWT of agents older than router-bound tokens. Routers refuse
/// it; the name is kept to tell such an agent what to do.
pub const UNBOUND_AUTH_AUDIENCE: &str = "hivenet-router";
/// Audience of router-issued session tokens; a session token cannot be replayed as an auth token.
pub const SESSION_AUDIENCE: &str = "hivenet-router-session";
/// Lifetime of the JWT an agent presents to authenticate: it is spent right away, and its router
/// nonce expires after `challenge::NONCE_TTL` anyway.
pub const AUTH_TOKEN_TTL: Duration = Duration::from_secs(30);
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
    /// Authentication tokens: the router nonce (hex) the token answers; it is spent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Session tokens: the router process that issued it (`ControlShared::session_issuer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtr: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("token signature or format is invalid")]
    Invalid,
    #[error("token has expired")]
    Expired,
    #[error("token was issued for another purpose or another router")]
    WrongAudience,
    #[error(
        "token is not bound to this router: the agent is older than this router and must be upgraded"
    )]
    Unbound,
    #[error("token answers another router nonce")]
    WrongNonce,
    #[error("session token was issued by another router or an earlier run of this one")]
    OtherIssuer,
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
    proof: ProofKey,
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
            proof: ProofKey::new(raw),
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

    /// The key of the challenge's proofs and nonce tags (`base::challenge`).
    pub fn proof_key(&self) -> &ProofKey {
        &self.proof
    }

    /// Verifies an agent's authentication JWT for the router `router_peer_id` and the router
    /// nonce `nonce`, and refuses one valid for longer than `max_lifetime`: `exp - iat` when it
    /// says when it was issued, `exp - now` when not, and never more than `max_lifetime` from now
    /// (a future `iat` cannot stretch it). The nonce itself is checked and spent by the caller.
    pub fn verify_auth(
        &self,
        token: &str,
        router_peer_id: &str,
        nonce: &[u8],
        now: SystemTime,
        max_lifetime: Duration,
    ) -> Result<Claims, TokenError> {
        let claims = match self.verify(token, router_peer_id) {
            Err(TokenError::WrongAudience) if self.verify(token, UNBOUND_AUTH_AUDIENCE).is_ok() => {
                return Err(TokenError::Unbound);
            }
            verified => verified?,
        };
        if claims.nonce.as_deref() != Some(hex::encode(nonce).as_str()) {
            return Err(TokenError::WrongNonce);
        }
        check_lifetime(&claims, unix_seconds(now), max_lifetime.as_secs())?;
        Ok(claims)
    }

    /// The JWT an agent presents to `Authenticate` at `router_peer_id`, answering its `nonce`.
    pub fn auth_token(
        &self,
        peer_id: &str,
        router_peer_id: &str,
        nonce: &[u8],
        now: SystemTime,
    ) -> String {
        let iat = unix_seconds(now);
        self.sign(&Claims {
            sub: peer_id.to_owned(),
            aud: router_peer_id.to_owned(),
            iat: Some(iat),
            exp: iat + AUTH_TOKEN_TTL.as_secs(),
            sid: 0,
            nonce: Some(hex::encode(nonce)),
            rtr: None,
        })
    }

    /// Verifies a session token issued by `issuer` (`ControlShared::session_issuer`).
    pub fn verify_session(&self, token: &str, issuer: &str) -> Result<Claims, TokenError> {
        let claims = self.verify(token, SESSION_AUDIENCE)?;
        if claims.rtr.as_deref() != Some(issuer) {
            return Err(TokenError::OtherIssuer);
        }
        Ok(claims)
    }
}

/// The issuer this run of a router names in its session tokens (`Claims::rtr`): its peer ID and
/// a random run ID, so a session token opens nothing at another router, nor at a later run of
/// this one, whose session serials start again from 1.
pub fn session_issuer(router_peer_id: &str) -> String {
    format!(
        "{router_peer_id}/{}",
        hex::encode(crate::base::challenge::random_bytes::<8>())
    )
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

    const ROUTER: &str = "12D3KooWrouter";
    const NONCE: &[u8] = b"a router nonce";

    #[test]
    fn auth_token_verifies_with_same_secret_only() {
        let secret = Secret::new(b"site-secret").unwrap();
        let token = secret.auth_token("12D3KooWtest", ROUTER, NONCE, SystemTime::now());
        let claims = secret.verify(&token, ROUTER).unwrap();
        assert_eq!(claims.sub, "12D3KooWtest");
        let other = Secret::new(b"other-secret").unwrap();
        assert_eq!(other.verify(&token, ROUTER), Err(TokenError::Invalid));
        assert_eq!(
            secret.verify(&token, SESSION_AUDIENCE),
            Err(TokenError::WrongAudience)
        );
        assert!(!format!("{secret:?}").contains("site-secret"));
    }

    #[test]
    fn an_auth_token_is_good_for_one_router_and_one_nonce() {
        let secret = Secret::new(b"site-secret").unwrap();
        let now = SystemTime::now();
        let max = AUTH_TOKEN_MAX_LIFETIME_DEFAULT;
        let token = secret.auth_token("peer", ROUTER, NONCE, now);
        assert!(secret.verify_auth(&token, ROUTER, NONCE, now, max).is_ok());
        assert_eq!(
            secret.verify_auth(&token, "12D3KooWother", NONCE, now, max),
            Err(TokenError::WrongAudience)
        );
        assert_eq!(
            secret.verify_auth(&token, ROUTER, b"another nonce", now, max),
            Err(TokenError::WrongNonce)
        );
        // What agents before router-bound tokens send: named, so the operator knows to upgrade.
        let iat = unix_seconds(now);
        let unbound = secret.sign(&Claims {
            aud: UNBOUND_AUTH_AUDIENCE.to_owned(),
            ..claims(Some(iat), iat + 300)
        });
        assert_eq!(
            secret.verify_auth(&unbound, ROUTER, NONCE, now, max),
            Err(TokenError::Unbound)
        );
    }

    #[test]
    fn a_session_token_opens_sessions_only_where_it_was_issued() {
        let secret = Secret::new(b"site-secret").unwrap();
        let iat = unix_seconds(SystemTime::now());
        let session = secret.sign(&Claims {
            aud: SESSION_AUDIENCE.to_owned(),
            sid: 3,
            rtr: Some("router-a/1".to_owned()),
            ..claims(Some(iat), iat + 300)
        });
        assert_eq!(
            secret.verify_session(&session, "router-a/1").unwrap().sid,
            3
        );
        assert_eq!(
            secret.verify_session(&session, "router-a/2"),
            Err(TokenError::OtherIssuer)
        );
        assert_eq!(
            secret.verify_session(&session, "router-b/1"),
            Err(TokenError::OtherIssuer)
        );
    }

    fn claims(iat: Option<u64>, exp: u64) -> Claims {
        Claims {
            sub: "peer".to_owned(),
            aud: ROUTER.to_owned(),
            iat,
            exp,
            sid: 0,
            nonce: Some(hex::encode(NONCE)),
            rtr: None,
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
        let token = secret.auth_token("peer", ROUTER, NONCE, now);
        assert!(
            secret
                .verify_auth(&token, ROUTER, NONCE, now, Duration::from_secs(3600))
                .is_ok()
        );
        let error = secret
            .verify_auth(&token, ROUTER, NONCE, now, Duration::from_secs(10))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "token is valid for 30 s, longer than the 10 s maximum (--agent-token-max-lifetime)"
        );
        let iat = unix_seconds(now);
        let long = secret.sign(&claims(Some(iat), iat + 30 * 86_400));
        assert!(matches!(
            secret.verify_auth(&long, ROUTER, NONCE, now, AUTH_TOKEN_MAX_LIFETIME_DEFAULT),
            Err(TokenError::LifetimeTooLong { .. })
        ));
    }

    #[test]
    fn expired_token_is_refused() {
        let secret = Secret::new(b"site-secret").unwrap();
        let past = SystemTime::now() - Duration::from_secs(3600);
        let token = secret.auth_token("peer", ROUTER, NONCE, past);
        assert_eq!(secret.verify(&token, ROUTER), Err(TokenError::Expired));
    }
}
