//! One router's usage for one sync round, as it travels through the store: a compact, versioned
//! binary encoding (seed `run-several-routers.md`, "How it works", step 1).
//!
//! Keys are named by their `KeyId` (derived from the key itself, the same on every router) and
//! models by name and capability, never by an index that only means something in one process.
//!
//! # Layout (version 1)
//! ```text
//! u8       version (1)
//! varint   router id length, then its UTF-8 bytes
//! varint   run (the router's start time, unix ms: tells a restarted router from its last run)
//! varint   admitted at (unix ms; a held-back batch keeps the time it was admitted)
//! varint   UTC day of the daily usage
//! varint   model count, then per model: u8 capability, varint name length, name bytes
//! varint   key count, then per key:
//!            u32 le  key id (hash-derived, so a varint would not be shorter)
//!            varint  bucket count, then per bucket:
//!              u8      tag: bits 0-1 kind (0 requests, 1 input tokens, 2 output tokens,
//!                      3 daily), bit 2 the bucket is a model's, bit 3 a day follows,
//!                      bits 4-7 the model index when below 15, else 15
//!              varint  model index (bit 2, and bits 4-7 are 15)
//!              varint  day (bit 3; only when it differs from the entry's day, at midnight)
//!              varint  amount
//! ```
//! A key whose owner's request and daily buckets were used costs 4 + 1 + 2 × (1 + amount) bytes:
//! about 10 bytes for one request of a few hundred tokens, 16 with B4 input and output token
//! rates too, where the seed's figure is 36.
//!
//! # Error handling
//! The store is shared with other routers, possibly of another version: [`Entry::decode`] refuses
//! an unknown version or a malformed entry with [`DecodeError`] and never panics; lengths are
//! checked against what is left before anything is allocated.

use std::fmt;

use crate::base::ids::{Capability, KeyId};
use crate::logic::limits::Day;

pub const VERSION: u8 = 1;

/// The most models and keys one entry may name; a bound on what decoding allocates.
const MODELS_MAX: usize = 1 << 16;
const KEYS_MAX: usize = 1 << 24;
const NAME_MAX: usize = 1024;

/// A model as routers name it to each other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName {
    pub name: Box<str>,
    pub capability: Capability,
}

/// One bucket of a key, with models as indexes into [`Entry::models`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bucket {
    Requests { model: Option<u32> },
    InputTokens { model: u32 },
    OutputTokens { model: u32 },
    Daily { model: Option<u32>, day: Day },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUsage {
    pub key: KeyId,
    pub buckets: Vec<(Bucket, u64)>,
}

/// One router's usage admitted in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub router: String,
    pub run: u64,
    pub admitted_at_unix_ms: u64,
    pub day: Day,
    pub models: Vec<ModelName>,
    pub keys: Vec<KeyUsage>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("usage entry version {0} is not supported (this router reads version {VERSION})")]
    Version(u8),
    #[error("usage entry is truncated")]
    Truncated,
    #[error("usage entry is malformed: {0}")]
    Malformed(&'static str),
}

const KIND_REQUESTS: u8 = 0;
const KIND_INPUT: u8 = 1;
const KIND_OUTPUT: u8 = 2;
const KIND_DAILY: u8 = 3;
const HAS_MODEL: u8 = 1 << 2;
const HAS_DAY: u8 = 1 << 3;
/// Model indexes below this ride in the tag's upper four bits.
const INLINE_MODELS: u32 = 15;

