//! The SHA-256 of a raw client key ([`KeyHash`]): the one form a client or admin key is kept in,
//! by the static keys of `auth.yaml`, the dynamic registry, the key registry and the admin keys.
//!
//! Owns: hashing a raw key, the hash's hex form (parsed and printed), and the constant-time
//! comparison.
//!
//! Must not: keep the raw key, or show a hash in `Debug`.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The SHA-256 of a raw client key. `Debug` does not show it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub [u8; 32]);

impl KeyHash {
    /// Hashes a raw key. The only place a raw key is read.
    pub fn of_raw_key(raw_key: &[u8]) -> KeyHash {
        KeyHash(Sha256::digest(raw_key).into())
    }

    /// 64 hex digits, either case.
    pub fn parse_hex(text: &str) -> Option<KeyHash> {
        if text.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(KeyHash(bytes))
    }

    /// 64 lowercase hex digits, as `sha256sum` prints.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Constant-time equality.
    pub fn ct_eq(&self, other: &KeyHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHash(..)")
    }
}

/// The "hash a key" helper: lowercase hex SHA-256 of a raw key, as `printf '%s' KEY | sha256sum`.
pub fn hash_key_hex(raw_key: &str) -> String {
    KeyHash::of_raw_key(raw_key.as_bytes()).to_hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_helper_matches_sha256sum() {
        // printf '%s' sk-hivenet-secret | sha256sum
        assert_eq!(
            hash_key_hex("sk-hivenet-secret"),
            "4a5b2d8d96e0a71abaad0d139c3e76954c6ae870253a2b3baad4ba8808317931"
        );
        assert_eq!(
            hash_key_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let hash = KeyHash::parse_hex(&hash_key_hex("x").to_uppercase()).unwrap();
        assert_eq!(hash, KeyHash::of_raw_key(b"x"));
        assert!(hash.ct_eq(&KeyHash::of_raw_key(b"x")));
        assert!(!hash.ct_eq(&KeyHash::of_raw_key(b"y")));
        assert_eq!(KeyHash::parse_hex("abc"), None);
    }
}
