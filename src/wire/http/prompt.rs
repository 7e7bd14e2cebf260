//! The shape of a chat prompt — text bytes, tool-schema bytes, message and image counts — read
//! during the one serde pass of [`super::fields::extract_fields`], for the learning input
//! estimate (seed `admission-control.md`, "One input estimate").
//!
//! Owns the counting rules below and the serde visitors that apply them. It must not fail a
//! request the backend might accept: every value it visits may have any JSON type, and a type it
//! does not expect counts nothing instead of refusing the body. It builds no `serde_json::Value`
//! and allocates nothing per message (strings are measured where serde_json hands them over,
//! raw JSON is borrowed as a `&RawValue` span of the body).
//!
//! # Counting rules
//! - **`messages`**: every element of the array is one message, whatever it holds (textless
//!   messages, `null` elements and non-objects included). In an object element, `content` is
//!   counted by the content rules and `tool_calls` (OpenAI assistant tool calls) by its raw JSON
//!   bytes, as text: chat templates render the calls into the prompt. Other message keys (`role`,
//!   `name`, `tool_call_id`, the legacy `function_call`) are not counted. A `messages` that is not
//!   an array counts nothing.
//! - **content** (a message's `content`, a block's nested `content`, the top-level `system`): a
//!   string counts its bytes; an array counts each element as a block; an object counts as one
//!   block; anything else counts nothing.
//! - **block**: a bare string counts its bytes. An object whose `type` is `"image_url"` (OpenAI)
//!   or `"image"` (Anthropic) is one image and none of its bytes are text. Any other object
//!   (`text`, untyped, `tool_use`, `tool_result`, types not known here) counts the bytes of its
//!   string `text` and `name`, the raw JSON bytes of its `input` (the `tool_use` arguments), and
//!   its nested `content` (a `tool_result`'s text and images) by the content rules. Its other
//!   keys are not counted: `source`, `image_url`, ids, `cache_control`, `thinking`/`signature`,
//!   audio and file payloads (none of them are byte-estimable text, or they are not re-sent to
//!   the model).
//! - **`system`** (Anthropic, top level): counted by the content rules, and one more message when
//!   it is a string, array or object, as chat templates render it as a turn of its own.
//! - **`tools`**: the raw byte length of the JSON value as sent (whitespace inside included),
//!   kept apart from the text in [`PromptShape::tools_bytes`]; `null` counts zero.
//!
//! Text bytes are UTF-8 bytes after JSON unescaping (`\n` is one byte, `\u00e9` two), which is
//! what a tokenizer reads. A key that appears twice among `messages`, `system` and `tools`
//! counts its last occurrence, as Python's `json` and most backends parse it.
//!
//! # Invariants
//! - Counts saturate; they never wrap and never panic.
//! - A body whose shape is unexpected yields smaller counts, never an error from this module. The
//!   only refusals counting adds to the fields pass are the ones serde_json makes when it decodes
//!   a string or number in a visited position: invalid UTF-8 or a lone surrogate escape in
//!   counted text, a number beyond `f64` (for example `1e400`) where a message, block or content
//!   is expected. Backends that decode strings as UTF-8 refuse those bodies too.
//! - Recursion follows only the counted path (content → block → a `tool_result`'s content →
//!   ...), and serde_json's nesting limit of 128 bounds it; anything else is skipped
//!   (`IgnoredAny`), iteratively and without a depth limit. So the one nesting refused is blocks
//!   nested about 60 `tool_result`s deep, which no API produces.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// What one request's prompt is made of, as far as bytes can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromptShape {
    /// Unescaped UTF-8 bytes of text in message content, `tool_calls`, and the Anthropic
    /// `system` (see the module's counting rules).
    pub text_bytes: u64,
    /// Raw bytes of the top-level `tools` JSON value.
    pub tools_bytes: u64,
    /// Chat turns: elements of `messages`, plus one for a top-level `system`.
    pub messages: u32,
    /// OpenAI `image_url` parts and Anthropic `image` blocks, anywhere in the content.
    pub images: u32,
}

