//! The pure parts of a sync round: the shards' usage into one entry, other routers' entries into
//! what each shard subtracts, the usage held back while the store is unreachable, and the daily
//! totals as the store keeps them (seed `run-several-routers.md`, "How it works").
//!
//! No I/O and no clock: `sync::core` runs the round against the store and passes time in.

use std::collections::{HashMap, VecDeque};

use crate::base::ids::{KeyId, ModelId, TenantId};
use crate::logic::limits::{BucketRef, Day};
use crate::router::shard::owner::quotas::{BucketUsage, DailyTotal, RemoteBatch};

use super::entry::{Bucket, Entry, KeyUsage, ModelName};

/// Held-back batches kept while the store is unreachable: ten minutes of one-second rounds.
/// Beyond it the two oldest are merged (their usage summed, the later admission time kept, so
/// the merged usage is never treated as older than it is).
pub const BACKLOG_MAX: usize = 600;

/// Rounds that read today's totals again after the store lost its data. Every other router
/// writes its totals again whole at its first round after noticing the loss (within one of its
/// intervals, or three when rounds fail); usage another router published between this router's
/// last read and the loss is in those totals only. Reading them a few times more (a read never
/// lowers what a budget counts, `DailyBudget::set_others_total`) picks it up; before, a router
/// counted only the totals it read at its first round, which the others had not written again
/// yet, and missed that usage for the rest of the day (`sync::simulation`, seed 8).
pub const RESYNC_ROUNDS_AFTER_LOSS: u32 = 5;

/// The days whose totals a read takes at `wall_ms` on this router's clock: its own, and the
/// next when midnight is nearer than the site's clocks may differ
/// ([`super::site::CLOCKS_DIFFER_BY_AT_MOST_MS`]). A router whose clock is behind already counts
/// the day the others reached (their usage starts it, `DailyBudget::apply_remote`); read for its
/// own day only, it missed what a data loss took from the stream and the others wrote again in
/// their totals of the new day (`sync::simulation`, seed 4,818: 1,017 tokens).
pub fn days_to_read(wall_ms: u64) -> (Day, Option<Day>) {
    let seconds = wall_ms / 1000;
    let day = Day::from_unix_seconds(seconds);
    let to_midnight_ms = u64::from(Day::seconds_until_next(seconds)) * 1000 - wall_ms % 1000;
    let next = (to_midnight_ms <= super::site::CLOCKS_DIFFER_BY_AT_MOST_MS).then(|| Day(day.0 + 1));
    (day, next)
}

/// Usage admitted at one time, in this process's model ids, not yet published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub admitted_at_unix_ms: u64,
    pub day: Day,
    pub usage: Vec<BucketUsage>,
}

/// One round's entry from a batch. Models this router no longer knows by name are dropped.
pub fn entry_of(
    router: &str,
    run: u64,
    batch: &Batch,
    model_name: impl Fn(ModelId) -> Option<ModelName>,
) -> Entry {
    let mut models: Vec<ModelName> = Vec::new();
    let mut model_index: HashMap<ModelId, Option<u32>> = HashMap::new();
    let mut index_of = |model: ModelId| -> Option<u32> {
        *model_index.entry(model).or_insert_with(|| {
            let name = model_name(model)?;
            models.push(name);
            Some(models.len() as u32 - 1)
        })
    };
    let mut by_key: Vec<&BucketUsage> = batch.usage.iter().collect();
    by_key.sort_by_key(|usage| usage.key);
    let mut keys: Vec<KeyUsage> = Vec::new();
    for usage in by_key {
        let bucket = match usage.bucket {
            BucketRef::Requests { model } => Bucket::Requests {
                model: match model {
                    None => None,
                    Some(model) => match index_of(model) {
                        Some(index) => Some(index),
                        None => continue,
                    },
                },
            },
            BucketRef::InputTokens { model } => match index_of(model) {
                Some(model) => Bucket::InputTokens { model },
                None => continue,
            },
            BucketRef::OutputTokens { model } => match index_of(model) {
                Some(model) => Bucket::OutputTokens { model },
                None => continue,
            },
            BucketRef::Daily { model, day } => Bucket::Daily {
                model: match model {
                    None => None,
                    Some(model) => match index_of(model) {
                        Some(index) => Some(index),
                        None => continue,
                    },
                },
                day,
            },
        };
        match keys.last_mut() {
            Some(last) if last.key == usage.key => last.buckets.push((bucket, usage.amount)),
            _ => keys.push(KeyUsage {
                key: usage.key,
                buckets: vec![(bucket, usage.amount)],
            }),
        }
    }
    Entry {
        router: router.to_owned(),
        run,
        admitted_at_unix_ms: batch.admitted_at_unix_ms,
        day: batch.day,
        models,
        keys,
    }
}

