//! Signed redirect tokens. Clients drop `Authorization` when they follow a redirect to another
//! origin, so the `307` to a sibling site carries, in its `Location` query
//! (`?hivenet_redirect=...`), a token that authenticates the redirected request there: the
//! sibling accepts it in place of the API key, for the key, model and site it names.
//!
//! Pure logic: signing, checking and the record of spent tokens take `now` from the caller and do
//! no I/O.
//!
//! # Format
//!
//! `base64url(payload) "." base64url(mac)`, both without padding, so a token needs no escaping in
//! a URL; `mac` is HMAC-SHA256 keyed with a secret over `"hivenet-router/redirect-token/v1\0"`
//! then the payload. The payload is binary: version (`1`), hops, expiry (i64 big-endian Unix ms),
//! the 16-byte nonce, then key, model, from site and to site, each a u32 big-endian length and
//! UTF-8 bytes. The domain prefix keeps a MAC for this purpose from ever matching one the same
//! secret makes for another.
//!
//! # Invariants
//!
//! - A token verifies only with a secret of the receiving site's `--redirect-secret-file`; the
//!   first secret signs, every secret verifies, so a new secret is rolled out by adding it second
//!   everywhere, then moving it first, then removing the old one.
//! - A token is good until its expiry ([`TOKEN_TTL`] after it is signed), never after, and is
//!   refused when its expiry is further ahead than the TTL plus [`MAX_CLOCK_SKEW`] (so a spent
//!   nonce never has to be remembered for longer).
//! - [`SpentTokens`] accepts each nonce once while its token is good, and holds at most
//!   [`SPENT_TOKENS_MAX`] nonces.
//!
//! The caller checks what only it knows: `to_site` is its own site id, the key still exists and
//! may use the model, `hops` is within its limit, and the nonce is spent once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The query parameter of the `Location` that carries the token.
pub const QUERY_PARAM: &str = "hivenet_redirect";
/// How long a token is good after it is signed: long enough for a client to follow the `307`.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// How far the receiving site's clock may lag the issuing site's: a token whose expiry is further
/// ahead than [`TOKEN_TTL`] plus this is refused.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);
/// Shortest secret, in bytes (the HMAC-SHA256 output size, so the key is not the weak part).
pub const MIN_SECRET_BYTES: usize = 32;
/// Most secrets in a secret file. Verification tries each, so this bounds its cost.
pub const MAX_SECRETS: usize = 16;
/// Longest token [`verify`] reads. Tokens signed for a map's site ids and models are far shorter.
pub const MAX_TOKEN_BYTES: usize = 2048;
/// Most nonces [`SpentTokens`] remembers at once.
pub const SPENT_TOKENS_MAX: usize = 1_000_000;

const MAC_DOMAIN: &[u8] = b"hivenet-router/redirect-token/v1\0";
const PAYLOAD_VERSION: u8 = 1;
const MAC_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Why a secret file or a token was refused.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the redirect secret file has no secret (blank lines and # comments are skipped)")]
    NoSecret,
    #[error("the redirect secret on line {line} is {bytes} bytes, at least 32 are required")]
    ShortSecret { line: usize, bytes: usize },
    #[error("the redirect secret file has {count} secrets, at most 16")]
    TooManySecrets { count: usize },
    #[error("redirect token is longer than 2048 bytes")]
    TooLong,
    #[error("redirect token is malformed: {0}")]
    Malformed(&'static str),
    #[error("redirect token signature does not verify")]
    BadMac,
    #[error("redirect token has expired")]
    Expired,
    #[error("redirect token expires further ahead than its lifetime allows")]
    TooFarAhead,
}

/// The `--redirect-secret-file` contents: one secret per line (blank lines and lines starting
/// with `#` skipped, surrounding whitespace trimmed); the first signs, all verify (rotation).
/// Each secret is at least [`MIN_SECRET_BYTES`] bytes; there are 1 to [`MAX_SECRETS`].
#[derive(Clone)]
pub struct RedirectSecrets {
    /// One HMAC keyed with each secret, ready to clone per token, in file order.
    macs: Vec<HmacSha256>,
}

impl fmt::Debug for RedirectSecrets {
    /// Shows how many secrets there are, never their bytes.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("RedirectSecrets")
            .field("count", &self.macs.len())
            .finish_non_exhaustive()
    }
}

