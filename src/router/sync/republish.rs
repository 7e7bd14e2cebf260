//! The rate usage this run published lately, kept to be published once more when the store may
//! have lost it before the other routers read it (issue 33, `sync::simulation`).
//!
//! A round that goes through has written its usage; the others read it at their next round.
//! When the store loses its data in between (a restart without it, a failover to a replica that
//! had not received it), that usage is in no other router's view: router-2 published the 9 s it
//! had held back while cut off, the store restarted empty 50 ms later, and for the next minute
//! every view showed room where the site had about 170 requests fewer than nothing (seed
//! 34,083: 2,507 requests in a minute where 2,483 were allowed). A router cut off while the
//! store lost the others' usage never reads it either (seed 49,786).
//!
//! So after the store failed over, restarted or lost its data (a new epoch), a router's next
//! round that goes through publishes again, as *copies*, the rate usage it published within
//! [`KEEP_MS`]: each batch with its run and admission time, which tell a receiver that applied
//! the original to drop the copy (`round::Applied`). The daily usage is left out: the totals are
//! written whole after a loss, and they count it. A copy lowers no level of the store
//! (`sync::levels`): the levels were lost too, and restart from views that may count it; a view
//! it lowers lowers them (`Levels::round`, a settled view below the level).
//!
//! Bound: the newest [`KEPT_MAX`] batches, within [`KEEP_MS`] of their publication.

use std::collections::VecDeque;

use crate::logic::limits::BucketRef;

use super::round::{BACKLOG_MAX, Batch};

/// How long published usage is kept to be published again: a bucket's capacity is a minute of
/// its rate, so a view that missed older usage has refilled past it, unless its bucket was in
/// use all along (then the copy would still lower it: a loss that long after is not covered).
pub const KEEP_MS: u64 = 60_000;

/// The most batches kept: half what a receiver remembers of one run (`round::Applied`), so that
/// the copies of batches a receiver applied are still known to it when they come, with the new
/// batches of a minute at the shortest interval beside them.
pub const KEPT_MAX: usize = BACKLOG_MAX / 2;

/// This run's recently published rate usage, and whether it is to be published again.
#[derive(Debug, Default)]
pub struct Recent {
    /// (published at, the batch's rate usage), oldest first.
    batches: VecDeque<(u64, Batch)>,
    /// The store may have lost what this run published: the next round publishes the copies.
    due: bool,
}

impl Recent {
    /// A round published `batches` at `now_ms`: their rate usage is kept.
    pub fn published(&mut self, now_ms: u64, batches: &[Batch]) {
        for batch in batches {
            let usage: Vec<_> = batch
                .usage
                .iter()
                .filter(|usage| !matches!(usage.bucket, BucketRef::Daily { .. }))
                .copied()
                .collect();
            if usage.is_empty() {
                continue;
            }
            if self.batches.len() >= KEPT_MAX {
                self.batches.pop_front();
            }
            self.batches.push_back((now_ms, Batch { usage, ..*batch }));
        }
        self.forget_before(now_ms.saturating_sub(KEEP_MS));
    }

    /// The store failed over, restarted or lost its data: what it held of this run's usage may
    /// be gone before the others read it.
    pub fn store_may_have_lost(&mut self) {
        self.due = true;
    }

    /// Whether the next round publishes the copies.
    pub fn due(&self) -> bool {
        self.due
    }

    /// The copies a round at `now_ms` publishes again (empty unless they are due), oldest first.
    pub fn copies(&mut self, now_ms: u64) -> impl Iterator<Item = &Batch> {
        self.forget_before(now_ms.saturating_sub(KEEP_MS));
        self.batches
            .iter()
            .filter(|_| self.due)
            .map(|(_, batch)| batch)
    }

    /// The round that published the copies went through: they are in the store, in the epoch
    /// that round read (a loss that round learned of came before them).
    pub fn copies_went_through(&mut self) {
        self.due = false;
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        while self
            .batches
            .front()
            .is_some_and(|(published, _)| *published < cutoff_ms)
        {
            self.batches.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::KeyId;
    use crate::logic::limits::Day;
    use crate::router::shard::owner::quotas::BucketUsage;

    fn batch(admitted_at_unix_ms: u64, requests: u64) -> Batch {
        Batch {
            admitted_at_unix_ms,
            day: Day(20_000),
            usage: vec![
                BucketUsage {
                    key: KeyId(7),
                    bucket: BucketRef::Requests { model: None },
                    amount: requests,
                },
                BucketUsage {
                    key: KeyId(7),
                    bucket: BucketRef::Daily {
                        model: None,
                        day: Day(20_000),
                    },
                    amount: 300,
                },
            ],
        }
    }

    fn copies(recent: &mut Recent, now_ms: u64) -> Vec<(u64, u64)> {
        recent
            .copies(now_ms)
            .map(|batch| {
                assert!(batch.usage.iter().all(|usage| usage.amount < 300));
                (batch.admitted_at_unix_ms, batch.usage[0].amount)
            })
            .collect()
    }

    #[test]
    fn the_last_minute_of_rate_usage_is_published_again_once_after_a_loss() {
        let mut recent = Recent::default();
        recent.published(10_000, &[batch(9_800, 4)]);
        // Held back 9 s while cut off, published at once.
        let held: Vec<Batch> = (0..45).map(|i| batch(60_000 + i * 200, 2)).collect();
        recent.published(69_200, &held);
        assert_eq!(
            copies(&mut recent, 69_400),
            [],
            "nothing is due before a loss"
        );
        recent.store_may_have_lost();
        let again = copies(&mut recent, 71_000);
        // The batch published at 10 s is more than a minute old: its usage is refilled.
        assert_eq!(again.len(), 45);
        assert_eq!(
            again[0],
            (60_000, 2),
            "with its admission time, daily usage left out"
        );
        // Due until a round that carries them goes through.
        assert_eq!(copies(&mut recent, 71_200).len(), 45);
        recent.copies_went_through();
        assert_eq!(copies(&mut recent, 71_400), []);
    }

    #[test]
    fn kept_batches_are_bounded() {
        let mut recent = Recent::default();
        let many: Vec<Batch> = (0..KEPT_MAX as u64 + 50).map(|at| batch(at, 1)).collect();
        recent.published(1_000, &many);
        recent.published(1_000, &[batch(5_000, 0)]);
        recent.store_may_have_lost();
        let again = copies(&mut recent, 1_000);
        assert_eq!(again.len(), KEPT_MAX);
        assert_eq!(again[0].0, 51, "the oldest go first");
        // A batch of daily usage alone is not kept.
        let daily_only = Batch {
            usage: vec![batch(6_000, 1).usage[1]],
            ..batch(6_000, 1)
        };
        recent.published(1_000, &[daily_only]);
        assert_eq!(copies(&mut recent, 1_000).len(), KEPT_MAX);
    }
}
