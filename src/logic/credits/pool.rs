//! One model's credit pool as the store keeps it (seed `run-several-routers.md`, "Occupancy
//! credits"): how much of an occupancy budget each router holds right now. This is the logic the
//! store's grant script runs atomically, written as plain data so the simulation and the unit
//! tests drive exactly what the store does.
//!
//! # Rules
//! - A grant comes only from the part of the budget no router holds: the routers together never
//!   hold more than the budget through grants.
//! - Each round a router rewrites what it holds (what it uses plus its headroom, or more when a
//!   stream grew past its credits: the seed's one stated excess, recorded so the others see it).
//!   A router that holds nothing in the pool was given up by the others (or its run replaced):
//!   only what it has in flight is written, never credits, and it learns it was given up.
//! - A router ID runs one process at a time: a holding written by a newer run replaces the
//!   older run's, which is given back at once.
//! - The pool carries the store's epoch. A grant or rewrite made by a router that has not seen
//!   the current epoch (the store lost its data since) is refused.
//! - A router leaving cleanly, or given up by the others, holds nothing from then on.
//!
//! Pure: no clock, no I/O.

use std::collections::BTreeMap;

/// What one router holds of one budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The router's run (its start time): a newer run replaces an older one.
    pub run: u64,
    pub held: u64,
}

/// What a rewrite found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewritten {
    Held,
    /// The router held nothing here (given up by the others): only what is in flight was
    /// written.
    GivenUp,
}

/// Why the pool refused a router's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The router has not seen the store's current epoch: the store lost its data since.
    #[error("the store's epoch changed: read the pool again")]
    StaleEpoch,
    /// A run older than the one the pool knows for this router (a process that was replaced).
    #[error("a newer run of this router holds its credits")]
    Replaced,
}

/// One budget's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    epoch: u64,
    holdings: BTreeMap<String, Holding>,
}

