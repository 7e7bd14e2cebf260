//! The router's disk database (`--disk-db-path`, default `./badger_disk`): today's daily token
//! totals and the per-agent lifetime history, kept so they survive a restart
//! (`HIVENET_ROUTER_QUOTA_BACKEND=badger`).
//!
//! The name `badger` is kept for configuration compatibility with the reference implementation,
//! which used BadgerDB. Underneath is [`redb`], an embedded, crash-safe (copy-on-write B-trees,
//! every commit durable) pure-Rust key-value store: the directory holds one file,
//! [`DATABASE_FILE`]. Files the reference's BadgerDB left in the directory are neither read nor
//! touched.
//!
//! # Key components
//! - [`DiskDb::open`]: create the directory and file (after `--reset-disk-db` deleted the file),
//!   and prove the database writable by pruning old days in a write transaction.
//! - [`DiskDb::load_daily`]: every total stored for one UTC day (start-up restore).
//! - [`DiskDb::write_daily`]: a batch of totals in one transaction (the control core's flush).
//! - [`DiskDb::prune_daily`]: delete the records of days before a given day.
//!
//! # Records
//! One record per quota holder's daily budget and UTC day; the value is this router's total of
//! tokens charged to that budget on that day (`u64`), overwritten by every flush. The key is text,
//! after the reference's `quotaTPD:{bucket}:{day}`, reordered so that one day's records are one
//! key range (load and prune are range scans):
//!
//! ```text
//! quotaTPD:{day}:{tenant}:flat
//! quotaTPD:{day}:{tenant}:model:{capability}:{model name}
//! ```
//!
//! Per-agent history (the observability reference's "Persistence and resets": the reference
//! keeps it in its disk store too), one record per (agent, model), in its own table:
//!
//! ```text
//! agentHistory:{peer id}:{capability}:{model name}
//! ```
//!
//! whose value is the agent's labels and lifetime totals as a JSON object
//! ([`encode_history_value`]), overwritten when they change.
//!
//! `{day}` is the UTC date `YYYY-MM-DD` (sorts like the day), `{tenant}` the owner's tenant id as
//! 8 lowercase hex digits (derived from the owner string, so stable across restarts:
//! `auth::keys`), `flat` marks the flat budget, and a per-model budget names its model by
//! capability (`llm`, `embedding`, `reranker`) and name. The name comes last and may contain `:`.
//!
//! Lifetime: the reference gave quota records "their own short expiration sufficient for restart
//! recovery across the UTC reset boundary" (48 hours). Here the flush deletes every day before
//! yesterday; yesterday stays so that a restart just after midnight finds the database as it was,
//! and start-up reads today's records only.
//!
//! # Error handling
//! Every failure is a [`DiskDbError`] naming the path and the operation. This module does not
//! retry; the flush keeps unwritten totals and tries again a second later.
//!
//! # Performance
//! Blocking file I/O with an fsync per commit: call it from a blocking thread (the control core
//! uses `spawn_blocking`), never from a shard or the control runtime itself.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::logic::auth::keys::TenantId;
use crate::logic::limits::Day;
use crate::logic::routing::counters::AgentTotals;
use crate::logic::snapshot::{Capability, ModelKey};
use crate::router::control::registry::{AgentLabels, HistoryRecord};
use crate::router::shard::owner::quotas::DailyRecord;

/// The database file inside `--disk-db-path`.
pub const DATABASE_FILE: &str = "hivenet-router.redb";

/// Daily token totals: key as described in the module doc, value in tokens.
const DAILY_TOKENS: TableDefinition<&str, u64> = TableDefinition::new("daily_tokens");

const DAILY_PREFIX: &str = "quotaTPD:";

/// Per-agent lifetime history: key and value as described in the module doc.
const AGENT_HISTORY: TableDefinition<&str, &str> = TableDefinition::new("agent_history");

const HISTORY_PREFIX: &str = "agentHistory:";

/// Page cache of the database. The daily table of even a large site is a few megabytes; redb's
/// default (1 GiB) would only ever be address space here, but say what we mean.
const CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Julian day number of 1970-01-01, to convert [`Day`] to a calendar date.
const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

