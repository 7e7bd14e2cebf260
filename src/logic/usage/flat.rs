//! The usage objects engines send, read without serde when they are plainly shaped.
//!
//! A response's `usage` is a small object of counts, `{"prompt_tokens":5,"completion_tokens":16,
//! "total_tokens":21}`, once per request. serde_json's derived reader took about 1,600
//! instructions for that object; this one reads it in one pass over its bytes. It reads only what
//! it is sure of and returns `None` for anything else, and its callers then let serde_json
//! decide: so an answer it gives is serde's answer, and it never refuses what serde accepts.
//!
//! Plainly shaped: members whose keys have no escapes and whose values are a non-negative integer
//! that fits in `u64`, `null`, a string without escapes, or (one level down, as in OpenAI's
//! `prompt_tokens_details`) an object of such members. Counts must be integers or `null`;
//! arrays, `true`/`false`, fractions, exponents and negative numbers are left to serde.

/// A member's value, as far as a usage reader cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FlatValue {
    Count(u64),
    Null,
    /// A string or a nested object: fine for a member the reader ignores, not for a count.
    Skipped,
}

/// Reads the JSON object at the start of `bytes` (after optional whitespace), calling `member`
/// with each top-level member's key and value in order. Returns how many bytes the object took,
/// its closing brace included; `None` when it is not plainly shaped or `member` refused one.
pub(super) fn read_object(
    bytes: &[u8],
    member: &mut dyn FnMut(&[u8], FlatValue) -> bool,
) -> Option<usize> {
    read_nested(bytes, 0, member)
}

/// Deepest object read: the usage object and the detail objects inside it.
const DEPTH_MAX: u8 = 1;

fn read_nested(
    bytes: &[u8],
    depth: u8,
    member: &mut dyn FnMut(&[u8], FlatValue) -> bool,
) -> Option<usize> {
    let mut at = skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_whitespace(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return Some(at + 1);
    }
    loop {
        let (key, after_key) = string(bytes, at)?;
        at = skip_whitespace(bytes, after_key);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(bytes, at + 1);
        let (value, after_value) = match *bytes.get(at)? {
            b'0'..=b'9' => count(bytes, at)?,
            b'n' if bytes[at..].starts_with(b"null") => (FlatValue::Null, at + 4),
            b'"' => (FlatValue::Skipped, string(bytes, at)?.1),
            b'{' if depth < DEPTH_MAX => {
                let taken = read_nested(&bytes[at..], depth + 1, &mut |_, _| true)?;
                (FlatValue::Skipped, at + taken)
            }
            _ => return None,
        };
        if !member(key, value) {
            return None;
        }
        at = skip_whitespace(bytes, after_value);
        match *bytes.get(at)? {
            b',' => at = skip_whitespace(bytes, at + 1),
            b'}' => return Some(at + 1),
            _ => return None,
        }
    }
}

/// The string starting with the quote at `at`: its contents and the index past its closing
/// quote. `None` at an escape (left to serde) or an unterminated string.
fn string(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let length = memchr::memchr2(b'"', b'\\', &bytes[start..])?;
    if bytes[start + length] == b'\\' {
        return None;
    }
    Some((&bytes[start..start + length], start + length + 1))
}

/// The integer starting at `at` (a digit) and the index past it. JSON allows no leading zero;
/// a fraction or an exponent stops the read at the next byte, which the caller refuses.
fn count(bytes: &[u8], at: usize) -> Option<(FlatValue, usize)> {
    let digits = bytes[at..]
        .iter()
        .position(|byte| !byte.is_ascii_digit())
        .unwrap_or(bytes.len() - at);
    if digits > 1 && bytes[at] == b'0' {
        return None;
    }
    let mut value: u64 = 0;
    for &digit in &bytes[at..at + digits] {
        value = value
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    Some((FlatValue::Count(value), at + digits))
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(object: &[u8]) -> Option<(Vec<(String, FlatValue)>, usize)> {
        let mut seen = Vec::new();
        let taken = read_object(object, &mut |key, value| {
            seen.push((String::from_utf8(key.to_vec()).unwrap(), value));
            true
        })?;
        Some((seen, taken))
    }

    #[test]
    fn plain_objects_are_read_member_by_member() {
        let (seen, taken) =
            members(br#" { "a" : 5 ,"b":null, "c":"x", "d":{"e":0,"f":"g"} ,"h":0}, rest"#)
                .unwrap();
        assert_eq!(
            seen,
            [
                ("a".to_owned(), FlatValue::Count(5)),
                ("b".to_owned(), FlatValue::Null),
                ("c".to_owned(), FlatValue::Skipped),
                ("d".to_owned(), FlatValue::Skipped),
                ("h".to_owned(), FlatValue::Count(0)),
            ]
        );
        assert_eq!(taken, 58);
        assert_eq!(members(b"{}").unwrap(), (vec![], 2));
        assert_eq!(
            members(br#"{"n":18446744073709551615}"#).unwrap().0[0].1,
            FlatValue::Count(u64::MAX)
        );
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        for object in [
            &br#"{"a":5.0}"#[..],
            br#"{"a":5e3}"#,
            br#"{"a":-5}"#,
            br#"{"a":05}"#,
            br#"{"a":18446744073709551616}"#,
            br#"{"a":true}"#,
            br#"{"a":[1]}"#,
            br#"{"a\"b":1}"#,
            br#"{"a":"x\"y"}"#,
            br#"{"a":{"b":{"c":1}}}"#,
            br#"{"a":1,}"#,
            br#"{"a":1"#,
            br#"{"a" 1}"#,
            br#"{a:1}"#,
            br#"{"a":nul}"#,
            b"",
            b"[]",
        ] {
            assert_eq!(members(object), None, "{}", String::from_utf8_lossy(object));
        }
    }

    #[test]
    fn a_refused_member_refuses_the_object() {
        let refused = read_object(br#"{"a":1,"b":2}"#, &mut |key, _| key != b"b");
        assert_eq!(refused, None);
    }
}
