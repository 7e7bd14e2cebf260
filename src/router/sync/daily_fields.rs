//! Daily totals as the store keeps them in `daily:{day}`: one field per router and budget, the
//! others' count read back from those fields and from the routers' memory, with the marks of the
//! batches each count holds (seed `run-several-routers.md`, "How it works"; `sync::counted`).
//!
//! No I/O: `sync::core` reads the hash and passes its rows in.

use std::collections::HashMap;

use crate::base::ids::TenantId;
use crate::logic::limits::Day;
use crate::logic::snapshot::ModelKey;
use crate::router::shard::owner::quotas::DailyRecord;

use super::counted::{Counted, MarkRows, Marks};

const FIELD_SEPARATOR: char = '|';

/// A daily total's field in the day's hash: `router|tenant|capability|model` (capability and
/// model empty for the flat budget). Router IDs never hold `|` (`config::sync`); model names may,
/// so the model comes last.
pub fn daily_field(router: &str, tenant: TenantId, model: Option<&ModelKey>) -> String {
    match model {
        None => format!("{router}|{:08x}||", tenant.0),
        Some(model) => format!(
            "{router}|{:08x}|{}|{}",
            tenant.0,
            model.capability.as_str(),
            model.name
        ),
    }
}

/// The parts of a [`daily_field`]; `None` for a field this version does not write.
pub fn parse_daily_field(field: &str) -> Option<(&str, TenantId, Option<ModelKey>)> {
    let mut parts = field.splitn(4, FIELD_SEPARATOR);
    // A mark's field (`sync::counted`) starts with the separator: no router's.
    let router = parts.next().filter(|router| !router.is_empty())?;
    let tenant = TenantId(u32::from_str_radix(parts.next()?, 16).ok()?);
    let capability = parts.next()?;
    let name = parts.next()?;
    let model = match (capability, name) {
        ("", "") => None,
        (capability, name) if !name.is_empty() => Some(ModelKey {
            name: name.into(),
            capability: crate::base::ids::Capability::ALL
                .into_iter()
                .find(|known| known.as_str() == capability)?,
        }),
        _ => return None,
    };
    Some((router, tenant, model))
}

/// `rows` (field, tokens) as [`daily_records`] takes its fields and memory.
pub fn field_rows(rows: &[(String, u64)]) -> impl Iterator<Item = (&str, u64)> {
    rows.iter().map(|(field, tokens)| (field.as_str(), *tokens))
}

/// Today's totals read from the store as the shards restore them ([`daily_records`]), and the
/// batches each count of the others holds (`sync::counted`), by budget.
#[derive(Debug, Default)]
pub struct DailyRecords {
    pub records: Vec<DailyRecord>,
    /// The marks of each of the others' records (`others: true`), by (tenant, model).
    pub marks: HashMap<(TenantId, Option<ModelKey>), Marks>,
}

impl DailyRecords {
    /// The others' record of `budget` with its marks: `tokens` when more than what is read.
    pub fn raise_others(
        &mut self,
        day: Day,
        budget: (TenantId, Option<ModelKey>),
        tokens: u64,
        marks: &Marks,
    ) {
        let (tenant, model) = budget.clone();
        match self
            .records
            .iter_mut()
            .find(|record| record.others && record.tenant == tenant && record.model == model)
        {
            Some(record) if record.tokens >= tokens => return,
            Some(record) => record.tokens = tokens,
            None => self.records.push(DailyRecord {
                tenant,
                model,
                day,
                tokens,
                others: true,
            }),
        }
        self.marks.insert(budget, marks.clone());
    }

    /// Each of the others' counts read, a bound of this router's count (`sync::counted`).
    pub fn bound(&self, counts: &mut Counted) {
        for record in self.records.iter().filter(|record| record.others) {
            let budget = (record.tenant, record.model.clone());
            let marks = self.marks.get(&budget).cloned().unwrap_or_default();
            counts.bound((record.day.0, budget.0, budget.1), record.tokens, &marks);
        }
    }
}

/// The mark rows (day, `|router|run|field`, at) beside each of `rows` (day, this router's field
/// of the budget, tokens) whose marks `counts` knows: what `memory:{day}` and the journal hold
/// beside the counts (`sync::counted`).
pub fn marks_beside(counts: &Counted, rows: &[(u32, String, u64)]) -> Vec<(u32, String, u64)> {
    let mut marks = Vec::new();
    for (day, field, tokens) in rows {
        let Some((_, tenant, model)) = parse_daily_field(field) else {
            continue;
        };
        if let Some(held) = counts.marks_of(&(*day, tenant, model), *tokens) {
            marks.extend(super::counted::mark_rows(*day, field, held));
        }
    }
    marks
}

