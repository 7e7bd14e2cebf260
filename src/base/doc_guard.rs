//! Shape limits for configuration documents a client, an operator or a peer can hand the router
//! (policy YAML from files and `/admin/policy*`, `auth.yaml`, the sibling map, every admin request
//! body), checked before the document is parsed, and the one place those documents are parsed
//! ([`from_yaml`], [`from_json`]).
//!
//! Why: the YAML parser (`yaml_serde` over `libyaml-rs`) spends time proportional to the flow
//! nesting depth on every token, so `shed_if: [[[[…]]]]` 60 000 levels deep (117 KiB) took 11 s
//! of a thread, and an alias-heavy document of 350 KiB expanded to more than 24 GB. Both are
//! refused here in time linear in the document's length, before the parser sees them.
//!
//! Owns: [`NESTING_DEPTH_MAX`] (collections inside collections, block and flow together) and
//! [`YAML_EXPANDED_NODES_MAX`] (nodes after aliases are expanded). Must not: allocate in
//! proportion to the input (the scanners keep a stack bounded by the limit), read files, or log.
//!
//! # Architecture
//! [`yaml_depth_exceeds`] is a tokenizer that follows libyaml's own scanner (`scanner.c`:
//! `fetch_next_token`, simple keys, `roll_indent`/`unroll_indent`, plain, quoted and block
//! scalars) closely enough to know, for every `[`, `{`, block sequence or block mapping, whether
//! libyaml opens a collection there, so a `[` inside a quoted or plain scalar is not counted and
//! one outside is never missed. Where libyaml reports an error and stops, this scanner carries on
//! (scanning more than libyaml ever will can only refuse a document libyaml would refuse anyway).
//! JSON needs no such care: [`json_depth_exceeds`] tracks strings and brackets.
//!
//! # Invariants
//! - The depth counted at any point is at least the nesting depth libyaml has reached there (the
//!   proptest below checks it against `yaml_serde` for generated documents in every style).
//! - A document under the limits reaches the parser unchanged.
//!
//! # Error handling
//! [`ShapeError`] names the limit and the line; [`DocError`] is a parse error or a shape error, with
//! the parser's message and line.
//!
//! # Performance
//! One pass over the bytes, no allocation beyond the bounded indentation stack; the alias expansion
//! count runs only for documents that contain an alias.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, Visitor};

mod yaml_scan;
use yaml_scan::YamlScan;

/// Most collections nested inside each other in one document: block mappings and sequences plus
/// flow `[…]`/`{…}`. Real policies and key files use fewer than ten; `yaml_serde` itself stops at
/// 128, but only after its tokenizer has spent time quadratic in the depth.
pub const NESTING_DEPTH_MAX: usize = 64;

/// Most nodes (scalars and collections) a YAML document may have once its aliases (`*name`) are
/// expanded; checked only for documents that contain an alias. A million nodes take about 0.1 s
/// to walk.
pub const YAML_EXPANDED_NODES_MAX: usize = 1_000_000;

/// Why a document was refused before parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("nesting deeper than {limit} levels (line {line})")]
    TooDeep { limit: usize, line: usize },
    #[error("YAML aliases expand to more than {limit} nodes")]
    TooManyNodes { limit: usize },
}

/// Why a document could not be turned into its type: its shape, or the parser's verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DocError {
    pub message: String,
    /// 1-based, when known.
    pub line: Option<usize>,
}

impl From<ShapeError> for DocError {
    fn from(error: ShapeError) -> DocError {
        let line = match error {
            ShapeError::TooDeep { line, .. } => Some(line),
            ShapeError::TooManyNodes { .. } => None,
        };
        DocError {
            message: error.to_string(),
            line,
        }
    }
}

/// Checks `text`'s shape, then parses it as YAML (JSON is YAML too).
pub fn from_yaml<T: DeserializeOwned>(text: &str) -> Result<T, DocError> {
    check_yaml(text)?;
    yaml_serde::from_str(text).map_err(|error| DocError {
        line: error.location().map(|location| location.line()),
        message: error.to_string(),
    })
}

