use super::*;

const NOW: i64 = 1_800_000_000_000;
const OLD: &str = "old-secret-0123456789abcdef0123456789";
const NEW: &str = "new-secret-0123456789abcdef0123456789";

fn secrets(text: &str) -> RedirectSecrets {
    RedirectSecrets::parse(text).expect("test secrets are valid")
}

fn claims() -> RedirectClaims {
    RedirectClaims {
        key: "key-42".to_owned(),
        model: "llama-3-70b".to_owned(),
        hops: 1,
        from_site: "site-fr-1".to_owned(),
        to_site: "site-de-1".to_owned(),
        expires_unix_ms: NOW + TOKEN_TTL.as_millis() as i64,
        nonce: [7; 16],
    }
}

/// Flips one bit of the decoded part `index` (0: payload, 1: signature) and re-encodes it.
fn tamper(token: &str, index: usize, byte: usize) -> String {
    let mut parts: Vec<Vec<u8>> = token
        .split('.')
        .map(|part| URL_SAFE_NO_PAD.decode(part).unwrap())
        .collect();
    parts[index][byte] ^= 1;
    parts
        .iter()
        .map(|part| URL_SAFE_NO_PAD.encode(part))
        .collect::<Vec<_>>()
        .join(".")
}

#[test]
fn a_signed_token_verifies_to_its_claims() {
    let secrets = secrets(OLD);
    let token = sign(&secrets, &claims());
    assert!(
        token
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.')),
        "{token}"
    );
    assert_eq!(verify(&secrets, &token, NOW), Ok(claims()));
    let anonymous = RedirectClaims {
        key: String::new(),
        hops: 2,
        ..claims()
    };
    assert_eq!(
        verify(&secrets, &sign(&secrets, &anonymous), NOW),
        Ok(anonymous)
    );
}

#[test]
fn every_secret_verifies_and_the_first_signs() {
    let old = secrets(OLD);
    let rotated = secrets(&format!("# rotation: new first\n{NEW}\n\n  {OLD}  \n"));
    assert_eq!(rotated.len(), 2);
    let from_old = sign(&old, &claims());
    assert_eq!(verify(&rotated, &from_old, NOW), Ok(claims()));
    let from_rotated = sign(&rotated, &claims());
    assert_eq!(
        verify(&old, &from_rotated, NOW),
        Err(TokenError::BadMac),
        "signed with the new secret"
    );
    assert_eq!(verify(&secrets(NEW), &from_rotated, NOW), Ok(claims()));
}

#[test]
fn a_token_from_another_secret_is_refused() {
    let token = sign(&secrets(OLD), &claims());
    assert_eq!(verify(&secrets(NEW), &token, NOW), Err(TokenError::BadMac));
}

#[test]
fn tampered_tokens_are_refused() {
    let secrets = secrets(OLD);
    let token = sign(&secrets, &claims());
    let payload_bytes = URL_SAFE_NO_PAD
        .decode(token.split('.').next().unwrap())
        .unwrap();
    for byte in 0..payload_bytes.len() {
        assert_eq!(
            verify(&secrets, &tamper(&token, 0, byte), NOW),
            Err(TokenError::BadMac),
            "payload byte {byte}"
        );
    }
    for byte in [0, 15, 31] {
        assert_eq!(
            verify(&secrets, &tamper(&token, 1, byte), NOW),
            Err(TokenError::BadMac),
            "signature byte {byte}"
        );
    }
    // Another token's signature on this payload.
    let other = sign(
        &secrets,
        &RedirectClaims {
            model: "other".to_owned(),
            ..claims()
        },
    );
    let spliced = format!(
        "{}.{}",
        token.split('.').next().unwrap(),
        other.split('.').nth(1).unwrap()
    );
    assert_eq!(verify(&secrets, &spliced, NOW), Err(TokenError::BadMac));
}

#[test]
fn malformed_tokens_say_why() {
    let secrets = secrets(OLD);
    let token = sign(&secrets, &claims());
    let (payload, tag) = token.split_once('.').unwrap();
    for (bad, reason) in [
        (String::new(), "no '.' before the signature"),
        (payload.to_owned(), "no '.' before the signature"),
        (
            format!("{payload}=.{tag}"),
            "payload is not unpadded base64url",
        ),
        (
            format!("{payload}.{tag}="),
            "signature is not unpadded base64url",
        ),
        (
            format!("{payload}.{tag}.x"),
            "signature is not unpadded base64url",
        ),
        (
            format!("{payload}.{}", &tag[..40]),
            "signature is not 32 bytes",
        ),
        (format!("{payload}%2E{tag}"), "no '.' before the signature"),
    ] {
        assert_eq!(
            verify(&secrets, &bad, NOW),
            Err(TokenError::Malformed(reason)),
            "{bad}"
        );
    }
    assert_eq!(
        verify(&secrets, &"a".repeat(MAX_TOKEN_BYTES + 1), NOW),
        Err(TokenError::TooLong)
    );
}

