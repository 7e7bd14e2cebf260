//! The raw JSON of a request's prompt, part by part, for `prefix-aware` routing
//! (`logic::routing::prefix::chain`): the Anthropic `system`, the `tools`, the chat `messages`
//! and the completions `prompt`, each as the client sent it, in the order chat templates render
//! them.
//!
//! A second pass over the body, made only for a model whose policy ranks by prefix: the fields
//! pass (`super::fields`) measures the prompt's text and keeps no span of it. This one borrows
//! each part as a `&RawValue` (validated, not decoded) and skips every other key. A body it
//! cannot read yields no parts: the request is still served, ranked least-loaded.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The prompt's parts as sent; a part the body lacks is `None`.
#[derive(Debug, Default, Deserialize)]
pub struct PromptParts<'a> {
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
}

impl<'a> PromptParts<'a> {
    /// The parts of `body`, or none when it does not read as a JSON object (a key given twice
    /// included). Only an object: serde would read an array's elements as the fields in order.
    pub fn of(body: &'a [u8]) -> PromptParts<'a> {
        let is_object = body
            .iter()
            .find(|byte| !byte.is_ascii_whitespace())
            .is_some_and(|byte| *byte == b'{');
        if !is_object {
            return PromptParts::default();
        }
        serde_json::from_slice(body).unwrap_or_default()
    }

    /// Each part's bytes, in template order.
    pub fn bytes(&self) -> [&'a [u8]; 4] {
        [self.system, self.tools, self.messages, self.prompt]
            .map(|part| part.map_or(&[][..], |raw| raw.get().as_bytes()))
    }
}

#[cfg(test)]
mod tests {
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
            &b"not json"[..],
            b"[1,2]",
            b" [\"system\", \"tools\", \"messages\"]",
            br#"{"messages":[1],"messages":[2]}"#,
        ] {
            assert_eq!(PromptParts::of(body).bytes(), [&b""[..]; 4]);
        }
    }
}
