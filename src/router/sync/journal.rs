//! The journal of usage held back while the store does not answer (`--sync-journal`): a small
//! file this router rewrites after every round that failed with usage to publish, and removes
//! after the first round that published it. The next run under the same `--router-id` reads it
//! at start and publishes what it holds. Without it, a router that crashes or shuts down before
//! the store answers again takes the usage it held back with it (up to its share of what was
//! left of every daily budget), and the site may spend that much more that day: 45 of the first
//! 400 seeds of the site's simulation with faults (`sync::simulation`).
//!
//! # What it holds
//! - The stream entries the backlog would publish, encoded as they are published: each names
//!   its router, run and admission time, so a copy that reached the store before (a round whose
//!   transaction ran and whose reply was lost) is applied once by every reader
//!   ([`super::round::Applied`]) and counted once by the levels ([`super::levels`]).
//! - This router's whole daily totals not written yet, as the store's own fields
//!   ([`super::daily_fields::daily_field`]): (day, field, tokens).
//! - What the run counted of the other routers on each budget ([`Journal::others`]): a new
//!   run counts at least that much of them, whatever the store still holds.
//!
//! After a round that published everything, the file becomes a checkpoint: no entries, and
//! this router's own totals as the store holds them ([`Journaling::after_published`]). A run
//! that starts after the store lost its data (a restart without its data, a failover to a
//! replica that missed writes) writes them again: nobody else does when no router that lived
//! through the loss counts them (33 of the first 400 seeds of the site's simulation with faults
//! failed on it; seed 118: 14,814 tokens counted nowhere). A failed round's journal replaces
//! the checkpoint with its own: the totals it changed, and the file's others.
//!
//! # How the next run uses it
//! Its entries are published first, at the first round that reaches the store; its totals
//! raise this router's own totals read from the store ([`Journal::raise_own_totals`]) and are
//! written whole. A journal of another router ID (a file copied between routers) is ignored.
//!
//! # Writes
//! Whole, to `PATH.tmp`, synced, then renamed over `PATH`: a crash leaves the old journal or the
//! new one, never a torn one; a checksum catches a file the disk cut short. Failed rounds write
//! it, once per round, on the sync core's blocking pool, never on the request path. A
//! checkpoint is written after a round that changed this router's totals, renamed but not
//! synced ([`replace`]): a process that dies keeps it, and a machine that crashes may lose the
//! latest one, never a journal of usage held back (the entries of which are in the store by
//! then).
//!
//! Bound: per run, the backlog's [`super::round::BACKLOG_MAX`] entries plus one total per budget
//! this router charged while the store did not answer, and one count of the others per budget
//! and day this router counts any on (the budgets its shards hold). A run that inherits a journal and fails
//! too keeps the inherited entries under its own, so a journal holds that much per run that
//! ended during one outage (each crash adds at most one backlog); a read refuses more than
//! `ITEMS_MAX` entries or totals, and anything that does not fit the bytes it was given.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::counted::MarkRows;
use super::daily_fields::DailyRecords;
use super::entry::{DecodeError, Reader, put_str, put_varint};
use crate::logic::limits::Day;

const MAGIC: &[u8; 4] = b"HVSJ";
/// 2 adds `others`; a journal of version 1 is read with none.
const VERSION: u8 = 2;
/// Entries and totals a journal may hold: far more than a backlog (a hostile or corrupted count
/// allocates nothing, `Reader::count`).
const ITEMS_MAX: usize = 1 << 20;
const CHECKSUM_BYTES: usize = 8;

/// What a run held back when its last round failed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    /// `--router-id` of the run that wrote it.
    pub router: String,
    /// That run's start (unix ms).
    pub run: u64,
    /// Stream entries not published, oldest first, encoded ([`super::entry::Entry::encode`]).
    pub entries: Vec<Vec<u8>>,
    /// Whole daily totals not written: (day, field, tokens).
    pub totals: Vec<(u32, String, u64)>,
    /// What the run counted of the other routers on each budget when the file was written:
    /// (day, this router's field of the budget, tokens). A lower bound of their usage that day:
    /// a run that starts after the store lost its data, before the others wrote theirs again,
    /// counts at least that much of them ([`Journal::raise_others`]).
    pub others: Vec<(u32, String, u64)>,
}

