//! The daily-total flush (`HIVENET_ROUTER_QUOTA_BACKEND=badger` only): every
//! [`FLUSH_INTERVAL`], ask every shard for the daily totals that changed
//! ([`ControlShared::daily_totals`]), name their models, and write them to the disk database in
//! one transaction; once more at SIGTERM/SIGINT ([`DailyFlush::finish`]). A crash loses at most
//! the last interval's changes (the reference flushed only periodically and at shutdown).
//!
//! The per-agent history rides along: at start the history an earlier run kept is added to the
//! registry's ([`DailyFlush::spawn`]), and each flush writes the (agent, model) records whose
//! totals or labels changed since the last write and deletes those the history no longer has
//! (a `POST /admin/metrics/reset`, or room made for new agents).
//!
//! # Architecture
//! One task on the control runtime owns the pending totals and is the only writer. The write
//! itself (file I/O and an fsync) runs on tokio's blocking pool, so the control runtime's thread
//! (agent gRPC, `/metrics`, admin calls) never waits on the disk. The shutdown request goes
//! through the same task, so the final flush runs after any write in progress, never beside it.
//!
//! # Invariants
//! - A total taken from a shard is written or kept: a failed write keeps the whole batch for the
//!   next attempt. A later total of the same budget and day replaces an earlier one (each value is
//!   a whole total, not an increment), so retrying never double-counts.
//! - Pending totals are bounded by the number of (holder, budget, day) triples reported, which the
//!   shards bound by the holders they keep.
//!
//! # Error handling
//! A failed write is counted in `hivenet_quota_backend_errors_total` and logged when writes
//! start failing and when they recover; admission goes on from memory meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::base::clock::utc_today;
use crate::logic::auth::keys::TenantId;
use crate::logic::limits::Day;
use crate::logic::routing::counters::AgentTotals;
use crate::logic::snapshot::ModelKey;
use crate::router::control::ControlShared;
use crate::router::control::disk_db::DiskDb;
use crate::router::control::registry::{AgentLabels, HistoryRecord};
use crate::router::shard::owner::quotas::{DailyRecord, DailyTotal};

/// How often changed totals are written: the most a crash loses.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// The longest shutdown waits for the final flush (a write in progress, one more report from
/// every shard, one more write) before exiting anyway.
pub const FINAL_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The running flush; [`DailyFlush::finish`] runs the final one.
pub struct DailyFlush {
    shutdown: mpsc::Sender<oneshot::Sender<()>>,
}

impl DailyFlush {
    /// Starts the flush task on `runtime`. `pruned_for`: the day the database was last pruned for
    /// (at open); old days are pruned again when the UTC day changes.
    /// `history`: the per-agent history the database held at start, added to the registry's
    /// here.
    pub fn spawn(
        runtime: &tokio::runtime::Runtime,
        shared: Arc<ControlShared>,
        disk_db: Arc<DiskDb>,
        pruned_for: Day,
        history: Vec<HistoryRecord>,
    ) -> DailyFlush {
        let (shutdown, requests) = mpsc::channel(1);
        let history_written = history
            .iter()
            .map(|record| {
                (
                    (record.peer_id.clone(), record.model.clone()),
                    (record.labels.clone(), record.totals),
                )
            })
            .collect();
        shared.registry().restore_history(history);
        let flusher = Flusher {
            shared,
            disk_db,
            pending: HashMap::new(),
            pruned_for,
            failing: false,
            history_written,
        };
        runtime.spawn(flusher.run(requests));
        DailyFlush { shutdown }
    }

    /// Writes what changed since the last flush and stops the flush. False when it did not finish
    /// within [`FINAL_FLUSH_TIMEOUT`] (or the flush task is gone).
    pub async fn finish(self) -> bool {
        let (done, finished) = oneshot::channel();
        if self.shutdown.send(done).await.is_err() {
            return false;
        }
        matches!(
            tokio::time::timeout(FINAL_FLUSH_TIMEOUT, finished).await,
            Ok(Ok(()))
        )
    }
}

type BudgetDay = (TenantId, Option<ModelKey>, Day);

struct Flusher {
    shared: Arc<ControlShared>,
    disk_db: Arc<DiskDb>,
    /// Totals taken from the shards and not yet written.
    pending: HashMap<BudgetDay, u64>,
    pruned_for: Day,
    /// The last write failed (to log the change of state, not every second).
    failing: bool,
    /// What the database holds of each (agent, model)'s history.
    history_written: HashMap<(String, ModelKey), (AgentLabels, AgentTotals)>,
}

