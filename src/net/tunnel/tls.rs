//! TLS on the data tunnel, when the operator gives the router a certificate
//! (`--p2p-tls-cert`, `--p2p-tls-key`).
//!
//! Wire, when TLS is on (the plaintext preamble of `preamble` is then refused):
//!
//! ```text
//! agent -> router   "HNTS" | shard: u16 BE          plaintext: which shard terminates the TLS
//! router -> agent   status: u8                       0: go on with TLS; else a refusal, and close
//! agent <-> router  TLS handshake                    (rustls, TLS 1.2/1.3, the shard is the server)
//! agent -> router   preamble "HNT1" | shard | token  inside TLS, as without TLS
//! router -> agent   status: u8                       inside TLS
//! then HTTP/2, router as client, inside TLS
//! ```
//!
//! The shard index is not secret; the session token travels only inside TLS. The shard that the
//! hint names terminates the TLS, so the tunnel's bytes are encrypted and decrypted on the core
//! that uses them, and checks the token itself (the control core checks that the session is live
//! when the shard reports the tunnel up). Routers announce `/tls` at the end of their tunnel
//! multiaddr; agents dial TLS exactly when the address says so.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// What a shard needs to terminate TLS tunnels: the server configuration, and the site secret
/// to check the session token that arrives inside.
pub struct TunnelSecurity {
    pub config: Arc<rustls::ServerConfig>,
    pub secret: crate::base::credentials::Secret,
    /// The issuer session tokens must name (`credentials::session_issuer`).
    pub session_issuer: String,
}

impl std::fmt::Debug for TunnelSecurity {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TunnelSecurity")
            .finish_non_exhaustive()
    }
}

/// The plaintext hint that opens a TLS tunnel.
pub const MAGIC: &[u8; 4] = b"HNTS";

/// The hint an agent writes before its TLS handshake.
pub fn encode_hint(shard: u16) -> [u8; 6] {
    let mut hint = [0u8; 6];
    hint[..4].copy_from_slice(MAGIC);
    hint[4..].copy_from_slice(&shard.to_be_bytes());
    hint
}

/// The shard of a hint's last two bytes (the caller has matched the magic).
pub fn decode_hint_shard(bytes: [u8; 2]) -> u16 {
    u16::from_be_bytes(bytes)
}

#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: String },
    #[error("{path}: {reason}")]
    BadPem { path: String, reason: String },
    #[error("the tunnel certificate and key do not form a usable server identity: {0}")]
    Identity(rustls::Error),
    #[error("no usable CA certificate in {path}")]
    NoRoots { path: String },
}

fn read(path: &Path) -> Result<Vec<u8>, TlsConfigError> {
    std::fs::read(path).map_err(|error| TlsConfigError::Read {
        path: path.display().to_string(),
        error,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let pem = read(path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsConfigError::BadPem {
            path: path.display().to_string(),
            reason: error.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsConfigError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certificates)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The router's TLS server configuration from PEM files: the certificate chain (leaf first) and
/// its private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsConfigError> {
    let chain = certificates(cert)?;
    let key_pem = read(key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsConfigError::NoKey {
        path: key.display().to_string(),
    })?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Identity)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsConfigError::Identity)?;
    Ok(Arc::new(config))
}

/// The agent's TLS client configuration: the CAs in `ca` (PEM), or the public web roots.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsConfigError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let (added, _ignored) = roots.add_parsable_certificates(certificates(path)?);
            if added == 0 {
                return Err(TlsConfigError::NoRoots {
                    path: path.display().to_string(),
                });
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Identity)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name the router's certificate must carry: the tunnel address's IP or DNS name.
pub fn server_name(host: &str) -> Option<ServerName<'static>> {
    ServerName::try_from(host.to_owned()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tls")
            .join(name)
    }

    #[test]
    fn hints_round_trip() {
        let hint = encode_hint(513);
        assert_eq!(&hint[..4], MAGIC);
        assert_eq!(decode_hint_shard([hint[4], hint[5]]), 513);
    }

    #[test]
    fn configs_load_from_pem_and_refuse_what_is_not() {
        server_config(&fixture("router.pem"), &fixture("router.key")).unwrap();
        client_config(Some(&fixture("ca.pem"))).unwrap();
        client_config(None).unwrap();
        // A key where the certificate should be, and the other way round.
        assert!(matches!(
            server_config(&fixture("router.key"), &fixture("router.key")),
            Err(TlsConfigError::NoCertificate { .. })
        ));
        assert!(matches!(
            server_config(&fixture("router.pem"), &fixture("router.pem")),
            Err(TlsConfigError::NoKey { .. })
        ));
        // A certificate with a key that is not its own.
        assert!(matches!(
            server_config(&fixture("router.pem"), &fixture("other.key")),
            Err(TlsConfigError::Identity(_))
        ));
        assert!(matches!(
            client_config(Some(Path::new("/nonexistent/ca.pem"))),
            Err(TlsConfigError::Read { .. })
        ));
        assert!(server_name("127.0.0.1").is_some());
        assert!(server_name("router.example").is_some());
        assert!(server_name("bad name").is_none());
    }
}