/// Checks `body`'s shape, then parses it as JSON.
pub fn from_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, DocError> {
    check_json(body)?;
    serde_json::from_slice(body).map_err(|error| DocError {
        line: Some(error.line()),
        message: error.to_string(),
    })
}

/// The YAML limits: nesting depth, then (when the text has an alias) the expanded node count.
pub fn check_yaml(text: &str) -> Result<(), ShapeError> {
    let scan = YamlScan::run(text.as_bytes(), NESTING_DEPTH_MAX);
    if let Some(line) = scan.too_deep_at {
        return Err(ShapeError::TooDeep {
            limit: NESTING_DEPTH_MAX,
            line,
        });
    }
    if scan.aliases > 0 && expanded_nodes_exceed(text, YAML_EXPANDED_NODES_MAX) {
        return Err(ShapeError::TooManyNodes {
            limit: YAML_EXPANDED_NODES_MAX,
        });
    }
    Ok(())
}

/// The JSON nesting limit.
pub fn check_json(body: &[u8]) -> Result<(), ShapeError> {
    match json_depth_exceeds(body, NESTING_DEPTH_MAX) {
        Some(line) => Err(ShapeError::TooDeep {
            limit: NESTING_DEPTH_MAX,
            line,
        }),
        None => Ok(()),
    }
}

/// The 1-based line where JSON `body` first nests deeper than `limit`, if it does. Brackets inside
/// strings do not count; malformed JSON is scanned as far as it goes (the parser refuses it).
pub fn json_depth_exceeds(body: &[u8], limit: usize) -> Option<usize> {
    let (mut depth, mut line) = (0usize, 1usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in body {
        if byte == b'\n' {
            line += 1;
        }
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// The 1-based line where YAML `text` first nests deeper than `limit`, if it does.
pub fn yaml_depth_exceeds(text: &str, limit: usize) -> Option<usize> {
    YamlScan::run(text.as_bytes(), limit).too_deep_at
}

/// The deepest nesting in YAML `text` as libyaml will see it.
pub fn yaml_depth(text: &str) -> usize {
    YamlScan::run(text.as_bytes(), usize::MAX).max_depth
}

// ---------------------------------------------------------------------------------------------
// Alias expansion: walk the document as the parser will, counting nodes, and stop at the limit.

/// Whether `text`, with its aliases expanded, has more than `limit` nodes. A document the parser
/// refuses for another reason counts as within the limit (the real parse reports that reason).
fn expanded_nodes_exceed(text: &str, limit: usize) -> bool {
    let left = Cell::new(limit);
    let counted = NodeCounter { left: &left }.deserialize(yaml_serde::Deserializer::from_str(text));
    counted.is_err() && left.get() == 0
}

/// Counts every node it is shown, failing once `left` reaches zero.
#[derive(Clone, Copy)]
struct NodeCounter<'a> {
    left: &'a Cell<usize>,
}

impl NodeCounter<'_> {
    fn take<E: serde::de::Error>(self) -> Result<(), E> {
        match self.left.get() {
            0 => Err(E::custom("too many nodes")),
            left => {
                self.left.set(left - 1);
                Ok(())
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for NodeCounter<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeCounter<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any YAML node")
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.take()
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.take()
    }

    fn visit_i128<E: serde::de::Error>(self, _: i128) -> Result<(), E> {
        self.take()
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.take()
    }

    fn visit_u128<E: serde::de::Error>(self, _: u128) -> Result<(), E> {
        self.take()
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.take()
    }

    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
        self.take()
    }

    fn visit_bytes<E: serde::de::Error>(self, _: &[u8]) -> Result<(), E> {
        self.take()
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.take()
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.take()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.deserialize(deserializer)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.take()?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use serde::de::VariantAccess;
        self.take()?;
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests;
