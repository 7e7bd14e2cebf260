//! The raw JSON of a request's prompt, part by part, for `prefix-aware` routing
//! (`logic::routing::prefix::chain`): the Anthropic `system`, the `tools`, the chat `messages`
//! and the completions `prompt`, each as the client sent it, in the order chat templates render
//! them.
//!
//! Read only for a model whose policy ranks by prefix, after the fields pass (`super::fields`)
//! has validated the body, which that pass cannot do for it: it measures the prompt and keeps
//! no span of it, and it runs before the model (and so its policy) is known. So this is not a
//! parser but a skim of the body's top level: string contents are skipped with `memchr` (a
//! prompt is nearly all strings), a nested value by counting brackets outside strings, and only
//! the top-level keys are compared. On an 8 KB chat it costs 0.31 of the fields pass
//! (`benches/prefix.rs`, 0.62 against 1.98 µs); the `serde_json` pass borrowing the parts as raw
//! values that it replaced cost 0.87 of it.
//!
//! A part given twice is the last one, as the fields pass and backends read it; a `null` part
//! is none, as a template renders it. A key written
//! with escapes (`"m\u0065ssages"`) is not recognised: that part is then missing and the request
//! ranks on the rest, or least-loaded. A body that does not skim as a JSON object yields no
//! parts; nothing here panics or reads past the body, whatever the bytes.

/// The prompt's parts as sent; a part the body lacks is empty.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PromptParts<'a> {
    system: &'a [u8],
    tools: &'a [u8],
    messages: &'a [u8],
    prompt: &'a [u8],
}

impl<'a> PromptParts<'a> {
    /// The parts of `body`, or none when it does not skim as a JSON object.
    pub fn of(body: &'a [u8]) -> PromptParts<'a> {
        Skim { body }.parts().unwrap_or_default()
    }

    /// Each part's bytes, in template order.
    pub fn bytes(&self) -> [&'a [u8]; 4] {
        [self.system, self.tools, self.messages, self.prompt]
    }
}

/// The top-level skim of one body. Each step returns the index after what it read, or `None`
/// where the body stops making sense (or ends).
struct Skim<'a> {
    body: &'a [u8],
}

