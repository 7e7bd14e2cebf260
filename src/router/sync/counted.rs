//! What this router counts of the other routers' daily usage, and which of their batches the
//! count holds: each budget's count with a mark per run of another router, the admission time of
//! the newest batch of that run it holds (pure).
//!
//! A count of the others is the larger of several lower bounds: the batches this router applied,
//! the totals read from the store, what another router remembers of the others after the store
//! lost its data (`memory:{day}`), what this router's previous run counted (its journal). A batch
//! published again after a lost reply is applied once thanks to `round::Applied`, but only by a
//! router that applied the first copy: one whose count came from a bound that held the batch
//! applied the copy on top of it (`sync::simulation`, seeds 3,538 and 6,671: 9,965 and 2,925
//! tokens counted twice for the rest of the day). Each bound now carries its marks, and a batch at
//! or before the mark of the bound the count came from is already in it.
//!
//! Why a mark per run is enough: a run publishes its batches in admission order, a batch
//! published again included, and the stream keeps that order, so what any router holds of one
//! run's batches on one budget is a prefix of them. Why the marks of the bound the count came
//! from, and only those: a count is one number per budget, and a larger bound replaces a smaller
//! one; batches the smaller bound held and the larger did not are not in the count any more, and
//! applied again when they are published again.
//!
//! On the wire the marks are fields beside the counts they describe, in hashes whose other
//! fields are daily totals (`daily_fields::daily_field`); a mark's field starts with the separator, which
//! no router ID does, so `daily_fields::parse_daily_field` never takes one for a total:
//! - `daily:{day}`: `|{router}|{run}` -> the newest batch of that run whose daily usage the
//!   router's totals hold (written with them, by the round's script);
//! - `memory:{day}` and a journal's `others`: `|{router}|{run}|{field}` -> the newest batch of
//!   that run the count of the budget `field` names holds.
//!
//! Bound: one entry per budget and day the others' usage reached this router (the budgets its
//! shards hold), each with at most [`MARKS_MAX`] marks.

use std::collections::{BTreeMap, HashMap};

use crate::base::ids::{KeyId, TenantId};
use crate::logic::snapshot::ModelKey;

use super::entry::{Bucket, Entry};

/// Marks a count keeps: two runs for each router of the largest site, the oldest dropped first
/// (a batch of a forgotten run is applied again: counted twice, the safe side).
pub const MARKS_MAX: usize = 2 * super::site::ROUTERS_MAX;

/// A daily budget: (day, tenant, model; none for the tenant's flat budget).
pub type Budget = (u32, TenantId, Option<ModelKey>);

/// Which batches of the other routers' runs a count holds: (router ID, run) -> the admission time
/// (unix ms) of the newest it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks(BTreeMap<(String, u64), u64>);

impl Marks {
    /// Whether the batch `router`'s run `run` admitted at `admitted_at` is held.
    pub fn holds(&self, router: &str, run: u64, admitted_at: u64) -> bool {
        self.0
            .get(&(router.to_owned(), run))
            .is_some_and(|mark| admitted_at <= *mark)
    }

    /// Holds the batches of `router`'s run `run` up to `admitted_at` too.
    pub fn raise(&mut self, router: &str, run: u64, admitted_at: u64) {
        let mark = self.0.entry((router.to_owned(), run)).or_default();
        *mark = (*mark).max(admitted_at);
        if self.0.len() > MARKS_MAX
            && let Some(oldest) = self
                .0
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(run, _)| run.clone())
        {
            self.0.remove(&oldest);
        }
    }

    /// Every mark of `other` too (a bound that is the sum of two, each holding its own runs).
    pub fn add(&mut self, other: &Marks) {
        for ((router, run), at) in &other.0 {
            self.raise(router, *run, *at);
        }
    }

    /// The marks of one router's runs only.
    pub fn of_router(&self, router: &str) -> Marks {
        Marks(
            self.0
                .iter()
                .filter(|((of, _), _)| of == router)
                .map(|(run, at)| (run.clone(), *at))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (router, run, admitted at), in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.0
            .iter()
            .map(|((router, run), at)| (router.as_str(), *run, *at))
    }
}

/// The field of a mark in `daily:{day}`: `router`'s run `run`, beside its totals.
pub fn published_field(router: &str, run: u64) -> String {
    format!("|{router}|{run}")
}

/// A mark beside a count of budget `field` (`memory:{day}`, a journal's others).
pub fn mark_field(router: &str, run: u64, field: &str) -> String {
    format!("|{router}|{run}|{field}")
}

/// The parts of a mark's field: (router, run, the count's field; empty in `daily:{day}`).
pub fn parse_mark_field(field: &str) -> Option<(&str, u64, &str)> {
    let rest = field.strip_prefix('|')?;
    let (router, rest) = rest.split_once('|')?;
    let (run, field) = match rest.split_once('|') {
        Some((run, field)) => (run, field),
        None => (rest, ""),
    };
    (!router.is_empty()).then_some(())?;
    Some((router, run.parse().ok()?, field))
}