impl PromptShape {
    /// Bytes the estimator reads as text: message text plus tool schemas (tool schemas become
    /// part of the model prompt; seed, "One input estimate").
    pub fn estimable_bytes(&self) -> u64 {
        self.text_bytes.saturating_add(self.tools_bytes)
    }
}

/// Text bytes and images found in one value.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    text_bytes: u64,
    images: u32,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.text_bytes = self.text_bytes.saturating_add(other.text_bytes);
        self.images = self.images.saturating_add(other.images);
    }

    fn add_text(&mut self, bytes: u64) {
        self.text_bytes = self.text_bytes.saturating_add(bytes);
    }
}

/// The `messages` value: its counts and the number of messages.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct MessagesShape {
    counts: Counts,
    messages: u32,
}

/// The `system` value: its counts, and whether it renders as a turn of its own.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SystemShape {
    counts: Counts,
    is_turn: bool,
}

/// Combine the three top-level values into the request's shape.
pub(crate) fn shape(
    messages: MessagesShape,
    system: SystemShape,
    tools: Option<&RawValue>,
) -> PromptShape {
    let mut counts = messages.counts;
    counts.add(system.counts);
    PromptShape {
        text_bytes: counts.text_bytes,
        tools_bytes: raw_len(tools),
        messages: messages.messages.saturating_add(u32::from(system.is_turn)),
        images: counts.images,
    }
}

fn raw_len(raw: Option<&RawValue>) -> u64 {
    raw.map_or(0, |raw| raw.get().len() as u64)
}

/// Skip the rest of an array or object we do not count inside.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The scalar methods every lenient visitor shares: a value of an unexpected scalar type counts
/// as the visitor's default (nothing).
macro_rules! scalars_count_nothing {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
}

impl<'de> Deserialize<'de> for MessagesShape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MessagesVisitor;
        impl<'de> Visitor<'de> for MessagesVisitor {
            type Value = MessagesShape;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a messages array")
            }

            scalars_count_nothing!();

            fn visit_str<E: de::Error>(self, _: &str) -> Result<MessagesShape, E> {
                Ok(MessagesShape::default())
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MessagesShape, A::Error> {
                let mut shape = MessagesShape::default();
                while let Some(Message(counts)) = seq.next_element()? {
                    shape.counts.add(counts);
                    shape.messages = shape.messages.saturating_add(1);
                }
                Ok(shape)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<MessagesShape, A::Error> {
                drain_map(map)?;
                Ok(MessagesShape::default())
            }
        }
        deserializer.deserialize_any(MessagesVisitor)
    }
}

impl<'de> Deserialize<'de> for SystemShape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let content = Content::deserialize(deserializer)?;
        Ok(SystemShape {
            counts: content.counts,
            is_turn: content.is_structured_or_text,
        })
    }
}

/// One element of `messages`.
#[derive(Default)]
struct Message(Counts);

