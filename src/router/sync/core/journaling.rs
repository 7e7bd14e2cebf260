//! The round's side of `--sync-journal` (`sync::journal`): the journal written after a round
//! that failed with usage to publish, a checkpoint of this router's totals after a round that
//! published everything, and a previous run's journal published at the first round that
//! reaches the store.

use super::*;
use crate::router::sync::journal::{self, AfterPublished, Journal};

impl Round {
    /// The stream entries this round publishes: a previous run's held back first, then the
    /// backlog's.
    pub(super) fn entries_to_publish(&self) -> Vec<Vec<u8>> {
        let registry = self.shared.registry();
        let own = encoded(
            &registry,
            &self.settings.router_id,
            self.run,
            self.backlog.batches().iter(),
        );
        self.journaling.entries_with(own)
    }

    /// The rate usage this run published lately, as copies, when the store may have lost it
    /// (`sync::republish`); none otherwise.
    pub(super) fn copies_to_publish(&mut self, now_ms: u64) -> Vec<Vec<u8>> {
        let registry = self.shared.registry();
        encoded(
            &registry,
            &self.settings.router_id,
            self.run,
            self.recent.copies(now_ms),
        )
        .collect()
    }

    /// The whole totals an inherited journal raised, as rows of the round's daily writes
    /// (`Journaling::raised_beside`), given the round's own `totals`.
    pub(super) fn raised_rows(&mut self, totals: &[(u32, String, u64)]) -> Vec<DailyRow> {
        self.ledger.unsure(&self.journaling.raised);
        self.journaling
            .raised_beside(totals)
            .into_iter()
            .filter_map(|(day, field, tokens)| {
                let (_, tenant, model) = daily_fields::parse_daily_field(&field)?;
                Some(DailyRow {
                    day,
                    tenant,
                    model,
                    field,
                    write: round::DailyWrite::Set(tokens),
                })
            })
            .collect()
    }

    /// After a round that failed: keeps what it could not publish in the journal.
    pub(super) async fn journal_held_back(&mut self) {
        let Some(path) = self.journaling.path.clone() else {
            return;
        };
        if self.backlog.is_empty() && self.journaling.inherited.is_none() {
            return;
        }
        let totals: Vec<(u32, String, u64)> = {
            let registry = self.shared.registry();
            self.backlog
                .totals()
                .filter_map(|total| {
                    let (field, _) = self.budget_field(&registry, &total)?;
                    Some((total.day.0, field, total.tokens))
                })
                .collect()
        };
        let held = self.journaling.keep_under(Journal {
            router: self.settings.router_id.clone(),
            run: self.run,
            // The inherited entries are in `entries_to_publish` already.
            entries: self.entries_to_publish(),
            totals,
            others: self.others_counted.clone(),
        });
        let bytes = held.encode();
        let written = self
            .on_journal_disk(
                move || journal::write(&path, &bytes),
                "the usage held back could not be written to the sync journal: a crash before the store answers loses it",
            )
            .await;
        if written {
            self.journaling.held_back(held);
            self.metrics
                .journal_writes_total
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// After a round that published everything: the inherited journal is done with, and the
    /// file becomes a checkpoint of this router's totals as the store holds them (written when
    /// they changed), or goes when there are none.
    pub(super) async fn journal_published(&mut self) {
        let known = if self.journaling.path.is_some() {
            self.ledger.known_totals()
        } else {
            Vec::new()
        };
        let after = self.journaling.after_published(
            &self.settings.router_id,
            self.run,
            known,
            self.others_counted.clone(),
        );
        let Some(path) = self.journaling.path.clone() else {
            return;
        };
        match after {
            AfterPublished::Keep => {}
            AfterPublished::Remove => {
                // Not removed, it is published again by the next run: every reader applies it
                // once.
                if self
                    .on_journal_disk(
                        move || journal::remove(&path),
                        "the sync journal could not be removed",
                    )
                    .await
                {
                    self.journaling.removed();
                }
            }
            AfterPublished::Checkpoint(checkpoint) => {
                let bytes = checkpoint.encode();
                let written = checkpoint.clone();
                if self
                    .on_journal_disk(
                        move || journal::replace(&path, &bytes),
                        "this router's daily totals could not be checkpointed in the sync journal: a restart after the store lost its data may count less than it used",
                    )
                    .await
                {
                    self.journaling.checkpointed(written);
                    self.metrics
                        .journal_checkpoints_total
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Runs one write, replacement or removal of the journal on the blocking pool: `true` when
    /// it succeeded; otherwise counted in `hivenet_sync_journal_errors_total` and logged with
    /// `failed`.
    async fn on_journal_disk(
        &self,
        operation: impl FnOnce() -> std::io::Result<()> + Send + 'static,
        failed: &'static str,
    ) -> bool {
        let error = match tokio::task::spawn_blocking(operation).await {
            Ok(Ok(())) => return true,
            Ok(Err(error)) => error.to_string(),
            Err(error) => format!("the blocking task did not finish: {error}"),
        };
        self.metrics
            .journal_errors_total
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%error, "{failed}");
        false
    }
}

/// Each batch as the stream entry `router`'s run `run` publishes, encoded, its models by name;
/// a batch with nothing to publish gives none.
fn encoded<'a>(
    registry: &'a crate::router::control::registry::Registry,
    router: &'a str,
    run: u64,
    batches: impl Iterator<Item = &'a round::Batch> + 'a,
) -> impl Iterator<Item = Vec<u8>> + 'a {
    batches
        .map(move |batch| {
            round::entry_of(router, run, batch, |model| {
                registry.model_key(model).map(|key| ModelName {
                    name: key.name,
                    capability: key.capability,
                })
            })
        })
        .filter(|entry| !entry.is_empty())
        .map(|entry| entry.encode())
}
