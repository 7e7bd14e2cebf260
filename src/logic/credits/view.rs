//! One router's view of one budget's pool: what it saw the others hold, and the guard it keeps
//! after the store lost its data (seed `run-several-routers.md`, "When the store is
//! unreachable", the occupancy rows). The sync core keeps one per budget and asks it, before
//! every grant, for the *ceiling*: what the routers of the pool may hold together at most, as
//! this router can vouch for. The grant script grants from `ceiling - held by all` (the ceiling
//! stands in for the budget), so the guard holds atomically with the grant.
//!
//! # Rules (each one a seed of `credits::simulation` that failed without it)
//! - Until every router seen before a loss is back (or given up), the routers in the new pool
//!   hold together at most the budget less what those held when last seen: the guard bounds the
//!   routers *together*, not each (seed 2).
//! - What no router held at the last read may have been granted to any router since, one this
//!   router never saw among them: it is guarded too, for the settle window (seeds 9, 9250); all
//!   of the budget when this router never read the pool that was lost (seed 7882).
//! - A second loss before the first's guard settled keeps the first's guard (seed 38).
//! - A store this router first reads younger than the settle window (the first deployment of a
//!   site, or one that lost its data before this router ever read it) gives it nothing until the
//!   window has passed.
//! - While agents report a router the store does not list, within the window after a loss, no
//!   new credits are taken (seed 686: that router may hold more than its share of the lost pool).
//! - A failover (a replica promoted, or a restart that kept its data) may have lost the last
//!   writes: grants no replica acknowledged, and returns. The epoch is the same, so the pool is
//!   not new: for the settle window, what each other router held at the last read before the
//!   failover counts for it where the new pool shows less, and what no router held then is
//!   guarded as after a loss. (The seed keeps only the router whose grant was not acknowledged
//!   at its share; that bounds its own admissions, not the grants the others may then get of
//!   the same capacity.)
//!
//! Pure: times are milliseconds on the caller's clock (unix ms in the sync core, virtual in the
//! simulation).

use std::collections::BTreeMap;

/// One router's view of one budget's pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolView {
    /// What each router held at this router's last read of the pool (itself included).
    seen: BTreeMap<String, u64>,
    /// What no router held at that read.
    seen_free: u64,
    /// The pool was read since the store's data was last lost (or since this router started):
    /// what was seen is worth something only then.
    read: bool,
    /// Whether this router has ever read the store (this budget's pool or not).
    knows_the_store: bool,
    /// After a loss: the routers seen before it that are not back yet, with what they held.
    guard: BTreeMap<String, u64>,
    /// After a loss: what no router held at the last read, guarded until the settle window
    /// ends: (amount, until).
    unallocated: (u64, u64),
    /// No credits before then (a store younger than the settle window when first read).
    waits_until: u64,
    /// When the settle window of the latest loss ends.
    settles_at: u64,
    /// After a failover, until the settle window ends.
    failover: Option<Failover>,
}

/// What a failover may have lost, as this router saw the pool before it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failover {
    /// What each other router held at the last read before the failover.
    seen: BTreeMap<String, u64>,
    /// What no router held then.
    free: u64,
    until: u64,
}

impl PoolView {
    /// A router that has not read the store yet.
    pub fn new() -> PoolView {
        PoolView::default()
    }

    /// A view for a budget first used now, by a router that has read the store before: it
    /// inherits nothing of another budget's guard, but a store still inside its settle window
    /// (`settles_at`) gives this budget nothing before then (seed: "a router takes no new credits
    /// for a budget it had not seen before the loss").
    pub fn for_new_budget(now: u64, settles_at: u64) -> PoolView {
        PoolView {
            knows_the_store: true,
            waits_until: if now < settles_at { settles_at } else { 0 },
            settles_at,
            ..PoolView::default()
        }
    }

    /// The first read of a store by this router: a store whose epoch began less than
    /// `settle_ms` ago (the first deployment, or one that lost its data) gives nothing until the
    /// window has passed.
    pub fn first_read(
        &mut self,
        now: u64,
        epoch_since: u64,
        settle_ms: u64,
        holdings: impl IntoIterator<Item = (String, u64)>,
        budget: u64,
    ) {
        let settles_at = epoch_since.saturating_add(settle_ms);
        if now < settles_at {
            self.waits_until = settles_at;
        }
        self.settles_at = settles_at;
        self.knows_the_store = true;
        self.read(holdings, budget);
    }