/// Keys of a message, matched without allocating.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum MessageKey {
    Content,
    ToolCalls,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MessageVisitor;
        impl<'de> Visitor<'de> for MessageVisitor {
            type Value = Message;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a message")
            }

            scalars_count_nothing!();

            fn visit_str<E: de::Error>(self, _: &str) -> Result<Message, E> {
                Ok(Message::default())
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Message, A::Error> {
                drain_seq(seq)?;
                Ok(Message::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
                let mut counts = Counts::default();
                while let Some(key) = map.next_key::<MessageKey>()? {
                    match key {
                        MessageKey::Content => counts.add(map.next_value::<Content>()?.counts),
                        MessageKey::ToolCalls => {
                            counts.add_text(raw_len(map.next_value::<Option<&'de RawValue>>()?))
                        }
                        MessageKey::Other => map.next_value::<IgnoredAny>().map(drop)?,
                    }
                }
                Ok(Message(counts))
            }
        }
        deserializer.deserialize_any(MessageVisitor)
    }
}

/// A content value: a string, blocks, one block, or something that counts nothing.
#[derive(Default)]
struct Content {
    counts: Counts,
    /// A string, array or object (what the `system` rule calls a turn).
    is_structured_or_text: bool,
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("message content")
            }

            scalars_count_nothing!();

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Content, E> {
                Ok(Content {
                    counts: Counts {
                        text_bytes: text.len() as u64,
                        images: 0,
                    },
                    is_structured_or_text: true,
                })
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut counts = Counts::default();
                while let Some(Block(block)) = seq.next_element()? {
                    counts.add(block);
                }
                Ok(Content {
                    counts,
                    is_structured_or_text: true,
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content, A::Error> {
                Ok(Content {
                    counts: block_counts(map)?,
                    is_structured_or_text: true,
                })
            }
        }
        deserializer.deserialize_any(ContentVisitor)
    }
}

/// One element of a content array.
#[derive(Default)]
struct Block(Counts);

/// Keys of a content block, matched without allocating.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum BlockKey {
    Type,
    Text,
    Name,
    Input,
    Content,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BlockVisitor;
        impl<'de> Visitor<'de> for BlockVisitor {
            type Value = Block;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a content block")
            }

            scalars_count_nothing!();

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Block, E> {
                Ok(Block(Counts {
                    text_bytes: text.len() as u64,
                    images: 0,
                }))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Block, A::Error> {
                drain_seq(seq)?;
                Ok(Block::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Block, A::Error> {
                block_counts(map).map(Block)
            }
        }
        deserializer.deserialize_any(BlockVisitor)
    }
}

/// The counts of one block object (the block rule of the module docs). Keys may come in any
/// order, so the block's own counts are kept aside until its `type` is known.
fn block_counts<'de, A: MapAccess<'de>>(mut map: A) -> Result<Counts, A::Error> {
    let mut is_image = false;
    let mut counts = Counts::default();
    while let Some(key) = map.next_key::<BlockKey>()? {
        match key {
            BlockKey::Type => is_image = map.next_value::<BlockType>()?.is_image,
            BlockKey::Text | BlockKey::Name => counts.add_text(map.next_value::<TextBytes>()?.0),
            BlockKey::Input => counts.add_text(raw_len(map.next_value::<Option<&'de RawValue>>()?)),
            BlockKey::Content => counts.add(map.next_value::<Content>()?.counts),
            BlockKey::Other => map.next_value::<IgnoredAny>().map(drop)?,
        }
    }
    Ok(if is_image {
        Counts {
            text_bytes: 0,
            images: 1,
        }
    } else {
        counts
    })
}

/// A block's `type`; only the two image types matter.
#[derive(Default)]
struct BlockType {
    is_image: bool,
}

impl<'de> Deserialize<'de> for BlockType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TypeVisitor;
        impl<'de> Visitor<'de> for TypeVisitor {
            type Value = BlockType;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a block type")
            }

            scalars_count_nothing!();

            fn visit_str<E: de::Error>(self, kind: &str) -> Result<BlockType, E> {
                Ok(BlockType {
                    is_image: matches!(kind, "image" | "image_url"),
                })
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<BlockType, A::Error> {
                drain_seq(seq)?;
                Ok(BlockType::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<BlockType, A::Error> {
                drain_map(map)?;
                Ok(BlockType::default())
            }
        }
        deserializer.deserialize_any(TypeVisitor)
    }
}

/// Bytes of a string value; any other value counts zero.
#[derive(Default)]
struct TextBytes(u64);

impl<'de> Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = TextBytes;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a text string")
            }

            scalars_count_nothing!();

            fn visit_str<E: de::Error>(self, text: &str) -> Result<TextBytes, E> {
                Ok(TextBytes(text.len() as u64))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<TextBytes, A::Error> {
                drain_seq(seq)?;
                Ok(TextBytes::default())
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TextBytes, A::Error> {
                drain_map(map)?;
                Ok(TextBytes::default())
            }
        }
        deserializer.deserialize_any(TextVisitor)
    }
}

#[cfg(test)]
mod tests {
    //! Proves each counting rule on OpenAI and Anthropic bodies, that unexpected shapes count
    //! less but never fail the body, and that on tool-free text the counts are the ones the
    //! simulated engine bills (`sim::request::prompt_tokens`).
    use super::*;
    use crate::wire::http::fields::extract_fields;

    fn shape(body: &str) -> PromptShape {
        extract_fields(body.as_bytes())
            .unwrap_or_else(|error| panic!("{body}: {error}"))
            .prompt
    }

    #[test]
    fn openai_string_content_and_tools() {
        let tools = r#"[{"type":"function","function":{"name":"f","parameters":{}}}]"#;
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"abc"}},{{"role":"user","content":"hello"}}],"tools": {tools} }}"#
        );
        assert_eq!(
            shape(&body),
            PromptShape {
                text_bytes: 8,
                tools_bytes: tools.len() as u64,
                messages: 2,
                images: 0,
            }
        );
        assert_eq!(shape(&body).estimable_bytes(), 8 + tools.len() as u64);
    }

    #[test]
    fn text_is_counted_unescaped() {
        // `\n` is one byte, `\u00e9` two, a surrogate pair four, `\"` one.
        let body = r#"{"model":"m","messages":[{"content":"a\nb\u00e9\ud83d\ude00\""}]}"#;
        assert_eq!(shape(body).text_bytes, 1 + 1 + 1 + 2 + 4 + 1);
    }

    #[test]
    fn textless_messages_count_as_messages() {
        let body = r#"{"model":"m","messages":[{"role":"user"},{"role":"assistant","content":null},{"content":""},null,7,"x",[1]]}"#;
        assert_eq!(
            shape(body),
            PromptShape {
                messages: 7,
                ..PromptShape::default()
            }
        );
        assert_eq!(
            shape(r#"{"model":"m","messages":[]}"#),
            PromptShape::default()
        );
        assert_eq!(shape(r#"{"model":"m"}"#), PromptShape::default());
    }

    #[test]
    fn openai_parts_count_text_and_images_apart() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"describe"},
            {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"},"text":"ignored"},
            {"image_url":{"url":"https://x"},"type":"image_url"},
            {"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}"#;
        assert_eq!(
            shape(body),
            PromptShape {
                text_bytes: 8,
                tools_bytes: 0,
                messages: 1,
                images: 2,
            }
        );
    }

    #[test]
    fn openai_tool_calls_count_their_raw_json() {
        let calls =
            r#"[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]"#;
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"assistant","content":null,"tool_calls":{calls}}},{{"role":"tool","tool_call_id":"c1","content":"42"}}]}}"#
        );
        let shape = shape(&body);
        assert_eq!(shape.text_bytes, calls.len() as u64 + 2);
        assert_eq!(shape.messages, 2);
        let null_calls = r#"{"model":"m","messages":[{"tool_calls":null}]}"#;
        assert_eq!(super::tests::shape(null_calls).text_bytes, 0);
    }

    #[test]
    fn anthropic_system_is_text_and_a_turn() {
        let string =
            r#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            shape(string),
            PromptShape {
                text_bytes: 10,
                tools_bytes: 0,
                messages: 2,
                images: 0,
            }
        );
        let blocks = r#"{"model":"m","system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}},{"type":"text","text":"!"}],"messages":[]}"#;
        assert_eq!(shape(blocks).text_bytes, 9);
        assert_eq!(shape(blocks).messages, 1);
        let empty = r#"{"model":"m","system":""}"#;
        assert_eq!(shape(empty).messages, 1);
        for not_a_turn in [
            r#"{"model":"m","system":null}"#,
            r#"{"model":"m","system":3}"#,
        ] {
            assert_eq!(shape(not_a_turn), PromptShape::default(), "{not_a_turn}");
        }
    }

    #[test]
    fn anthropic_blocks_tool_use_tool_result_and_images() {
        let input = r#"{"city": "Paris"}"#;
        let body = format!(
            r#"{{"model":"m","max_tokens":5,"messages":[
            {{"role":"user","content":[{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}}},{{"type":"text","text":"what is this"}}]}},
            {{"role":"assistant","content":[{{"type":"thinking","thinking":"hmm","signature":"sig"}},{{"type":"tool_use","id":"t1","name":"weather","input":{input}}}]}},
            {{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t1","content":"sunny"}},
                {{"type":"tool_result","tool_use_id":"t2","is_error":false,"content":[{{"type":"text","text":"rain"}},{{"type":"image","source":{{}}}}]}}]}}]}}"#
        );
        assert_eq!(
            shape(&body),
            PromptShape {
                text_bytes: 12 + (7 + input.len() as u64) + 5 + 4,
                tools_bytes: 0,
                messages: 3,
                images: 2,
            }
        );
    }

    #[test]
    fn tools_are_raw_bytes_and_null_is_zero() {
        let body = "{\"model\":\"m\",\"tools\":  [ {\"a\" : 1} ]  }";
        assert_eq!(shape(body).tools_bytes, "[ {\"a\" : 1} ]".len() as u64);
        assert_eq!(shape(r#"{"model":"m","tools":null}"#).tools_bytes, 0);
        assert_eq!(shape(r#"{"model":"m","tools":"x"}"#).tools_bytes, 3);
    }

    #[test]
    fn repeated_prompt_keys_count_the_last_occurrence() {
        let body = r#"{"model":"m","messages":[{"content":"aaaa"}],"tools":[1],"messages":[{"content":"b"},{}],"tools":[22]}"#;
        assert_eq!(
            shape(body),
            PromptShape {
                text_bytes: 1,
                tools_bytes: 4,
                messages: 2,
                images: 0,
            }
        );
    }

    #[test]
    fn unexpected_shapes_count_less_but_never_fail() {
        for (body, expected) in [
            (
                r#"{"model":"m","messages":"hello"}"#,
                PromptShape::default(),
            ),
            (
                r#"{"model":"m","messages":{"content":"x"}}"#,
                PromptShape::default(),
            ),
            (r#"{"model":"m","messages":null}"#, PromptShape::default()),
            (
                r#"{"model":"m","messages":-1.5e300}"#,
                PromptShape::default(),
            ),
            (
                r#"{"model":"m","messages":[{"content":{"type":"text","text":"abc"}}]}"#,
                PromptShape {
                    text_bytes: 3,
                    messages: 1,
                    ..PromptShape::default()
                },
            ),
            (
                r#"{"model":"m","messages":[{"content":[null,true,1,["x"],"bare",{"type":5,"text":"ab"},{"type":["image"],"text":{"t":"x"}},{"text":"c","name":7}]}]}"#,
                PromptShape {
                    text_bytes: 4 + 2 + 1,
                    messages: 1,
                    ..PromptShape::default()
                },
            ),
            (
                r#"{"model":"m","messages":[{"content":false,"tool_calls":"xy"}]}"#,
                PromptShape {
                    text_bytes: 4,
                    messages: 1,
                    ..PromptShape::default()
                },
            ),
        ] {
            assert_eq!(shape(body), expected, "{body}");
        }
    }

    #[test]
    fn deep_nesting_is_skipped_or_bounded() {
        // Deep values outside the counted path are skipped without a depth limit.
        let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
        let body = format!(
            r#"{{"model":"m","messages":[{{"content":[{deep},{{"type":"text","text":"ab","x":{deep}}}]}}],"tools":{deep}}}"#
        );
        assert_eq!(shape(&body).text_bytes, 2);
        // Nested tool results are counted, 50 deep.
        let mut content = String::from(r#""abc""#);
        for _ in 0..50 {
            content = format!(r#"[{{"type":"tool_result","content":{content}}}]"#);
        }
        let body = format!(r#"{{"model":"m","messages":[{{"content":{content}}}]}}"#);
        assert_eq!(shape(&body).text_bytes, 3);
    }

    #[test]
    fn router_field_errors_are_unchanged() {
        use crate::wire::http::fields::FieldsError;
        for body in [
            r#"{"model":"a","messages":[],"model":"b"}"#,
            r#"{"model":"m","stream":1,"messages":[{"content":"x"}]}"#,
            r#"{"model":"m","max_tokens":1,"max_tokens":2}"#,
        ] {
            let error = extract_fields(body.as_bytes()).unwrap_err();
            assert!(
                matches!(error, FieldsError::InvalidField(_)),
                "{body}: {error}"
            );
        }
        let error = extract_fields(br#"{"model":"a","model":"b"}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "request body has an invalid field: duplicate field `model` at line 1 column 20"
        );
        // Syntax errors inside the prompt are still syntax errors.
        let error = extract_fields(br#"{"model":"m","messages":[{"content":"a"]}"#).unwrap_err();
        assert!(matches!(error, FieldsError::MalformedJson(_)), "{error}");
    }

    /// The simulated engine's own text and message counts of a tool-free body.
    fn sim_counts(body: &str) -> (u64, u64) {
        use crate::simulated_engine::request::MessagesRequest;
        let request: MessagesRequest<'_> = serde_json::from_str(body).unwrap();
        let text: u64 = request
            .messages
            .iter()
            .filter_map(|message| message.content.as_ref())
            .map(|content| content.text_bytes())
            .sum::<u64>()
            + request
                .system
                .as_ref()
                .map_or(0, |system| system.text_bytes());
        let messages = request.messages.len() as u64 + u64::from(request.system.is_some());
        (text, messages)
    }

    fn text_strategy() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[a-z \\n\"\\\\é€😀\u{7f}]{0,40}").unwrap()
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            text_strategy().prop_map(Value::String),
            prop_oneof![
                Just("text"),
                Just("image"),
                Just("image_url"),
                Just("tool_use")
            ]
            .prop_map(|kind| Value::String(kind.to_owned())),
        ];
        leaf.prop_recursive(5, 48, 6, |inner| {
            let key = prop_oneof![
                Just("content"),
                Just("type"),
                Just("text"),
                Just("name"),
                Just("input"),
                Just("tool_calls"),
                Just("image_url"),
                Just("role"),
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((key, inner), 0..6).prop_map(|entries| {
                    Value::Object(
                        entries
                            .into_iter()
                            .map(|(key, value)| (key.to_owned(), value))
                            .collect(),
                    )
                }),
            ]
        })
    }

    proptest::proptest! {
        /// On tool-free text (string content, text and image blocks, optional system), the shape
        /// measures exactly what the simulated engine bills for.
        #[test]
        fn text_and_turns_match_the_simulated_engine(
            messages in proptest::collection::vec(
                proptest::option::of(proptest::collection::vec(
                    (text_strategy(), proptest::prelude::any::<bool>()), 0..4)),
                0..6),
            plain in proptest::collection::vec(text_strategy(), 0..6),
            system in proptest::option::of(text_strategy()),
        ) {
            use serde_json::json;
            let mut rendered: Vec<serde_json::Value> = plain
                .iter()
                .map(|text| json!({"role": "user", "content": text}))
                .collect();
            for blocks in &messages {
                rendered.push(match blocks {
                    None => json!({"role": "assistant"}),
                    Some(blocks) => json!({"role": "user", "content": blocks
                        .iter()
                        .map(|(text, image)| if *image {
                            json!({"type": "image", "source": {"type": "base64", "data": text}})
                        } else {
                            json!({"type": "text", "text": text})
                        })
                        .collect::<Vec<_>>()}),
                });
            }
            let mut body = json!({"model": "m", "max_tokens": 8, "messages": rendered});
            if let Some(system) = &system {
                body["system"] = json!(system);
            }
            let body = body.to_string();
            let shape = shape(&body);
            let (text, turns) = sim_counts(&body);
            proptest::prop_assert_eq!(shape.text_bytes, text);
            proptest::prop_assert_eq!(u64::from(shape.messages), turns);
            let images = messages.iter().flatten().flatten().filter(|(_, image)| *image).count();
            proptest::prop_assert_eq!(shape.images as usize, images);
        }

        /// Whatever JSON sits in `messages`, `system` or `tools`, a body with a good model is
        /// accepted.
        #[test]
        fn any_prompt_shape_is_accepted(
            messages in json_value(),
            system in json_value(),
            tools in json_value(),
        ) {
            let body = serde_json::json!({
                "model": "m", "messages": messages, "system": system, "tools": tools,
            })
            .to_string();
            let fields = extract_fields(body.as_bytes());
            proptest::prop_assert!(fields.is_ok(), "{}: {:?}", body, fields.err());
        }
    }
}
