//! A request's forward attempts over its policy's steps (policy reference, "Forward-attempt
//! budgets"), and the prompt chain its `prefix-aware` asks carry: which step the next ask starts
//! from, which agents it must not get again, whether a failure may still be retried, and when a
//! request moves on to the next step.
//!
//! The chain (`logic::routing::prefix::chain`) comes from the shard's pool and goes back to it
//! when no ask of the request can need it again: before the last attempt's forward, or when the
//! attempts are dropped.

use std::sync::Arc;

use crate::logic::routing::Ask as RouteAsk;
use crate::logic::routing::prefix::chain::{Chain, ChainPool};
use crate::router::api::forward;
use crate::router::error::Rejection;

thread_local! {
    /// The shard's idle prompt chains (`prefix-aware`): a shard is one thread.
    static CHAINS: std::cell::RefCell<ChainPool> = std::cell::RefCell::new(ChainPool::default());
}

/// The prompt chain of `parts` from this shard's pool; `None` for a prompt shorter than a block.
pub(super) fn chain_of(parts: &[&[u8]]) -> Option<Arc<Chain>> {
    CHAINS.with_borrow_mut(|pool| pool.chain_of(parts))
}

/// A request's forward attempts over its policy's steps (policy reference, "Forward-attempt
/// budgets"): a failed agent is excluded for the rest of its step; `max_tries` failures in a
/// step move the request to the next step, where every agent is eligible again.
pub(super) struct Attempts<'p> {
    policy: &'p crate::logic::policy::ModelPolicy,
    start_step: u8,
    excluded: Vec<crate::logic::routing::AgentId>,
    failures_in_step: u32,
    last_failure: Option<Rejection>,
    /// Queue beyond `--queue-depth` (a request released by a wake).
    beyond_depth: bool,
    /// The prompt's chain, for a `prefix-aware` step; back to the shard's pool on drop.
    prefix: Option<Arc<Chain>>,
}

impl Drop for Attempts<'_> {
    fn drop(&mut self) {
        self.give_back_chain();
    }
}

impl<'p> Attempts<'p> {
    /// The attempts of a request under `policy`, asking with `prefix` (its prompt's chain, for a
    /// `prefix-aware` step) and queueing `beyond_depth` (a request a wake released).
    pub(super) fn new(
        policy: &'p crate::logic::policy::ModelPolicy,
        prefix: Option<Arc<Chain>>,
        beyond_depth: bool,
    ) -> Self {
        Attempts {
            policy,
            start_step: 0,
            excluded: Vec::new(),
            failures_in_step: 0,
            last_failure: None,
            beyond_depth,
            prefix,
        }
    }

    /// What the last failure answers when no other attempt is made.
    pub(super) fn take_last_failure(&mut self) -> Option<Rejection> {
        self.last_failure.take()
    }

    /// The prompt's chain back to the shard's pool: no ask of this request needs it again.
    pub(super) fn give_back_chain(&mut self) {
        if let Some(chain) = self.prefix.take() {
            CHAINS.with_borrow_mut(|pool| pool.give_back(chain));
        }
    }

    fn max_tries(&self, step: u8) -> u32 {
        self.policy
            .step(usize::from(step))
            .map_or(1, |step| step.max_tries.max(1))
    }

    pub(super) fn ask(&self) -> RouteAsk {
        RouteAsk {
            start_step: self.start_step,
            excluded: self.excluded.clone().into_boxed_slice(),
            beyond_depth: self.beyond_depth,
            prefix: self.prefix.clone(),
        }
    }

    /// Whether a failure on `step` could still be followed by another attempt.
    pub(super) fn may_retry(&self, step: u8, provider: bool) -> bool {
        let failed_here = if step == self.start_step {
            self.failures_in_step
        } else {
            0
        };
        failed_here + 1 < self.max_tries(step)
            || usize::from(step) + 1 < 1 + self.policy.fallback_chain.len()
            || provider
    }