/// What a shard subtracts for another router's entry. `rates_only`: the entry is already in the
/// daily totals this router read (a replay), so only its rate usage applies. Models this router
/// does not serve are skipped (no bucket here limits them).
pub fn remote_batch(
    entry: &Entry,
    now_unix_ms: u64,
    rates_only: bool,
    model_id: impl Fn(&ModelName) -> Option<ModelId>,
) -> RemoteBatch {
    let ids: Vec<Option<ModelId>> = entry.models.iter().map(&model_id).collect();
    let id = |index: u32| ids.get(index as usize).copied().flatten();
    let mut usage = Vec::new();
    for key in &entry.keys {
        for &(bucket, amount) in &key.buckets {
            let bucket = match bucket {
                Bucket::Requests { model: None } => BucketRef::Requests { model: None },
                Bucket::Requests { model: Some(index) } => match id(index) {
                    Some(model) => BucketRef::Requests { model: Some(model) },
                    None => continue,
                },
                Bucket::InputTokens { model } => match id(model) {
                    Some(model) => BucketRef::InputTokens { model },
                    None => continue,
                },
                Bucket::OutputTokens { model } => match id(model) {
                    Some(model) => BucketRef::OutputTokens { model },
                    None => continue,
                },
                Bucket::Daily { .. } if rates_only => continue,
                Bucket::Daily { model: None, day } => BucketRef::Daily { model: None, day },
                Bucket::Daily {
                    model: Some(index),
                    day,
                } => match id(index) {
                    Some(model) => BucketRef::Daily {
                        model: Some(model),
                        day,
                    },
                    None => continue,
                },
            };
            usage.push(BucketUsage {
                key: key.key,
                bucket,
                amount,
            });
        }
    }
    RemoteBatch {
        age_ms: now_unix_ms.saturating_sub(entry.admitted_at_unix_ms),
        usage,
    }
}

/// Usage taken from the shards and not published yet, oldest first (at most [`BACKLOG_MAX`]
/// batches), and the daily totals not written yet (each a whole total: the latest replaces an
/// earlier one, so one per budget and day changed while the store was away).
#[derive(Debug, Default)]
pub struct Backlog {
    batches: Vec<Batch>,
    totals: HashMap<(TenantId, Option<ModelId>, Day), u64>,
}

impl Backlog {
    pub fn push(&mut self, batch: Batch) {
        if batch.usage.is_empty() {
            return;
        }
        if self.batches.len() >= BACKLOG_MAX {
            let older = self.batches.remove(0);
            let newer = &mut self.batches[0];
            newer.usage = merge(older.usage, std::mem::take(&mut newer.usage));
        }
        self.batches.push(batch);
    }

    pub fn push_totals(&mut self, totals: Vec<DailyTotal>) {
        for total in totals {
            self.totals
                .insert((total.tenant, total.model, total.day), total.tokens);
        }
    }

    pub fn batches(&self) -> &[Batch] {
        &self.batches
    }

    pub fn totals(&self) -> impl Iterator<Item = DailyTotal> + '_ {
        self.totals
            .iter()
            .map(|(&(tenant, model, day), &tokens)| DailyTotal {
                tenant,
                model,
                day,
                tokens,
            })
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty() && self.totals.is_empty()
    }

    /// Everything was written.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.totals.clear();
    }
}

/// The usage of two batches with each (key, bucket) once.
fn merge(older: Vec<BucketUsage>, newer: Vec<BucketUsage>) -> Vec<BucketUsage> {
    let mut sums: HashMap<(KeyId, BucketRef), u64> = HashMap::new();
    let mut order = Vec::new();
    for usage in older.into_iter().chain(newer) {
        let slot = sums.entry((usage.key, usage.bucket)).or_insert_with(|| {
            order.push((usage.key, usage.bucket));
            0
        });
        *slot = slot.saturating_add(usage.amount);
    }
    order
        .into_iter()
        .map(|(key, bucket)| BucketUsage {
            key,
            bucket,
            amount: sums[&(key, bucket)],
        })
        .collect()
}

