//! `hivenet_queue_wait_seconds{model}`: how long tickets waited in a model's capacity queue,
//! timed on the owner shard from the owner's [`QueueMove`]s (the owner's logic reads no clock).
//! A ticket that leaves granted, cancelled (timed out, client gone) or failed (the model's last
//! agent left) is observed once.
//!
//! Bounds: one entry per queued ticket (each model's queue holds at most `--queue-depth`), and
//! one histogram per model that ever queued on this shard.

use std::time::Instant;

use crate::base::ids::{ModelId, Ticket};
use crate::router::metrics::histogram::DurationCounts;
use crate::router::shard::IdMap;
use crate::router::shard::owner::QueueMove;

#[derive(Debug, Default)]
pub struct QueueWaits {
    entered: IdMap<Ticket, Instant>,
    waits: IdMap<ModelId, DurationCounts>,
}

impl QueueWaits {
    /// Times the ticket of an `Entered`, observes the wait of a `Left` (`now`: when the owner
    /// decided it).
    pub fn record(&mut self, moved: QueueMove, now: Instant) {
        match moved {
            QueueMove::Entered(_, ticket) => {
                self.entered.insert(ticket, now);
            }
            QueueMove::Left(model, ticket) => {
                if let Some(entered) = self.entered.remove(&ticket) {
                    self.waits
                        .entry(model)
                        .or_default()
                        .observe(now.saturating_duration_since(entered));
                }
            }
        }
    }

    /// Every model's waits so far, for `/metrics`.
    pub fn report(&self) -> Vec<(ModelId, DurationCounts)> {
        self.waits
            .iter()
            .map(|(model, counts)| (*model, *counts))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_wait_is_observed_once_when_its_ticket_leaves_the_queue() {
        let mut waits = QueueWaits::default();
        let (model, ticket) = (
            ModelId(1),
            Ticket {
                shard: 0,
                sequence: 7,
            },
        );
        let start = Instant::now();
        waits.record(QueueMove::Entered(model, ticket), start);
        assert!(waits.report().is_empty(), "nothing left the queue yet");
        waits.record(
            QueueMove::Left(model, ticket),
            start + Duration::from_millis(300),
        );
        // A second leave (never sent by the owner) observes nothing more.
        waits.record(
            QueueMove::Left(model, ticket),
            start + Duration::from_secs(9),
        );
        let report = waits.report();
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].0, model);
        assert_eq!(report[0].1.count(), 1);
        assert!(waits.entered.is_empty());
    }
}
