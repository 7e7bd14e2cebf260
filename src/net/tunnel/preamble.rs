//! The tunnel preamble: the first bytes an agent writes on a socket it dialed to `--p2p-port`.
//!
//! ```text
//! agent -> router   magic: "HNT2" or "HNT1" | shard: u16 BE | token_len: u16 BE
//!                   | session token (token_len bytes)
//! router -> agent   status: u8   (0 accepted, 1 bad token, 2 bad shard, 3 malformed,
//!                                 4 TLS required, 5 TLS not offered)
//! ```
//!
//! The magic names what the socket carries after an accepted status, always with the router as
//! the client and the agent as the server ([`Codec`]): `HNT2` the lean tunnel
//! (`crate::net::tunnel::link`), `HNT1` HTTP/2, which routers and agents before the lean tunnel speak.
//! A router accepts both, so agents and routers can be upgraded in any order; an agent offers
//! `HNT2` and, when an older router answers [`Status::Malformed`], dials again with `HNT1`.
//! One such socket exists per router shard, so a response never crosses cores.

/// What a tunnel carries after its preamble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// The lean tunnel (`crate::net::tunnel::link`): magic `HNT2`.
    Lean,
    /// HTTP/2, the router as client: magic `HNT1`. Kept for agents and routers older than the
    /// lean tunnel; to be removed once none is left.
    Http2,
}

impl Codec {
    pub fn magic(self) -> &'static [u8; 4] {
        match self {
            Codec::Lean => b"HNT2",
            Codec::Http2 => b"HNT1",
        }
    }

    /// The codec a preamble's first four bytes name.
    pub fn from_magic(magic: &[u8]) -> Option<Codec> {
        match magic {
            b"HNT2" => Some(Codec::Lean),
            b"HNT1" => Some(Codec::Http2),
            _ => None,
        }
    }
}
/// Session tokens are short JWTs; anything longer is refused before it is buffered.
pub const TOKEN_LEN_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Accepted = 0,
    BadToken = 1,
    BadShard = 2,
    Malformed = 3,
    /// The router's tunnel port speaks TLS (`tunnel::tls`); a plaintext preamble is refused.
    TlsRequired = 4,
    /// The agent asked for TLS and the router has no tunnel certificate.
    TlsNotOffered = 5,
}

impl Status {
    pub fn from_byte(byte: u8) -> Option<Status> {
        match byte {
            0 => Some(Status::Accepted),
            1 => Some(Status::BadToken),
            2 => Some(Status::BadShard),
            3 => Some(Status::Malformed),
            4 => Some(Status::TlsRequired),
            5 => Some(Status::TlsNotOffered),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Status::Accepted => "accepted",
            Status::BadToken => "session token refused",
            Status::BadShard => "shard index out of range",
            Status::Malformed => "malformed preamble",
            Status::TlsRequired => "the router requires TLS on the tunnel",
            Status::TlsNotOffered => "the router offers no TLS on the tunnel",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Preamble {
    pub shard: u16,
    pub token: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PreambleError {
    #[error("preamble does not start with the tunnel magic")]
    BadMagic,
    #[error("preamble token of {0} bytes exceeds the limit")]
    TokenTooLong(usize),
    #[error("preamble token is not UTF-8")]
    TokenNotUtf8,
}

pub fn encode(codec: Codec, shard: u16, token: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + token.len());
    out.extend_from_slice(codec.magic());
    out.extend_from_slice(&shard.to_be_bytes());
    out.extend_from_slice(&(token.len() as u16).to_be_bytes());
    out.extend_from_slice(token.as_bytes());
    out
}

/// The fixed 8-byte head: magic, shard and token length. Returns `(codec, shard, token_len)`.
pub fn decode_head(head: &[u8; 8]) -> Result<(Codec, u16, usize), PreambleError> {
    let codec = Codec::from_magic(&head[..4]).ok_or(PreambleError::BadMagic)?;
    let shard = u16::from_be_bytes([head[4], head[5]]);
    let token_len = u16::from_be_bytes([head[6], head[7]]) as usize;
    if token_len > TOKEN_LEN_MAX {
        return Err(PreambleError::TokenTooLong(token_len));
    }
    Ok((codec, shard, token_len))
}

pub fn decode_token(bytes: Vec<u8>) -> Result<String, PreambleError> {
    String::from_utf8(bytes).map_err(|_| PreambleError::TokenNotUtf8)
}

/// The router's side of a preamble, on the plaintext port or inside TLS: reads the rest of the
/// head after the `read_already` bytes (the plaintext port reads the magic first, to tell a TLS
/// hint apart), answers [`Status::Malformed`] to a bad head, reads the token and checks its
/// signature and that this run of the router (`session_issuer`) issued it. Returns the codec and
/// the shard the preamble names, and the token's claims (`None`: a bad token; the caller
/// answers, after its own checks).
pub async fn read_claims<IO>(
    io: &mut IO,
    read_already: &[u8],
    secret: &crate::base::credentials::Secret,
    session_issuer: &str,
) -> Result<(Codec, u16, Option<crate::base::credentials::Claims>), &'static str>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = [0u8; 8];
    head[..read_already.len()].copy_from_slice(read_already);
    io.read_exact(&mut head[read_already.len()..])
        .await
        .map_err(|_| "connection closed during preamble")?;
    let Ok((codec, shard, token_len)) = decode_head(&head) else {
        let _ = io.write_all(&[Status::Malformed as u8]).await;
        let _ = io.flush().await;
        return Err("malformed preamble");
    };
    let mut token = vec![0u8; token_len];
    io.read_exact(&mut token)
        .await
        .map_err(|_| "connection closed during preamble")?;
    let claims = decode_token(token)
        .ok()
        .and_then(|token| secret.verify_session(&token, session_issuer).ok());
    Ok((codec, shard, claims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for codec in [Codec::Lean, Codec::Http2] {
            let bytes = encode(codec, 3, "abc.def");
            let head: [u8; 8] = bytes[..8].try_into().unwrap();
            let (decoded, shard, len) = decode_head(&head).unwrap();
            assert_eq!((decoded, shard), (codec, 3));
            assert_eq!(decode_token(bytes[8..8 + len].to_vec()).unwrap(), "abc.def");
        }
        // What agents before the lean tunnel send.
        assert_eq!(&encode(Codec::Http2, 0, "")[..4], b"HNT1");
    }

    #[test]
    fn refuses_bad_head() {
        assert_eq!(decode_head(b"HTTP/1.1"), Err(PreambleError::BadMagic));
        assert_eq!(decode_head(b"HNT3\0\0\0\0"), Err(PreambleError::BadMagic));
        let mut head = *b"HNT1\0\0\0\0";
        head[6..8].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(decode_head(&head), Err(PreambleError::TokenTooLong(5000)));
    }
}