impl RedirectSecrets {
    /// Parses the secret file's text.
    pub fn parse(text: &str) -> Result<RedirectSecrets, TokenError> {
        let mut macs = Vec::new();
        let mut count = 0;
        for (index, line) in text.lines().enumerate() {
            let secret = line.trim();
            if secret.is_empty() || secret.starts_with('#') {
                continue;
            }
            if secret.len() < MIN_SECRET_BYTES {
                return Err(TokenError::ShortSecret {
                    line: index + 1,
                    bytes: secret.len(),
                });
            }
            count += 1;
            if count <= MAX_SECRETS {
                macs.push(keyed(secret.as_bytes()));
            }
        }
        if count > MAX_SECRETS {
            return Err(TokenError::TooManySecrets { count });
        }
        if macs.is_empty() {
            return Err(TokenError::NoSecret);
        }
        Ok(RedirectSecrets { macs })
    }

    /// How many secrets verify.
    pub fn len(&self) -> usize {
        self.macs.len()
    }

    /// Always false: a parsed file has at least one secret.
    pub fn is_empty(&self) -> bool {
        self.macs.is_empty()
    }

    fn signer(&self) -> &HmacSha256 {
        // `parse` refuses a file without a secret, and that is the only constructor.
        &self.macs[0]
    }
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC takes a key of any length")
}

/// What a redirect token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectClaims {
    /// The dynamic key's registry id, `""` for auth mode none.
    pub key: String,
    pub model: String,
    /// Redirects so far, this one included (the first redirect: 1).
    pub hops: u8,
    /// The site that issued the token.
    pub from_site: String,
    /// The site the token is for; the receiver checks it is itself.
    pub to_site: String,
    /// Good while `now < expires_unix_ms`.
    pub expires_unix_ms: i64,
    /// Single-use identity; the caller supplies random bytes.
    pub nonce: [u8; 16],
}

/// Signs `claims` with the first secret. See the module docs for the format.
pub fn sign(secrets: &RedirectSecrets, claims: &RedirectClaims) -> String {
    let payload = encode_payload(claims);
    let mut mac = secrets.signer().clone();
    mac.update(MAC_DOMAIN);
    mac.update(&payload);
    let tag = mac.finalize().into_bytes();
    let mut token = URL_SAFE_NO_PAD.encode(&payload);
    token.push('.');
    URL_SAFE_NO_PAD.encode_string(tag.as_slice(), &mut token);
    token
}

