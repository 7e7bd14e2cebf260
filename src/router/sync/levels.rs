//! The site's level of each contended rate bucket, kept by the store (issue 33: views that drift
//! apart starve a router).
//!
//! Every router keeps each shared rate bucket in memory and subtracts the usage the others
//! publish. Those views drift apart: a restarted router rebuilds its view from a replay, usage
//! admitted by a router that crashed before publishing is in no view, refill credited to late
//! usage depends on the order it arrives in. While a bucket has room, that costs nothing; once
//! the site keeps it near empty, a router whose view is lower than the others' admits nothing
//! while they admit its part, and nothing brings the views back together while the load lasts
//! (the bucket never refills to its capacity, where views meet again).
//!
//! So the store keeps one level per contended bucket, in the round's usage script: the site's
//! level, refilled on the store's clock and lowered by every router's published usage as it is
//! written. A router whose view of a bucket is below half its capacity asks for it in its round
//! ([`Ask`]) and sets its view to what the store returns (`Bucket::anchor`), minus what it
//! admitted since. Every view of a contended bucket is then the same each round, whatever
//! happened before.
//!
//! # In the store
//! One hash, `hivenet:{site}:levels`; a field per bucket ([`field`]): `{key id}|{kind}|` for a
//! key's flat request rate, `{key id}|{kind}|{capability}|{model}` for a model's. The value is
//! `level,at,rate,capacity`: the level in units (`limits::bucket::UNITS_PER_TOKEN` a token) at
//! the store's time `at` (ms), refilling `rate` units a millisecond up to `capacity` units. A
//! bucket the hash has no field for is full: a field that refills to its capacity is removed,
//! a few random fields are checked each round and removed when full, and the whole hash
//! expires when no round touched it for two minutes. Beside it, `hivenet:{site}:levels:applied`
//! holds, per router, its run and the admission time of its newest batch the levels count: a
//! batch published again after a lost reply is not applied twice. While no bucket is tracked and
//! a round asks for none, the script reads only the entries' headers. A bucket is tracked from the first
//! round that asks for it; from then on every router's usage of it lowers it, asked or not.
//!
//! # What is not anchored
//! A round whose script did not run in the transaction of its read (the store had forgotten
//! the script, or its ACL refuses scripts) returns no levels; nor does one that did not read
//! the stream whole. A router that reads an entry written without the script (a router of the
//! version before, or one whose store user may not run scripts) stops anchoring for
//! [`UNLEVELLED_HOLD_MS`]: that router's usage is not in the levels.
//!
//! [`Levels`] is the script's model in Rust, for the site's simulation and for the test that
//! runs the script against a real Valkey and compares.

use std::collections::BTreeMap;

use crate::base::ids::KeyId;
use crate::logic::limits::bucket::{AnchorView, UNITS_PER_TOKEN};
use crate::router::sync::entry::{Bucket, Entry, ModelName};

/// How long a router does not anchor after it read an entry written without the script.
pub const UNLEVELLED_HOLD_MS: u64 = 120_000;

/// The levels hash's expiry, in seconds: two minutes untouched, every bucket in it is full.
pub const LEVELS_TTL_SECONDS: u64 = 120;

/// Fields the script checks at random each round, removed when full.
pub const SWEEP_FIELDS: u64 = 2;

const KIND_REQUESTS: u8 = 0;
const KIND_INPUT: u8 = 1;
const KIND_OUTPUT: u8 = 2;

/// A bucket's field in the levels hash: the key, the kind (0 requests, 1 input tokens, 2 output
/// tokens, as in the entry's tag) and, for a model's bucket, the model.
pub fn field(key: KeyId, kind: u8, model: Option<&ModelName>) -> String {
    match model {
        None => format!("{:08x}|{kind}|", key.0),
        Some(model) => format!(
            "{:08x}|{kind}|{}|{}",
            key.0,
            capability_code(model),
            model.name
        ),
    }
}

fn capability_code(model: &ModelName) -> u8 {
    match model.capability {
        crate::base::ids::Capability::Llm => 0,
        crate::base::ids::Capability::Embedding => 1,
        crate::base::ids::Capability::Reranker => 2,
    }
}

