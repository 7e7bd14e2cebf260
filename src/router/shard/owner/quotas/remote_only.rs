//! Usage other routers admitted for holders this router has not built: kept compact until a
//! request here builds the holder, then applied to it.
//!
//! Every router of a site receives every other router's usage each round. A router that built a
//! full holder (`limits::KeyLimits`) for each key it hears of pays for every key of the site,
//! served here or not: at 30,000 keys served elsewhere that was most of a router's memory. Here
//! each such tenant costs one small list of [`Pending`] usage instead:
//!
//! - rate buckets (requests, input and output tokens per minute): one entry per bucket and
//!   [`MERGE_WINDOW`], for [`RATE_HORIZON`]. Usage merged into an entry counts as admitted at the
//!   entry's latest time, so it is credited less refill than it earned: a holder built from it is
//!   never looser than one that took every round as it came, and at most a merge window's refill
//!   stricter. Older entries are dropped: a one-minute bucket (with at most 59 burst seconds) has
//!   refilled what they took.
//! - daily budgets: one running sum per budget and day, dropped when the day is over.
//!
//! Bounded: at most `RATE_HORIZON / MERGE_WINDOW + 1` (13) entries per rate bucket and one per
//! daily budget and day, for at most the tenants of the keys this router knows (usage of a key it
//! does not know is skipped before it gets here); [`RemoteOnly::prune`] runs with every cleanup.
//!
//! Pure: no clock, no I/O.

use crate::base::ids::{KeyId, TenantId};
use crate::logic::limits::{BucketRef, Day, Millis};
use crate::router::shard::IdMap;

/// Usage of one bucket arriving within this long of the entry before it is merged into it.
pub const MERGE_WINDOW: u64 = 15_000;
/// How long a rate entry is kept: a one-minute bucket with the longest burst refills from empty
/// well within it.
pub const RATE_HORIZON: u64 = 180_000;

/// Usage of one bucket, of one key, admitted elsewhere at `at` (this process's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub key: KeyId,
    pub bucket: BucketRef,
    pub amount: u64,
    pub at: Millis,
}

/// The usage waiting for holders not built, by the tenant that owns them.
#[derive(Debug, Default)]
pub struct RemoteOnly {
    tenants: IdMap<TenantId, Vec<Pending>>,
}

impl RemoteOnly {
    /// Keeps `amount` of `bucket`, admitted by another router at `at`, for `tenant`'s holders.
    pub fn record(
        &mut self,
        tenant: TenantId,
        key: KeyId,
        bucket: BucketRef,
        amount: u64,
        at: Millis,
    ) {
        if amount == 0 {
            return;
        }
        let pending = self.tenants.entry(tenant).or_default();
        let daily = matches!(bucket, BucketRef::Daily { .. });
        let mergeable = pending.iter_mut().rev().find(|entry| {
            entry.key == key
                && entry.bucket == bucket
                && (daily || entry.at.0.abs_diff(at.0) <= MERGE_WINDOW)
        });
        match mergeable {
            Some(entry) => {
                entry.amount = entry.amount.saturating_add(amount);
                entry.at = Millis(entry.at.0.max(at.0));
            }
            None => {
                pending.push(Pending {
                    key,
                    bucket,
                    amount,
                    at,
                });
            }
        }
    }

    /// Takes the usage waiting for `tenant`'s holders built for `key`: every owner bucket (any of
    /// the tenant's keys used them), and `key`'s own token buckets. Other keys' token buckets
    /// stay. Oldest first.
    pub fn take(&mut self, tenant: TenantId, key: KeyId) -> Vec<Pending> {
        let Some(pending) = self.tenants.get_mut(&tenant) else {
            return Vec::new();
        };
        let (taken, kept): (Vec<Pending>, Vec<Pending>) = pending
            .drain(..)
            .partition(|entry| !is_key_bucket(entry.bucket) || entry.key == key);
        if kept.is_empty() {
            self.tenants.remove(&tenant);
        } else {
            *pending = kept;
        }
        let mut taken = taken;
        taken.sort_by_key(|entry| entry.at);
        taken
    }

    /// Drops rate usage older than [`RATE_HORIZON`] and daily usage of days before `day`.
    pub fn prune(&mut self, now: Millis, day: Day) {
        self.tenants.retain(|_, pending| {
            pending.retain(|entry| match entry.bucket {
                BucketRef::Daily { day: of, .. } => of >= day,
                _ => entry.at.until(now) <= RATE_HORIZON,
            });
            pending.shrink_to_fit();
            !pending.is_empty()
        });
        if self.tenants.capacity() > 4 * self.tenants.len().max(16) {
            self.tenants.shrink_to_fit();
        }
    }

