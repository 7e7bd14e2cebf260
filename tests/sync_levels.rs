//! The site's levels of contended rate buckets (`sync::levels`, issue 33) in a real Valkey: the
//! round's usage script keeps them exactly as the Rust model the site's simulation runs
//! (`Levels`), for several routers publishing real entries and asking in any order; a level
//! refills on the store's clock; a level started from a view counts the others' entries the view
//! had not read; a full bucket is forgotten, by the round that touches it or by
//! the sweep; entries the script wrote say so, and a round that did not read the stream whole
//! returns no levels; an entry the script cannot read is written and counts in no level; and a
//! router's memory of the others' daily usage, written after a loss, is read with the totals.

mod common;

use common::runtime;
use common::valkey::{RoundExtras, Valkey};
use hivenet_router::base::ids::{Capability, KeyId};
use hivenet_router::logic::limits::Day;
use hivenet_router::logic::limits::bucket::{AnchorView, UNITS_PER_TOKEN};
use hivenet_router::router::sync::entry::{Bucket, Entry, KeyUsage, ModelName};
use hivenet_router::router::sync::levels::{Answers, Ask, Levels, field};
use hivenet_router::router::sync::store::{RoundReads, Store, StreamId};

const SITE: &str = "levels";
const DAY: Day = Day(20_426);

fn store(valkey: &Valkey, router: &str) -> Store {
    common::valkey::sync_store(valkey, SITE, router)
}

fn llama() -> ModelName {
    ModelName {
        name: "llama|v2".into(),
        capability: Capability::Llm,
    }
}

/// A router's entry: `requests` of key `key`'s flat rate, `tokens` of its input rate on llama.
fn entry(
    router: &str,
    run: u64,
    key: u32,
    requests: u64,
    tokens: u64,
    admitted_at: u64,
) -> Vec<u8> {
    let mut buckets = vec![(
        Bucket::Daily {
            model: None,
            day: DAY,
        },
        requests * 10,
    )];
    if requests > 0 {
        buckets.push((Bucket::Requests { model: None }, requests));
    }
    if tokens > 0 {
        buckets.push((Bucket::InputTokens { model: 0 }, tokens));
    }
    Entry {
        router: router.into(),
        run,
        admitted_at_unix_ms: admitted_at,
        day: DAY,
        models: vec![llama()],
        keys: vec![KeyUsage {
            key: KeyId(key),
            buckets,
        }],
    }
    .encode()
}

fn ask(key: u32, input: bool, rate: u64, level_units: i64) -> Ask {
    Ask {
        key: KeyId(key),
        kind: u8::from(input),
        model: input.then(llama),
        view: AnchorView {
            level_units,
            rate_per_minute: rate,
            capacity_units: 1200 * UNITS_PER_TOKEN,
            settled: key % 2 == 1,
        },
    }
}

/// Caches the script in `valkey` through `store`, and checks on the way that a round whose
/// script the store did not know (`NOSCRIPT`, then `EVAL` outside the transaction of its read)
/// returns no levels. Leaves no level behind.
async fn warm(valkey: &Valkey, store: &mut Store) {
    let idle = round(store, &[], &[]).await;
    assert_eq!(idle.levels, None, "an idle round runs no script");
    let first = round(store, &[], &[ask(1000, false, 0, 0)]).await;
    assert_eq!(first.levels, None, "the script was not cached yet");
    let second = round(store, &[], &[ask(1000, false, 0, 0)]).await;
    assert_eq!(
        second.levels.map(|levels| levels.answers),
        Some(vec![0]),
        "cached, the script answers"
    );
    valkey.command(&["DEL", &format!("hivenet:{{{SITE}}}:levels")]);
}

async fn round(store: &mut Store, entries: &[Vec<u8>], asks: &[Ask]) -> RoundReads {
    let extras = RoundExtras {
        asks,
        ..RoundExtras::default()
    };
    common::valkey::round(store, entries, &[], extras).await
}

/// [`round`] of a router of run `run` whose views were taken at `views_after`.
async fn round_after(
    store: &mut Store,
    entries: &[Vec<u8>],
    asks: &[Ask],
    views_after: Option<StreamId>,
    run: u64,
) -> RoundReads {
    let extras = RoundExtras {
        asks,
        views_after,
        run,
        ..RoundExtras::default()
    };
    common::valkey::round(store, entries, &[], extras).await
}

/// The entries of `reads` after `views_after` a router of `router`'s run `run` did not write:
/// what its views did not count (the model's `unread`).
fn unread(reads: &RoundReads, views_after: Option<StreamId>, router: &str, run: u64) -> Vec<Entry> {
    let Some(after) = views_after else {
        return Vec::new();
    };
    reads
        .entries
        .iter()
        .filter(|(id, _)| *id > after)
        .map(|(_, bytes)| Entry::decode(bytes).unwrap())
        .filter(|entry| !(entry.router == router && entry.run == run))
        .collect()
}