    /// The steps from the one the request starts from to the last, that one included.
    pub(super) fn steps_left(&self) -> u32 {
        (1 + self.policy.fallback_chain.len()).saturating_sub(usize::from(self.start_step)) as u32
    }

    /// Moves the request to the step after the one it starts from, every agent eligible
    /// again (its wait there ran out). False on the last step.
    ///
    /// The owner does not tell where a ticket waited: a step with no eligible agent between is
    /// skipped by the owner's own search, so the next wait is at the first later step that has
    /// one, or at the same step when the request started before an empty step.
    pub(super) fn move_on(&mut self) -> bool {
        let next = usize::from(self.start_step) + 1;
        // The steps are the primary one and the fallback chain's.
        if next > self.policy.fallback_chain.len() {
            return false;
        }
        self.start_step = next as u8;
        self.excluded.clear();
        self.failures_in_step = 0;
        true
    }

    pub(super) fn failed(&mut self, failure: forward::Failure) {
        if failure.step != self.start_step {
            // The owner moved the request on to a later step (nothing eligible before it).
            self.start_step = failure.step;
            self.excluded.clear();
            self.failures_in_step = 0;
        }
        self.failures_in_step += 1;
        if self.failures_in_step >= self.max_tries(failure.step) {
            self.start_step = failure.step.saturating_add(1);
            self.excluded.clear();
            self.failures_in_step = 0;
        } else {
            self.excluded.push(failure.agent);
        }
        self.last_failure = Some(failure.rejection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(agent: u32, step: u8) -> forward::Failure {
        forward::Failure {
            agent: crate::logic::routing::AgentId(agent),
            step,
            rejection: Rejection::agent_disconnected(),
        }
    }

    #[test]
    fn attempts_exclude_failed_agents_then_advance_steps() {
        let compiled = crate::logic::policy::compile_text(
            "test.yaml",
            "models: [m]\nrouting_policy:\n  strategy: least-loaded\n  max_tries: 2\nfallback_chain:\n  - strategy: least-loaded\n    max_tries: 1\n",
            crate::logic::policy::Role::Named("test"),
            &crate::logic::policy::PolicyContext::default(),
        )
        .unwrap();
        let mut attempts = Attempts::new(&compiled.policy, None, false);
        assert!(attempts.may_retry(0, false));
        attempts.failed(failure(7, 0));
        assert_eq!(attempts.ask().start_step, 0);
        assert_eq!(
            &*attempts.ask().excluded,
            &[crate::logic::routing::AgentId(7)]
        );
        attempts.failed(failure(8, 0));
        // Two failures used step 0's budget: step 1, every agent eligible again.
        assert_eq!(attempts.ask().start_step, 1);
        assert!(attempts.ask().excluded.is_empty());
        // Step 1 allows one try and is the last step: no retry unless a provider follows.
        assert!(!attempts.may_retry(1, false));
        assert!(attempts.may_retry(1, true));
        attempts.failed(failure(7, 1));
        assert_eq!(attempts.ask().start_step, 2);
        assert!(attempts.last_failure.is_some());
    }

    #[test]
    fn a_wait_that_runs_out_moves_on_until_the_last_step() {
        let compiled = crate::logic::policy::compile_text(
            "test.yaml",
            "models: [m]\nrouting_policy:\n  strategy: least-loaded\n  max_tries: 2\nfallback_chain:\n  - strategy: least-loaded\n",
            crate::logic::policy::Role::Named("test"),
            &crate::logic::policy::PolicyContext::default(),
        )
        .unwrap();
        let mut attempts = Attempts::new(&compiled.policy, None, false);
        attempts.failed(failure(7, 0));
        assert!(attempts.move_on());
        // The next step, with every agent eligible and its own try budget.
        assert_eq!(attempts.ask().start_step, 1);
        assert!(attempts.ask().excluded.is_empty());
        assert_eq!(attempts.failures_in_step, 0);
        // No step after the last: the caller answers `504`.
        assert!(!attempts.move_on());
        assert_eq!(attempts.ask().start_step, 1);
    }
}