impl Journal {
    /// Whether it holds anything to publish.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.totals.is_empty()
    }

    /// Adds `earlier`, a previous run's journal not published yet, under this one: its entries
    /// first, and each total the larger of the two (both are whole totals of the same field).
    pub fn keep(&mut self, earlier: &Journal) {
        let mut entries = earlier.entries.clone();
        entries.append(&mut self.entries);
        self.entries = entries;
        keep_larger(&mut self.totals, &earlier.totals);
        keep_larger_counts(&mut self.others, &earlier.others);
    }

    /// Raises what `records` (today's totals as read from the store, `sync::daily_fields::daily_records`)
    /// count of the other routers of `day` to what this journal's run counted of them, where it
    /// counted more. A run that crashed and started again just after the store lost its data,
    /// before the routers that lived through it wrote their totals and memory again, read only
    /// its own total, and spent as if the others had used nothing that day (`sync::simulation`,
    /// seed 677: 7,297 tokens where nothing was left).
    pub fn raise_others(&self, router: &str, day: u32, read: &mut DailyRecords) {
        let marks = MarkRows::read(
            self.others
                .iter()
                .filter(|(of, _, _)| *of == day)
                .map(|(_, field, at)| (field.as_str(), *at)),
        );
        for (of, field, tokens) in &self.others {
            let Some((owner, tenant, model)) = super::daily_fields::parse_daily_field(field) else {
                continue;
            };
            if *of != day || owner != router {
                continue;
            }
            let held = marks.counts.get(field).cloned().unwrap_or_default();
            read.raise_others(Day(day), (tenant, model), *tokens, &held);
        }
    }

    /// Raises this router's own totals of `day` read from the store (`fields`: field, tokens)
    /// to what the journal holds where it holds more; returns those, to write whole.
    pub fn raise_own_totals(
        &self,
        router: &str,
        day: u32,
        fields: &mut Vec<(String, u64)>,
    ) -> Vec<(u32, String, u64)> {
        let mut raised = Vec::new();
        for (of, field, tokens) in &self.totals {
            let own = super::daily_fields::parse_daily_field(field)
                .is_some_and(|(owner, _, _)| owner == router);
            if *of != day || !own {
                continue;
            }
            match fields.iter_mut().find(|(known, _)| known == field) {
                Some((_, stored)) if *stored >= *tokens => continue,
                Some((_, stored)) => *stored = *tokens,
                None => fields.push((field.clone(), *tokens)),
            }
            raised.push((day, field.clone(), *tokens));
        }
        raised
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            64 + self
                .entries
                .iter()
                .map(|entry| entry.len() + 2)
                .sum::<usize>()
                + self.totals.len() * 64,
        );
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        put_str(&mut out, &self.router);
        out.extend_from_slice(&self.run.to_le_bytes());
        put_varint(&mut out, self.entries.len() as u64);
        for entry in &self.entries {
            put_varint(&mut out, entry.len() as u64);
            out.extend_from_slice(entry);
        }
        for rows in [&self.totals, &self.others] {
            put_varint(&mut out, rows.len() as u64);
            for (day, field, tokens) in rows {
                out.extend_from_slice(&day.to_le_bytes());
                put_str(&mut out, field);
                put_varint(&mut out, *tokens);
            }
        }
        let checksum = checksum(&out);
        out.extend_from_slice(&checksum);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Journal, DecodeError> {
        if bytes.len() < MAGIC.len() + 1 + CHECKSUM_BYTES {
            return Err(DecodeError::Truncated);
        }
        let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if checksum(body) != sum {
            return Err(DecodeError::Malformed(
                "the journal's checksum does not match",
            ));
        }
        let mut reader = Reader { bytes: body };
        for expected in MAGIC {
            if reader.byte()? != *expected {
                return Err(DecodeError::Malformed("not a sync journal"));
            }
        }
        let version = reader.byte()?;
        if !(1..=VERSION).contains(&version) {
            return Err(DecodeError::Version(version));
        }
        let router = reader.string()?;
        let run = u64::from(reader.u32_le()?) | u64::from(reader.u32_le()?) << 32;
        let count = reader.count(ITEMS_MAX, 1)?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let len = reader.varint()?;
            if len > reader.bytes.len() as u64 {
                return Err(DecodeError::Truncated);
            }
            let (entry, rest) = reader.bytes.split_at(len as usize);
            entries.push(entry.to_vec());
            reader.bytes = rest;
        }
        let totals = rows(&mut reader)?;
        let others = if version >= 2 {
            rows(&mut reader)?
        } else {
            Vec::new()
        };
        if !reader.bytes.is_empty() {
            return Err(DecodeError::Malformed("trailing bytes"));
        }
        Ok(Journal {
            router,
            run,
            entries,
            totals,
            others,
        })
    }
}

