//! Persistent Ed25519 identities and their libp2p-style peer IDs.
//!
//! The key file holds the protobuf encoding of the keypair (the libp2p format), written with mode
//! 0600. A missing file is created; an unreadable or corrupt one is an error, never silently
//! replaced, because replacing it would change the peer ID the site knows this process by.

use std::path::Path;

use libp2p_identity::{Keypair, PeerId};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read identity file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write identity file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("identity file {path} is not a valid Ed25519 key: {reason}")]
    Corrupt { path: String, reason: String },
}

pub struct Identity {
    pub keypair: Keypair,
    pub peer_id: PeerId,
}

impl Identity {
    /// Loads the key at `path`, creating it (and its parent folder) when it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Identity, IdentityError> {
        let shown = path.display().to_string();
        match std::fs::read(path) {
            Ok(bytes) => {
                let keypair = Keypair::from_protobuf_encoding(&bytes).map_err(|error| {
                    IdentityError::Corrupt {
                        path: shown.clone(),
                        reason: error.to_string(),
                    }
                })?;
                Ok(Identity::from_keypair(keypair))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let keypair = Keypair::generate_ed25519();
                let encoded =
                    keypair
                        .to_protobuf_encoding()
                        .map_err(|error| IdentityError::Corrupt {
                            path: shown.clone(),
                            reason: error.to_string(),
                        })?;
                write_private(path, &encoded).map_err(|source| IdentityError::Write {
                    path: shown.clone(),
                    source,
                })?;
                Ok(Identity::from_keypair(keypair))
            }
            Err(source) => Err(IdentityError::Read {
                path: shown,
                source,
            }),
        }
    }

    /// A throwaway identity, for processes run without `--identity-path`.
    pub fn ephemeral() -> Identity {
        Identity::from_keypair(Keypair::generate_ed25519())
    }

    fn from_keypair(keypair: Keypair) -> Identity {
        let peer_id = keypair.public().to_peer_id();
        Identity { keypair, peer_id }
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_persists_across_loads() {
        let dir = std::env::temp_dir().join(format!("hivenet-identity-{}", std::process::id()));
        let path = dir.join("agent.key");
        let _ = std::fs::remove_dir_all(&dir);
        let first = Identity::load_or_create(&path).expect("create");
        let second = Identity::load_or_create(&path).expect("load");
        assert_eq!(first.peer_id, second.peer_id);
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(
            Identity::load_or_create(&path),
            Err(IdentityError::Corrupt { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