/// Signs raw payload bytes, as a holder of the secret with a broken encoder would.
fn sign_payload(secrets: &RedirectSecrets, payload: &[u8]) -> String {
    let mut mac = secrets.signer().clone();
    mac.update(MAC_DOMAIN);
    mac.update(payload);
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(payload),
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    )
}

#[test]
fn a_signed_but_undecodable_payload_is_malformed() {
    let secrets = secrets(OLD);
    let good = encode_payload(&claims());
    let mut version_two = good.clone();
    version_two[0] = 2;
    let mut zero_hops = good.clone();
    zero_hops[1] = 0;
    let mut trailing = good.clone();
    trailing.push(0);
    let mut not_utf8 = good.clone();
    // The key's first byte follows version, hops, expiry, nonce and the key's length.
    not_utf8[1 + 1 + 8 + 16 + 4] = 0xff;
    for (payload, reason) in [
        (version_two, "unknown payload version"),
        (zero_hops, "hops is 0"),
        (trailing, "payload has trailing bytes"),
        (good[..good.len() - 1].to_vec(), "payload is truncated"),
        (good[..20].to_vec(), "payload is truncated"),
        (Vec::new(), "payload is truncated"),
        (not_utf8, "payload text is not UTF-8"),
    ] {
        assert_eq!(
            verify(&secrets, &sign_payload(&secrets, &payload), NOW),
            Err(TokenError::Malformed(reason))
        );
    }
}

#[test]
fn a_token_is_good_until_its_expiry() {
    let secrets = secrets(OLD);
    let token = sign(&secrets, &claims());
    let expires = claims().expires_unix_ms;
    assert!(verify(&secrets, &token, expires - 1).is_ok());
    assert_eq!(verify(&secrets, &token, expires), Err(TokenError::Expired));
    assert_eq!(verify(&secrets, &token, i64::MAX), Err(TokenError::Expired));
    // A receiver whose clock lags by up to the allowed skew still accepts it.
    let lag = MAX_CLOCK_SKEW.as_millis() as i64;
    assert!(verify(&secrets, &token, NOW - lag).is_ok());
    assert_eq!(
        verify(&secrets, &token, NOW - lag - 1),
        Err(TokenError::TooFarAhead)
    );
    let far = RedirectClaims {
        expires_unix_ms: i64::MAX,
        ..claims()
    };
    assert_eq!(
        verify(&secrets, &sign(&secrets, &far), NOW),
        Err(TokenError::TooFarAhead)
    );
    let long_ago = RedirectClaims {
        expires_unix_ms: i64::MIN,
        ..claims()
    };
    assert_eq!(
        verify(&secrets, &sign(&secrets, &long_ago), NOW),
        Err(TokenError::Expired)
    );
}

#[test]
fn secret_files_need_long_secrets() {
    assert_eq!(RedirectSecrets::parse("").err(), Some(TokenError::NoSecret));
    assert_eq!(
        RedirectSecrets::parse("\n  # only a comment\n\t\n").unwrap_err(),
        TokenError::NoSecret
    );
    assert_eq!(
        RedirectSecrets::parse(&format!("{OLD}\n\n  short  \n")).err(),
        Some(TokenError::ShortSecret { line: 3, bytes: 5 })
    );
    assert_eq!(
        RedirectSecrets::parse(&"x".repeat(31))
            .unwrap_err()
            .to_string(),
        "the redirect secret on line 1 is 31 bytes, at least 32 are required"
    );
    assert_eq!(RedirectSecrets::parse(&"x".repeat(32)).unwrap().len(), 1);
    let many: Vec<String> = (0..=MAX_SECRETS).map(|n| format!("{OLD}{n}")).collect();
    assert_eq!(
        RedirectSecrets::parse(&many.join("\n")).err(),
        Some(TokenError::TooManySecrets { count: 17 })
    );
    assert_eq!(
        RedirectSecrets::parse(&many[..MAX_SECRETS].join("\r\n"))
            .unwrap()
            .len(),
        MAX_SECRETS
    );
    // A comment line is skipped even when it is long enough to be a secret.
    let commented = secrets(&format!("#{NEW}\n{OLD}"));
    assert_eq!(commented.len(), 1);
    assert_eq!(
        verify(&commented, &sign(&secrets(OLD), &claims()), NOW),
        Ok(claims())
    );
}

#[test]
fn debug_never_shows_a_secret() {
    let shown = format!("{:?}", secrets(&format!("{OLD}\n{NEW}")));
    assert!(!shown.contains("secret-0123"), "{shown}");
    assert!(shown.contains("count: 2"), "{shown}");
}

