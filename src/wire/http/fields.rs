//! The inference-request body fields the router acts on, read in one validating pass.
//!
//! Owns the reading of `model`, `stream`, `stream_options.include_usage`, `max_tokens` and
//! `max_completion_tokens` from an OpenAI- or Anthropic-style JSON body, and the one rewrite the
//! router makes to a body: asking a streaming backend to report usage. The same pass measures the
//! prompt (`messages`, `system`, `tools`) into a [`PromptShape`] by the rules of
//! [`super::prompt`], which never refuse a body for the shape of those values.
//!
//! Invariants:
//! - A body that passes [`extract_fields`] is a syntactically valid JSON object (serde_json reads
//!   the whole document, skipping unknown fields without building them).
//! - `model` is non-empty and at most [`MODEL_CHARS_MAX`] characters; it borrows from the body
//!   unless it contained escapes.
//! - Prompt strings the shape counts are decoded, so they must be valid UTF-8 without lone
//!   surrogate escapes; other skipped strings are only checked as JSON (see [`super::prompt`]).
//! - `stream_options`, when present, is UTF-8 throughout (its unknown members are captured as raw
//!   JSON, which checks it), so [`request_with_include_usage`] can always find it again.
//! - [`request_with_include_usage`] changes nothing but `stream_options`: every other byte of the
//!   body goes upstream as sent.

use std::borrow::Cow;

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use thiserror::Error;

pub use super::prompt::PromptShape;
use super::prompt::{self, MessagesShape, SystemShape};

/// Longest accepted model name, in characters.
pub const MODEL_CHARS_MAX: usize = 256;

#[derive(Debug, Error)]
pub enum FieldsError {
    #[error("request body is empty")]
    EmptyBody,
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(serde_json::Error),
    #[error("request body is not a JSON object")]
    NotAnObject,
    /// Valid JSON, but a known field has the wrong type (or appears twice).
    #[error("request body has an invalid field: {0}")]
    InvalidField(serde_json::Error),
    #[error("model field is required")]
    ModelMissing,
    #[error("model field is empty")]
    ModelEmpty,
    #[error("model field is longer than 256 characters")]
    ModelTooLong,
}

/// The fields of one request body. Borrows from the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFields<'a> {
    pub model: Cow<'a, str>,
    /// `stream`, false when absent or null.
    pub stream: bool,
    /// `stream_options.include_usage` as sent; `None` when absent or null.
    pub include_usage: Option<bool>,
    /// Whether a `stream_options` key is present at all (even `null`), which decides how
    /// [`request_with_include_usage`] may rewrite the body.
    pub stream_options_present: bool,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    /// What the prompt is made of, for the input estimate.
    pub prompt: PromptShape,
}

/// The fields as read, before the model checks. `None` means absent; the inner `Option` of the
/// scalar fields is `None` for JSON `null`.
#[derive(Default)]
struct RawFields<'a> {
    model: Option<Option<ModelName<'a>>>,
    stream: Option<Option<bool>>,
    stream_options: Option<Option<RawStreamOptions>>,
    max_tokens: Option<Option<i64>>,
    max_completion_tokens: Option<Option<i64>>,
    messages: MessagesShape,
    system: SystemShape,
    tools: Option<&'a RawValue>,
}

/// Top-level keys, matched without allocating.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum FieldKey {
    Model,
    Stream,
    StreamOptions,
    MaxTokens,
    MaxCompletionTokens,
    Messages,
    System,
    Tools,
    #[serde(other)]
    Other,
}