/// Checks a token at `now_unix_ms` and returns its claims. The signature is compared in
/// constant time against each secret; it is checked before the payload is read.
///
/// Refusals: [`TokenError::TooLong`] past [`MAX_TOKEN_BYTES`]; [`TokenError::Malformed`] (with
/// why) when the text or a signed payload cannot be decoded; [`TokenError::BadMac`] when no
/// secret signed it; [`TokenError::Expired`] once `now >= expires_unix_ms`;
/// [`TokenError::TooFarAhead`] when the expiry is more than [`TOKEN_TTL`] + [`MAX_CLOCK_SKEW`]
/// ahead. The caller still checks `to_site`, the key, the hops and spends the nonce.
pub fn verify(
    secrets: &RedirectSecrets,
    token: &str,
    now_unix_ms: i64,
) -> Result<RedirectClaims, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::TooLong);
    }
    let (payload_text, tag_text) = token
        .split_once('.')
        .ok_or(TokenError::Malformed("no '.' before the signature"))?;
    let payload = URL_SAFE_NO_PAD
        .decode(payload_text)
        .map_err(|_| TokenError::Malformed("payload is not unpadded base64url"))?;
    let tag = URL_SAFE_NO_PAD
        .decode(tag_text)
        .map_err(|_| TokenError::Malformed("signature is not unpadded base64url"))?;
    if tag.len() != MAC_BYTES {
        return Err(TokenError::Malformed("signature is not 32 bytes"));
    }
    let signed_by_a_secret = secrets.macs.iter().any(|keyed| {
        let mut mac = keyed.clone();
        mac.update(MAC_DOMAIN);
        mac.update(&payload);
        mac.verify_slice(&tag).is_ok()
    });
    if !signed_by_a_secret {
        return Err(TokenError::BadMac);
    }
    let claims = decode_payload(&payload).map_err(TokenError::Malformed)?;
    if now_unix_ms >= claims.expires_unix_ms {
        return Err(TokenError::Expired);
    }
    let longest_ms = (TOKEN_TTL + MAX_CLOCK_SKEW).as_millis() as i64;
    if claims.expires_unix_ms.saturating_sub(now_unix_ms) > longest_ms {
        return Err(TokenError::TooFarAhead);
    }
    Ok(claims)
}

/// Finds the token in a request target's query (`/v1/chat/completions?hivenet_redirect=...`), if
/// present: the value of the first `hivenet_redirect` parameter, as written. Tokens use only
/// characters a query carries unescaped, so nothing is percent-decoded; a value that is not
/// UTF-8 is no token.
pub fn from_target(target: &[u8]) -> Option<&str> {
    let target = &target[..memchr::memchr(b'#', target).unwrap_or(target.len())];
    let query = &target[memchr::memchr(b'?', target)? + 1..];
    query
        .split(|&byte| byte == b'&')
        .find_map(|pair| {
            pair.strip_prefix(QUERY_PARAM.as_bytes())?
                .strip_prefix(b"=")
        })
        .and_then(|value| std::str::from_utf8(value).ok())
}

/// The `307` `Location`: `{base_url}{path}?hivenet_redirect={token}`. When `path` already has a
/// query, its other parameters are kept and any `hivenet_redirect` in it is dropped, so a
/// request redirected again carries only its new token.
pub fn location(base_url: &str, path: &str, token: &str) -> String {
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, query),
        None => (path, ""),
    };
    let mut location =
        String::with_capacity(base_url.len() + path.len() + query.len() + token.len() + 20);
    location.push_str(base_url);
    location.push_str(path);
    location.push('?');
    for pair in query.split('&') {
        let is_token = pair
            .strip_prefix(QUERY_PARAM)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('='));
        if pair.is_empty() || is_token {
            continue;
        }
        location.push_str(pair);
        location.push('&');
    }
    location.push_str(QUERY_PARAM);
    location.push('=');
    location.push_str(token);
    location
}

fn encode_payload(claims: &RedirectClaims) -> Vec<u8> {
    let strings = [
        &claims.key,
        &claims.model,
        &claims.from_site,
        &claims.to_site,
    ];
    let mut payload =
        Vec::with_capacity(26 + strings.iter().map(|text| 4 + text.len()).sum::<usize>());
    payload.push(PAYLOAD_VERSION);
    payload.push(claims.hops);
    payload.extend_from_slice(&claims.expires_unix_ms.to_be_bytes());
    payload.extend_from_slice(&claims.nonce);
    for text in strings {
        // Claims come from a validated map and the key registry, far below 4 GiB.
        let length = u32::try_from(text.len()).unwrap_or(u32::MAX);
        payload.extend_from_slice(&length.to_be_bytes());
        payload.extend_from_slice(text.as_bytes());
    }
    payload
}