    /// A round's read of the pool, in the epoch this router knows: routers back since a loss
    /// leave the guard.
    pub fn read(&mut self, holdings: impl IntoIterator<Item = (String, u64)>, budget: u64) {
        let holdings: BTreeMap<String, u64> = holdings.into_iter().collect();
        self.guard.retain(|other, _| !holdings.contains_key(other));
        self.seen_free = budget.saturating_sub(holdings.values().sum());
        self.seen = holdings;
        self.read = true;
    }

    /// The store lost its data (a new epoch, which began at `epoch_since`), noticed now by
    /// `me`. The caller forfeits the wallet's credits and rewrites what is in use under the new
    /// epoch: requests in flight are held, never credits.
    pub fn lost(&mut self, now: u64, epoch_since: u64, settle_ms: u64, me: &str, budget: u64) {
        let until = epoch_since.saturating_add(settle_ms);
        // What was seen counts only if it was read in the epoch just lost: a pool this router
        // never read (two losses in a row) may have granted anyone anything (seed 7882).
        let seen_free = if self.read { self.seen_free } else { budget };
        // The routers seen at the last read, and those a loss before this one left unsettled
        // (seed 38). What was seen stays what was last seen until the next read (seed 7882).
        let mut guard = std::mem::take(&mut self.guard);
        for (other, held) in &self.seen {
            let kept = guard.entry(other.clone()).or_insert(0);
            *kept = (*kept).max(*held);
        }
        guard.remove(me);
        self.guard = guard;
        let unallocated = if now < self.unallocated.1 {
            self.unallocated.0
        } else {
            0
        };
        self.unallocated = (unallocated.max(seen_free), until);
        if !self.knows_the_store {
            self.waits_until = until;
        }
        self.knows_the_store = true;
        self.settles_at = until;
        self.read = false;
    }

    /// The store failed over (noticed now by `me`): the last writes before it may be lost,
    /// though the pool is not new. See the module doc.
    pub fn failed_over(&mut self, now: u64, settle_ms: u64, me: &str) {
        let mut seen: BTreeMap<String, u64> = self
            .seen
            .iter()
            .filter(|(router, _)| router.as_str() != me)
            .map(|(router, held)| (router.clone(), *held))
            .collect();
        let mut free = if self.read { self.seen_free } else { 0 };
        if let Some(earlier) = self.failover.take().filter(|earlier| now < earlier.until) {
            for (router, held) in earlier.seen {
                let kept = seen.entry(router).or_insert(0);
                *kept = (*kept).max(held);
            }
            free = free.max(earlier.free);
        }
        self.failover = Some(Failover {
            seen,
            free,
            until: now.saturating_add(settle_ms),
        });
    }

    /// The others gave `router` up (or it left cleanly): it no longer holds what was guarded
    /// after a loss. What a failover may have lost stays guarded: the capacity a router given
    /// up held may have gone to another router in a grant the failover lost, and the promoted
    /// replica may show the router's holding again.
    pub fn forget(&mut self, router: &str) {
        self.guard.remove(router);
    }

    /// What the routers in the pool may hold together at most, as this router sees it now: the
    /// budget less what is guarded; 0 while this router waits for the settle window, and while
    /// `unknown_routers` (agents report routers the store does not list) within the window of the
    /// latest loss.
    pub fn ceiling(&self, now: u64, budget: u64, unknown_routers: bool) -> u64 {
        if now < self.waits_until || (unknown_routers && now < self.settles_at) {
            return 0;
        }
        let mut guarded: u64 = self.guard.values().sum();
        if now < self.unallocated.1 {
            guarded = guarded.saturating_add(self.unallocated.0);
        }
        if let Some(failover) = self.failover.as_ref().filter(|f| now < f.until) {
            let lost: u64 = failover
                .seen
                .iter()
                .map(|(router, held)| held.saturating_sub(self.seen(router).unwrap_or(0)))
                .sum();
            guarded = guarded.saturating_add(lost).saturating_add(failover.free);
        }
        budget.saturating_sub(guarded)
    }