/// Rows of (day, field, tokens), as `Journal::encode` writes them.
fn rows(reader: &mut Reader<'_>) -> Result<Vec<(u32, String, u64)>, DecodeError> {
    let count = reader.count(ITEMS_MAX, 6)?;
    let mut rows = Vec::with_capacity(count);
    for _ in 0..count {
        let day = reader.u32_le()?;
        let field = reader.string()?;
        let tokens = reader.varint()?;
        rows.push((day, field, tokens));
    }
    Ok(rows)
}

/// Each of `earlier`'s rows into `rows`, the larger of the two where both hold the field.
fn keep_larger(rows: &mut Vec<(u32, String, u64)>, earlier: &[(u32, String, u64)]) {
    for (day, field, tokens) in earlier {
        match rows
            .iter_mut()
            .find(|(of, known, _)| of == day && known == field)
        {
            Some(row) => row.2 = row.2.max(*tokens),
            None => rows.push((*day, field.clone(), *tokens)),
        }
    }
}

/// Each count of the others the larger of the two, with the marks beside it
/// (`sync::counted`): the marks of the count not kept describe batches the kept one may not hold.
fn keep_larger_counts(rows: &mut Vec<(u32, String, u64)>, earlier: &[(u32, String, u64)]) {
    let beside = |rows: &[(u32, String, u64)], day: u32, field: &str| -> Vec<(u32, String, u64)> {
        rows.iter()
            .filter(|(of, mark, _)| {
                *of == day
                    && super::counted::parse_mark_field(mark).is_some_and(|(_, _, of)| of == field)
            })
            .cloned()
            .collect()
    };
    for (day, field, tokens) in earlier {
        if super::daily_fields::parse_daily_field(field).is_none() {
            continue;
        }
        let ours = rows
            .iter()
            .find(|(of, known, _)| of == day && known == field)
            .map(|(_, _, tokens)| *tokens);
        if ours.is_some_and(|ours| ours >= *tokens) {
            continue;
        }
        rows.retain(|(of, known, _)| {
            !(of == day
                && (known == field
                    || super::counted::parse_mark_field(known)
                        .is_some_and(|(_, _, of)| of == field)))
        });
        rows.push((*day, field.clone(), *tokens));
        rows.extend(beside(earlier, *day, field));
    }
}

/// The journal as the sync core keeps it (`sync::core::journaling` writes and removes it).
#[derive(Debug, Default)]
pub struct Journaling {
    /// `--sync-journal`; `None`: no journal.
    pub path: Option<PathBuf>,
    /// A previous run's journal not published yet.
    pub inherited: Option<Journal>,
    /// This router's own totals the inherited journal raised when today's totals were read
    /// (`Journal::raise_own_totals`), to write whole: (day, field, tokens).
    pub raised: Vec<(u32, String, u64)>,
    /// A journal file of usage held back is there (this run's, or the previous run's).
    pub on_disk: bool,
    /// The totals the file on disk holds, a checkpoint's or a journal of usage held back's
    /// (empty: none).
    pub checkpoint: Vec<(u32, String, u64)>,
    /// What the file holds of the other routers (`Journal::others`).
    pub others: Vec<(u32, String, u64)>,
}