/// Why the disk database could not be used. Each message names the path and carries the cause
/// (the cause is part of the message, not a separate `source`, so it prints once).
#[derive(Debug, thiserror::Error)]
pub enum DiskDbError {
    #[error("cannot create the disk database directory {path}: {cause}")]
    CreateDirectory {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("cannot delete the disk database {path} (--reset-disk-db): {cause}")]
    Reset {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("cannot open the disk database {path}: {cause}")]
    Open {
        path: PathBuf,
        /// Boxed: redb's errors are large and this one travels in every `Result`.
        cause: Box<redb::DatabaseError>,
    },
    #[error("disk database {path}: cannot {operation}: {cause}")]
    Access {
        path: PathBuf,
        operation: &'static str,
        cause: Box<redb::Error>,
    },
}

/// The open disk database. Thread-safe: reads and writes may come from any thread (one write
/// transaction at a time; redb serialises them).
pub struct DiskDb {
    database: redb::Database,
    path: PathBuf,
}

impl std::fmt::Debug for DiskDb {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DiskDb")
            .field("path", &self.path)
            .finish()
    }
}

/// Deletes the database file in `directory` (`--reset-disk-db`); other files stay. A missing
/// file is not an error.
pub fn reset(directory: &Path) -> Result<(), DiskDbError> {
    let path = directory.join(DATABASE_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(DiskDbError::Reset { path, cause }),
    }
}

impl DiskDb {
    /// Opens (creating if needed) the database in `directory`, after deleting it when `reset`.
    /// Deletes records of days before `today - 1`, which also proves the file writable: a
    /// router that cannot persist refuses to start rather than lose totals silently.
    pub fn open(directory: &Path, reset: bool, today: Day) -> Result<DiskDb, DiskDbError> {
        if reset {
            self::reset(directory)?;
        }
        std::fs::create_dir_all(directory).map_err(|cause| DiskDbError::CreateDirectory {
            path: directory.to_owned(),
            cause,
        })?;
        let path = directory.join(DATABASE_FILE);
        let database = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|cause| DiskDbError::Open {
                path: path.clone(),
                cause: Box::new(cause),
            })?;
        let disk_db = DiskDb { database, path };
        disk_db.prune_daily(Day(today.0.saturating_sub(1)))?;
        Ok(disk_db)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn error(&self, operation: &'static str, cause: impl Into<redb::Error>) -> DiskDbError {
        DiskDbError::Access {
            path: self.path.clone(),
            operation,
            cause: Box::new(cause.into()),
        }
    }

    fn access<T>(
        &self,
        operation: &'static str,
        result: Result<T, impl Into<redb::Error>>,
    ) -> Result<T, DiskDbError> {
        result.map_err(|cause| self.error(operation, cause))
    }

    /// Every total stored for `day`. Keys that do not decode (written by something else) are
    /// skipped with a warning.
    pub fn load_daily(&self, day: Day) -> Result<Vec<DailyRecord>, DiskDbError> {
        const OPERATION: &str = "read daily totals";
        let transaction = self.access(OPERATION, self.database.begin_read())?;
        let table = match transaction.open_table(DAILY_TOKENS) {
            Ok(table) => table,
            // A database no flush has written to yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(self.error(OPERATION, error)),
        };
        let prefix = day_prefix(day);
        let mut records = Vec::new();
        for entry in self.access(OPERATION, table.range(prefix.as_str()..))? {
            let (key, value) = self.access(OPERATION, entry)?;
            let key = key.value();
            if !key.starts_with(&prefix) {
                break;
            }
            match decode_key(key) {
                Some((tenant, model, record_day)) => records.push(DailyRecord {
                    tenant,
                    model,
                    day: record_day,
                    tokens: value.value(),
                    others: false,
                }),
                None => {
                    tracing::warn!(key, path = %self.path.display(), "skipping an unreadable daily total")
                }
            }
        }
        Ok(records)
    }

    /// Stores `records` (each overwrites the total of its budget and day) in one transaction,
    /// durable when this returns.
    pub fn write_daily(&self, records: &[DailyRecord]) -> Result<(), DiskDbError> {
        const OPERATION: &str = "write daily totals";
        let transaction = self.access(OPERATION, self.database.begin_write())?;
        {
            let mut table = self.access(OPERATION, transaction.open_table(DAILY_TOKENS))?;
            for record in records {
                let key = encode_key(record.tenant, record.model.as_ref(), record.day);
                self.access(OPERATION, table.insert(key.as_str(), record.tokens))?;
            }
        }
        self.access(OPERATION, transaction.commit())
    }