/// By hand rather than derived so that the prompt values (`messages`, `system`, `tools`) may
/// repeat (the last one counts, as backends parse it), while a repeated router field stays a
/// `duplicate field` error exactly as the derived reader reported it.
impl<'de> Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = RawFields<'de>;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a request body object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawFields<'de>, A::Error> {
                let mut raw = RawFields::default();
                while let Some(key) = map.next_key::<FieldKey>()? {
                    match key {
                        FieldKey::Model => once(&mut map, &mut raw.model, "model")?,
                        FieldKey::Stream => once(&mut map, &mut raw.stream, "stream")?,
                        FieldKey::StreamOptions => {
                            once(&mut map, &mut raw.stream_options, "stream_options")?
                        }
                        FieldKey::MaxTokens => once(&mut map, &mut raw.max_tokens, "max_tokens")?,
                        FieldKey::MaxCompletionTokens => once(
                            &mut map,
                            &mut raw.max_completion_tokens,
                            "max_completion_tokens",
                        )?,
                        FieldKey::Messages => raw.messages = map.next_value()?,
                        FieldKey::System => raw.system = map.next_value()?,
                        FieldKey::Tools => raw.tools = map.next_value()?,
                        FieldKey::Other => map.next_value::<IgnoredAny>().map(drop)?,
                    }
                }
                Ok(raw)
            }
        }
        deserializer.deserialize_map(FieldsVisitor)
    }
}

/// Read a router field that may appear once.
fn once<'de, A, T>(map: &mut A, slot: &mut Option<T>, name: &'static str) -> Result<(), A::Error>
where
    A: MapAccess<'de>,
    T: Deserialize<'de>,
{
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// serde borrows a `Cow<str>` only when it is a field's direct type, not inside `Option`; this
/// newtype makes it direct.
#[derive(Deserialize)]
struct ModelName<'a>(#[serde(borrow)] Cow<'a, str>);

struct RawStreamOptions {
    include_usage: Option<bool>,
}

/// Matches keys without allocating them.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum OptionsKey {
    IncludeUsage,
    #[serde(other)]
    Other,
}

/// By hand because derived structs also accept JSON arrays, and `stream_options` must be an
/// object.
impl<'de> Deserialize<'de> for RawStreamOptions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OptionsVisitor;
        impl<'de> Visitor<'de> for OptionsVisitor {
            type Value = RawStreamOptions;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a stream_options object")
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawStreamOptions, A::Error> {
                let mut include_usage = None;
                while let Some(key) = map.next_key::<OptionsKey>()? {
                    match key {
                        OptionsKey::IncludeUsage => include_usage = map.next_value()?,
                        // Borrowed raw JSON rather than skipped: capturing it checks the value is
                        // UTF-8, so `request_with_include_usage` can always find this object again.
                        OptionsKey::Other => map.next_value::<&'de RawValue>().map(drop)?,
                    }
                }
                Ok(RawStreamOptions { include_usage })
            }
        }
        deserializer.deserialize_map(OptionsVisitor)
    }
}

/// Validate `body` as a JSON object and read the router's fields from it.
pub fn extract_fields(body: &[u8]) -> Result<RequestFields<'_>, FieldsError> {
    let Some(&first) = body.iter().find(|byte| !byte.is_ascii_whitespace()) else {
        return Err(FieldsError::EmptyBody);
    };
    if first != b'{' {
        // Derived structs also accept JSON arrays; refuse them here. Telling "not JSON" from
        // "not an object" costs a second parse, but only on this rejection path.
        return Err(match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) => FieldsError::NotAnObject,
            Err(error) => FieldsError::MalformedJson(error),
        });
    }
    // A body that is UTF-8 throughout (nearly all) is checked once, here, and parsed as text:
    // the parser then borrows each string without checking it again. Any other body is parsed
    // as bytes, with the same answer: a string the router skips need not be UTF-8.
    let parsed = match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    };
    let raw: RawFields<'_> = parsed.map_err(|error| {
        if error.is_data() {
            FieldsError::InvalidField(error)
        } else {
            FieldsError::MalformedJson(error)
        }
    })?;
    let model = raw.model.flatten().ok_or(FieldsError::ModelMissing)?.0;
    if model.is_empty() {
        return Err(FieldsError::ModelEmpty);
    }
    // Bytes bound chars from above, so most names skip the count.
    if model.len() > MODEL_CHARS_MAX && model.chars().count() > MODEL_CHARS_MAX {
        return Err(FieldsError::ModelTooLong);
    }
    let stream_options_present = raw.stream_options.is_some();
    Ok(RequestFields {
        model,
        stream: raw.stream.flatten().unwrap_or(false),
        include_usage: raw
            .stream_options
            .flatten()
            .and_then(|options| options.include_usage),
        stream_options_present,
        max_tokens: raw.max_tokens.flatten(),
        max_completion_tokens: raw.max_completion_tokens.flatten(),
        prompt: prompt::shape(raw.messages, raw.system, raw.tools),
    })
}