/// What the journal becomes after a round that published everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterPublished {
    /// The file on disk says it already (or there is no journal).
    Keep,
    /// This router has no totals: the file goes.
    Remove,
    /// A checkpoint of this router's totals replaces the file.
    Checkpoint(Journal),
}

impl Journaling {
    /// Reads what the previous run under `router_id` left at `path`. A journal that cannot be
    /// read, or that another router ID wrote, is logged and left where it is.
    pub fn open(path: Option<PathBuf>, router_id: &str) -> Journaling {
        let Some(path) = path else {
            return Journaling::default();
        };
        let mut journaling = Journaling {
            path: Some(path.clone()),
            ..Journaling::default()
        };
        match read(&path) {
            Ok(None) => {}
            Ok(Some(bytes)) => match Journal::decode(&bytes) {
                Ok(found) if found.router == router_id => {
                    journaling.on_disk = true;
                    if !found.is_empty() {
                        tracing::info!(
                            path = %path.display(),
                            entries = found.entries.len(),
                            totals = found.totals.len(),
                            run = found.run,
                            "a previous run's journal: its usage held back (entries) is published, and its own daily totals raise this router's where the store holds less, at the first round that reaches the sync store"
                        );
                        journaling.inherited = Some(found);
                    }
                }
                Ok(found) => {
                    tracing::warn!(path = %path.display(), written_by = %found.router, "the sync journal was written by another --router-id: ignored (each router needs its own --sync-journal)");
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "the sync journal cannot be read: ignored, and replaced at the next round");
                }
            },
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "the sync journal cannot be read: ignored");
            }
        }
        journaling
    }
}

impl Journaling {
    /// The entries a round publishes: the inherited journal's first, then `own` (encoded).
    pub fn entries_with(&self, own: impl Iterator<Item = Vec<u8>>) -> Vec<Vec<u8>> {
        self.inherited
            .iter()
            .flat_map(|journal| journal.entries.iter().cloned())
            .chain(own)
            .collect()
    }

    /// What a failed round keeps: `held` (this run's entries, the inherited ones included,
    /// and its own totals not written), with the inherited journal's totals and the raised ones
    /// under it, and the totals of the file it replaces that none of those holds: a total no
    /// round changed since is still this router's. Left out, a run that shut down while the
    /// store did not answer took the checkpoint of its totals with it, and the store lost its
    /// data before the next run (`sync::simulation`, seed 1,069: 2,228 tokens counted nowhere).
    /// Only where the new journal has no total of the field: the file's may be older than a
    /// refund the round wrote whole (merged as the larger, they put a refund back, seed 290).
    pub fn keep_under(&self, mut held: Journal) -> Journal {
        if let Some(inherited) = &self.inherited {
            held.keep(&Journal {
                entries: Vec::new(),
                ..inherited.clone()
            });
        }
        held.keep(&Journal {
            totals: self.raised.clone(),
            ..Journal::default()
        });
        for (day, field, tokens) in &self.checkpoint {
            if !held
                .totals
                .iter()
                .any(|(of, known, _)| of == day && known == field)
            {
                held.totals.push((*day, field.clone(), *tokens));
            }
        }
        keep_larger_counts(&mut held.others, &self.others);
        held
    }