/// The marks a round writes beside its totals (`store::RoundWrites::marks`): for each day and
/// run of `entries` (this router's, encoded) with daily usage, the newest batch's admission time,
/// as (day, run, admitted at). An entry that does not decode is left out (it holds no mark).
pub fn published_marks(entries: &[Vec<u8>]) -> Vec<(u32, u64, u64)> {
    let mut marks: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    for entry in entries.iter().filter_map(|bytes| Entry::decode(bytes).ok()) {
        let daily = entry
            .keys
            .iter()
            .flat_map(|key| &key.buckets)
            .filter_map(|(bucket, _)| match bucket {
                Bucket::Daily { day, .. } => Some(day.0),
                _ => None,
            });
        for day in daily {
            let mark = marks.entry((day, entry.run)).or_default();
            *mark = (*mark).max(entry.admitted_at_unix_ms);
        }
    }
    marks
        .into_iter()
        .map(|((day, run), at)| (day, run, at))
        .collect()
}

/// The marks among `rows` (field, value) of a hash: those beside totals (`daily:{day}`, by
/// router) and those beside counts (by the count's field).
#[derive(Debug, Default)]
pub struct MarkRows {
    /// Per router, the marks of its runs its totals hold.
    pub published: HashMap<String, Marks>,
    /// Per count's field, the marks it holds.
    pub counts: HashMap<String, Marks>,
}

impl MarkRows {
    pub fn read<'a>(rows: impl IntoIterator<Item = (&'a str, u64)>) -> MarkRows {
        let mut marks = MarkRows::default();
        for (field, at) in rows {
            let Some((router, run, of)) = parse_mark_field(field) else {
                continue;
            };
            if of.is_empty() {
                marks
                    .published
                    .entry(router.to_owned())
                    .or_default()
                    .raise(router, run, at);
            } else {
                marks
                    .counts
                    .entry(of.to_owned())
                    .or_default()
                    .raise(router, run, at);
            }
        }
        marks
    }

    /// The marks of `router`'s own totals.
    pub fn published_by(&self, router: &str) -> Marks {
        self.published.get(router).cloned().unwrap_or_default()
    }
}

/// The rows (day, field, at) of `marks` beside the count of `field` of `day`.
pub fn mark_rows(day: u32, field: &str, marks: &Marks) -> impl Iterator<Item = (u32, String, u64)> {
    marks
        .iter()
        .map(move |(router, run, at)| (day, mark_field(router, run, field), at))
}

/// One budget's count of the others and the batches it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Count {
    tokens: u64,
    marks: Marks,
}

/// This router's count of the others on each budget, as the shards hold it: batches applied add
/// to it, a larger bound replaces it (`DailyBudget::apply_remote`, `set_others_total`).
#[derive(Debug, Default)]
pub struct Counted {
    budgets: HashMap<Budget, Count>,
}

impl Counted {
    /// The daily usage `tokens` of `budget` in the batch `router`'s run `run` admitted at
    /// `admitted_at`: whether the count does not hold it yet (it is to be applied); counts it.
    pub fn count(
        &mut self,
        budget: Budget,
        router: &str,
        run: u64,
        admitted_at: u64,
        tokens: u64,
    ) -> bool {
        let count = self.budgets.entry(budget).or_default();
        if count.marks.holds(router, run, admitted_at) {
            return false;
        }
        count.tokens = count.tokens.saturating_add(tokens);
        count.marks.raise(router, run, admitted_at);
        true
    }

    /// Keeps in `entry`, another router's batch about to be applied, only the daily usage the
    /// counts do not hold yet, and counts it. `tenant_of`: the tenant of a key (`None`: a key
    /// this router does not know, whose usage nothing here counts).
    pub fn take_new(&mut self, entry: &mut Entry, tenant_of: impl Fn(KeyId) -> Option<TenantId>) {
        let Entry {
            router,
            run,
            admitted_at_unix_ms,
            models,
            keys,
            ..
        } = entry;
        for key in keys.iter_mut() {
            let Some(tenant) = tenant_of(key.key) else {
                continue;
            };
            key.buckets.retain(|(bucket, tokens)| {
                let Bucket::Daily { model, day } = bucket else {
                    return true;
                };
                let model = match model {
                    None => None,
                    Some(index) => match models.get(*index as usize) {
                        Some(name) => Some(ModelKey {
                            name: name.name.clone(),
                            capability: name.capability,
                        }),
                        None => return true,
                    },
                };
                self.count(
                    (day.0, tenant, model),
                    router,
                    *run,
                    *admitted_at_unix_ms,
                    *tokens,
                )
            });
        }
    }