/// Today's totals read from the store as the shards restore them: this router's own (added once,
/// at start-up, when `with_own`) and the other routers' (replacing what was known), each count
/// of the others with the marks of the batches it holds (`sync::counted`).
///
/// The others' usage is the sum of their totals, or more where a router's memory says so. After
/// the store lost its data, each router writes its own total again, but nobody writes the total
/// of a run that ended before the loss: the routers that lived through it still count it in
/// memory, and write what they count of the others to `memory:{day}` (their field of the budget
/// in it). A router that starts later reads it: what router A remembers of everyone but A, plus
/// A's own total, less this router's own total, is a lower bound of what everyone but this
/// router used (A's memory of this router is at most this router's total, once this router has
/// written it again: until then the memory is not read). Before, a router
/// that started after a loss missed the dead run's usage for the rest of the day
/// (`sync::simulation`, seed 46: 15,400 tokens).
///
/// The sum of the totals holds each router's batches up to the marks written beside its totals;
/// A's bound holds those of A's memory and of A's totals. The larger bound is the count, with its
/// marks.
///
/// A's memory may hold batches of this router's that its total in the store does not: a round
/// whose reply was lost ran, A applied its entry, and a failover lost it. A's marks of this
/// router's runs then pass the marks beside its total, and `sent(field, mark)` (this router's
/// total as its round sent it with its newest batch at `mark`, [`DailyLedger::sent_at`]) is what
/// A counted of it. Reckoned against the field, the batch was counted twice, as the others'
/// usage, for the rest of the day (`sync::simulation`, long-mode seed 36,879: 2,253 tokens).
///
/// [`DailyLedger::sent_at`]: super::round::DailyLedger::sent_at
pub fn daily_records<'a>(
    own_router: &str,
    day: Day,
    fields: impl IntoIterator<Item = (&'a str, u64)>,
    memory: impl IntoIterator<Item = (&'a str, u64)>,
    with_own: bool,
    sent: impl Fn(&str, u64) -> Option<u64>,
) -> DailyRecords {
    type Budget = (TenantId, Option<ModelKey>);
    let fields: Vec<(&str, u64)> = fields.into_iter().collect();
    let memory: Vec<(&str, u64)> = memory.into_iter().collect();
    let published = MarkRows::read(fields.iter().copied());
    let remembered = MarkRows::read(memory.iter().copied());
    let mut summed = Marks::default();
    for (router, marks) in &published.published {
        if router != own_router {
            summed.add(marks);
        }
    }
    let mut others: HashMap<Budget, (u64, Option<Marks>)> = HashMap::new();
    let mut totals: HashMap<(Budget, &str), u64> = HashMap::new();
    let mut read = DailyRecords::default();
    for (field, tokens) in fields {
        let Some((router, tenant, model)) = parse_daily_field(field) else {
            continue;
        };
        totals.insert(((tenant, model.clone()), router), tokens);
        if router == own_router {
            if with_own {
                read.records.push(DailyRecord {
                    tenant,
                    model,
                    day,
                    tokens,
                    others: false,
                });
            }
        } else {
            let sum = &mut others.entry((tenant, model)).or_default().0;
            *sum = sum.saturating_add(tokens);
        }
    }
    let ours_published = published.published_by(own_router);
    for (field, remembered_tokens) in memory {
        let Some((router, tenant, model)) = parse_daily_field(field) else {
            continue;
        };
        if router == own_router {
            continue;
        }
        let budget = (tenant, model);
        let theirs = totals.get(&(budget.clone(), router)).copied().unwrap_or(0);
        // This router's own total must be in the store (or be none, at start-up): re-reading
        // after a loss, before its own is written again, A's memory of it would count twice.
        let Some(ours) = totals
            .get(&(budget.clone(), own_router))
            .copied()
            .or(with_own.then_some(0))
        else {
            continue;
        };
        // The newest batch of this router's that A holds and its total does not.
        let held_by_them = remembered.counts.get(field).and_then(|marks| {
            marks
                .iter()
                .filter(|(router, run, at)| {
                    *router == own_router && !ours_published.holds(router, *run, *at)
                })
                .map(|(_, _, at)| at)
                .max()
        });
        let ours = match held_by_them {
            Some(mark) => {
                let own_field = daily_field(own_router, budget.0, budget.1.as_ref());
                ours.max(sent(&own_field, mark).unwrap_or(0))
            }
            None => ours,
        };
        let floor = remembered_tokens
            .saturating_add(theirs)
            .saturating_sub(ours);
        let known = others.entry(budget).or_default();
        if floor > known.0 {
            let mut marks = remembered.counts.get(field).cloned().unwrap_or_default();
            marks.add(&published.published_by(router));
            *known = (floor, Some(marks));
        }
    }
    for ((tenant, model), (tokens, marks)) in others {
        read.marks.insert(
            (tenant, model.clone()),
            marks.unwrap_or_else(|| summed.clone()),
        );
        read.records.push(DailyRecord {
            tenant,
            model,
            day,
            tokens,
            others: true,
        });
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Capability;

    const MONDAY: Day = Day(20_000);

    #[test]
    fn daily_fields_round_trip_and_sum_the_other_routers() {
        let chat = ModelKey {
            name: "org/chat|v2".into(),
            capability: Capability::Llm,
        };
        let field = daily_field("router-0", TenantId(0xab), Some(&chat));
        assert_eq!(
            parse_daily_field(&field),
            Some(("router-0", TenantId(0xab), Some(chat.clone())))
        );
        let flat = daily_field("router-1", TenantId(0xab), None);
        assert_eq!(
            parse_daily_field(&flat),
            Some(("router-1", TenantId(0xab), None))
        );
        assert_eq!(parse_daily_field("garbage"), None);

        let fields = [
            (daily_field("me", TenantId(1), None), 100),
            (daily_field("a", TenantId(1), None), 20),
            (daily_field("b", TenantId(1), None), 30),
        ];
        let read = |with_own| {
            let mut records =
                daily_records("me", MONDAY, field_rows(&fields), [], with_own, |_, _| None).records;
            records.sort_by_key(|record| record.others);
            records
                .into_iter()
                .map(|record| (record.tokens, record.others))
                .collect::<Vec<_>>()
        };
        assert_eq!(read(true), [(100, false), (50, true)]);
        assert_eq!(read(false), [(50, true)]);
    }

    /// After a loss, "a" and "b" wrote their totals again (20 and 30), and "a" remembers 4,000
    /// of everyone else: "me"'s 100 and a run that ended before the loss. "me" counts at least
    /// 4,000 + 20 - 100 of the others, not the 50 their totals say; "b"'s memory, smaller, changes
    /// nothing, and "me"'s own memory is not read back.
    #[test]
    fn a_router_remembers_usage_whose_writer_is_gone() {
        let fields = [
            (daily_field("me", TenantId(1), None), 100),
            (daily_field("a", TenantId(1), None), 20),
            (daily_field("b", TenantId(1), None), 30),
        ];
        let memory = [
            (daily_field("a", TenantId(1), None), 4_000),
            (daily_field("b", TenantId(1), None), 900),
            (daily_field("me", TenantId(1), None), 9_999),
        ];
        let records = daily_records(
            "me",
            MONDAY,
            field_rows(&fields),
            field_rows(&memory),
            false,
            |_, _| None,
        )
        .records;
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].tokens, 3_920);
        assert!(records[0].others);
    }

    /// Long-mode seed 36,879: "me" sent 2,253 tokens in a round whose reply was lost; "a"
    /// applied the batch, then a failover lost it from the store, total and mark alike. "a"'s
    /// memory holds it (its mark of "me" passes the one beside "me"'s total): reckoned against
    /// the field, "me" counted its own batch among the others'.
    #[test]
    fn a_memory_that_holds_a_batch_the_store_lost_is_reckoned_against_what_was_sent() {
        use super::super::counted::{mark_field, published_field};
        let field = |router: &str| daily_field(router, TenantId(1), None);
        let fields = [
            (field("me"), 64_632),
            (published_field("me", 1), 1_000),
            (field("a"), 77_682),
            (field("b"), 61_600),
        ];
        let memory = [
            (field("a"), 64_632 + 2_253 + 61_600),
            (mark_field("me", 1, &field("a")), 2_000),
        ];
        let others = |sent: &dyn Fn(&str, u64) -> Option<u64>| {
            daily_records(
                "me",
                MONDAY,
                field_rows(&fields),
                field_rows(&memory),
                false,
                sent,
            )
            .records[0]
                .tokens
        };
        let mut ledger = super::super::round::DailyLedger::default();
        ledger.sent(
            &[(MONDAY.0, field("me"), 64_632 + 2_253)],
            &[(MONDAY.0, 1, 2_000)],
            1,
        );
        assert_eq!(ledger.sent_at(MONDAY.0, &field("me"), 1_999), None);
        let sent = |field: &str, mark: u64| ledger.sent_at(MONDAY.0, field, mark);
        assert_eq!(others(&sent), 77_682 + 61_600);
        assert_eq!(
            others(&|_, _| None),
            77_682 + 61_600 + 2_253,
            "as before: twice"
        );
        // Once a round that writes the field goes through, nothing sent is kept.
        ledger.wrote(&[(MONDAY.0, field("me"), 70_000)]);
        assert_eq!(ledger.sent_at(MONDAY.0, &field("me"), 2_000), None);
    }
}