impl Pool {
    /// An empty pool in a store of `epoch`.
    pub fn new(epoch: u64) -> Pool {
        Pool {
            epoch,
            holdings: BTreeMap::new(),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What every router holds together.
    pub fn held(&self) -> u64 {
        self.holdings
            .values()
            .fold(0u64, |sum, holding| sum.saturating_add(holding.held))
    }

    pub fn holding(&self, router: &str) -> Option<Holding> {
        self.holdings.get(router).copied()
    }

    pub fn holdings(&self) -> impl Iterator<Item = (&str, Holding)> {
        self.holdings
            .iter()
            .map(|(router, holding)| (router.as_str(), *holding))
    }

    /// The router's holding for `run`, a newer run replacing an older one's (given back).
    fn entry(&mut self, router: &str, run: u64, epoch: u64) -> Result<&mut Holding, PoolError> {
        if epoch != self.epoch {
            return Err(PoolError::StaleEpoch);
        }
        let holding = self
            .holdings
            .entry(router.to_owned())
            .or_insert(Holding { run, held: 0 });
        if run < holding.run {
            return Err(PoolError::Replaced);
        }
        if run > holding.run {
            *holding = Holding { run, held: 0 };
        }
        Ok(holding)
    }

    /// Grants `router` up to `want` of `budget` from what no router holds; returns the grant.
    pub fn grant(
        &mut self,
        router: &str,
        run: u64,
        epoch: u64,
        want: u64,
        budget: u64,
    ) -> Result<u64, PoolError> {
        // The free part is computed before the entry, which may give an older run's back.
        self.entry(router, run, epoch)?;
        let free = budget.saturating_sub(self.held());
        let granted = want.min(free);
        let holding = self.entry(router, run, epoch)?;
        holding.held += granted;
        Ok(granted)
    }

    /// The router's per-round rewrite of what it holds (`sync::pool_store::ROUND` runs the
    /// same rule). Lower than before gives credits back; higher is only ever what streamed
    /// output grew past the router's credits (never a grant). When the pool has no holding of
    /// this run (the others gave the router up), only `in_use` is written and the answer is
    /// [`Rewritten::GivenUp`]: the router forfeits what it believed it held.
    pub fn rewrite(
        &mut self,
        router: &str,
        run: u64,
        epoch: u64,
        held: u64,
        in_use: u64,
    ) -> Result<Rewritten, PoolError> {
        let known = self
            .holdings
            .get(router)
            .is_some_and(|holding| holding.run == run);
        let holding = self.entry(router, run, epoch)?;
        if known || held <= in_use {
            holding.held = held;
            Ok(Rewritten::Held)
        } else {
            holding.held = in_use;
            Ok(Rewritten::GivenUp)
        }
    }

    /// A clean shutdown, or the others giving the router up (only the run they gave up: a newer
    /// run keeps what it holds).
    pub fn release(&mut self, router: &str, run: u64) {
        if self
            .holdings
            .get(router)
            .is_some_and(|holding| holding.run <= run)
        {
            self.holdings.remove(router);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grants_come_only_from_what_no_router_holds() {
        let mut pool = Pool::new(1);
        assert_eq!(pool.grant("a", 1, 1, 60, 100), Ok(60));
        assert_eq!(pool.grant("b", 1, 1, 60, 100), Ok(40));
        assert_eq!(pool.grant("c", 1, 1, 10, 100), Ok(0));
        assert_eq!(pool.held(), 100);
        // A returns half in its round: B can have it.
        pool.rewrite("a", 1, 1, 30, 0).unwrap();
        assert_eq!(pool.grant("b", 1, 1, 50, 100), Ok(30));
        assert_eq!(pool.held(), 100);
    }

    #[test]
    fn a_new_run_of_a_router_replaces_the_old_runs_credits() {
        let mut pool = Pool::new(1);
        pool.grant("a", 1, 1, 80, 100).unwrap();
        // The restarted router holds nothing it did not ask for: the old run's 80 are free again.
        assert_eq!(pool.grant("a", 2, 1, 100, 100), Ok(100));
        // The old process, still writing, is refused.
        assert_eq!(pool.rewrite("a", 1, 1, 80, 0), Err(PoolError::Replaced));
        assert_eq!(pool.grant("a", 1, 1, 1, 100), Err(PoolError::Replaced));
    }

    #[test]
    fn a_router_that_missed_the_stores_data_loss_is_refused() {
        let mut pool = Pool::new(2);
        assert_eq!(pool.grant("a", 1, 1, 10, 100), Err(PoolError::StaleEpoch));
        assert_eq!(pool.rewrite("a", 1, 1, 10, 0), Err(PoolError::StaleEpoch));
        assert_eq!(pool.held(), 0);
    }

    #[test]
    fn a_router_given_up_writes_back_only_what_is_in_flight() {
        let mut pool = Pool::new(1);
        pool.grant("a", 1, 1, 40, 100).unwrap();
        pool.release("a", 1);
        assert_eq!(pool.rewrite("a", 1, 1, 40, 15), Ok(Rewritten::GivenUp));
        assert_eq!(pool.held(), 15);
        assert_eq!(pool.rewrite("a", 1, 1, 20, 15), Ok(Rewritten::Held));
        assert_eq!(pool.held(), 20);
    }

    #[test]
    fn releasing_gives_everything_back_but_never_a_newer_runs() {
        let mut pool = Pool::new(1);
        pool.grant("a", 5, 1, 40, 100).unwrap();
        pool.release("a", 4);
        assert_eq!(pool.held(), 40, "the others gave up an older run");
        pool.release("a", 5);
        assert_eq!(pool.held(), 0);
    }

    #[derive(Debug, Clone)]
    enum Call {
        Grant { router: u8, run: u64, want: u64 },
        Shrink { router: u8, run: u64, by: u64 },
        Release { router: u8, run: u64 },
    }

    fn call() -> impl Strategy<Value = Call> {
        prop_oneof![
            (0u8..4, 1u64..3, 0u64..80).prop_map(|(router, run, want)| Call::Grant {
                router,
                run,
                want
            }),
            (0u8..4, 1u64..3, 0u64..80).prop_map(|(router, run, by)| Call::Shrink {
                router,
                run,
                by
            }),
            (0u8..4, 1u64..3).prop_map(|(router, run)| Call::Release { router, run }),
        ]
    }

    proptest! {
        /// However grants, returns, restarts and releases interleave, and even when the budget
        /// shrinks, grants never take the routers past the budget: what they hold stays within
        /// the largest of the budget and what they held before the call.
        #[test]
        fn grants_never_take_the_routers_past_the_budget(
            calls in proptest::collection::vec((call(), 1u64..200), 1..200),
        ) {
            let mut pool = Pool::new(1);
            for (call, budget) in calls {
                let before = pool.held();
                match call {
                    Call::Grant { router, run, want } => {
                        let _ = pool.grant(&router.to_string(), run, 1, want, budget);
                    }
                    Call::Shrink { router, run, by } => {
                        let router = router.to_string();
                        let held = pool.holding(&router).map_or(0, |holding| holding.held);
                        let _ = pool.rewrite(&router, run, 1, held.saturating_sub(by), 0);
                    }
                    Call::Release { router, run } => pool.release(&router.to_string(), run),
                }
                prop_assert!(pool.held() <= budget.max(before), "{} > {}", pool.held(), budget.max(before));
            }
        }
    }
}