/// The kind and model of an entry's rate bucket; `None` for a daily one.
fn rate_bucket(bucket: Bucket) -> Option<(u8, Option<u32>)> {
    match bucket {
        Bucket::Requests { model } => Some((KIND_REQUESTS, model)),
        Bucket::InputTokens { model } => Some((KIND_INPUT, Some(model))),
        Bucket::OutputTokens { model } => Some((KIND_OUTPUT, Some(model))),
        Bucket::Daily { .. } => None,
    }
}

/// The kind (as [`Ask::kind`]) and model of a rate bucket; `None` for a daily budget.
pub fn kind_of(
    bucket: crate::logic::limits::BucketRef,
) -> Option<(u8, Option<crate::base::ids::ModelId>)> {
    use crate::logic::limits::BucketRef;
    match bucket {
        BucketRef::Requests { model } => Some((KIND_REQUESTS, model)),
        BucketRef::InputTokens { model } => Some((KIND_INPUT, Some(model))),
        BucketRef::OutputTokens { model } => Some((KIND_OUTPUT, Some(model))),
        BucketRef::Daily { .. } => None,
    }
}

/// The rate buckets `batches` used, by their field (what the script names the levels it
/// returns for a round's usage by). Models this router no longer knows by name are left out.
pub fn fields_of(
    batches: &[crate::router::sync::round::Batch],
    model_name: impl Fn(crate::base::ids::ModelId) -> Option<ModelName>,
) -> std::collections::HashMap<String, (KeyId, crate::logic::limits::BucketRef)> {
    let mut fields = std::collections::HashMap::new();
    for usage in batches.iter().flat_map(|batch| &batch.usage) {
        let Some((kind, model)) = kind_of(usage.bucket) else {
            continue;
        };
        let model = match model {
            None => None,
            Some(model) => match model_name(model) {
                Some(name) => Some(name),
                None => continue,
            },
        };
        fields.insert(
            field(usage.key, kind, model.as_ref()),
            (usage.key, usage.bucket),
        );
    }
    fields
}

/// The anchors a round's answers make: each ask's (`asked`, in order) with its level, then one
/// per tracked bucket the round used without asking, found by its field in `published`
/// ([`fields_of`] of the round's batches).
pub fn anchors(
    asked: Vec<crate::router::shard::owner::quotas::Anchor>,
    answers: Answers,
    published: &std::collections::HashMap<String, (KeyId, crate::logic::limits::BucketRef)>,
) -> Vec<crate::router::shard::owner::quotas::Anchor> {
    use crate::router::shard::owner::quotas::Anchor;
    asked
        .into_iter()
        .zip(answers.answers)
        .map(|(anchor, site_units)| Anchor {
            site_units,
            ..anchor
        })
        .chain(
            answers
                .published
                .into_iter()
                .filter_map(|(field, site_units)| {
                    let &(key, bucket) = published.get(&field)?;
                    Some(Anchor {
                        key,
                        bucket,
                        site_units,
                        lower_only: false,
                    })
                }),
        )
        .collect()
}

/// The rate usage of an entry by field, as the script reads it from the entry's bytes.
pub fn rate_usage(entry: &Entry) -> Vec<(String, u64)> {
    let mut usage = Vec::new();
    for key in &entry.keys {
        for &(bucket, amount) in &key.buckets {
            let Some((kind, model)) = rate_bucket(bucket) else {
                continue;
            };
            let model = model.and_then(|index| entry.models.get(index as usize));
            usage.push((field(key.key, kind, model), amount));
        }
    }
    usage
}

/// What `entries` used of the rate bucket `field`, in tokens.
fn unread_usage(entries: &[Entry], field: &str) -> u64 {
    entries
        .iter()
        .flat_map(rate_usage)
        .filter(|(used, _)| used == field)
        .map(|(_, amount)| amount)
        .fold(0, u64::saturating_add)
}

/// One bucket a round asks the store to anchor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub key: KeyId,
    /// 0 requests, 1 input tokens, 2 output tokens.
    pub kind: u8,
    pub model: Option<ModelName>,
    pub view: AnchorView,
}

impl Ask {
    pub fn field(&self) -> String {
        field(self.key, self.kind, self.model.as_ref())
    }
}