const INCLUDE_USAGE_MEMBER: &[u8] = br#""stream_options":{"include_usage":true}"#;

/// The body to send upstream so a streaming backend reports usage, or `None` when `body` can go
/// as is (not streaming, or `include_usage` already true).
///
/// `body` and `fields` must come from the same successful [`extract_fields`] call.
pub fn request_with_include_usage(body: &[u8], fields: &RequestFields<'_>) -> Option<Vec<u8>> {
    if !fields.stream || fields.include_usage == Some(true) {
        return None;
    }
    if !fields.stream_options_present {
        // Splice the member in after the opening brace: no re-serialisation of a possibly large
        // prompt, and the rest of the body stays byte-identical.
        let open = body.iter().position(|&byte| byte == b'{')?;
        let after_open = &body[open + 1..];
        let object_is_empty = after_open
            .iter()
            .find(|byte| !byte.is_ascii_whitespace())
            .is_some_and(|&byte| byte == b'}');
        let mut rewritten = Vec::with_capacity(body.len() + INCLUDE_USAGE_MEMBER.len() + 1);
        rewritten.extend_from_slice(&body[..=open]);
        rewritten.extend_from_slice(INCLUDE_USAGE_MEMBER);
        if !object_is_empty {
            rewritten.push(b',');
        }
        rewritten.extend_from_slice(after_open);
        return Some(rewritten);
    }
    // stream_options exists (null, or an object maybe with other options): edit it in place.
    // Not through `serde_json::Value`: a body extract_fields accepted may still fail to parse as
    // one (invalid UTF-8 in a string it skipped, a number beyond f64, nesting past 128), and the
    // body would then go upstream without asking for usage.
    let options = stream_options_span(body)?;
    let options_text = std::str::from_utf8(&body[options.clone()]).ok()?;
    let mut rewritten = Vec::with_capacity(body.len() + INCLUDE_USAGE_OBJECT.len());
    rewritten.extend_from_slice(&body[..options.start]);
    if !options_text.starts_with('{') {
        // `null`, the one other value extract_fields accepts.
        rewritten.extend_from_slice(INCLUDE_USAGE_OBJECT);
    } else {
        let spans = include_usage_spans(options_text)?;
        if spans.is_empty() {
            let after_open = &options_text.as_bytes()[1..];
            let object_is_empty = after_open
                .iter()
                .find(|byte| !byte.is_ascii_whitespace())
                .is_some_and(|&byte| byte == b'}');
            rewritten.push(b'{');
            rewritten.extend_from_slice(INCLUDE_USAGE_MEMBER_IN_OPTIONS);
            if !object_is_empty {
                rewritten.push(b',');
            }
            rewritten.extend_from_slice(after_open);
        } else {
            // Every occurrence: a repeated include_usage counts its last one, as backends read it.
            let mut at = 0;
            for span in spans {
                rewritten.extend_from_slice(&options_text.as_bytes()[at..span.start]);
                rewritten.extend_from_slice(b"true");
                at = span.end;
            }
            rewritten.extend_from_slice(&options_text.as_bytes()[at..]);
        }
    }
    rewritten.extend_from_slice(&body[options.end..]);
    Some(rewritten)
}

const INCLUDE_USAGE_OBJECT: &[u8] = br#"{"include_usage":true}"#;
const INCLUDE_USAGE_MEMBER_IN_OPTIONS: &[u8] = br#""include_usage":true"#;

/// Where `part`, a slice of `whole`, lies in it.
fn span_in(whole: &str, part: &str) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    start..start + part.len()
}