    /// After a round that published everything, with `known` this router's totals as the store
    /// holds them (`DailyLedger::known_totals`, sorted) and `others` what it counts of the other
    /// routers (`Journal::others`): what the file becomes. A checkpoint is written when either
    /// changed: written only with this router's own, a run whose budget was spent kept the
    /// others as they were when it last charged, 17,000 tokens short of what it counted when it
    /// crashed (seed 677). The inherited journal is done with.
    pub fn after_published(
        &mut self,
        router: &str,
        run: u64,
        known: Vec<(u32, String, u64)>,
        others: Vec<(u32, String, u64)>,
    ) -> AfterPublished {
        self.inherited = None;
        self.raised.clear();
        let mut others = others;
        others.sort_unstable();
        if self.path.is_none() {
            AfterPublished::Keep
        } else if known.is_empty() && others.is_empty() {
            if self.on_disk || !self.checkpoint.is_empty() || !self.others.is_empty() {
                AfterPublished::Remove
            } else {
                AfterPublished::Keep
            }
        } else if !self.on_disk && self.checkpoint == known && self.others == others {
            AfterPublished::Keep
        } else {
            AfterPublished::Checkpoint(Journal {
                router: router.to_owned(),
                run,
                entries: Vec::new(),
                totals: known,
                others,
            })
        }
    }

    /// The file now holds `journal`, a failed round's (usage held back).
    pub fn held_back(&mut self, journal: Journal) {
        self.on_disk = true;
        self.checkpoint = journal.totals;
        self.others = journal.others;
    }

    /// The file now holds `checkpoint`.
    pub fn checkpointed(&mut self, checkpoint: Journal) {
        self.on_disk = false;
        self.checkpoint = checkpoint.totals;
        self.others = checkpoint.others;
    }

    /// The file is gone.
    pub fn removed(&mut self) {
        self.on_disk = false;
        self.checkpoint.clear();
        self.others.clear();
    }

    /// The raised totals a round writes as rows of their own, given its own `totals` (day,
    /// field, whole total): a field those write too is written from the shards' total, which
    /// holds the raised one (the shards start from it), and whole (the caller marks every raised
    /// field whole in its ledger). Written beside it, the raised total replaced the shards'
    /// newer one in the same round and lost what the new run charged since (`sync::simulation`,
    /// seed 89: 2,263 tokens).
    pub fn raised_beside(&self, totals: &[(u32, String, u64)]) -> Vec<(u32, String, u64)> {
        self.raised
            .iter()
            .filter(|(day, field, _)| {
                !totals
                    .iter()
                    .any(|(of, written, _)| of == day && written == field)
            })
            .cloned()
            .collect()
    }
}

fn checksum(bytes: &[u8]) -> [u8; CHECKSUM_BYTES] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref()[..CHECKSUM_BYTES]
        .try_into()
        .expect("a SHA-256 digest is longer")
}

/// Reads the journal at `path`: `None` when there is none.
pub fn read(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Replaces the journal at `path` with `bytes`, durably (see the module doc).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = temporary(path);
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    sync_directory(path)
}

/// Writes `bytes` as the journal at `path`, renamed over it but not synced: a checkpoint,
/// which a machine crash may take back to the previous file.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = temporary(path);
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}

/// Removes the journal at `path` (everything in it reached the store).
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_directory(path),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