/// The asks as the script reads them: the models they name (`{capability}|{name}`), and one
/// blob of `u32 le key, u8 kind | has model << 2 | settled << 3, [varint model index], varint
/// rate, varint
/// capacity in tokens, varint zigzag level in units` per ask.
pub fn pack(asks: &[Ask]) -> (Vec<String>, Vec<u8>) {
    let mut models: Vec<String> = Vec::new();
    let mut blob = Vec::with_capacity(asks.len() * 12);
    for ask in asks {
        blob.extend_from_slice(&ask.key.0.to_le_bytes());
        let mut tag = ask.kind;
        if ask.model.is_some() {
            tag |= 1 << 2;
        }
        if ask.view.settled {
            tag |= 1 << 3;
        }
        blob.push(tag);
        if let Some(model) = &ask.model {
            let name = format!("{}|{}", capability_code(model), model.name);
            let index = match models.iter().position(|known| *known == name) {
                Some(index) => index,
                None => {
                    models.push(name);
                    models.len() - 1
                }
            };
            put_varint(&mut blob, index as u64);
        }
        put_varint(&mut blob, ask.view.rate_per_minute);
        put_varint(
            &mut blob,
            (ask.view.capacity_units / UNITS_PER_TOKEN).max(0) as u64,
        );
        let level = ask.view.level_units;
        put_varint(&mut blob, ((level << 1) ^ (level >> 63)) as u64);
    }
    (models, blob)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// One tracked bucket in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    pub units: i64,
    pub at_ms: u64,
    pub rate_per_minute: u64,
    pub capacity_units: i64,
}

impl Level {
    /// The level refilled up to `now_ms` (never back).
    pub fn at(&self, now_ms: u64) -> i64 {
        if self.units >= self.capacity_units || now_ms <= self.at_ms {
            return self.units;
        }
        let refill = (now_ms - self.at_ms).saturating_mul(self.rate_per_minute);
        let gap = (self.capacity_units - self.units) as u64;
        self.units + refill.min(gap) as i64
    }
}

/// What the round's script answers about levels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    /// One level per ask, in units, in order.
    pub answers: Vec<i64>,
    /// The tracked buckets the round's entries used without asking: (field, level in units).
    pub published: Vec<(String, i64)>,
}

/// The levels hash and what the round's script does with it, in Rust.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Levels {
    pub fields: BTreeMap<String, Level>,
    /// Per router (`hivenet:{site}:levels:applied`): what of its usage the levels count.
    pub applied: BTreeMap<String, Applied>,
}

/// What of one router's usage the levels count: the newest batch applied of its latest run, and
/// of the run before. A run publishes its predecessor's journal first, then its own batches,
/// and after a lost reply all of them again: with one mark, the journal's batches reset it to
/// the old run, the new run's were then applied again, and the site's level sank by everything
/// the round carried (issue 33, seed 229: 290 requests of 1,200; the rate unusable for 10 s
/// after healing). In the store: `run,at,previous run,previous at`, -1 for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub latest: (u64, u64),
    pub previous: Option<(u64, u64)>,
}

impl Applied {
    /// Whether the batch `run` admitted at `at` is counted already (published again).
    pub fn again(&self, run: u64, at: u64) -> bool {
        [Some(self.latest), self.previous]
            .into_iter()
            .flatten()
            .any(|(applied_run, applied_at)| applied_run == run && at <= applied_at)
    }

    /// The batch `run` admitted at `at` was just counted.
    pub fn note(&mut self, run: u64, at: u64) {
        if run != self.latest.0 {
            self.previous = Some(self.latest);
        }
        self.latest = (run, at);
    }

    /// The hash's value, as the script writes it.
    pub fn encode(&self) -> String {
        let (run, at) = self.latest;
        match self.previous {
            Some((previous_run, previous_at)) => format!("{run},{at},{previous_run},{previous_at}"),
            None => format!("{run},{at},-1,-1"),
        }
    }
}