    /// What this router saw `router` hold at its last read.
    pub fn seen(&self, router: &str) -> Option<u64> {
        self.seen.get(router).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holdings(of: &[(&str, u64)]) -> Vec<(String, u64)> {
        of.iter()
            .map(|(name, held)| (name.to_string(), *held))
            .collect()
    }

    #[test]
    fn a_young_store_gives_nothing_until_it_settles() {
        let mut view = PoolView::new();
        view.first_read(1_000, 0, 10_000, holdings(&[]), 100);
        assert_eq!(view.ceiling(5_000, 100, false), 0);
        assert_eq!(view.ceiling(10_000, 100, false), 100);
        let mut old = PoolView::new();
        old.first_read(20_000, 0, 10_000, holdings(&[("b", 30)]), 100);
        assert_eq!(old.ceiling(20_000, 100, false), 100);
    }

    #[test]
    fn after_a_loss_the_routers_not_back_and_the_unallocated_part_are_guarded() {
        let mut view = PoolView::new();
        view.first_read(
            50_000,
            0,
            10_000,
            holdings(&[("a", 10), ("b", 30), ("c", 20)]),
            100,
        );
        view.lost(60_000, 59_000, 10_000, "a", 100);
        // b and c not back: 50 guarded; 40 no one held: guarded until 69 s.
        assert_eq!(view.ceiling(60_000, 100, false), 10);
        view.read(holdings(&[("a", 5), ("b", 0)]), 100);
        assert_eq!(view.ceiling(60_000, 100, false), 40, "b is back; c is not");
        assert_eq!(view.ceiling(69_000, 100, false), 80, "the window passed");
        view.forget("c");
        assert_eq!(view.ceiling(69_000, 100, false), 100);
    }

    #[test]
    fn a_loss_before_any_read_guards_the_whole_budget_for_the_window() {
        let mut view = PoolView::new();
        view.first_read(50_000, 0, 10_000, holdings(&[("b", 30)]), 100);
        view.lost(60_000, 59_000, 10_000, "a", 100);
        view.lost(61_000, 61_000, 10_000, "a", 100);
        assert_eq!(
            view.ceiling(65_000, 100, false),
            0,
            "b guarded, and all else"
        );
        assert_eq!(view.ceiling(71_000, 100, false), 70, "b is still guarded");
    }

    #[test]
    fn unknown_routers_stop_new_credits_within_the_window_only() {
        let mut view = PoolView::new();
        view.first_read(50_000, 0, 10_000, holdings(&[]), 100);
        assert_eq!(view.ceiling(50_000, 100, true), 100, "no loss: no window");
        view.lost(60_000, 59_000, 10_000, "a", 100);
        view.read(holdings(&[]), 100);
        assert_eq!(view.ceiling(65_000, 100, true), 0);
        assert_eq!(view.ceiling(69_000, 100, true), 100);
    }

    #[test]
    fn after_a_failover_what_the_new_pool_lost_and_what_was_free_are_guarded() {
        let mut view = PoolView::new();
        view.first_read(50_000, 0, 10_000, holdings(&[("a", 10), ("b", 30)]), 100);
        view.failed_over(60_000, 10_000, "a");
        // Not read since: 60 free at the last read are guarded.
        assert_eq!(view.ceiling(60_000, 100, false), 40);
        // The new pool lost 20 of b's: they count for b still.
        view.read(holdings(&[("a", 10), ("b", 10)]), 100);
        assert_eq!(view.ceiling(61_000, 100, false), 100 - 20 - 60);
        assert_eq!(view.ceiling(70_000, 100, false), 100, "the window passed");
    }

    #[test]
    fn a_budget_first_used_inside_the_window_waits_for_it() {
        let view = PoolView::for_new_budget(60_000, 69_000);
        assert_eq!(view.ceiling(60_000, 100, false), 0);
        assert_eq!(view.ceiling(69_000, 100, false), 100);
    }
}
