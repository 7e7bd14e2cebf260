//! The tunnel preamble (`tunnel::preamble`): the first bytes an agent writes on a socket it dialed
//! to the router's tunnel port, read by the router's side (`read_claims`) exactly as the accept
//! path reads them, whole or with the magic read first (the plaintext port's TLS sniff).
//!
//! Asserts:
//! - nothing panics, and the router reads at most the 8-byte head plus `TOKEN_LEN_MAX` token bytes;
//! - a malformed head is answered with the one `Malformed` status byte and nothing else;
//! - reading with the magic already taken gives the same outcome as reading it all;
//! - round trip: `encode` of a codec, a shard and a token decodes to the same codec, shard and
//!   token; the status byte decodes back to itself.
//!
//! The tokens in the seed corpus are signed with [`SECRET`], so a verified session is reachable.
#![no_main]

use fuzz_support::{Wire, block_on};
use hivenet_router::base::credentials::{Claims, Secret};
use hivenet_router::net::tunnel::preamble::{self, Codec, PreambleError, Status, TOKEN_LEN_MAX};
use libfuzzer_sys::fuzz_target;

/// The HS256 secret the seed tokens are signed with (fuzz/seeds/make.py). Test material only.
const SECRET: &[u8] = b"hivenet-fuzz-secret-0123456789abcdef";

/// The issuer the seed session tokens name (fuzz/seeds/make.py).
const SESSION_ISSUER: &str = "12D3KooWfuzzrouter/0000000000000000";
type Outcome = Result<(Codec, u16, Option<Claims>), &'static str>;

fuzz_target!(|data: &[u8]| {
    let secret = Secret::new(SECRET).expect("a non-empty secret");

    let whole = read(data, 0, &secret);
    let magic_first = read(data, data.len().min(4), &secret);
    assert_eq!(
        whole.0, magic_first.0,
        "reading the magic first changes the outcome"
    );
    assert_eq!(
        whole.1, magic_first.1,
        "reading the magic first changes the answer"
    );
    match &whole.0 {
        Err("malformed preamble") => assert_eq!(whole.1, [Status::Malformed as u8]),
        _ => assert!(whole.1.is_empty(), "only a malformed head is answered here"),
    }

    if let Ok(head) = <[u8; 8]>::try_from(data.get(..8).unwrap_or_default()) {
        match preamble::decode_head(&head) {
            Ok((codec, shard, token_len)) => {
                assert!(token_len <= TOKEN_LEN_MAX);
                assert_eq!(Codec::from_magic(&head[..4]), Some(codec));
                if let Ok((read_codec, read_shard, _)) = whole.0 {
                    assert_eq!((read_codec, read_shard), (codec, shard));
                }
            }
            Err(PreambleError::TokenTooLong(token_len)) => assert!(token_len > TOKEN_LEN_MAX),
            Err(_) => {}
        }
    }

    // Round trip: the input's text as a token, its first bytes as a shard.
    let text = String::from_utf8_lossy(data);
    let mut token: String = text.chars().take(TOKEN_LEN_MAX / 4).collect();
    token.truncate(TOKEN_LEN_MAX);
    let shard = u16::from_le_bytes([data.first().copied().unwrap_or(0), data.len() as u8]);
    let codec = if data.len() % 2 == 0 {
        Codec::Lean
    } else {
        Codec::Http2
    };
    let encoded = preamble::encode(codec, shard, &token);
    let head: [u8; 8] = encoded[..8].try_into().expect("an 8-byte head");
    let (decoded_codec, decoded_shard, token_len) =
        preamble::decode_head(&head).expect("an encoded head decodes");
    assert_eq!((decoded_codec, decoded_shard), (codec, shard));
    assert_eq!(token_len, token.len());
    let decoded = preamble::decode_token(encoded[8..].to_vec()).expect("an encoded token decodes");
    assert_eq!(decoded, token);

    if let Some(&byte) = data.first()
        && let Some(status) = Status::from_byte(byte)
    {
        assert_eq!(status as u8, byte);
        assert!(!status.describe().is_empty());
    }
});

/// `read_claims` over the input, `read_already` bytes of it taken before as the accept path
/// does; returns the outcome and what the router wrote back.
fn read(data: &[u8], read_already: usize, secret: &Secret) -> (Outcome, Vec<u8>) {
    let mut wire = Wire::new(data[read_already..].to_vec());
    let outcome = block_on(preamble::read_claims(
        &mut wire,
        &data[..read_already],
        secret,
        SESSION_ISSUER,
    ));
    assert!(read_already + wire.read_bytes() <= 8 + TOKEN_LEN_MAX);
    (outcome, wire.written)
}