impl Levels {
    /// One call of the round's script at the store's `now_ms`: every tracked bucket the
    /// entries used is refilled and lowered by their usage; each ask is then answered with
    /// its bucket's level, starting to track it from the asking router's view (which counts
    /// its own usage already) when it was not. A bucket back at its capacity is forgotten.
    /// The script's random sweep is left out: it removes only full buckets, which read the same.
    ///
    /// Returns the answers to the asks, in order, and the levels of the tracked buckets the
    /// entries used without asking (by field, sorted): the writer's view of them may be higher
    /// than the site's, and it anchors to them too.
    ///
    /// An ask's view lower than the level by more than `interval_ms` of refill lowers the
    /// level to it, when the view is settled (`AnchorView::settled`): it knows usage the level
    /// does not (the bucket was tracked from another router's view, stale after a lost reply).
    /// An unsettled view neither lowers a level nor starts one: it is answered with itself. Within that, the difference is the time
    /// between the router's reading and the script's, and the level stands.
    ///
    /// `unread`: the other runs' entries the asking router reads in this round (after its
    /// cursor). A view was taken before them: a level started from it is lowered by their usage
    /// of its bucket, published while nobody tracked it. Started from the view alone, the level
    /// missed what the others admitted while the asker could not read them: after an outage and
    /// a lost reply, router-2 started a level at 594 requests where, once it read the others'
    /// outage usage, 34 were left, and the others were anchored up to it (`sync::simulation`,
    /// seed 4,906: 2,706 requests in the first minute where 2,523 were allowed).
    pub fn round(
        &mut self,
        now_ms: u64,
        interval_ms: u64,
        entries: &[Entry],
        asks: &[Ask],
        unread: &[Entry],
    ) -> Answers {
        let mut used: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let mut touched: BTreeMap<String, Option<Level>> = BTreeMap::new();
        // Each entry's usage at the time it was admitted: usage held back in an outage is not
        // charged the refill its bucket had meanwhile.
        for entry in entries {
            let time = entry.admitted_at_unix_ms.min(now_ms);
            let (run, at) = (entry.run, entry.admitted_at_unix_ms);
            let applied = self.applied.get_mut(&entry.router);
            let again = applied
                .as_ref()
                .is_some_and(|applied| applied.again(run, at));
            if !again {
                match applied {
                    Some(applied) => applied.note(run, at),
                    None => {
                        let applied = Applied {
                            latest: (run, at),
                            previous: None,
                        };
                        self.applied.insert(entry.router.clone(), applied);
                    }
                }
            }
            for (field, amount) in rate_usage(entry) {
                used.insert(field.clone());
                let level = touched
                    .entry(field.clone())
                    .or_insert_with(|| self.fields.get(&field).copied());
                if let Some(level) = level.as_mut().filter(|_| !again) {
                    let time = time.max(level.at_ms);
                    level.units = (level.at(time) - amount as i64 * UNITS_PER_TOKEN)
                        .max(-level.capacity_units);
                    level.at_ms = time;
                }
            }
        }
        for level in touched.values_mut().flatten() {
            level.units = level.at(now_ms);
            level.at_ms = now_ms;
        }
        let mut answers = Vec::with_capacity(asks.len());
        let mut asked = std::collections::BTreeSet::new();
        for ask in asks {
            let field = ask.field();
            asked.insert(field.clone());
            let current = match touched.get(&field) {
                Some(level) => *level,
                None => self.fields.get(&field).map(|level| Level {
                    units: level.at(now_ms),
                    at_ms: now_ms,
                    ..*level
                }),
            };
            let capacity = ask.view.capacity_units;
            let level =
                match current {
                    Some(level) => Level {
                        units: if ask.view.settled {
                            level.units.min(capacity).min(
                                ask.view.level_units.saturating_add(
                                    (ask.view.rate_per_minute.saturating_mul(interval_ms) as i64)
                                        .max(0),
                                ),
                            )
                        } else {
                            level.units.min(capacity)
                        },
                        at_ms: now_ms,
                        rate_per_minute: ask.view.rate_per_minute,
                        capacity_units: capacity,
                    },
                    None if !ask.view.settled => {
                        // An unsettled view starts no level either: answered with itself.
                        answers.push(ask.view.level_units.clamp(-capacity, capacity));
                        continue;
                    }
                    None => Level {
                        units: (ask.view.level_units
                            - unread_usage(unread, &field) as i64 * UNITS_PER_TOKEN)
                            .clamp(-capacity, capacity),
                        at_ms: now_ms,
                        rate_per_minute: ask.view.rate_per_minute,
                        capacity_units: capacity,
                    },
                };
            answers.push(level.units);
            touched.insert(field, Some(level));
        }
        let published = touched
            .iter()
            .filter(|(field, _)| used.contains(*field) && !asked.contains(*field))
            .filter_map(|(field, level)| Some((field.clone(), level.as_ref()?.units)))
            .collect();
        for (field, level) in touched {
            match level {
                Some(level) if level.units < level.capacity_units => {
                    self.fields.insert(field, level);
                }
                _ => {
                    self.fields.remove(&field);
                }
            }
        }
        Answers { answers, published }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Capability;
    use crate::logic::limits::Day;
    use crate::router::sync::entry::KeyUsage;

    const KEY: KeyId = KeyId(0x0102_0304);
    const RATE: u64 = 1200;
    const CAPACITY: i64 = 1200 * UNITS_PER_TOKEN;

    fn entry(requests: u64, admitted_at_unix_ms: u64) -> Entry {
        Entry {
            router: "router-0".into(),
            run: 1,
            admitted_at_unix_ms,
            day: Day(20_000),
            models: vec![ModelName {
                name: "llama".into(),
                capability: Capability::Llm,
            }],
            keys: vec![KeyUsage {
                key: KEY,
                buckets: vec![
                    (Bucket::Requests { model: None }, requests),
                    (Bucket::InputTokens { model: 0 }, 7),
                    (
                        Bucket::Daily {
                            model: None,
                            day: Day(20_000),
                        },
                        99,
                    ),
                ],
            }],
        }
    }

    fn ask(level_units: i64) -> Ask {
        Ask {
            key: KEY,
            kind: KIND_REQUESTS,
            model: None,
            view: AnchorView {
                level_units,
                rate_per_minute: RATE,
                capacity_units: CAPACITY,
                settled: true,
            },
        }
    }

    #[test]
    fn fields_name_the_key_the_kind_and_the_model() {
        let usage = rate_usage(&entry(3, 0));
        assert_eq!(
            usage,
            vec![
                ("01020304|0|".to_owned(), 3),
                ("01020304|1|0|llama".to_owned(), 7),
            ]
        );
    }

    #[test]
    fn an_untracked_bucket_starts_from_the_asking_view_and_is_lowered_by_every_use_after() {
        let mut levels = Levels::default();
        // Used but asked by nobody: nothing is tracked.
        assert_eq!(
            levels.round(0, 0, &[entry(5, 0)], &[], &[]),
            Answers::default()
        );
        assert!(levels.fields.is_empty());
        // A router whose view is 100 requests asks: tracked from its view.
        assert_eq!(
            levels
                .round(0, 0, &[], &[ask(100 * UNITS_PER_TOKEN)], &[])
                .answers,
            vec![100 * UNITS_PER_TOKEN]
        );
        // Another router's 30 requests, 1 s later (20 refilled): 90 left, whoever asks. The
        // writer, whose view may be higher, hears it without asking.
        assert_eq!(
            levels.round(1000, 0, &[entry(30, 1000)], &[], &[]),
            Answers {
                answers: Vec::new(),
                published: vec![("01020304|0|".to_owned(), 90 * UNITS_PER_TOKEN)],
            }
        );
        assert_eq!(
            levels
                .round(1000, 0, &[], &[ask(500 * UNITS_PER_TOKEN)], &[])
                .answers,
            vec![90 * UNITS_PER_TOKEN]
        );
    }

    #[test]
    fn a_batch_published_again_is_not_counted_twice_and_held_back_usage_counts_when_admitted() {
        let mut levels = Levels::default();
        levels.round(0, 0, &[], &[ask(0)], &[]);
        // 30 requests admitted at 1 s, published at 2 s: the bucket refilled 20 a second all
        // along, not only since the publication: 0 + 20 - 30 + 20.
        let (first, held) = (entry(30, 1000), entry(0, 1500));
        assert_eq!(
            levels
                .round(2000, 0, &[first.clone(), held.clone()], &[], &[])
                .published,
            vec![("01020304|0|".to_owned(), 10 * UNITS_PER_TOKEN)]
        );
        // The reply was lost: the same batches again, then a new one.
        let again = levels.round(2000, 0, &[first, held, entry(5, 2000)], &[], &[]);
        assert_eq!(
            again.published,
            vec![("01020304|0|".to_owned(), 5 * UNITS_PER_TOKEN)]
        );
    }

    /// Seed 229: a restarted router's round carries its previous run's journal, then its own
    /// batches; its reply is lost and it publishes both again. Neither is counted twice.
    #[test]
    fn a_new_runs_round_published_again_with_the_journal_before_it_is_not_counted_twice() {
        let mut levels = Levels::default();
        levels.round(0, 0, &[], &[ask(0)], &[]);
        let journal = Entry {
            run: 1,
            ..entry(300, 0)
        };
        let own = Entry {
            run: 2,
            ..entry(10, 0)
        };
        // 0 + 20 a second for 10 s, less 310.
        let published = |levels: &mut Levels, entries: &[Entry]| {
            levels.round(10_000, 0, entries, &[], &[]).published[0].1 / UNITS_PER_TOKEN
        };
        assert_eq!(
            published(&mut levels, &[journal.clone(), own.clone()]),
            -110
        );
        assert_eq!(published(&mut levels, &[journal, own]), -110);
        assert_eq!(
            levels.applied["router-0"].encode(),
            "2,0,1,0",
            "the newest of each run, as the script writes it"
        );
    }

    /// A view lower than the level by more than an interval's refill lowers it, if settled; an
    /// unsettled view (lowered at once by merged usage or a replay) neither lowers nor starts one.
    #[test]
    fn only_a_settled_view_lowers_a_level() {
        let mut levels = Levels::default();
        // Nor starts one: answered with itself, nothing tracked.
        let stale = Ask {
            view: AnchorView {
                settled: false,
                ..ask(-900 * UNITS_PER_TOKEN).view
            },
            ..ask(0)
        };
        assert_eq!(
            levels.round(0, 500, &[], &[stale], &[]).answers,
            vec![-900 * UNITS_PER_TOKEN]
        );
        assert!(levels.fields.is_empty());
        levels.round(0, 500, &[], &[ask(100 * UNITS_PER_TOKEN)], &[]);
        let unsettled = Ask {
            view: AnchorView {
                settled: false,
                ..ask(-1200 * UNITS_PER_TOKEN).view
            },
            ..ask(0)
        };
        assert_eq!(
            levels.round(0, 500, &[], &[unsettled], &[]).answers,
            vec![100 * UNITS_PER_TOKEN]
        );
        // 20 a second, 500 ms: within 10 of the level stands; 40 below brings it to 70.
        assert_eq!(
            levels
                .round(0, 500, &[], &[ask(95 * UNITS_PER_TOKEN)], &[])
                .answers,
            vec![100 * UNITS_PER_TOKEN]
        );
        assert_eq!(
            levels
                .round(0, 500, &[], &[ask(60 * UNITS_PER_TOKEN)], &[])
                .answers,
            vec![70 * UNITS_PER_TOKEN]
        );
    }

    #[test]
    fn a_bucket_back_at_its_capacity_is_forgotten() {
        let mut levels = Levels::default();
        levels.round(0, 0, &[], &[ask(0)], &[]);
        // A minute later the bucket is full again: the answer is its capacity, and it is gone.
        assert_eq!(
            levels.round(60_000, 0, &[], &[ask(CAPACITY)], &[]).answers,
            vec![CAPACITY]
        );
        assert!(levels.fields.is_empty());
    }

    #[test]
    fn asks_pack_with_their_models_once() {
        let model = ModelName {
            name: "llama".into(),
            capability: Capability::Llm,
        };
        let asks = vec![
            Ask {
                kind: KIND_INPUT,
                model: Some(model.clone()),
                ..ask(-3)
            },
            Ask {
                kind: KIND_OUTPUT,
                model: Some(model),
                ..ask(1)
            },
        ];
        let (models, blob) = pack(&asks);
        assert_eq!(models, vec!["0|llama".to_owned()]);
        // key, tag (settled), model 0, rate 1200 (2 bytes), capacity 1200 (2 bytes), zigzag -3 = 5.
        assert_eq!(
            &blob[..11],
            &[4, 3, 2, 1, KIND_INPUT | 4 | 8, 0, 0xb0, 0x09, 0xb0, 0x09, 5]
        );
        assert_eq!(blob.len(), 22);
    }
}