fn temporary(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// A rename or a removal is durable once the directory holding it is synced.
fn sync_directory(path: &Path) -> std::io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::File::open(directory)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::TenantId;
    use crate::router::shard::owner::quotas::DailyRecord;
    use crate::router::sync::daily_fields::daily_field;

    fn journal() -> Journal {
        Journal {
            router: "router-0".into(),
            run: 1_780_000_000_123,
            entries: vec![vec![1, 2, 3], vec![], vec![9; 300]],
            totals: vec![
                (20_000, daily_field("router-0", TenantId(7), None), 1_234),
                (20_001, daily_field("router-0", TenantId(7), None), 5),
            ],
            others: vec![(20_000, daily_field("router-0", TenantId(7), None), 40_000)],
        }
    }

    #[test]
    fn a_journal_round_trips_and_a_damaged_one_is_refused() {
        let bytes = journal().encode();
        assert_eq!(Journal::decode(&bytes).unwrap(), journal());
        for cut in [0, 4, bytes.len() / 2, bytes.len() - 1] {
            assert!(Journal::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[10] ^= 1;
        assert!(Journal::decode(&flipped).is_err());
        assert_eq!(
            Journal::decode(&Journal::default().encode()).unwrap(),
            Journal::default()
        );
    }

    #[test]
    fn own_totals_are_raised_where_the_journal_holds_more() {
        let own = daily_field("router-0", TenantId(7), None);
        let other = daily_field("router-1", TenantId(7), None);
        let mut journal = journal();
        journal.totals.push((20_000, other.clone(), 99_999));
        // The store has less of this router's own total, and the other router's: only the own
        // one of the day is raised.
        let mut fields = vec![(own.clone(), 1_000), (other.clone(), 10)];
        let raised = journal.raise_own_totals("router-0", 20_000, &mut fields);
        assert_eq!(raised, vec![(20_000, own.clone(), 1_234)]);
        assert_eq!(fields, vec![(own.clone(), 1_234), (other.clone(), 10)]);
        // The store has more (the journal's round reached it before its reply was lost).
        let mut fields = vec![(own.clone(), 2_000)];
        assert!(
            journal
                .raise_own_totals("router-0", 20_000, &mut fields)
                .is_empty()
        );
        // Nothing in the store at all (it lost its data).
        let mut fields = Vec::new();
        assert_eq!(
            journal
                .raise_own_totals("router-0", 20_000, &mut fields)
                .len(),
            1
        );
        assert_eq!(fields, vec![(own, 1_234)]);
    }

    #[test]
    fn a_later_journal_keeps_an_earlier_one_under_it() {
        let own = daily_field("router-0", TenantId(7), None);
        let mut later = Journal {
            router: "router-0".into(),
            run: 1_780_000_100_000,
            entries: vec![vec![4]],
            totals: vec![(20_000, own.clone(), 1_000)],
            others: vec![(20_000, own.clone(), 30_000)],
        };
        later.keep(&journal());
        assert_eq!(later.others, vec![(20_000, own.clone(), 40_000)]);
        assert_eq!(
            later.entries,
            vec![vec![1, 2, 3], vec![], vec![9; 300], vec![4]]
        );
        assert_eq!(later.totals[0], (20_000, own, 1_234));
        assert_eq!(later.totals.len(), 2);
    }

    #[test]
    fn a_raised_total_the_round_writes_anyway_is_not_written_beside_it() {
        let own = daily_field("router-0", TenantId(7), None);
        let flat = daily_field("router-0", TenantId(8), None);
        let journaling = Journaling {
            raised: vec![(20_000, own.clone(), 1_234), (20_000, flat.clone(), 50)],
            ..Journaling::default()
        };
        // The shards report the first budget's total this round (the raised 1,234 and 100
        // charged since): only the other is written beside it.
        let totals = vec![(20_000, own, 1_334)];
        assert_eq!(journaling.raised_beside(&totals), vec![(20_000, flat, 50)]);
    }

    #[test]
    fn a_published_round_leaves_a_checkpoint_of_the_totals_the_store_holds() {
        let own = daily_field("router-0", TenantId(7), None);
        let flat = daily_field("router-0", TenantId(8), None);
        let mut journaling = Journaling {
            path: Some("journal".into()),
            inherited: Some(journal()),
            raised: vec![(20_000, own.clone(), 1_234)],
            on_disk: true,
            ..Journaling::default()
        };
        let known = vec![(20_000, own.clone(), 1_300), (20_000, flat.clone(), 50)];
        // The inherited journal is published: the file becomes the checkpoint.
        let AfterPublished::Checkpoint(checkpoint) =
            journaling.after_published("router-0", 7, known.clone(), Vec::new())
        else {
            panic!("a checkpoint replaces a journal of usage held back");
        };
        assert_eq!(journaling.inherited, None);
        assert!(journaling.raised.is_empty());
        assert!(checkpoint.entries.is_empty());
        assert_eq!(
            (checkpoint.router.as_str(), checkpoint.run),
            ("router-0", 7)
        );
        assert_eq!(checkpoint.totals, known);
        journaling.checkpointed(checkpoint);
        // Unchanged totals write nothing; a changed one writes the checkpoint again.
        assert_eq!(
            journaling.after_published("router-0", 7, known.clone(), Vec::new()),
            AfterPublished::Keep
        );
        let grown = vec![(20_000, own.clone(), 1_400), (20_000, flat.clone(), 50)];
        assert!(matches!(
            journaling.after_published("router-0", 7, grown, Vec::new()),
            AfterPublished::Checkpoint(_)
        ));
        // The others grew, this router's own did not: the checkpoint is written again.
        journaling.checkpointed(Journal {
            totals: known.clone(),
            ..Journal::default()
        });
        let others = vec![(20_000, own.clone(), 60_000)];
        let AfterPublished::Checkpoint(checkpoint) =
            journaling.after_published("router-0", 7, known.clone(), others.clone())
        else {
            panic!("what the router counts of the others changed");
        };
        assert_eq!(checkpoint.others, others);
        journaling.checkpointed(checkpoint);
        assert_eq!(
            journaling.after_published("router-0", 7, known.clone(), others),
            AfterPublished::Keep
        );
        // No totals (a new day's first rounds): the file goes, once.
        assert_eq!(
            journaling.after_published("router-0", 7, Vec::new(), Vec::new()),
            AfterPublished::Remove
        );
        journaling.removed();
        assert_eq!(
            journaling.after_published("router-0", 7, Vec::new(), Vec::new()),
            AfterPublished::Keep
        );
        // Without a journal, nothing.
        let mut none = Journaling::default();
        assert_eq!(
            none.after_published("router-0", 7, known, Vec::new()),
            AfterPublished::Keep
        );
    }

    /// Seed 1,069: a checkpoint of two totals; a failed round changes one of them (a refund,
    /// written whole); its journal keeps the other as the file held it, and the changed one as
    /// the round has it. A later failed round that changes neither keeps both.
    #[test]
    fn a_failed_rounds_journal_keeps_the_totals_of_the_file_it_replaces() {
        let own = daily_field("router-0", TenantId(7), None);
        let flat = daily_field("router-0", TenantId(8), None);
        let mut journaling = Journaling {
            path: Some("journal".into()),
            ..Journaling::default()
        };
        journaling.checkpointed(Journal {
            totals: vec![(20_000, own.clone(), 1_300), (20_000, flat.clone(), 50)],
            others: vec![(20_000, own.clone(), 9_000)],
            ..Journal::default()
        });
        let held = |totals| Journal {
            router: "router-0".into(),
            run: 7,
            entries: vec![vec![1]],
            totals,
            others: Vec::new(),
        };
        let journal = journaling.keep_under(held(vec![(20_000, flat.clone(), 40)]));
        assert_eq!(
            journal.totals,
            vec![(20_000, flat.clone(), 40), (20_000, own.clone(), 1_300)]
        );
        journaling.held_back(journal);
        let journal = journaling.keep_under(held(Vec::new()));
        assert_eq!(
            journal.totals,
            vec![(20_000, flat, 40), (20_000, own.clone(), 1_300)]
        );
        assert_eq!(
            journal.others,
            vec![(20_000, own, 9_000)],
            "the others, as counted"
        );
    }

    /// Seed 677: a run crashed and started again just after the store lost its data; the
    /// previous run's count of the others raises what the totals read say of them.
    #[test]
    fn a_new_run_counts_of_the_others_at_least_what_the_journal_counted() {
        let mut read = DailyRecords {
            records: vec![DailyRecord {
                tenant: TenantId(7),
                model: None,
                day: Day(20_000),
                tokens: 22_547,
                others: false,
            }],
            ..DailyRecords::default()
        };
        journal().raise_others("router-0", 20_000, &mut read);
        assert_eq!(read.records.len(), 2);
        assert!(read.records[1].others && read.records[1].tokens == 40_000);
        // Another day's count, or another router's, raises nothing; a larger read stays.
        read.records[1].tokens = 50_000;
        journal().raise_others("router-0", 20_000, &mut read);
        journal().raise_others("router-0", 20_001, &mut read);
        journal().raise_others("router-1", 20_000, &mut read);
        assert_eq!(read.records[1].tokens, 50_000);
        assert_eq!(read.records.len(), 2);
    }

    /// Seeds 3,538 and 6,671 (`sync::counted`): a new run takes, with the previous run's count
    /// of the others, the batches it holds; two journals merged keep each count with its own
    /// marks, never the larger count with the other's marks.
    #[test]
    fn a_count_of_the_others_keeps_the_marks_of_the_batches_it_holds() {
        use crate::router::sync::counted::mark_field;
        let field = daily_field("router-0", TenantId(7), None);
        let mut with_marks = journal();
        with_marks
            .others
            .push((20_000, mark_field("router-2", 5, &field), 1_000));
        let mut read = DailyRecords::default();
        with_marks.raise_others("router-0", 20_000, &mut read);
        assert_eq!(read.records[0].tokens, 40_000);
        assert!(read.marks[&(TenantId(7), None)].holds("router-2", 5, 1_000));
        assert!(!read.marks[&(TenantId(7), None)].holds("router-2", 5, 1_001));
        // A later journal's count with its mark, merged over `with_marks`'s: what it keeps.
        let merged = |tokens: u64, router: &str, run: u64, at: u64| {
            let mut later = Journal {
                others: vec![
                    (20_000, field.clone(), tokens),
                    (20_000, mark_field(router, run, &field), at),
                ],
                ..journal()
            };
            later.keep(&with_marks);
            later.others.sort();
            later.others
        };
        // Counting less, with a later mark: the larger count stays, with its own marks (the
        // later mark may name batches the larger count does not hold).
        assert_eq!(
            merged(30_000, "router-2", 5, 2_000),
            vec![
                (20_000, field.clone(), 40_000),
                (20_000, mark_field("router-2", 5, &field), 1_000),
            ]
        );
        // Counting more, the later one keeps its own.
        assert_eq!(
            merged(50_000, "router-1", 3, 700),
            vec![
                (20_000, field.clone(), 50_000),
                (20_000, mark_field("router-1", 3, &field), 700),
            ]
        );
    }

    /// A journal of version 1 (before `others`) is read, with none.
    #[test]
    fn a_journal_of_the_version_before_is_read() {
        let mut older = journal();
        older.others.clear();
        let mut bytes = older.encode();
        // Version 2 writes an empty `others` as one zero byte before the checksum.
        let body = bytes.len() - CHECKSUM_BYTES;
        bytes.truncate(body - 1);
        bytes[MAGIC.len()] = 1;
        let sum = checksum(&bytes);
        bytes.extend_from_slice(&sum);
        assert_eq!(Journal::decode(&bytes).unwrap(), older);
    }

    #[test]
    fn writes_replace_the_file_whole_and_removal_is_quiet_when_there_is_none() {
        let directory =
            std::env::temp_dir().join(format!("hivenet-journal-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("journal");
        assert_eq!(read(&path).unwrap(), None);
        write(&path, &journal().encode()).unwrap();
        write(&path, &journal().encode()).unwrap();
        let bytes = read(&path).unwrap().unwrap();
        assert_eq!(Journal::decode(&bytes).unwrap(), journal());
        assert!(!temporary(&path).exists());
        replace(&path, &Journal::default().encode()).unwrap();
        let bytes = read(&path).unwrap().unwrap();
        assert_eq!(Journal::decode(&bytes).unwrap(), Journal::default());
        assert!(!temporary(&path).exists());
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(read(&path).unwrap(), None);
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