/// `value` in 7-bit groups, least significant first, the high bit saying more follow (also what
/// the store's scripts read: `store::scripts`, `pool_store::ROUND`).
pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub(super) fn put_str(out: &mut Vec<u8>, text: &str) {
    put_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

fn capability_code(capability: Capability) -> u8 {
    match capability {
        Capability::Llm => 0,
        Capability::Embedding => 1,
        Capability::Reranker => 2,
    }
}

impl Entry {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.keys.len() * 14);
        out.push(VERSION);
        put_str(&mut out, &self.router);
        put_varint(&mut out, self.run);
        put_varint(&mut out, self.admitted_at_unix_ms);
        put_varint(&mut out, u64::from(self.day.0));
        put_varint(&mut out, self.models.len() as u64);
        for model in &self.models {
            out.push(capability_code(model.capability));
            put_str(&mut out, &model.name);
        }
        put_varint(&mut out, self.keys.len() as u64);
        for key in &self.keys {
            out.extend_from_slice(&key.key.0.to_le_bytes());
            put_varint(&mut out, key.buckets.len() as u64);
            for (bucket, amount) in &key.buckets {
                let (kind, model, day) = match *bucket {
                    Bucket::Requests { model } => (KIND_REQUESTS, model, None),
                    Bucket::InputTokens { model } => (KIND_INPUT, Some(model), None),
                    Bucket::OutputTokens { model } => (KIND_OUTPUT, Some(model), None),
                    Bucket::Daily { model, day } => {
                        (KIND_DAILY, model, (day != self.day).then_some(day))
                    }
                };
                let mut tag = kind;
                if let Some(model) = model {
                    tag |= HAS_MODEL | ((model.min(INLINE_MODELS) as u8) << 4);
                }
                if day.is_some() {
                    tag |= HAS_DAY;
                }
                out.push(tag);
                if let Some(model) = model
                    && model >= INLINE_MODELS
                {
                    put_varint(&mut out, u64::from(model));
                }
                if let Some(day) = day {
                    put_varint(&mut out, u64::from(day.0));
                }
                put_varint(&mut out, *amount);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Entry, DecodeError> {
        let mut reader = Reader { bytes };
        let version = reader.byte()?;
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let router = reader.string()?;
        let run = reader.varint()?;
        let admitted_at_unix_ms = reader.varint()?;
        let day = Day(reader.u32_varint()?);
        let model_count = reader.count(MODELS_MAX, 2)?;
        let mut models = Vec::with_capacity(model_count);
        for _ in 0..model_count {
            let capability = match reader.byte()? {
                0 => Capability::Llm,
                1 => Capability::Embedding,
                2 => Capability::Reranker,
                _ => return Err(DecodeError::Malformed("unknown capability")),
            };
            let name = reader.string()?.into_boxed_str();
            models.push(ModelName { name, capability });
        }
        let model_index = |index: u64| -> Result<u32, DecodeError> {
            if index < models.len() as u64 {
                Ok(index as u32)
            } else {
                Err(DecodeError::Malformed("model index out of range"))
            }
        };
        let key_count = reader.count(KEYS_MAX, 5)?;
        let mut keys = Vec::with_capacity(key_count);
        for _ in 0..key_count {
            let key = KeyId(reader.u32_le()?);
            let bucket_count = reader.count(usize::MAX, 2)?;
            let mut buckets = Vec::with_capacity(bucket_count);
            for _ in 0..bucket_count {
                let tag = reader.byte()?;
                let inline = u32::from(tag >> 4);
                let model = if tag & HAS_MODEL == 0 {
                    if inline != 0 {
                        return Err(DecodeError::Malformed("model bits without a model"));
                    }
                    None
                } else if inline < INLINE_MODELS {
                    Some(model_index(u64::from(inline))?)
                } else {
                    Some(model_index(reader.varint()?)?)
                };
                let bucket_day = if tag & HAS_DAY != 0 {
                    Day(reader.u32_varint()?)
                } else {
                    day
                };
                let bucket = match (tag & 0b11, model) {
                    (KIND_REQUESTS, model) if tag & HAS_DAY == 0 => Bucket::Requests { model },
                    (KIND_INPUT, Some(model)) if tag & HAS_DAY == 0 => {
                        Bucket::InputTokens { model }
                    }
                    (KIND_OUTPUT, Some(model)) if tag & HAS_DAY == 0 => {
                        Bucket::OutputTokens { model }
                    }
                    (KIND_DAILY, model) => Bucket::Daily {
                        model,
                        day: bucket_day,
                    },
                    _ => return Err(DecodeError::Malformed("bucket kind and fields disagree")),
                };
                buckets.push((bucket, reader.varint()?));
            }
            keys.push(KeyUsage { key, buckets });
        }
        if !reader.bytes.is_empty() {
            return Err(DecodeError::Malformed("trailing bytes"));
        }
        Ok(Entry {
            router,
            run,
            admitted_at_unix_ms,
            day,
            models,
            keys,
        })
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.capability.as_str())
    }
}

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
}