    /// Deletes the records of every day before `keep_from`; returns how many went.
    pub fn prune_daily(&self, keep_from: Day) -> Result<usize, DiskDbError> {
        const OPERATION: &str = "delete old daily totals";
        let transaction = self.access(OPERATION, self.database.begin_write())?;
        let mut deleted = 0;
        {
            let mut table = self.access(OPERATION, transaction.open_table(DAILY_TOKENS))?;
            let end = day_prefix(keep_from);
            self.access(
                OPERATION,
                table.retain_in(DAILY_PREFIX..end.as_str(), |_, _| {
                    deleted += 1;
                    false
                }),
            )?;
        }
        self.access(OPERATION, transaction.commit())?;
        Ok(deleted)
    }
}

impl DiskDb {
    /// Every per-agent history record. Records that do not decode are skipped with a warning.
    pub fn load_history(&self) -> Result<Vec<HistoryRecord>, DiskDbError> {
        const OPERATION: &str = "read the agent history";
        let transaction = self.access(OPERATION, self.database.begin_read())?;
        let table = match transaction.open_table(AGENT_HISTORY) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(self.error(OPERATION, error)),
        };
        let mut records = Vec::new();
        for entry in self.access(OPERATION, table.iter())? {
            let (key, value) = self.access(OPERATION, entry)?;
            match decode_history(key.value(), value.value()) {
                Some(record) => records.push(record),
                None => {
                    tracing::warn!(key = key.value(), path = %self.path.display(), "skipping an unreadable agent history record")
                }
            }
        }
        Ok(records)
    }

    /// Stores `records` (each overwrites its agent and model's) and deletes `removed`, in one
    /// transaction, durable when this returns.
    pub fn write_history(
        &self,
        records: &[HistoryRecord],
        removed: &[(String, ModelKey)],
    ) -> Result<(), DiskDbError> {
        const OPERATION: &str = "write the agent history";
        let transaction = self.access(OPERATION, self.database.begin_write())?;
        {
            let mut table = self.access(OPERATION, transaction.open_table(AGENT_HISTORY))?;
            for record in records {
                let key = history_key(&record.peer_id, &record.model);
                let value = encode_history_value(&record.labels, &record.totals);
                self.access(OPERATION, table.insert(key.as_str(), value.as_str()))?;
            }
            for (peer_id, model) in removed {
                self.access(
                    OPERATION,
                    table.remove(history_key(peer_id, model).as_str()),
                )?;
            }
        }
        self.access(OPERATION, transaction.commit())
    }
}

/// The key of an (agent, model)'s history record (see the module doc).
pub fn history_key(peer_id: &str, model: &ModelKey) -> String {
    format!(
        "{HISTORY_PREFIX}{peer_id}:{}:{}",
        model.capability.as_str(),
        model.name
    )
}