impl Flusher {
    async fn run(mut self, mut shutdown: mpsc::Receiver<oneshot::Sender<()>>) {
        let mut ticker = tokio::time::interval(FLUSH_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.flush().await,
                request = shutdown.recv() => {
                    self.flush().await;
                    if let Some(done) = request {
                        let _ = done.send(());
                    }
                    return;
                }
            }
        }
    }

    async fn flush(&mut self) {
        let totals = self.shared.daily_totals().await;
        self.take(totals);
        let today = utc_today();
        let prune_before = (today > self.pruned_for).then(|| Day(today.0.saturating_sub(1)));
        let (history, removed) = self.history_changes();
        if self.pending.is_empty()
            && prune_before.is_none()
            && history.is_empty()
            && removed.is_empty()
        {
            return;
        }
        let records: Vec<DailyRecord> = self
            .pending
            .iter()
            .map(|((tenant, model, day), tokens)| DailyRecord {
                tenant: *tenant,
                model: model.clone(),
                day: *day,
                tokens: *tokens,
                others: false,
            })
            .collect();
        let count = records.len();
        let disk_db = self.disk_db.clone();
        let written = tokio::task::spawn_blocking(move || {
            if !records.is_empty() {
                disk_db.write_daily(&records)?;
            }
            if let Some(keep_from) = prune_before {
                disk_db.prune_daily(keep_from)?;
            }
            if !history.is_empty() || !removed.is_empty() {
                disk_db.write_history(&history, &removed)?;
            }
            Ok::<_, crate::router::control::disk_db::DiskDbError>((history, removed))
        })
        .await;
        let error = match written {
            Ok(Ok((history, removed))) => {
                for key in removed {
                    self.history_written.remove(&key);
                }
                for record in history {
                    self.history_written.insert(
                        (record.peer_id, record.model),
                        (record.labels, record.totals),
                    );
                }
                self.pending.clear();
                if prune_before.is_some() {
                    self.pruned_for = today;
                }
                if self.failing {
                    self.failing = false;
                    tracing::info!(
                        totals = count,
                        "daily totals written to the disk database again"
                    );
                }
                return;
            }
            Ok(Err(error)) => error.to_string(),
            Err(join_error) => format!("the write task failed: {join_error}"),
        };
        self.shared
            .quota_backend_errors_total
            .fetch_add(1, Ordering::Relaxed);
        if !self.failing {
            self.failing = true;
            tracing::warn!(%error, totals = count, "cannot write daily totals to the disk database; keeping them and retrying every second");
        }
    }

    /// The history records that differ from what the database holds, and the (agent, model)
    /// pairs it holds that the history no longer has. A failed write leaves `history_written`
    /// as it was, so the next flush finds the same changes again.
    fn history_changes(&self) -> (Vec<HistoryRecord>, Vec<(String, ModelKey)>) {
        let records = self.shared.registry().history_records();
        let present: std::collections::HashSet<(&str, &ModelKey)> = records
            .iter()
            .map(|record| (record.peer_id.as_str(), &record.model))
            .collect();
        let removed = self
            .history_written
            .keys()
            .filter(|(peer_id, model)| !present.contains(&(peer_id.as_str(), model)))
            .cloned()
            .collect();
        let changed = records
            .iter()
            .filter(|record| {
                self.history_written
                    .get(&(record.peer_id.clone(), record.model.clone()))
                    .is_none_or(|(labels, totals)| {
                        *labels != record.labels || *totals != record.totals
                    })
            })
            .cloned()
            .collect();
        (changed, removed)
    }

    /// Names the models of `totals` and adds them to the pending batch, later totals replacing
    /// earlier ones.
    fn take(&mut self, totals: Vec<DailyTotal>) {
        if totals.is_empty() {
            return;
        }
        let registry = self.shared.registry();
        for total in totals {
            let model = match total.model {
                None => None,
                Some(id) => match registry.model_key(id) {
                    Some(key) => Some(key),
                    None => {
                        // Every id is assigned by this registry; an unknown one is a bug.
                        tracing::error!(
                            model = id.0,
                            "daily total for an unknown model id; not persisted"
                        );
                        continue;
                    }
                },
            };
            self.pending
                .insert((total.tenant, model, total.day), total.tokens);
        }
    }
}