impl<'a> Skim<'a> {
    fn parts(&self) -> Option<PromptParts<'a>> {
        let mut parts = PromptParts::default();
        let mut at = self.expect(self.blank(0), b'{')?;
        at = self.blank(at);
        if self.byte(at)? == b'}' {
            return Some(parts);
        }
        loop {
            let key_start = self.expect(at, b'"')?;
            let key_end = self.string_end(key_start)?;
            let key = &self.body[key_start..key_end];
            let value_start = self.blank(self.expect(self.blank(key_end + 1), b':')?);
            let value_end = self.value_end(value_start)?;
            // `null` is no part, as a template renders it.
            let value = match &self.body[value_start..value_end] {
                b"null" => &[][..],
                value => value,
            };
            match key {
                b"system" => parts.system = value,
                b"tools" => parts.tools = value,
                b"messages" => parts.messages = value,
                b"prompt" => parts.prompt = value,
                _ => {}
            }
            at = self.blank(value_end);
            match self.byte(at)? {
                b',' => at = self.blank(at + 1),
                b'}' => return Some(parts),
                _ => return None,
            }
        }
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.body.get(at).copied()
    }

    /// The index after `expected` at `at`.
    fn expect(&self, at: usize, expected: u8) -> Option<usize> {
        (self.byte(at)? == expected).then_some(at + 1)
    }

    /// The first index at or after `at` that is not JSON whitespace.
    fn blank(&self, mut at: usize) -> usize {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.byte(at) {
            at += 1;
        }
        at
    }

    /// The index of the quote that closes the string whose contents start at `at`.
    fn string_end(&self, mut at: usize) -> Option<usize> {
        loop {
            let found = at + memchr::memchr2(b'"', b'\\', self.body.get(at..)?)?;
            if self.body[found] == b'"' {
                return Some(found);
            }
            // An escape: the byte after the backslash is never the string's end.
            at = found + 2;
        }
    }

    /// The index after the value that starts at `at`.
    fn value_end(&self, at: usize) -> Option<usize> {
        match self.byte(at)? {
            b'"' => Some(self.string_end(at + 1)? + 1),
            b'{' | b'[' => self.container_end(at),
            _ => {
                // A number, `true`, `false` or `null`: up to the next delimiter.
                let rest = self.body.get(at..)?;
                let length = rest
                    .iter()
                    .position(|byte| {
                        matches!(byte, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                    })
                    .unwrap_or(rest.len());
                (length > 0).then_some(at + length)
            }
        }
    }

    /// The index after the object or array that opens at `at`: brackets counted outside
    /// strings, each string skipped whole.
    fn container_end(&self, mut at: usize) -> Option<usize> {
        let mut depth = 0usize;
        loop {
            match self.byte(at)? {
                b'"' => at = self.string_end(at + 1)? + 1,
                b'{' | b'[' => {
                    depth += 1;
                    at += 1;
                }
                b'}' | b']' => {
                    depth -= 1;
                    at += 1;
                    if depth == 0 {
                        return Some(at);
                    }
                }
                _ => at += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parts_come_in_template_order_as_sent() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,
            "tools":[ {"type":"function"} ],"system":"be brief","max_tokens":3}"#;
        let parts = PromptParts::of(body);
        assert_eq!(
            parts.bytes(),
            [
                &br#""be brief""#[..],
                br#"[ {"type":"function"} ]"#,
                br#"[{"role":"user","content":"hi"}]"#,
                b"",
            ]
        );
        let completion = PromptParts::of(br#"{"model":"m","prompt":"Once upon"}"#);
        assert_eq!(completion.bytes()[3], br#""Once upon""#);
    }

    #[test]
    fn a_body_that_does_not_read_has_no_parts() {
        for body in [
            &b""[..],
            b"not json",
            b"[1,2]",
            b" [\"system\", \"tools\", \"messages\"]",
            br#"{"messages":[1] "system":"x"}"#,
            br#"{"messages" [1]}"#,
            br#"{"messages":"ends\"}"#,
            br#"{"messages":[[}"#,
        ] {
            assert_eq!(PromptParts::of(body).bytes(), [&b""[..]; 4], "{body:?}");
        }
    }

    #[test]
    fn a_part_given_twice_is_the_last_and_an_escaped_key_is_not_read() {
        let parts = PromptParts::of(br#"{"messages":[1],"messages":[2],"m\u0065ssages":[3]}"#);
        assert_eq!(parts.bytes()[2], b"[2]");
        let parts = PromptParts::of(br#"{"messages":[" ] } \" \\",{"a":"}"}] , "prompt":-1.5e3}"#);
        assert_eq!(parts.bytes()[2], br#"[" ] } \" \\",{"a":"}"}]"#);
        assert_eq!(parts.bytes()[3], b"-1.5e3");
    }

    /// Any JSON value, nested, with strings that hold JSON's own delimiters and escapes.
    fn json() -> impl Strategy<Value = serde_json::Value> {
        fn text() -> impl Strategy<Value = String> {
            proptest::string::string_regex(r#"[ a-z"\\{}\[\]:,é\n]{0,12}"#).expect("regex")
        }
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |number| number.is_finite())
                .prop_map(serde_json::Value::from),
            text().prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("system".to_string()),
                        Just("messages".to_string()),
                        text()
                    ],
                    inner,
                    0..6
                )
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// serde_json's own reading of the parts' raw spans, the skim's reference.
    #[derive(Debug, Default, serde::Deserialize)]
    struct RawParts<'a> {
        #[serde(borrow, default)]
        system: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow, default)]
        tools: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow, default)]
        messages: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow, default)]
        prompt: Option<&'a serde_json::value::RawValue>,
    }

    proptest! {
        /// The skim finds exactly the spans serde_json finds, compact or pretty; every strict
        /// prefix of the body yields no parts, and no byte string panics it.
        #[test]
        fn the_skim_reads_the_spans_serde_reads(
            fields in proptest::collection::btree_map(
                prop_oneof![
                    Just("system".to_string()),
                    Just("tools".to_string()),
                    Just("messages".to_string()),
                    Just("prompt".to_string()),
                    Just("model".to_string()),
                    "[a-z]{1,6}",
                ],
                json(),
                0..7,
            ),
            pretty in any::<bool>(),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let object = serde_json::Value::Object(fields.into_iter().collect());
            let body = if pretty {
                serde_json::to_vec_pretty(&object)
            } else {
                serde_json::to_vec(&object)
            }
            .expect("serializes");
            let expected: RawParts<'_> = serde_json::from_slice(&body).expect("reads");
            let expected = [expected.system, expected.tools, expected.messages, expected.prompt]
                .map(|part| part.map_or(&b""[..], |raw| raw.get().as_bytes()));
            prop_assert_eq!(PromptParts::of(&body).bytes(), expected);
            for end in 0..body.len() {
                prop_assert_eq!(PromptParts::of(&body[..end]).bytes(), [&b""[..]; 4]);
            }
            let _ = PromptParts::of(&noise);
        }
    }
}