    /// Forgets the daily usage of `day` and before waiting: the other routers' totals of `day`
    /// were just read from the store (`Quotas::restore`), and they include it. Usage of a later
    /// day stays, as does rate usage: a router whose clock is behind the others' holds usage of
    /// their new day, which a read of its own day does not hold (a holder built after such a
    /// read counted none of it; found reading the code beside `sync::simulation`'s seed 4,818,
    /// whose own loss is another, `docs/site-simulation.md`).
    pub fn forget_daily(&mut self, day: Day) {
        self.tenants.retain(|_, pending| {
            pending.retain(|entry| match entry.bucket {
                BucketRef::Daily { day: of, .. } => of > day,
                _ => true,
            });
            !pending.is_empty()
        });
    }

    /// Tenants with usage waiting.
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

fn is_key_bucket(bucket: BucketRef) -> bool {
    matches!(
        bucket,
        BucketRef::InputTokens { .. } | BucketRef::OutputTokens { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::ModelId;

    const TENANT: TenantId = TenantId(7);
    const KEY: KeyId = KeyId(1);
    const OTHER_KEY: KeyId = KeyId(2);
    const RPM: BucketRef = BucketRef::Requests { model: None };

    fn daily(day: u32) -> BucketRef {
        BucketRef::Daily {
            model: None,
            day: Day(day),
        }
    }

    #[test]
    fn usage_within_a_merge_window_is_one_entry_at_its_latest_time() {
        let mut remote = RemoteOnly::default();
        remote.record(TENANT, KEY, RPM, 5, Millis(1_000));
        remote.record(TENANT, KEY, RPM, 3, Millis(1_000 + MERGE_WINDOW));
        remote.record(TENANT, KEY, RPM, 2, Millis(2_001 + MERGE_WINDOW * 2));
        remote.record(TENANT, KEY, daily(10), 100, Millis(1_000));
        remote.record(TENANT, KEY, daily(10), 50, Millis(900_000));
        remote.record(TENANT, KEY, RPM, 0, Millis(5_000_000));
        let taken = remote.take(TENANT, KEY);
        let entry = |bucket, amount, at| Pending {
            key: KEY,
            bucket,
            amount,
            at: Millis(at),
        };
        assert_eq!(
            taken,
            [
                entry(RPM, 8, 1_000 + MERGE_WINDOW),
                entry(RPM, 2, 2_001 + MERGE_WINDOW * 2),
                entry(daily(10), 150, 900_000),
            ]
        );
        assert!(remote.is_empty());
    }

    #[test]
    fn a_keys_token_buckets_wait_for_that_keys_holder() {
        let mut remote = RemoteOnly::default();
        let input = BucketRef::InputTokens { model: ModelId(3) };
        remote.record(TENANT, OTHER_KEY, input, 40, Millis(10));
        remote.record(TENANT, OTHER_KEY, RPM, 1, Millis(10));
        remote.record(TENANT, KEY, input, 30, Millis(20));
        let taken = remote.take(TENANT, KEY);
        // The owner's RPM (used through another key) and this key's input tokens.
        assert_eq!(taken.len(), 2);
        assert!(
            taken
                .iter()
                .all(|entry| entry.bucket == RPM || entry.key == KEY)
        );
        assert_eq!(remote.len(), 1);
        let later = remote.take(TENANT, OTHER_KEY);
        assert_eq!(later[0].amount, 40);
        assert!(remote.is_empty());
    }

    #[test]
    fn old_rate_usage_and_past_days_are_dropped() {
        let mut remote = RemoteOnly::default();
        remote.record(TENANT, KEY, RPM, 5, Millis(0));
        remote.record(TENANT, KEY, RPM, 5, Millis(RATE_HORIZON));
        remote.record(TENANT, KEY, daily(10), 100, Millis(0));
        remote.record(TENANT, KEY, daily(11), 100, Millis(0));
        remote.prune(Millis(RATE_HORIZON + 1), Day(11));
        let kept = remote.take(TENANT, KEY);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept.iter().any(|entry| entry.bucket == daily(11)));
        assert!(kept.iter().any(|entry| entry.at == Millis(RATE_HORIZON)));
        remote.record(TENANT, KEY, RPM, 5, Millis(0));
        remote.prune(Millis(RATE_HORIZON * 2), Day(11));
        assert!(remote.is_empty());
    }

    #[test]
    fn daily_usage_is_forgotten_when_the_totals_of_its_day_are_read_again() {
        let mut remote = RemoteOnly::default();
        remote.record(TENANT, KEY, daily(10), 100, Millis(0));
        remote.record(TenantId(8), KEY, daily(10), 100, Millis(0));
        remote.record(TENANT, KEY, RPM, 5, Millis(0));
        // The others' new day, read by a router whose clock is still on the day before.
        remote.record(TenantId(9), KEY, daily(11), 100, Millis(0));
        remote.forget_daily(Day(10));
        assert_eq!(remote.len(), 2);
        assert_eq!(remote.take(TENANT, KEY)[0].bucket, RPM);
        assert_eq!(remote.take(TenantId(9), KEY)[0].bucket, daily(11));
        remote.record(TenantId(9), KEY, daily(11), 100, Millis(0));
        remote.forget_daily(Day(11));
        assert!(remote.is_empty());
    }
}