/// The byte range of the top-level `stream_options` value in `body`, read as extract_fields
/// reads the body (other members skipped the same way), so it is found in any body that
/// extract_fields accepted with `stream_options` present.
fn stream_options_span(body: &[u8]) -> Option<std::ops::Range<usize>> {
    struct Finder;
    impl<'de> Visitor<'de> for Finder {
        type Value = Option<&'de RawValue>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            formatter.write_str("a request body object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<FieldKey>()? {
                match key {
                    FieldKey::StreamOptions => found = Some(map.next_value::<&'de RawValue>()?),
                    _ => map.next_value::<IgnoredAny>().map(drop)?,
                }
            }
            Ok(found)
        }
    }
    struct Found<'de>(Option<&'de RawValue>);
    impl<'de> Deserialize<'de> for Found<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_map(Finder).map(Found)
        }
    }
    let raw = serde_json::from_slice::<Found<'_>>(body).ok()?.0?;
    // `body` is UTF-8 where the raw value lies: serde_json checked it when capturing.
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    Some(start..start + raw.get().len())
}

/// The byte ranges, in a `stream_options` object's text, of every `include_usage` value.
fn include_usage_spans(options: &str) -> Option<Vec<std::ops::Range<usize>>> {
    struct SpansVisitor;
    impl<'de> Visitor<'de> for SpansVisitor {
        type Value = Vec<&'de RawValue>;

        fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
            formatter.write_str("a stream_options object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut values = Vec::new();
            while let Some(key) = map.next_key::<OptionsKey>()? {
                let value = map.next_value::<&'de RawValue>()?;
                if let OptionsKey::IncludeUsage = key {
                    values.push(value);
                }
            }
            Ok(values)
        }
    }
    struct Values<'de>(Vec<&'de RawValue>);
    impl<'de> Deserialize<'de> for Values<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_map(SpansVisitor).map(Values)
        }
    }
    let values = serde_json::from_str::<Values<'_>>(options).ok()?.0;
    Some(
        values
            .into_iter()
            .map(|value| span_in(options, value.get()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    //! Proves fields are read, defaulted and refused as documented, and that the include_usage
    //! rewrite yields valid JSON that asks for usage.
    use super::*;

    fn fields(body: &str) -> Result<RequestFields<'_>, FieldsError> {
        extract_fields(body.as_bytes())
    }

    #[test]
    fn reads_a_typical_chat_body() {
        let body = r#"{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi {\"model\":1}"}],
            "stream":true,"stream_options":{"include_usage":false,"other":1},"max_tokens":-5,
            "max_completion_tokens":200,"tools":[{"a":{"b":[1,2.5,null]}}]}"#;
        let fields = fields(body).unwrap();
        assert_eq!(fields.model, "llama-3.1-8b");
        assert!(matches!(fields.model, Cow::Borrowed(_)));
        assert!(fields.stream);
        assert_eq!(fields.include_usage, Some(false));
        assert!(fields.stream_options_present);
        assert_eq!(fields.max_tokens, Some(-5));
        assert_eq!(fields.max_completion_tokens, Some(200));
    }

    #[test]
    fn defaults_and_nulls() {
        let fields =
            fields(r#" {"model":"m","stream":null,"stream_options":null,"max_tokens":null} "#)
                .unwrap();
        assert!(!fields.stream);
        assert_eq!(fields.include_usage, None);
        assert!(fields.stream_options_present);
        assert_eq!(fields.max_tokens, None);
        let minimal = extract_fields(br#"{"model":"m"}"#).unwrap();
        assert!(!minimal.stream_options_present);
        assert_eq!(minimal.max_completion_tokens, None);
    }

    #[test]
    fn escaped_model_is_owned_and_unescaped() {
        let fields = fields(r#"{"model":"org\/model-\u00e9"}"#).unwrap();
        assert_eq!(fields.model, "org/model-é");
        assert!(matches!(fields.model, Cow::Owned(_)));
    }

    #[test]
    fn empty_and_non_json_bodies() {
        assert!(matches!(fields(""), Err(FieldsError::EmptyBody)));
        assert!(matches!(fields(" \r\n\t"), Err(FieldsError::EmptyBody)));
        for body in [
            r#"{"model":"m""#,
            "{model:1}",
            "nope",
            r#"{"model":"m"} trailing"#,
            "[1,",
        ] {
            let error = fields(body).unwrap_err();
            assert!(
                matches!(error, FieldsError::MalformedJson(_)),
                "{body}: {error}"
            );
            assert!(
                error
                    .to_string()
                    .starts_with("request body is not valid JSON: ")
            );
        }
    }

    #[test]
    fn non_objects_are_refused() {
        for body in [r#"["model"]"#, "42", r#""model""#, "null", "[]"] {
            assert!(
                matches!(fields(body), Err(FieldsError::NotAnObject)),
                "{body}"
            );
        }
    }

    #[test]
    fn model_is_required_non_empty_and_bounded() {
        assert!(matches!(fields("{}"), Err(FieldsError::ModelMissing)));
        assert!(matches!(
            fields(r#"{"model":null}"#),
            Err(FieldsError::ModelMissing)
        ));
        assert_eq!(
            fields("{}").unwrap_err().to_string(),
            "model field is required"
        );
        assert!(matches!(
            fields(r#"{"model":""}"#),
            Err(FieldsError::ModelEmpty)
        ));
        let at_limit = format!(r#"{{"model":"{}"}}"#, "é".repeat(MODEL_CHARS_MAX));
        assert_eq!(
            fields(&at_limit).unwrap().model.chars().count(),
            MODEL_CHARS_MAX
        );
        let over = format!(r#"{{"model":"{}"}}"#, "a".repeat(MODEL_CHARS_MAX + 1));
        assert!(matches!(fields(&over), Err(FieldsError::ModelTooLong)));
    }

    #[test]
    fn wrong_types_are_invalid_fields() {
        for body in [
            r#"{"model":5}"#,
            r#"{"model":"m","stream":"true"}"#,
            r#"{"model":"m","max_tokens":1.5}"#,
            r#"{"model":"m","max_tokens":9223372036854775808}"#,
            r#"{"model":"m","stream_options":[]}"#,
            r#"{"model":"m","stream_options":{"include_usage":1}}"#,
            r#"{"model":"a","model":"b"}"#,
        ] {
            assert!(
                matches!(fields(body), Err(FieldsError::InvalidField(_))),
                "{body}"
            );
        }
    }

    fn rewrite(body: &str) -> Option<String> {
        let fields = extract_fields(body.as_bytes()).unwrap();
        request_with_include_usage(body.as_bytes(), &fields).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn include_usage_not_needed() {
        assert_eq!(rewrite(r#"{"model":"m"}"#), None);
        assert_eq!(rewrite(r#"{"model":"m","stream":false}"#), None);
        assert_eq!(
            rewrite(r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#),
            None
        );
    }

    #[test]
    fn include_usage_is_spliced_when_stream_options_is_absent() {
        assert_eq!(
            rewrite(" \n{\"model\":\"m\",\"stream\":true}").unwrap(),
            " \n{\"stream_options\":{\"include_usage\":true},\"model\":\"m\",\"stream\":true}"
        );
        let rewritten = rewrite(r#"{ "stream" : true , "model":"m"}"#).unwrap();
        let fields = extract_fields(rewritten.as_bytes()).unwrap();
        assert_eq!(fields.include_usage, Some(true));
        assert!(fields.stream);
    }

    #[test]
    fn splice_into_an_empty_object_has_no_trailing_comma() {
        let stream_fields = RequestFields {
            model: Cow::Borrowed("m"),
            stream: true,
            include_usage: None,
            stream_options_present: false,
            max_tokens: None,
            max_completion_tokens: None,
            prompt: PromptShape::default(),
        };
        let rewritten = request_with_include_usage(b"{ }", &stream_fields).unwrap();
        assert_eq!(rewritten, br#"{"stream_options":{"include_usage":true} }"#);
        serde_json::from_slice::<serde_json::Value>(&rewritten).unwrap();
    }

    #[test]
    fn include_usage_is_set_in_place_when_stream_options_exists() {
        for (body, expected) in [
            (
                r#"{"model":"m","stream":true,"stream_options":null}"#,
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options": { } }"#,
                r#"{"model":"m","stream":true,"stream_options": {"include_usage":true } }"#,
            ),
            (
                r#"{"stream_options":{"x":1},"model":"m","stream":true}"#,
                r#"{"stream_options":{"include_usage":true,"x":1},"model":"m","stream":true}"#,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}"#,
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"x":1}}"#,
            ),
            (
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":null}}"#,
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":true}}"#,
            ),
        ] {
            let rewritten = rewrite(body).unwrap();
            let value: serde_json::Value = serde_json::from_str(&rewritten).unwrap();
            assert_eq!(value["stream_options"]["include_usage"], true, "{body}");
            assert_eq!(
                rewritten.replace("{ }", "{}"),
                expected.replace("{ }", "{}")
            );
        }
    }

    /// Found by the `body_fields` fuzz target: a body with `stream_options` and a string that is
    /// not UTF-8 in a field the router skips went upstream without `include_usage`, because the
    /// rewrite re-parsed it as a `serde_json::Value`, which refuses it; the router then had no
    /// exact usage for the stream. The rewrite now edits `stream_options` in place.
    #[test]
    fn include_usage_is_set_when_a_skipped_field_would_not_parse_as_a_value() {
        let mut invalid_utf8 = br#"{"model":"m","stream":true,"messagex":""#.to_vec();
        invalid_utf8.extend_from_slice(&[0xe4; 12]);
        invalid_utf8.extend_from_slice(br#"","stream_options":{"include_usage":false}}"#);
        let deep = format!(
            r#"{{"x":{}{},"model":"m","stream":true,"stream_options":null}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let huge_number = br#"{"x":1e400,"model":"m","stream":true,"stream_options":{}}"#.to_vec();
        for body in [invalid_utf8, deep.into_bytes(), huge_number] {
            let found = extract_fields(&body).unwrap();
            let rewritten = request_with_include_usage(&body, &found)
                .expect("a streaming body without include_usage is rewritten");
            let again = extract_fields(&rewritten).unwrap();
            assert_eq!(again.include_usage, Some(true));
            assert_eq!(again.model, "m");
        }
    }

    /// `stream_options` must be UTF-8 throughout, or the rewrite could not find it again.
    #[test]
    fn stream_options_that_are_not_utf8_are_refused() {
        let mut body = br#"{"model":"m","stream":true,"stream_options":{"x":""#.to_vec();
        body.push(0xff);
        body.extend_from_slice(br#""}}"#);
        assert!(matches!(
            extract_fields(&body),
            Err(FieldsError::MalformedJson(_) | FieldsError::InvalidField(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(fields) = extract_fields(&body) {
                let _ = request_with_include_usage(&body, &fields);
            }
        }

        #[test]
        fn rewrite_always_yields_valid_json_with_include_usage(
            other in "[a-z]{0,8}",
            value in proptest::prelude::any::<i32>(),
            stream_options in proptest::option::of(proptest::prelude::any::<bool>()),
        ) {
            let options = match stream_options {
                Some(include) => format!(r#","stream_options":{{"include_usage":{include}}}"#),
                None => String::new(),
            };
            let body = format!(r#"{{"stream":true,"model":"m","{other}x":{value}{options}}}"#);
            let fields = extract_fields(body.as_bytes()).unwrap();
            match request_with_include_usage(body.as_bytes(), &fields) {
                Some(rewritten) => {
                    let again = extract_fields(&rewritten).unwrap();
                    proptest::prop_assert_eq!(again.include_usage, Some(true));
                    proptest::prop_assert_eq!(again.model, "m");
                }
                None => proptest::prop_assert_eq!(stream_options, Some(true)),
            }
        }
    }
}