fn levels_hash(valkey: &Valkey) -> Vec<(String, String)> {
    valkey.hash(&format!("hivenet:{{{SITE}}}:levels"))
}

/// A small deterministic generator (the test's only randomness, reproducible from its seed).
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

/// Without refill (rate 0) the store's clock does not matter: three routers publish and ask
/// at random for 300 rounds and every answer, and the hash after each, is the model's.
#[test]
fn the_script_keeps_the_levels_as_the_model_does() {
    let valkey = Valkey::primary();
    let routers = ["router-0", "router-1", "router-2"];
    let mut stores: Vec<Store> = routers.iter().map(|id| store(&valkey, id)).collect();
    let mut model = Levels::default();
    let mut rng = Rng(33);
    // Admission times in the past (the script counts each batch then, and no earlier than the
    // level's last update): with rate 0 the result does not depend on them.
    let mut admitted = 1_780_000_000_000u64;
    let mut last: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
    let mut runs = [1u64; 3];
    let mut cursors: [Option<StreamId>; 3] = [None; 3];
    runtime().block_on(async {
        warm(&valkey, &mut stores[0]).await;
        for _ in 0..300 {
            let which = rng.below(3) as usize;
            let mut entries = Vec::new();
            let mut decoded = Vec::new();
            // Now and then the last round's entries again (its reply was lost): not counted twice.
            // Or the router restarted: its new run publishes the last round's entries first
            // (the journal of the run before), and again with its own after a lost reply.
            match rng.below(8) {
                0 | 1 => entries = last[which].clone(),
                2 => {
                    entries = last[which].clone();
                    runs[which] += 1;
                }
                _ => {}
            }
            for _ in 0..rng.below(3) {
                let key = 1 + rng.below(3) as u32;
                admitted += 1;
                let requests = rng.below(40);
                let tokens = rng.below(2) * 500;
                let bytes = entry(routers[which], runs[which], key, requests, tokens, admitted);
                entries.push(bytes);
            }
            for bytes in &entries {
                decoded.push(Entry::decode(bytes).unwrap());
            }
            last[which] = entries.clone();
            let asks: Vec<Ask> = (0..rng.below(3))
                .map(|_| {
                    let view = (rng.below(1800) as i64 - 600) * UNITS_PER_TOKEN;
                    ask(1 + rng.below(3) as u32, rng.below(2) == 1, 0, view)
                })
                .collect();
            // The views were taken at the router's last read (none before its first): a level
            // started from one is lowered by the others' entries since.
            let views_after = cursors[which];
            let reads = round_after(
                &mut stores[which],
                &entries,
                &asks,
                views_after,
                runs[which],
            )
            .await;
            let unread = unread(&reads, views_after, routers[which], runs[which]);
            let expected = model.round(0, 500, &decoded, &asks, &unread);
            let newest = reads
                .entries
                .last()
                .map(|(id, _)| *id)
                .max(reads.own_newest);
            if newest.is_some() {
                cursors[which] = newest;
            }
            let written = !entries.is_empty() || !asks.is_empty();
            // A round with nothing to write runs no script: no answers, and none asked.
            let mut answers = match reads.levels {
                None if !written => Some(Answers::default()),
                answers => answers,
            }
            .expect("the script answers");
            answers.published.sort();
            assert_eq!(answers, expected, "the answers");
            assert!(!reads.unlevelled, "the script marks its entries");
            let hash = levels_hash(&valkey);
            let markers = valkey.hash(&format!("hivenet:{{{SITE}}}:levels:applied"));
            let modelled_markers: Vec<(String, String)> = model
                .applied
                .iter()
                .map(|(router, applied)| (router.clone(), applied.encode()))
                .collect();
            assert_eq!(markers, modelled_markers, "what each router's levels count");
            let stored: Vec<(String, i64)> = hash
                .into_iter()
                .map(|(field, value)| (field, value.split(',').next().unwrap().parse().unwrap()))
                .collect();
            let modelled: Vec<(String, i64)> = model
                .fields
                .iter()
                .map(|(field, level)| (field.clone(), level.units))
                .collect();
            assert_eq!(stored, modelled, "the hash");
        }
    });
    assert!(
        !levels_hash(&valkey).is_empty(),
        "the run left contended buckets"
    );
}