/// An (agent, model)'s labels and lifetime totals as a JSON object: the labels, the counts, and
/// the latency estimator (`null` before a first sample).
pub fn encode_history_value(labels: &AgentLabels, totals: &AgentTotals) -> String {
    let (srtt, rttvar) = match totals.latency_ms {
        Some((srtt, rttvar)) => (serde_json::json!(srtt), serde_json::json!(rttvar)),
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    serde_json::json!({
        "engine": labels.engine,
        "region": labels.region,
        "organization": labels.organization,
        "machine": labels.machine,
        "success": totals.success,
        "failed": totals.failed,
        "input_tokens": totals.input_tokens,
        "output_tokens": totals.output_tokens,
        "disconnections": totals.disconnections,
        "failures": totals.failures,
        "rejected": totals.rejected,
        "resets_tunnel": totals.resets[0],
        "resets_engine": totals.resets[1],
        "srtt_ms": srtt,
        "rttvar_ms": rttvar,
    })
    .to_string()
}

/// The inverse of [`history_key`] and [`encode_history_value`]; `None` for anything else.
pub fn decode_history(key: &str, value: &str) -> Option<HistoryRecord> {
    let rest = key.strip_prefix(HISTORY_PREFIX)?;
    let (peer_id, rest) = rest.split_once(':')?;
    let (capability, name) = rest.split_once(':')?;
    if peer_id.is_empty() || name.is_empty() {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(value).ok()?;
    let text = |field: &str| value[field].as_str().map(str::to_owned);
    let count = |field: &str| value[field].as_u64();
    let latency_ms = match (value["srtt_ms"].as_f64(), value["rttvar_ms"].as_f64()) {
        (Some(srtt), Some(rttvar)) => Some((srtt, rttvar)),
        _ => None,
    };
    Some(HistoryRecord {
        peer_id: peer_id.to_owned(),
        model: ModelKey {
            name: name.into(),
            capability: Capability::parse(capability)?,
        },
        labels: AgentLabels {
            engine: text("engine")?,
            region: text("region")?,
            organization: text("organization")?,
            machine: text("machine")?,
        },
        totals: AgentTotals {
            success: count("success")?,
            failed: count("failed")?,
            input_tokens: count("input_tokens")?,
            output_tokens: count("output_tokens")?,
            disconnections: count("disconnections")?,
            failures: count("failures")?,
            rejected: count("rejected")?,
            resets: [count("resets_tunnel")?, count("resets_engine")?],
            latency_ms,
        },
    })
}

/// `YYYY-MM-DD` of a UTC day. Days outside the calendar `time` supports (beyond year 9999) do not
/// occur for a clock after 1970; they format as the day number so nothing panics.
fn date_text(day: Day) -> String {
    let julian = i32::try_from(day.0)
        .ok()
        .and_then(|days| days.checked_add(UNIX_EPOCH_JULIAN_DAY));
    match julian.and_then(|julian| time::Date::from_julian_day(julian).ok()) {
        Some(date) => format!(
            "{:04}-{:02}-{:02}",
            date.year(),
            u8::from(date.month()),
            date.day()
        ),
        None => format!("day-{}", day.0),
    }
}

fn parse_date(text: &str) -> Option<Day> {
    let mut parts = text.splitn(3, '-');
    let year: i32 = parts.next()?.parse().ok()?;
    let month: u8 = parts.next()?.parse().ok()?;
    let day: u8 = parts.next()?.parse().ok()?;
    let month = time::Month::try_from(month).ok()?;
    let date = time::Date::from_calendar_date(year, month, day).ok()?;
    let days = date.to_julian_day().checked_sub(UNIX_EPOCH_JULIAN_DAY)?;
    u32::try_from(days).ok().map(Day)
}

fn day_prefix(day: Day) -> String {
    format!("{DAILY_PREFIX}{}:", date_text(day))
}

/// The key of one budget's total on `day` (see the module doc).
pub fn encode_key(tenant: TenantId, model: Option<&ModelKey>, day: Day) -> String {
    let mut key = format!("{}{:08x}:", day_prefix(day), tenant.0);
    match model {
        None => key.push_str("flat"),
        Some(model) => {
            key.push_str("model:");
            key.push_str(model.capability.as_str());
            key.push(':');
            key.push_str(&model.name);
        }
    }
    key
}

/// The inverse of [`encode_key`]; `None` for anything else.
pub fn decode_key(key: &str) -> Option<(TenantId, Option<ModelKey>, Day)> {
    let rest = key.strip_prefix(DAILY_PREFIX)?;
    let (date, rest) = rest.split_once(':')?;
    let (tenant, bucket) = rest.split_once(':')?;
    if tenant.len() != 8 {
        return None;
    }
    let tenant = TenantId(u32::from_str_radix(tenant, 16).ok()?);
    let model = match bucket {
        "flat" => None,
        _ => {
            let (capability, name) = bucket.strip_prefix("model:")?.split_once(':')?;
            if name.is_empty() {
                return None;
            }
            Some(ModelKey {
                name: name.into(),
                capability: Capability::parse(capability)?,
            })
        }
    };
    Some((tenant, model, parse_date(date)?))
}

#[cfg(test)]
mod tests {
    //! Against a real database file in a temporary directory.

    use super::*;

    /// 2024-06-01.
    const SATURDAY: Day = Day(19_875);
    const SUNDAY: Day = Day(19_876);

    /// A fresh directory under the build's temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let sequence = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "hivenet-disk-db-{name}-{}-{sequence}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&path);
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn model(name: &str, capability: Capability) -> Option<ModelKey> {
        Some(ModelKey {
            name: name.into(),
            capability,
        })
    }

    fn record(tenant: u32, model: Option<ModelKey>, day: Day, tokens: u64) -> DailyRecord {
        DailyRecord {
            tenant: TenantId(tenant),
            model,
            day,
            tokens,
            others: false,
        }
    }

    fn sorted(mut records: Vec<DailyRecord>) -> Vec<DailyRecord> {
        records.sort_by(|a, b| (a.tenant, &a.model).cmp(&(b.tenant, &b.model)));
        records
    }

    #[test]
    fn keys_round_trip_and_sort_by_day() {
        let key = encode_key(TenantId(0xab), None, SATURDAY);
        assert_eq!(key, "quotaTPD:2024-06-01:000000ab:flat");
        assert_eq!(decode_key(&key), Some((TenantId(0xab), None, SATURDAY)));
        let chat = model("meta-llama/Llama-3:8b", Capability::Llm);
        let key = encode_key(TenantId(u32::MAX), chat.as_ref(), SUNDAY);
        assert_eq!(
            key,
            "quotaTPD:2024-06-02:ffffffff:model:llm:meta-llama/Llama-3:8b"
        );
        assert_eq!(decode_key(&key), Some((TenantId(u32::MAX), chat, SUNDAY)));
        let rerank = model("bge", Capability::Reranker);
        let key = encode_key(TenantId(1), rerank.as_ref(), Day(0));
        assert_eq!(decode_key(&key), Some((TenantId(1), rerank, Day(0))));
        // Lexicographic order is day order, across month and year ends.
        let days = [
            Day(0),
            Day(30),
            Day(31),
            Day(364),
            Day(365),
            SATURDAY,
            SUNDAY,
        ];
        let keys: Vec<String> = days
            .iter()
            .map(|day| encode_key(TenantId(1), None, *day))
            .collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "{keys:?}");
        for bad in [
            "quotaTPD:2024-06-01:ab:flat",
            "quotaTPD:2024-06-01:000000ab:other",
            "quotaTPD:2024-13-01:000000ab:flat",
            "quotaTPD:2024-06-01:000000ab:model:gpu:x",
            "quotaTPD:2024-06-01:000000ab:model:llm:",
            "universalHistory:peer",
        ] {
            assert_eq!(decode_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn totals_survive_reopening_and_overwrite() {
        let dir = TempDir::new("reopen");
        {
            let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
            assert!(
                db.load_daily(SATURDAY).unwrap().is_empty(),
                "fresh database"
            );
            db.write_daily(&[
                record(1, None, SATURDAY, 100),
                record(1, model("chat", Capability::Llm), SATURDAY, 40),
                record(2, None, SATURDAY, 7),
            ])
            .unwrap();
            db.write_daily(&[record(1, None, SATURDAY, 150)]).unwrap();
        }
        let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
        assert_eq!(
            sorted(db.load_daily(SATURDAY).unwrap()),
            vec![
                record(1, None, SATURDAY, 150),
                record(1, model("chat", Capability::Llm), SATURDAY, 40),
                record(2, None, SATURDAY, 7),
            ]
        );
        assert!(db.load_daily(SUNDAY).unwrap().is_empty());
    }

    fn history(peer_id: &str, model_name: &str, success: u64) -> HistoryRecord {
        HistoryRecord {
            peer_id: peer_id.into(),
            model: model(model_name, Capability::Llm).unwrap(),
            labels: AgentLabels {
                engine: "vllm".into(),
                region: "eu".into(),
                organization: "ml".into(),
                machine: "box:1".into(),
            },
            totals: AgentTotals {
                success,
                failed: 2,
                input_tokens: 300,
                output_tokens: 40,
                disconnections: 1,
                failures: 0,
                rejected: 1,
                resets: [3, 4],
                latency_ms: (success > 1).then_some((81.5, 12.25)),
            },
        }
    }

    /// The history survives reopening, each record overwritten by a later write and deleted
    /// when removed; the daily totals beside it are untouched.
    #[test]
    fn the_agent_history_survives_reopening() {
        let dir = TempDir::new("history");
        {
            let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
            assert!(db.load_history().unwrap().is_empty(), "fresh database");
            db.write_daily(&[record(1, None, SATURDAY, 100)]).unwrap();
            db.write_history(
                &[
                    history("12D3KooWa", "org/chat:v1", 1),
                    history("12D3KooWb", "chat", 5),
                ],
                &[],
            )
            .unwrap();
            db.write_history(&[history("12D3KooWa", "org/chat:v1", 9)], &[])
                .unwrap();
        }
        let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
        let mut loaded = db.load_history().unwrap();
        loaded.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
        assert_eq!(
            loaded,
            vec![
                history("12D3KooWa", "org/chat:v1", 9),
                history("12D3KooWb", "chat", 5)
            ]
        );
        db.write_history(&[], &[("12D3KooWa".into(), loaded[0].model.clone())])
            .unwrap();
        assert_eq!(
            db.load_history().unwrap(),
            vec![history("12D3KooWb", "chat", 5)]
        );
        assert_eq!(
            db.load_daily(SATURDAY).unwrap(),
            vec![record(1, None, SATURDAY, 100)]
        );
    }

    #[test]
    fn history_records_that_do_not_read_are_none() {
        let good = history("p", "m", 1);
        let value = encode_history_value(&good.labels, &good.totals);
        let key = history_key("p", &good.model);
        assert_eq!(decode_history(&key, &value), Some(good));
        for (key, value) in [
            ("agentHistory:p:llm:m", "not json"),
            ("agentHistory:p:llm:m", r#"{"engine":"vllm"}"#),
            ("agentHistory::llm:m", value.as_str()),
            ("agentHistory:p:llm:", value.as_str()),
            ("agentHistory:p:video:m", value.as_str()),
            ("quotaTPD:p:llm:m", value.as_str()),
        ] {
            assert_eq!(decode_history(key, value), None, "{key} {value}");
        }
    }

    #[test]
    fn days_before_yesterday_are_deleted() {
        let dir = TempDir::new("prune");
        let friday = Day(SATURDAY.0 - 1);
        let thursday = Day(SATURDAY.0 - 2);
        {
            let db = DiskDb::open(&dir.0, false, thursday).unwrap();
            db.write_daily(&[
                record(1, None, thursday, 1),
                record(1, None, friday, 2),
                record(1, None, SATURDAY, 3),
                record(1, None, SUNDAY, 4),
            ])
            .unwrap();
        }
        // Opening on Saturday keeps Friday (yesterday) and later.
        let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
        assert!(db.load_daily(thursday).unwrap().is_empty());
        assert_eq!(
            db.load_daily(friday).unwrap(),
            vec![record(1, None, friday, 2)]
        );
        assert_eq!(db.prune_daily(SUNDAY).unwrap(), 2);
        assert!(db.load_daily(SATURDAY).unwrap().is_empty());
        assert_eq!(
            db.load_daily(SUNDAY).unwrap(),
            vec![record(1, None, SUNDAY, 4)]
        );
    }

    #[test]
    fn reset_deletes_the_database_only() {
        let dir = TempDir::new("reset");
        {
            let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
            db.write_daily(&[record(1, None, SATURDAY, 100)]).unwrap();
        }
        std::fs::write(dir.0.join("MANIFEST"), b"someone else's").unwrap();
        let db = DiskDb::open(&dir.0, true, SATURDAY).unwrap();
        assert!(db.load_daily(SATURDAY).unwrap().is_empty());
        assert!(
            dir.0.join("MANIFEST").exists(),
            "other files are left alone"
        );
        drop(db);
        // Resetting a directory that has no database yet is fine.
        let empty = TempDir::new("reset-empty");
        assert!(reset(&empty.0).is_ok());
    }

    #[test]
    fn an_unusable_path_is_a_clear_error() {
        let dir = TempDir::new("unusable");
        std::fs::create_dir_all(&dir.0).unwrap();
        // A file where the directory should be.
        let file = dir.0.join("not-a-directory");
        std::fs::write(&file, b"x").unwrap();
        let error = DiskDb::open(&file, false, SATURDAY).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot create the disk database directory"),
            "{error}"
        );
        // Opened twice: the second open is refused, naming the file.
        let db = DiskDb::open(&dir.0, false, SATURDAY).unwrap();
        let error = DiskDb::open(&dir.0, false, SATURDAY).unwrap_err();
        assert!(error.to_string().contains(DATABASE_FILE), "{error}");
        drop(db);
    }
}