    /// A bound of the others' usage of `budget` (`tokens`, holding the batches `marks` says):
    /// the count when it is more.
    pub fn bound(&mut self, budget: Budget, tokens: u64, marks: &Marks) {
        let count = self.budgets.entry(budget).or_default();
        if tokens > count.tokens {
            *count = Count {
                tokens,
                marks: marks.clone(),
            };
        }
    }

    /// The marks of `budget`'s count when the count is `tokens` (as a shard reports it); none
    /// when the shard counts otherwise (then which batches its count holds is not known).
    pub fn marks_of(&self, budget: &Budget, tokens: u64) -> Option<&Marks> {
        self.budgets
            .get(budget)
            .filter(|count| count.tokens == tokens)
            .map(|count| &count.marks)
    }

    /// Forgets the days before `day`.
    pub fn forget_before(&mut self, day: u32) {
        self.budgets.retain(|(of, _, _), _| *of >= day);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::sync::daily_fields::parse_daily_field;

    const DAY: u32 = 20_000;
    const FLAT: Budget = (DAY, TenantId(7), None);

    #[test]
    fn a_batch_published_again_is_counted_once_through_a_bound_that_held_it() {
        // Router-2's batch at 1,000 ran, its reply was lost; router-0 counted it, then
        // remembered it after the store lost its data. Router-1 never applied it: its count
        // comes from router-0's memory, which holds it.
        let mut memory = Marks::default();
        memory.raise("router-2", 5, 1_000);
        let mut counted = Counted::default();
        counted.bound(FLAT, 15_503, &memory);
        // Router-2, back, publishes its held-back batches again: the first is in the count.
        assert!(!counted.count(FLAT, "router-2", 5, 1_000, 15_503));
        assert!(counted.count(FLAT, "router-2", 5, 1_500, 200));
        assert_eq!(
            counted.marks_of(&FLAT, 15_703),
            Some(&{
                let mut marks = Marks::default();
                marks.raise("router-2", 5, 1_500);
                marks
            })
        );
    }

    #[test]
    fn a_larger_bound_replaces_the_marks_of_what_it_does_not_hold() {
        let mut counted = Counted::default();
        assert!(counted.count(FLAT, "router-1", 3, 900, 100));
        // A bound that holds more tokens, but none of router-1's run 3.
        let mut other = Marks::default();
        other.raise("router-2", 5, 1_000);
        counted.bound(FLAT, 500, &other);
        // Router-1's batch published again is not in the count any more: applied again.
        assert!(counted.count(FLAT, "router-1", 3, 900, 100));
        // A smaller bound changes nothing.
        counted.bound(FLAT, 550, &Marks::default());
        assert_eq!(
            counted.marks_of(&FLAT, 600).map(Marks::is_empty),
            Some(false)
        );
        assert!(!counted.count(FLAT, "router-2", 5, 1_000, 50));
    }

    #[test]
    fn marks_are_only_given_for_the_count_they_describe() {
        let mut counted = Counted::default();
        counted.count(FLAT, "router-1", 3, 900, 100);
        let field = super::super::daily_fields::daily_field("router-0", TenantId(7), None);
        assert_eq!(
            super::super::daily_fields::marks_beside(&counted, &[(DAY, field.clone(), 100)]),
            vec![(DAY, mark_field("router-1", 3, &field), 900)]
        );
        // The shard counts otherwise: which batches it holds is not known.
        assert!(super::super::daily_fields::marks_beside(&counted, &[(DAY, field, 90)]).is_empty());
    }

    #[test]
    fn mark_fields_round_trip_and_are_never_totals() {
        let field = super::super::daily_fields::daily_field("router-0", TenantId(7), None);
        let beside = mark_field("router-1", 42, &field);
        assert_eq!(
            parse_mark_field(&beside),
            Some(("router-1", 42, field.as_str()))
        );
        assert_eq!(parse_daily_field(&beside), None);
        let published = published_field("router-1", 42);
        assert_eq!(parse_mark_field(&published), Some(("router-1", 42, "")));
        assert_eq!(parse_daily_field(&published), None);
        assert_eq!(parse_mark_field(&field), None);
        let rows = MarkRows::read([(published.as_str(), 7), (beside.as_str(), 9)]);
        assert!(rows.published_by("router-1").holds("router-1", 42, 7));
        assert!(!rows.published_by("router-1").holds("router-1", 42, 8));
        assert!(rows.counts[&field].holds("router-1", 42, 9));
    }

    #[test]
    fn marks_are_bounded() {
        let mut marks = Marks::default();
        for run in 0..(MARKS_MAX as u64 + 10) {
            marks.raise("router-1", run, run);
        }
        assert_eq!(marks.iter().count(), MARKS_MAX);
        // The oldest went.
        assert!(!marks.holds("router-1", 0, 0));
    }
}