fn decode_payload(payload: &[u8]) -> Result<RedirectClaims, &'static str> {
    let mut reader = Reader(payload);
    if reader.take::<1>()? != [PAYLOAD_VERSION] {
        return Err("unknown payload version");
    }
    let [hops] = reader.take::<1>()?;
    if hops == 0 {
        return Err("hops is 0");
    }
    let expires_unix_ms = i64::from_be_bytes(reader.take::<8>()?);
    let nonce = reader.take::<16>()?;
    let claims = RedirectClaims {
        key: reader.text()?,
        model: reader.text()?,
        hops,
        from_site: reader.text()?,
        to_site: reader.text()?,
        expires_unix_ms,
        nonce,
    };
    if !reader.0.is_empty() {
        return Err("payload has trailing bytes");
    }
    Ok(claims)
}

/// Reads the payload front to back.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or("payload is truncated")?;
        self.0 = rest;
        Ok(*head)
    }

    fn text(&mut self) -> Result<String, &'static str> {
        let length = u32::from_be_bytes(self.take::<4>()?) as usize;
        if length > self.0.len() {
            return Err("payload is truncated");
        }
        let (text, rest) = self.0.split_at(length);
        self.0 = rest;
        String::from_utf8(text.to_vec()).map_err(|_| "payload text is not UTF-8")
    }
}

/// Tokens already spent, so each is accepted once (per router). Pure: callers pass `now`.
///
/// A nonce is remembered until its token expires, then forgotten: an expired token is refused by
/// [`verify`] anyway. Forgetting is amortised — each `spend` first drops the nonces that expired
/// by `now`, oldest first from a min-heap by expiry — so memory follows the tokens spent per
/// [`TOKEN_TTL`] (plus [`MAX_CLOCK_SKEW`]).
///
/// At most [`SPENT_TOKENS_MAX`] nonces are held (under 100 MB). Past it, `spend` refuses new
/// nonces instead of growing: growing would let a flood of redirects exhaust memory, and
/// forgetting a nonce before its expiry would let its token be replayed. A refused redirect is
/// the safe failure — the client can resend its request with its API key.
#[derive(Debug)]
pub struct SpentTokens {
    nonces: HashSet<[u8; 16]>,
    /// (expiry, nonce), earliest expiry on top.
    by_expiry: BinaryHeap<Reverse<(i64, [u8; 16])>>,
    /// [`SPENT_TOKENS_MAX`]; smaller only in tests.
    max_nonces: usize,
}

impl Default for SpentTokens {
    fn default() -> Self {
        SpentTokens::with_max(SPENT_TOKENS_MAX)
    }
}

impl SpentTokens {
    pub fn new() -> Self {
        SpentTokens::default()
    }

    fn with_max(max_nonces: usize) -> Self {
        SpentTokens {
            nonces: HashSet::new(),
            by_expiry: BinaryHeap::new(),
            max_nonces,
        }
    }

    /// True the first time a nonce is spent while its token is good (it is then remembered until
    /// `expires_unix_ms`); false when it was spent before, when the token has already expired,
    /// or when [`SPENT_TOKENS_MAX`] nonces are held.
    pub fn spend(&mut self, nonce: [u8; 16], expires_unix_ms: i64, now_unix_ms: i64) -> bool {
        self.forget_expired(now_unix_ms);
        if expires_unix_ms <= now_unix_ms
            || self.nonces.contains(&nonce)
            || self.nonces.len() >= self.max_nonces
        {
            return false;
        }
        self.nonces.insert(nonce);
        self.by_expiry.push(Reverse((expires_unix_ms, nonce)));
        true
    }

    /// Nonces remembered now.
    pub fn len(&self) -> usize {
        self.nonces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nonces.is_empty()
    }

    fn forget_expired(&mut self, now_unix_ms: i64) {
        while let Some(Reverse((expires_unix_ms, nonce))) = self.by_expiry.peek().copied()
            && expires_unix_ms <= now_unix_ms
        {
            self.by_expiry.pop();
            self.nonces.remove(&nonce);
        }
    }
}

#[cfg(test)]
mod tests;