/// Other routers' batches already applied, so that a batch published twice is applied once. A
/// round whose transaction ran but whose reply was lost (a timeout, one error reply) keeps its
/// backlog and publishes it again; every other router read the first copy, and counted that usage
/// twice (`sync::simulation`: a router's view of a shared bucket then stays below the others' under
/// sustained load, and it starves). A batch is known by its router, run and admission time, which
/// a republished copy keeps.
///
/// Bound: [`BACKLOG_MAX`] admission times per run (all a backlog can republish) for at most
/// [`APPLIED_RUNS_MAX`] runs, the least recently seen forgotten first.
#[derive(Debug, Default)]
pub struct Applied {
    runs: HashMap<(String, u64), AppliedRun>,
    /// Increases with each batch seen: which run was seen least recently.
    clock: u64,
}

#[derive(Debug, Default)]
struct AppliedRun {
    admitted_at: std::collections::VecDeque<u64>,
    seen: u64,
}

/// Runs whose applied batches are remembered: two per router of the largest site.
pub const APPLIED_RUNS_MAX: usize = 2 * super::site::ROUTERS_MAX;

impl Applied {
    /// Whether the batch `router`'s run `run` admitted at `admitted_at_unix_ms` is seen for the
    /// first time (and is to be applied); remembers it.
    pub fn first_time(&mut self, router: &str, run: u64, admitted_at_unix_ms: u64) -> bool {
        self.clock += 1;
        let clock = self.clock;
        if !self.runs.contains_key(&(router.to_owned(), run))
            && self.runs.len() >= APPLIED_RUNS_MAX
            && let Some(oldest) = self
                .runs
                .iter()
                .min_by_key(|(_, applied)| applied.seen)
                .map(|(key, _)| key.clone())
        {
            self.runs.remove(&oldest);
        }
        let applied = self.runs.entry((router.to_owned(), run)).or_default();
        applied.seen = clock;
        if applied.admitted_at.contains(&admitted_at_unix_ms) {
            return false;
        }
        if applied.admitted_at.len() >= BACKLOG_MAX {
            applied.admitted_at.pop_front();
        }
        applied.admitted_at.push_back(admitted_at_unix_ms);
        true
    }
}

/// How one daily total goes to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DailyWrite {
    /// `HINCRBY`: the tokens this process spent since its last write of the field.
    Add(u64),
    /// `HSET`: the whole total, written again after the store lost its data.
    Set(u64),
}

/// The daily totals this process has written, per (day, field), turning the whole totals the
/// shards report into increments. A field written with increments never loses a write whatever
/// two writers of it do (two processes started under one `--router-id`, which HSET of a whole
/// total made overwrite each other: 10,911 tokens spent, 8,186 in the store). Bound: one entry
/// per daily budget this router charged on the days not yet forgotten
/// ([`DailyLedger::forget_before`]).
///
/// A round whose transaction may have run but whose answer did not come (a timeout, an error
/// reply) writes those fields whole next time ([`DailyLedger::unsure`]): an increment sent again
/// would count twice (`sync::simulation`, invariant 3). After a failover or a data loss every
/// field is written whole once ([`DailyLedger::lost`]): increments the promoted replica never
/// received are not brought back by later ones.
#[derive(Debug, Default)]
pub struct DailyLedger {
    written: HashMap<(u32, String), u64>,
    /// What the store holds of each field as far as this process knows: below `written` after
    /// a whole write of a total lowered by a net refund ([`DailyLedger::known_totals`]).
    held: HashMap<(u32, String), u64>,
    /// Fields to write whole once more: the store lost its data.
    whole: std::collections::HashSet<(u32, String)>,
    /// What the rounds whose transaction may have run sent of each field since the last one
    /// known to run: (the newest batch of this run the round published, the total), oldest
    /// first ([`DailyLedger::sent_at`]). Bound: [`SENT_KEPT`] a field, and only until a round
    /// that writes it goes through.
    sent: HashMap<(u32, String), VecDeque<(u64, u64)>>,
}

/// The unsure rounds [`DailyLedger`] keeps of each field: past them, the oldest is dropped, and
/// another router's memory that holds it is reckoned against the field (its batches counted
/// twice, the safe side).
pub const SENT_KEPT: usize = 16;

