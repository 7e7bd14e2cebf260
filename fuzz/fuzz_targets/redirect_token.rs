//! Redirect tokens (`sibling::token`): the `hivenet_redirect` query parameter a sibling site
//! accepts in place of an API key, and the secret file that keys it.
//!
//! Asserts:
//! - `verify` never panics on any text, and refuses anything longer than `MAX_TOKEN_BYTES`;
//! - a token found in a request target (`from_target`) is a piece of that target's query;
//! - round trip: claims built from the input, signed, verify to the same claims while good, and
//!   to `Expired` / `TooFarAhead` outside their window; they verify with the signing secret
//!   listed second (rotation), and never with another secret; a good token's nonce is spent once;
//! - round trip: a `Location` built for any path carries exactly the token, which `from_target`
//!   finds again;
//! - a secret file parses to 1 to `MAX_SECRETS` secrets or is refused.
//!
//! The tokens in the seed corpus are signed with [`SECRET`] at [`NOW_UNIX_MS`].
#![no_main]

use fuzz_support::{Cuts, fnv1a};
use hivenet_router::logic::sibling::token::{
    self, MAX_CLOCK_SKEW, MAX_SECRETS, MAX_TOKEN_BYTES, RedirectClaims, RedirectSecrets,
    SpentTokens, TOKEN_TTL, TokenError,
};
use libfuzzer_sys::fuzz_target;

/// The secret the seed tokens are signed with (fuzz/seeds/make.py). Test material only.
const SECRET: &str = "hivenet-fuzz-redirect-secret-0123456789abcdef";
const OTHER_SECRET: &str = "another-site-redirect-secret-0123456789abcdef";
/// The clock of every check: 2027-01-15T08:00:00Z.
const NOW_UNIX_MS: i64 = 1_800_000_000_000;

fuzz_target!(|data: &[u8]| {
    let secrets = RedirectSecrets::parse(SECRET).expect("one long secret");
    let text = String::from_utf8_lossy(data);

    match token::verify(&secrets, &text, NOW_UNIX_MS) {
        Err(TokenError::TooLong) => assert!(text.len() > MAX_TOKEN_BYTES),
        Ok(claims) => {
            assert!(claims.expires_unix_ms > NOW_UNIX_MS);
            // A verified token is one this secret signed: signing its claims gives it back.
            assert_eq!(token::sign(&secrets, &claims), text);
        }
        Err(_) => {}
    }

    if let Some(found) = token::from_target(data) {
        let query_start = data.iter().position(|&byte| byte == b'?').expect("a query");
        let found_at = found.as_ptr() as usize - data.as_ptr() as usize;
        assert!(found_at > query_start && found_at + found.len() <= data.len());
        let _ = token::verify(&secrets, found, NOW_UNIX_MS);
    }

    if let Ok(parsed) = RedirectSecrets::parse(&text) {
        assert!((1..=MAX_SECRETS).contains(&parsed.len()));
    }

    round_trip(data, &text, &secrets);
});

fn round_trip(data: &[u8], text: &str, secrets: &RedirectSecrets) {
    let mut cuts = Cuts::new(data, 64);
    let mut pieces = text.split('\u{0}');
    let mut next_text = || pieces.next().unwrap_or_default().to_owned();
    let window_ms = (TOKEN_TTL + MAX_CLOCK_SKEW).as_millis() as i64;
    // Expiry from a minute ago to a minute past the longest accepted lifetime.
    let offset_ms = (cuts.next_u64() % (window_ms as u64 + 120_000)) as i64 - 60_000;
    let claims = RedirectClaims {
        key: next_text(),
        model: next_text(),
        // A token records at least one hop; `verify` refuses 0.
        hops: data.first().copied().unwrap_or(1).max(1),
        from_site: next_text(),
        to_site: next_text(),
        expires_unix_ms: NOW_UNIX_MS + offset_ms,
        nonce: {
            let mut nonce = [0u8; 16];
            nonce[..8].copy_from_slice(&fnv1a(data).to_be_bytes());
            nonce[8..].copy_from_slice(&cuts.next_u64().to_be_bytes());
            nonce
        },
    };
    let signed = token::sign(secrets, &claims);
    let verified = token::verify(secrets, &signed, NOW_UNIX_MS);
    if signed.len() > MAX_TOKEN_BYTES {
        assert_eq!(verified, Err(TokenError::TooLong));
        return;
    }
    if offset_ms <= 0 {
        assert_eq!(verified, Err(TokenError::Expired));
    } else if offset_ms > window_ms {
        assert_eq!(verified, Err(TokenError::TooFarAhead));
    } else {
        assert_eq!(verified.as_ref(), Ok(&claims));
        // Spent once while good, refused after.
        let mut spent = SpentTokens::new();
        assert!(spent.spend(claims.nonce, claims.expires_unix_ms, NOW_UNIX_MS));
        assert!(!spent.spend(claims.nonce, claims.expires_unix_ms, NOW_UNIX_MS));
    }

    let rotated = RedirectSecrets::parse(&format!("{OTHER_SECRET}\n# rotation\n{SECRET}\n"))
        .expect("two long secrets");
    assert_eq!(rotated.len(), 2);
    assert_eq!(token::verify(&rotated, &signed, NOW_UNIX_MS), verified);
    let other = RedirectSecrets::parse(OTHER_SECRET).expect("one long secret");
    assert_eq!(
        token::verify(&other, &signed, NOW_UNIX_MS),
        Err(TokenError::BadMac)
    );

    // The Location for the redirected request: any path and query, with '#' left out (a
    // fragment never reaches the server).
    let path: String = text.chars().filter(|&char| char != '#').take(200).collect();
    let path = format!("/{path}");
    let location = token::location("https://sibling.example", &path, &signed);
    assert_eq!(
        token::from_target(location.as_bytes()),
        Some(signed.as_str())
    );
}