/// A level started from a view counts the usage the view had not read: the other routers'
/// entries after the cursor it was taken at, published while nobody tracked the bucket (after
/// an outage, the usage each router held back), and the entries of this router's run before;
/// not this run's own, which the view counts. Started from the view alone, a level missed the
/// others' outage usage and the routers anchored to it admitted it again (`sync::simulation`,
/// seed 4,906: 2,706 requests in a minute where 2,523 were allowed).
#[test]
fn a_level_started_from_a_view_counts_what_the_view_had_not_read() {
    let valkey = Valkey::primary();
    let mut zero = store(&valkey, "router-0");
    let mut one = store(&valkey, "router-1");
    let at = 1_780_000_000_000u64;
    runtime().block_on(async {
        warm(&valkey, &mut zero).await;
        let read = round(&mut zero, &[entry("router-0", 2, 9, 1, 0, at)], &[]).await;
        let views_after = read.own_newest;
        assert!(views_after.is_some(), "router-0 wrote an entry");
        // Then, unread by router-0: router-1's 500 requests, 50 of router-0's run before (its
        // journal, published by this run), 100 of this run (a round whose reply was lost).
        round(&mut one, &[entry("router-1", 1, 1, 500, 0, at + 1)], &[]).await;
        round(
            &mut zero,
            &[
                entry("router-0", 1, 1, 50, 0, at + 2),
                entry("router-0", 2, 1, 100, 0, at + 3),
            ],
            &[],
        )
        .await;
        assert!(levels_hash(&valkey).is_empty(), "nobody tracks the bucket");
        let view = 800 * UNITS_PER_TOKEN;
        let reads = round_after(&mut zero, &[], &[ask(1, false, 0, view)], views_after, 2).await;
        assert_eq!(
            reads.levels.unwrap().answers,
            vec![(800 - 500 - 50) * UNITS_PER_TOKEN],
            "started from the view, less the others' usage and the run before's"
        );
        // Without a cursor (a start: its first read replays the last minute into the views),
        // the level starts from the view.
        let reads = round_after(&mut zero, &[], &[ask(3, false, 0, view)], None, 2).await;
        assert_eq!(reads.levels.unwrap().answers, vec![view]);
    });
}

/// Copies of usage published before (`sync::republish`, after the store may have lost the
/// originals) are read as usage by the others, under the field `c` and beside `l` (the writer
/// runs the script), and lower no level: neither one tracked, nor one a view after them starts.
/// The levels were lost with the originals and restart from views that may count them.
#[test]
fn copies_are_read_as_usage_and_lower_no_level() {
    let valkey = Valkey::primary();
    let mut zero = store(&valkey, "router-0");
    let mut one = store(&valkey, "router-1");
    let at = 1_780_000_000_000u64;
    let copy = |requests, admitted_at| {
        let extras = RoundExtras {
            copies: 1,
            ..RoundExtras::default()
        };
        (entry("router-0", 1, 1, requests, 0, admitted_at), extras)
    };
    runtime().block_on(async {
        warm(&valkey, &mut zero).await;
        let read = round(&mut one, &[entry("router-1", 1, 9, 1, 0, at)], &[]).await;
        let views_after = read.own_newest;
        let (bytes, extras) = copy(300, at + 1);
        common::valkey::round(&mut zero, std::slice::from_ref(&bytes), &[], extras).await;
        // Router-1's settled view of key 1 starts the level: the copy after its cursor is
        // not subtracted from it, and router-1 reads the copy as an entry.
        let view = 800 * UNITS_PER_TOKEN;
        let reads = round_after(&mut one, &[], &[ask(1, false, 0, view)], views_after, 1).await;
        assert_eq!(reads.levels.unwrap().answers, vec![view]);
        assert!(!reads.unlevelled, "a copy is written beside `l`");
        assert!(
            reads.entries.iter().any(|(_, read)| *read == bytes),
            "the copy is read as usage"
        );
        // Tracked now: another copy leaves the level, an entry of usage lowers it.
        let (bytes, extras) = copy(200, at + 2);
        let reads = common::valkey::round(&mut zero, &[bytes], &[], extras).await;
        assert_eq!(reads.levels.unwrap().published, vec![]);
        let reads = round(&mut zero, &[entry("router-0", 1, 1, 50, 0, at + 3)], &[]).await;
        assert_eq!(
            reads.levels.unwrap().published,
            vec![("00000001|0|".to_owned(), (800 - 50) * UNITS_PER_TOKEN)]
        );
        let fields: Vec<String> = valkey
            .reply(&["XRANGE", &format!("hivenet:{{{SITE}}}:usage"), "-", "+"])
            .expect("XRANGE")
            .items()
            .iter()
            .map(|item| {
                let fields = item.items()[1].items();
                fields.iter().step_by(2).map(|field| field.text()).collect()
            })
            .collect();
        assert_eq!(fields[fields.len() - 3..], ["cl", "cl", "ul"]);
    });
}