impl DailyLedger {
    /// The total the store holds of this router's `field` as read at start: the shards start
    /// from it, so only what they add to it is written.
    pub fn restored(&mut self, day: u32, field: &str, tokens: u64) {
        self.written.insert((day, field.to_owned()), tokens);
        self.held.insert((day, field.to_owned()), tokens);
    }

    /// How each of `totals` (day, field, the shards' whole total) is written.
    pub fn writes(&self, totals: &[(u32, String, u64)]) -> Vec<(u32, String, DailyWrite)> {
        totals
            .iter()
            .filter_map(|(day, field, total)| {
                Some((*day, field.clone(), self.write_of(*day, field, *total)?))
            })
            .collect()
    }

    /// How the shards' whole `total` of `field` is written; `None`: nothing to write.
    pub fn write_of(&self, day: u32, field: &str, total: u64) -> Option<DailyWrite> {
        let key = (day, field.to_owned());
        let written = self.written.get(&key).copied().unwrap_or(0);
        if self.whole.contains(&key) {
            return Some(DailyWrite::Set(total.max(written)));
        }
        let added = total.checked_sub(written).filter(|added| *added > 0)?;
        Some(DailyWrite::Add(added))
    }

    /// `totals` reached the store (the round's transaction ran).
    pub fn wrote(&mut self, totals: &[(u32, String, u64)]) {
        for (day, field, total) in totals {
            let key = (*day, field.clone());
            let whole = self.whole.remove(&key);
            // A field holds the highest total this process wrote, as its published usage does
            // (`Bucket::take_delta` offsets a net refund against later usage, never publishes
            // it): written whole too. Written whole as the shards' lower total, the refund came
            // off the field, and off it again as the next increment counted from the higher
            // total (seed 1,145: the store one token short of what was published, for good).
            let written = self.written.entry(key.clone()).or_default();
            *written = (*written).max(*total);
            let held = self.held.entry(key.clone()).or_default();
            *held = if whole { *written } else { (*held).max(*total) };
            // The field now holds every batch those rounds sent.
            self.sent.remove(&key);
        }
    }

    /// A round whose transaction may have run sent `totals` with the newest batch of each day
    /// at `newest` (this run's [`super::counted::published_marks`]: day, run, admitted at).
    pub fn sent(&mut self, totals: &[(u32, String, u64)], newest: &[(u32, u64, u64)], run: u64) {
        for (day, field, total) in totals {
            let Some(at) = newest
                .iter()
                .find(|(of, of_run, _)| of == day && *of_run == run)
                .map(|(_, _, at)| *at)
            else {
                continue;
            };
            let sent = self.sent.entry((*day, field.clone())).or_default();
            if sent.back().is_some_and(|(_, last)| last == total) {
                continue;
            }
            sent.push_back((at, *total));
            if sent.len() > SENT_KEPT {
                sent.pop_front();
            }
        }
    }

    /// This router's total of `field` as a round whose reply did not come sent it with every
    /// batch up to `mark`: what a router that applied those batches counts of it
    /// (`daily_fields::daily_records`). `None`: no such round is known.
    pub fn sent_at(&self, day: u32, field: &str, mark: u64) -> Option<u64> {
        self.sent
            .get(&(day, field.to_owned()))?
            .iter()
            .rev()
            .find(|(at, _)| *at <= mark)
            .map(|(_, total)| *total)
    }

    /// A round that wrote `totals` failed: whether its transaction ran is unknown, so each is
    /// written whole next time.
    pub fn unsure(&mut self, totals: &[(u32, String, u64)]) {
        self.whole
            .extend(totals.iter().map(|(day, field, _)| (*day, field.clone())));
    }

    /// The store lost its data: every field this process wrote is written whole once more
    /// (the shards report each total again).
    pub fn lost(&mut self) {
        self.whole.extend(self.written.keys().cloned());
    }

    /// This router's own totals the store is known to hold, whole: (day, field, tokens).
    pub fn known_totals(&self) -> Vec<(u32, String, u64)> {
        let mut known: Vec<_> = self
            .held
            .iter()
            .map(|((day, field), tokens)| (*day, field.clone(), *tokens))
            .collect();
        known.sort_unstable();
        known
    }