impl Reader<'_> {
    pub(super) fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&first, rest) = self.bytes.split_first().ok_or(DecodeError::Truncated)?;
        self.bytes = rest;
        Ok(first)
    }

    pub(super) fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(DecodeError::Malformed("varint overflows 64 bits"));
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Malformed("varint longer than 10 bytes"))
    }

    fn u32_varint(&mut self) -> Result<u32, DecodeError> {
        u32::try_from(self.varint()?).map_err(|_| DecodeError::Malformed("value over 32 bits"))
    }

    pub(super) fn u32_le(&mut self) -> Result<u32, DecodeError> {
        if self.bytes.len() < 4 {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.bytes.split_at(4);
        self.bytes = rest;
        Ok(u32::from_le_bytes(head.try_into().expect("four bytes")))
    }

    /// A count of items each at least `min_item_bytes` long: more than the bytes left could hold
    /// is malformed, so a hostile count allocates nothing.
    pub(super) fn count(
        &mut self,
        max: usize,
        min_item_bytes: usize,
    ) -> Result<usize, DecodeError> {
        let count = self.varint()?;
        if count > max as u64 || count > (self.bytes.len() / min_item_bytes) as u64 {
            return Err(DecodeError::Malformed("count larger than the entry"));
        }
        Ok(count as usize)
    }

    pub(super) fn string(&mut self) -> Result<String, DecodeError> {
        let len = self.varint()?;
        if len > NAME_MAX as u64 || len > self.bytes.len() as u64 {
            return Err(DecodeError::Malformed("string longer than the entry"));
        }
        let (head, rest) = self.bytes.split_at(len as usize);
        self.bytes = rest;
        String::from_utf8(head.to_vec()).map_err(|_| DecodeError::Malformed("string is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MONDAY: Day = Day(20_000);

    fn entry(keys: Vec<KeyUsage>) -> Entry {
        Entry {
            router: "router-0".into(),
            run: 1_780_000_000_000,
            admitted_at_unix_ms: 1_780_000_123_456,
            day: MONDAY,
            models: vec![
                ModelName {
                    name: "llama-3-8b".into(),
                    capability: Capability::Llm,
                },
                ModelName {
                    name: "bge".into(),
                    capability: Capability::Embedding,
                },
            ],
            keys,
        }
    }

    #[test]
    fn every_bucket_kind_round_trips() {
        let original = entry(vec![
            KeyUsage {
                key: KeyId(0xdead_beef),
                buckets: vec![
                    (Bucket::Requests { model: None }, 3),
                    (Bucket::Requests { model: Some(1) }, 1),
                    (Bucket::InputTokens { model: 0 }, 1200),
                    (Bucket::OutputTokens { model: 0 }, 90_000),
                    (
                        Bucket::Daily {
                            model: None,
                            day: MONDAY,
                        },
                        1290,
                    ),
                    (
                        Bucket::Daily {
                            model: Some(1),
                            day: Day(MONDAY.0 - 1),
                        },
                        7,
                    ),
                ],
            },
            KeyUsage {
                key: KeyId(1),
                buckets: vec![(Bucket::Requests { model: None }, u64::MAX)],
            },
        ]);
        assert_eq!(Entry::decode(&original.encode()), Ok(original));
    }

    /// The size target of a round: at 1,000 requests per second per router, each on its own key,
    /// a round is at most 18 KB (the seed's figure is about 36 KB).
    #[test]
    fn a_round_of_a_thousand_keys_fits_in_eighteen_kilobytes() {
        let keys = (0..1000u32)
            .map(|index| KeyUsage {
                key: KeyId(index.wrapping_mul(2_654_435_761)),
                buckets: vec![
                    (Bucket::Requests { model: None }, 1),
                    (Bucket::InputTokens { model: 0 }, 900),
                    (Bucket::OutputTokens { model: 0 }, 300),
                    (
                        Bucket::Daily {
                            model: None,
                            day: MONDAY,
                        },
                        1200,
                    ),
                ],
            })
            .collect();
        let size = entry(keys).encode().len();
        assert!(size <= 18_000, "{size} bytes");
    }

    #[test]
    fn model_indexes_past_the_tag_round_trip() {
        let mut original = entry(Vec::new());
        original.models = (0..40)
            .map(|index| ModelName {
                name: format!("model-{index}").into(),
                capability: Capability::Llm,
            })
            .collect();
        original.keys = vec![KeyUsage {
            key: KeyId(9),
            buckets: (0..40)
                .map(|model| (Bucket::InputTokens { model }, u64::from(model)))
                .collect(),
        }];
        assert_eq!(Entry::decode(&original.encode()), Ok(original));
    }

    #[test]
    fn another_version_is_refused() {
        let mut bytes = entry(Vec::new()).encode();
        bytes[0] = 2;
        assert_eq!(Entry::decode(&bytes), Err(DecodeError::Version(2)));
    }

    #[test]
    fn a_model_index_out_of_range_is_refused() {
        let original = entry(vec![KeyUsage {
            key: KeyId(5),
            buckets: vec![(Bucket::InputTokens { model: 9 }, 1)],
        }]);
        assert!(matches!(
            Entry::decode(&original.encode()),
            Err(DecodeError::Malformed(_))
        ));
    }

    proptest! {
        /// Whatever the store hands back, decoding returns an error or an entry, never panics,
        /// and never allocates beyond what the bytes could describe.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Entry::decode(&bytes);
        }

        #[test]
        fn truncating_an_entry_is_an_error(cut in 0usize..60) {
            let bytes = entry(vec![KeyUsage {
                key: KeyId(77),
                buckets: vec![(Bucket::Requests { model: Some(0) }, 300)],
            }])
            .encode();
            let cut = cut.min(bytes.len() - 1);
            prop_assert!(Entry::decode(&bytes[..cut]).is_err());
        }

        #[test]
        fn amounts_and_ids_round_trip(key in any::<u32>(), amount in any::<u64>(), day in 0u32..100_000) {
            let original = Entry {
                day: Day(day),
                ..entry(vec![KeyUsage {
                    key: KeyId(key),
                    buckets: vec![(Bucket::Daily { model: None, day: Day(day) }, amount)],
                }])
            };
            prop_assert_eq!(Entry::decode(&original.encode()), Ok(original));
        }
    }
}