/// A level refills on the store's clock, up to the capacity, where it is forgotten.
#[test]
fn a_level_refills_on_the_stores_clock_and_is_forgotten_when_full() {
    let valkey = Valkey::primary();
    let mut store = store(&valkey, "router-0");
    // 60,000 a minute: one unit of a token a millisecond per token, 1,000 tokens a second.
    let rate = 60_000;
    runtime().block_on(async {
        warm(&valkey, &mut store).await;
        let started = std::time::Instant::now();
        let first = round(&mut store, &[], &[ask(9, false, rate, 0)]).await;
        assert_eq!(first.levels.unwrap().answers, vec![0]);
        let second = round(&mut store, &[], &[ask(9, false, rate, 0)]).await;
        let level = second.levels.unwrap().answers[0];
        let elapsed_ms = started.elapsed().as_millis() as i64 + 1;
        assert!(
            level >= 0 && level <= elapsed_ms * rate as i64,
            "refilled {level} units in at most {elapsed_ms} ms"
        );
        // 1,200 tokens at 1,000 a second: full after 1.2 s. The view asking is as high as it
        // gets (a lower one, by more than an interval's refill, would lower the level).
        let high = 1200 * UNITS_PER_TOKEN;
        let deadline = std::time::Instant::now() + common::WAIT;
        loop {
            let reads = round(&mut store, &[], &[ask(9, false, rate, high)]).await;
            if reads.levels.unwrap().answers == vec![1200 * UNITS_PER_TOKEN] {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never full again");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    assert!(
        levels_hash(&valkey).is_empty(),
        "a full bucket is forgotten"
    );
}

/// A full bucket no round touches is swept; entries written without the script are noticed.
#[test]
fn the_sweep_forgets_full_buckets_and_plain_entries_are_noticed() {
    let valkey = Valkey::primary();
    let hash = format!("hivenet:{{{SITE}}}:levels");
    let stale = field(KeyId(77), 0, None);
    let mut store = store(&valkey, "router-0");
    runtime().block_on(async {
        warm(&valkey, &mut store).await;
        valkey.command(&["HSET", &hash, &stale, "0,1,60000,72000000"]);
        round(&mut store, &[], &[ask(5, false, 0, 0)]).await;
        // An entry of this version the script cannot read (truncated) is written all the same,
        // and counts in no level: the round does not fail after its first write.
        let truncated = vec![1u8, 200];
        let reads = round(&mut store, &[truncated], &[]).await;
        assert!(reads.levels.is_some());
    });
    let written = valkey.command(&["XLEN", &format!("hivenet:{{{SITE}}}:usage")]);
    assert_eq!(written, "1", "the entry is written");
    let fields: Vec<String> = levels_hash(&valkey).into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        vec![field(KeyId(5), 0, None)],
        "the stale bucket is swept"
    );
    valkey.command(&[
        "XADD",
        &format!("hivenet:{{{SITE}}}:usage"),
        "*",
        "u",
        "plain",
    ]);
    let mut other = store_for_reads(&valkey);
    let reads = runtime().block_on(round(&mut other, &[], &[]));
    assert!(reads.unlevelled, "an entry without the levels is noticed");
}

fn store_for_reads(valkey: &Valkey) -> Store {
    store(valkey, "router-1")
}

/// After the store lost its data, a router writes what it remembers of the others' daily usage
/// (`memory:{day}`), in its round's transaction, and a router reading today's totals gets it
/// beside them (`daily_fields::daily_records` counts at least that of the others).
#[test]
fn a_routers_memory_of_the_others_is_read_with_the_totals() {
    use hivenet_router::base::ids::TenantId;
    use hivenet_router::router::sync::daily_fields::{daily_field, daily_records};
    let valkey = Valkey::primary();
    let mut survivor = store(&valkey, "router-0");
    let mut newcomer = store(&valkey, "router-1");
    let day = 20_426u32;
    let field = daily_field("router-0", TenantId(7), None);
    runtime().block_on(async {
        let memory = [(day, field.clone(), 4_000u64)];
        let extras = RoundExtras {
            memory: &memory,
            ..RoundExtras::default()
        };
        common::valkey::round(&mut survivor, &[], &[], extras).await;
        // The day before and the day, in one read (near midnight a router reads two days).
        let mut days = newcomer
            .read_daily(&[day - 1, day])
            .await
            .expect("the read")
            .days;
        let (totals, remembered) = days.pop().expect("the day's");
        assert_eq!(
            days,
            vec![(Vec::new(), Vec::new())],
            "nothing the day before"
        );
        assert!(totals.is_empty());
        assert_eq!(remembered, vec![(field.clone(), 4_000)]);
        let records = daily_records(
            "router-1",
            Day(day),
            totals.iter().map(|(f, t)| (f.as_str(), *t)),
            remembered.iter().map(|(f, t)| (f.as_str(), *t)),
            true,
            |_, _| None,
        )
        .records;
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].tokens, 4_000, "router-0's memory of the others");
        assert!(records[0].others);
    });
}