    /// Raises this router's own `fields` of `day`, as read from the store, to what this process
    /// knows the store held of them. A write the store lost (a failover to a replica that missed
    /// it) leaves the field lower until this router writes it whole again, and another router's
    /// memory of this one, reckoned against that field (`daily_records`), counted the lost part
    /// among the others' usage besides this router's own count of it (`sync::simulation`, seed
    /// 314: 2,893 tokens counted twice by the router that wrote them).
    pub fn raise_to_known(&self, day: u32, fields: &mut [(String, u64)]) {
        for (field, tokens) in fields.iter_mut() {
            if let Some(held) = self.held.get(&(day, field.clone())) {
                *tokens = (*tokens).max(*held);
            }
        }
    }

    /// Forgets the days before `day`: no shard reports totals of them any more.
    pub fn forget_before(&mut self, day: u32) {
        self.written.retain(|(of, _), _| *of >= day);
        self.held.retain(|(of, _), _| *of >= day);
        self.whole.retain(|(of, _)| *of >= day);
        self.sent.retain(|(of, _), _| *of >= day);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Capability;
    use crate::router::sync::daily_fields::{daily_field, daily_records, field_rows};

    const MONDAY: Day = Day(20_000);
    const CHAT: ModelId = ModelId(3);

    fn names(model: ModelId) -> Option<ModelName> {
        (model == CHAT).then(|| ModelName {
            name: "chat".into(),
            capability: Capability::Llm,
        })
    }

    fn ids(name: &ModelName) -> Option<ModelId> {
        (&*name.name == "chat").then_some(ModelId(9))
    }

    fn usage(key: u32, bucket: BucketRef, amount: u64) -> BucketUsage {
        BucketUsage {
            key: KeyId(key),
            bucket,
            amount,
        }
    }

    #[test]
    fn usage_crosses_routers_by_key_and_model_name() {
        let batch = Batch {
            admitted_at_unix_ms: 10_000,
            day: MONDAY,
            usage: vec![
                usage(2, BucketRef::Requests { model: None }, 1),
                usage(1, BucketRef::InputTokens { model: CHAT }, 500),
                usage(
                    2,
                    BucketRef::Daily {
                        model: Some(CHAT),
                        day: MONDAY,
                    },
                    700,
                ),
                // A model this router no longer names: dropped.
                usage(1, BucketRef::OutputTokens { model: ModelId(4) }, 5),
            ],
        };
        let entry = entry_of("router-0", 1, &batch, names);
        assert_eq!(entry.keys.len(), 2, "grouped by key");
        let decoded = Entry::decode(&entry.encode()).unwrap();
        let remote = remote_batch(&decoded, 10_250, false, ids);
        assert_eq!(remote.age_ms, 250);
        assert_eq!(
            remote.usage,
            [
                usage(1, BucketRef::InputTokens { model: ModelId(9) }, 500),
                usage(2, BucketRef::Requests { model: None }, 1),
                usage(
                    2,
                    BucketRef::Daily {
                        model: Some(ModelId(9)),
                        day: MONDAY
                    },
                    700
                ),
            ]
        );
        let replayed = remote_batch(&decoded, 10_250, true, ids);
        assert_eq!(replayed.usage.len(), 2, "daily usage is in the totals read");
    }

    #[test]
    fn a_round_that_failed_writes_its_totals_whole_next_time() {
        let mut ledger = DailyLedger::default();
        let totals = [(7, "r|1||".to_string(), 30)];
        ledger.wrote(&totals);
        // 40 now: 10 more. The round fails; the increment may or may not have landed.
        let totals = [(7, "r|1||".to_string(), 40)];
        assert_eq!(ledger.writes(&totals)[0].2, DailyWrite::Add(10));
        ledger.unsure(&totals);
        let totals = [(7, "r|1||".to_string(), 45)];
        assert_eq!(ledger.writes(&totals)[0].2, DailyWrite::Set(45));
        ledger.wrote(&totals);
        let totals = [(7, "r|1||".to_string(), 50)];
        assert_eq!(ledger.writes(&totals)[0].2, DailyWrite::Add(5));
    }

    #[test]
    fn the_totals_the_store_holds_follow_a_refund_written_whole() {
        let mut ledger = DailyLedger::default();
        ledger.restored(7, "r|1||", 100);
        ledger.wrote(&[(7, "r|1||".to_string(), 130), (8, "r|1||".to_string(), 5)]);
        // A net refund lowers the shards' total to 125; an increment cannot write it, so the
        // store keeps 130, as the published usage does.
        ledger.wrote(&[(7, "r|1||".to_string(), 125)]);
        assert_eq!(
            ledger.known_totals(),
            [(7, "r|1||".to_string(), 130), (8, "r|1||".to_string(), 5)]
        );
        // Written whole after the store lost its data: 130 again, not 125, so the next
        // increment does not take the refund off a second time (seed 1,145).
        ledger.lost();
        let totals = [(7, "r|1||".to_string(), 125)];
        assert_eq!(ledger.writes(&totals)[0].2, DailyWrite::Set(130));
        ledger.wrote(&totals);
        assert_eq!(ledger.known_totals()[0], (7, "r|1||".to_string(), 130));
        let totals = [(7, "r|1||".to_string(), 140)];
        assert_eq!(ledger.writes(&totals)[0].2, DailyWrite::Add(10));
        ledger.wrote(&totals);
        assert_eq!(ledger.known_totals()[0], (7, "r|1||".to_string(), 140));
        ledger.forget_before(8);
        assert_eq!(ledger.known_totals(), [(8, "r|1||".to_string(), 5)]);
    }

    /// Seed 314: a failover lost router-0's last increment (2,893 tokens); router-2, which had
    /// counted it, remembers the others. Router-0 reads its own field as it knows the store held
    /// it, and counts the lost increment once, as its own.
    #[test]
    fn a_write_the_store_lost_is_not_counted_among_the_others() {
        let field = |router: &str| daily_field(router, TenantId(1), None);
        let mut ledger = DailyLedger::default();
        ledger.wrote(&[(7, field("router-0"), 37_421)]);
        let mut fields = vec![
            (field("router-0"), 37_421 - 2_893),
            (field("router-1"), 31_456),
            (field("router-2"), 37_843),
        ];
        ledger.raise_to_known(7, &mut fields);
        assert_eq!(fields[0].1, 37_421);
        let memory = [(field("router-2"), 37_421 + 31_456)];
        let others = |fields: &[(String, u64)]| {
            daily_records(
                "router-0",
                Day(7),
                field_rows(fields),
                field_rows(&memory),
                false,
                |_, _| None,
            )
            .records[0]
                .tokens
        };
        assert_eq!(others(&fields), 31_456 + 37_843);
        fields[0].1 -= 2_893;
        assert_eq!(others(&fields), 31_456 + 37_843 + 2_893, "as before: twice");
    }

    #[test]
    fn a_batch_published_twice_is_applied_once() {
        let mut applied = Applied::default();
        assert!(applied.first_time("router-a", 1, 1_000));
        assert!(applied.first_time("router-a", 1, 1_200));
        // The round of 1,200 ran but its reply was lost: both batches come again.
        assert!(!applied.first_time("router-a", 1, 1_000));
        assert!(!applied.first_time("router-a", 1, 1_200));
        assert!(applied.first_time("router-a", 1, 1_400));
        // Another run, or another router, at the same time is another batch.
        assert!(applied.first_time("router-a", 2, 1_000));
        assert!(applied.first_time("router-b", 1, 1_000));
    }

    #[test]
    fn applied_batches_are_bounded() {
        let mut applied = Applied::default();
        for run in 0..APPLIED_RUNS_MAX as u64 + 10 {
            for at in 0..3 {
                assert!(applied.first_time("router", run, at));
            }
        }
        assert_eq!(applied.runs.len(), APPLIED_RUNS_MAX);
        for at in 0..BACKLOG_MAX as u64 + 10 {
            applied.first_time("busy", 1, at);
        }
        assert_eq!(
            applied.runs[&("busy".to_owned(), 1)].admitted_at.len(),
            BACKLOG_MAX
        );
    }

    #[test]
    fn daily_totals_go_out_as_increments_from_what_was_restored() {
        let mut ledger = DailyLedger::default();
        ledger.restored(7, "r|1||", 100);
        let totals = vec![(7, "r|1||".to_string(), 130), (7, "r|2||".to_string(), 5)];
        assert_eq!(
            ledger.writes(&totals),
            [
                (7, "r|1||".to_string(), DailyWrite::Add(30)),
                (7, "r|2||".to_string(), DailyWrite::Add(5)),
            ]
        );
        // Not written (the round failed): the same increments next time, from the latest total.
        let later = vec![(7, "r|1||".to_string(), 140)];
        assert_eq!(
            ledger.writes(&later),
            [(7, "r|1||".to_string(), DailyWrite::Add(40))]
        );
        ledger.wrote(&later);
        assert!(ledger.writes(&later).is_empty(), "nothing new");
        let lower = vec![(7, "r|1||".to_string(), 120)];
        assert!(
            ledger.writes(&lower).is_empty(),
            "a total never goes back: nothing to take from the store"
        );
    }

    #[test]
    fn two_writers_of_one_field_lose_nothing() {
        // Two processes under one router ID, each with its own ledger, both started from the
        // store's 100: the store ends with both processes' tokens.
        let mut ledgers = [DailyLedger::default(), DailyLedger::default()];
        for ledger in &mut ledgers {
            ledger.restored(7, "r|1||", 100);
        }
        let mut store = 100;
        for (writer, total) in [(0, 150), (1, 120), (0, 170)] {
            let ledger = &mut ledgers[writer];
            let totals = vec![(7, "r|1||".to_string(), total)];
            for (_, _, write) in ledger.writes(&totals) {
                match write {
                    DailyWrite::Add(tokens) => store += tokens,
                    DailyWrite::Set(tokens) => store = tokens,
                }
            }
            ledger.wrote(&totals);
        }
        assert_eq!(store, 100 + 70 + 20);
    }

    #[test]
    fn after_a_data_loss_each_field_is_written_whole_once() {
        let mut ledger = DailyLedger::default();
        let totals = vec![(7, "r|1||".to_string(), 50)];
        ledger.wrote(&totals);
        ledger.lost();
        assert_eq!(
            ledger.writes(&totals),
            [(7, "r|1||".to_string(), DailyWrite::Set(50))]
        );
        ledger.wrote(&totals);
        let more = vec![(7, "r|1||".to_string(), 60)];
        assert_eq!(
            ledger.writes(&more),
            [(7, "r|1||".to_string(), DailyWrite::Add(10))]
        );
        ledger.forget_before(8);
        assert_eq!(
            ledger.writes(&more),
            [(7, "r|1||".to_string(), DailyWrite::Add(60))],
            "forgotten"
        );
    }

    #[test]
    fn a_full_backlog_merges_its_oldest_batches_without_losing_usage() {
        let mut backlog = Backlog::default();
        for round in 0..BACKLOG_MAX as u64 + 5 {
            backlog.push(Batch {
                admitted_at_unix_ms: round,
                day: MONDAY,
                usage: vec![usage(1, BucketRef::Requests { model: None }, 1)],
            });
        }
        assert_eq!(backlog.batches().len(), BACKLOG_MAX);
        let total: u64 = backlog
            .batches()
            .iter()
            .flat_map(|batch| &batch.usage)
            .map(|usage| usage.amount)
            .sum();
        assert_eq!(total, BACKLOG_MAX as u64 + 5);
        assert_eq!(backlog.batches()[0].usage.len(), 1, "one line per bucket");
        assert_eq!(
            backlog.batches()[0].admitted_at_unix_ms,
            5,
            "the later time of the merged batches"
        );
    }

    #[test]
    fn the_latest_daily_total_replaces_an_earlier_one() {
        let mut backlog = Backlog::default();
        let total = |tokens| DailyTotal {
            tenant: TenantId(1),
            model: None,
            day: MONDAY,
            tokens,
        };
        backlog.push_totals(vec![total(10)]);
        backlog.push_totals(vec![total(25)]);
        assert_eq!(backlog.totals().collect::<Vec<_>>(), [total(25)]);
    }

    /// A read takes the next day's totals too once midnight is nearer than the site's clocks
    /// may differ (30 s), and only then.
    #[test]
    fn a_read_near_midnight_takes_the_next_days_totals_too() {
        let midnight = 20_001 * 86_400_000;
        assert_eq!(days_to_read(midnight - 30_001), (MONDAY, None));
        assert_eq!(days_to_read(midnight - 30_000), (MONDAY, Some(Day(20_001))));
        assert_eq!(days_to_read(midnight - 1), (MONDAY, Some(Day(20_001))));
        assert_eq!(days_to_read(midnight), (Day(20_001), None));
    }
}