#[test]
fn the_token_is_found_among_other_query_parameters() {
    let token = sign(&secrets(OLD), &claims());
    for target in [
        format!("/v1/chat/completions?hivenet_redirect={token}"),
        format!("/v1/chat/completions?a=1&hivenet_redirect={token}"),
        format!("/v1/chat/completions?hivenet_redirect={token}&b=2"),
        format!("/v1/embeddings?x=%2F&hivenet_redirect={token}&y=&z"),
        format!("/v1/rerank?hivenet_redirect={token}#fragment"),
        format!("/v1/rerank?xhivenet_redirect=no&hivenet_redirect_=no&hivenet_redirect={token}"),
        format!("/v1/rerank?hivenet_redirect={token}&hivenet_redirect=second"),
    ] {
        assert_eq!(
            from_target(target.as_bytes()),
            Some(token.as_str()),
            "{target}"
        );
    }
    for target in [
        "/v1/chat/completions",
        "/v1/chat/completions?",
        "/v1/chat/completions?hivenet_redirect",
        "/v1/chat/completions?other=hivenet_redirect=x",
        "/v1/chat/completions#?hivenet_redirect=x",
    ] {
        assert_eq!(from_target(target.as_bytes()), None, "{target}");
    }
    assert_eq!(from_target(b"/v1/x?hivenet_redirect="), Some(""));
    assert_eq!(from_target(b"/v1/x?hivenet_redirect=\xff"), None);
    // Percent-encoded as written: tokens never need escaping, so nothing is decoded.
    assert_eq!(
        from_target(b"/v1/x?hivenet_redirect=abc%2Edef"),
        Some("abc%2Edef")
    );
}

#[test]
fn the_location_carries_one_fresh_token() {
    assert_eq!(
        location("https://de1.example.com", "/v1/chat/completions", "p.s"),
        "https://de1.example.com/v1/chat/completions?hivenet_redirect=p.s"
    );
    assert_eq!(
        location(
            "https://de1.example.com/prefix",
            "/v1/rerank?a=1&hivenet_redirect=old&b=2&hivenet_redirect",
            "new"
        ),
        "https://de1.example.com/prefix/v1/rerank?a=1&b=2&hivenet_redirect=new"
    );
    let target = location(
        "https://de1.example.com",
        "/v1/embeddings?hivenet_redirect_x=1",
        "t",
    );
    assert_eq!(
        target,
        "https://de1.example.com/v1/embeddings?hivenet_redirect_x=1&hivenet_redirect=t"
    );
    let path = &target["https://de1.example.com".len()..];
    assert_eq!(from_target(path.as_bytes()), Some("t"));
}

#[test]
fn a_nonce_is_spent_once() {
    let mut spent = SpentTokens::new();
    assert!(spent.is_empty());
    assert!(spent.spend([1; 16], NOW + 60_000, NOW));
    assert!(!spent.spend([1; 16], NOW + 60_000, NOW + 1));
    assert!(
        !spent.spend([1; 16], NOW + 90_000, NOW + 2),
        "another expiry is the same nonce"
    );
    assert!(spent.spend([2; 16], NOW + 60_000, NOW + 3));
    assert_eq!(spent.len(), 2);
    assert!(
        !spent.spend([3; 16], NOW, NOW),
        "an expired token is not spendable"
    );
    assert_eq!(spent.len(), 2);
}

#[test]
fn expired_nonces_are_forgotten() {
    let mut spent = SpentTokens::new();
    for n in 0..10u8 {
        assert!(spent.spend([n; 16], NOW + i64::from(n) * 1000, NOW - 1));
    }
    assert_eq!(spent.len(), 10);
    // At `now`, tokens expiring at or before it are gone: 0..=4 at NOW + 4000.
    assert!(spent.spend([100; 16], NOW + 60_000, NOW + 4000));
    assert_eq!(spent.len(), 10 - 5 + 1);
    assert!(
        !spent.spend([5; 16], NOW + 5000, NOW + 4999),
        "not expired yet"
    );
    assert!(spent.spend([99; 16], NOW + 70_000, NOW + 60_000));
    assert_eq!(spent.len(), 1, "only the last one is still good");
    assert_eq!(spent.by_expiry.len(), 1);
}

#[test]
fn memory_follows_the_tokens_of_one_lifetime() {
    let mut spent = SpentTokens::new();
    let ttl = TOKEN_TTL.as_millis() as i64;
    // One token per 10 ms for ten lifetimes: never more than a lifetime's worth remembered.
    for step in 0..60_000i64 {
        let now = NOW + step * 10;
        let nonce = (step as u128).to_be_bytes();
        assert!(spent.spend(nonce, now + ttl, now));
        assert!(spent.len() <= (ttl / 10) as usize + 1);
    }
}

#[test]
fn past_the_cap_new_nonces_are_refused() {
    assert_eq!(SpentTokens::new().max_nonces, SPENT_TOKENS_MAX);
    let mut spent = SpentTokens::with_max(3);
    for n in 0..3u8 {
        assert!(spent.spend([n; 16], NOW + 60_000, NOW));
    }
    assert!(!spent.spend([9; 16], NOW + 60_000, NOW), "full");
    assert!(!spent.spend([0; 16], NOW + 60_000, NOW), "still spent");
    assert_eq!(spent.len(), 3);
    // Room again once the remembered tokens expire.
    assert!(spent.spend([9; 16], NOW + 120_000, NOW + 60_000));
    assert_eq!(spent.len(), 1);
}
