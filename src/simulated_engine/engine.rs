//! The simulated engine's per-model state: the admission queue (concurrency limit plus a bounded
//! FIFO of waiting requests), the KV-cache model, the prefix cache, and the counters `/metrics`
//! reports.
//!
//! Each served model behaves like its own vLLM instance: its own concurrency limit, waiting queue
//! and KV capacity, so a router sees independent signals per model.
//!
//! Invariants: `waiting` counts requests holding a [`Queued`]; `running` and `kv_tokens` count
//! requests holding a [`Generation`]. Both guards undo their contribution on drop, so a request that
//! is abandoned at any point (client gone, handler dropped) returns every counter to where it was and
//! frees its concurrency permit. A guard dropped before its request finished counts as cancelled.
//!
//! Performance: one relaxed atomic per counter change; the queue is tokio's FIFO-fair semaphore,
//! which only allocates for requests that actually wait. The one lock is the prefix cache's, taken
//! once per admitted generation request and only when prefix caching is on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::simulated_engine::error::SimError;
use crate::simulated_engine::prefix_cache::{BlockKey, PrefixCache};

/// Fraction of the KV cache in use: `tokens_in_use / capacity`, clamped to `[0, 1]`, unless the
/// control endpoint pinned a value. `tokens_in_use` is the sum over running requests of prompt
/// tokens plus the tokens generated so far — what a paged KV cache holds for them.
pub fn kv_usage_fraction(tokens_in_use: u64, capacity_tokens: u64, pinned: Option<f64>) -> f64 {
    if let Some(pinned) = pinned {
        return pinned.clamp(0.0, 1.0);
    }
    if capacity_tokens == 0 {
        return if tokens_in_use == 0 { 0.0 } else { 1.0 };
    }
    (tokens_in_use as f64 / capacity_tokens as f64).min(1.0)
}

/// Counters of one model, read by `/metrics`.
#[derive(Debug)]
pub struct ModelCounters {
    /// Requests admitted and generating.
    pub running: AtomicU64,
    /// Requests queued behind the concurrency limit.
    pub waiting: AtomicU64,
    /// Prompt plus generated tokens of running requests (the KV model's numerator).
    pub kv_tokens: AtomicU64,
    /// Requests addressed to this model that were accepted (not rejected up front).
    pub requests_total: AtomicU64,
    /// Requests whose client went away (or whose handler was dropped) before the answer was done.
    pub cancelled_total: AtomicU64,
    /// The most requests that were ever running at once (how a benchmark sees whether the
    /// routers in front kept within an occupancy budget).
    pub running_peak: AtomicU64,
    /// Answers completed (vLLM's `request_success_total{finished_reason="stop"}`: the simulator
    /// always stops by itself).
    pub finished_total: AtomicU64,
    /// Time to first token of every generation that produced one (vLLM's
    /// `time_to_first_token_seconds`).
    pub ttft: Histogram,
    /// Time between a generation's successive tokens (vLLM's `inter_token_latency_seconds`).
    pub itl: Histogram,
    /// Prompt and generated tokens of every finished generation (vLLM's
    /// `request_prompt_tokens`, `request_generation_tokens`).
    pub prompt_tokens: Histogram,
    pub generation_tokens: Histogram,
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`): every prompt
    /// token of every admitted generation request, while prefix caching is on.
    pub prefix_cache_queries_total: AtomicU64,
    /// Of those, the tokens found cached (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hits_total: AtomicU64,
}

impl Default for ModelCounters {
    fn default() -> Self {
        ModelCounters {
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            kv_tokens: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
            cancelled_total: AtomicU64::new(0),
            running_peak: AtomicU64::new(0),
            finished_total: AtomicU64::new(0),
            ttft: Histogram::new(&TTFT_BOUNDS_SECONDS),
            itl: Histogram::new(&ITL_BOUNDS_SECONDS),
            prompt_tokens: Histogram::new(&TOKEN_BOUNDS),
            generation_tokens: Histogram::new(&TOKEN_BOUNDS),
            prefix_cache_queries_total: AtomicU64::new(0),
            prefix_cache_hits_total: AtomicU64::new(0),
        }
    }
}

/// vLLM's time-to-first-token bucket bounds, in seconds (a prefix of its list: the simulator
/// answers within seconds).
pub const TTFT_BOUNDS_SECONDS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
];

/// vLLM's inter-token latency bucket bounds, in seconds (a prefix of its list).
pub const ITL_BOUNDS_SECONDS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
];

/// vLLM's prompt and generation length bucket bounds, in tokens (1-2-5 steps up to a model
/// length the simulator never passes).
pub const TOKEN_BOUNDS: [f64; 13] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// A histogram over fixed `bounds`: per-bucket (not cumulative) counts, the last one past every
/// bound, and the sum of the observations in millionths.
#[derive(Debug)]
pub struct Histogram {
    pub bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    sum_millionths: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_millionths: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        let bucket = self
            .bounds
            .iter()
            .position(|bound| value <= *bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_millionths
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
    }

    /// Cumulative counts by bound (the last is `+Inf`, the total) and the sum.
    pub fn cumulative(&self) -> (Vec<u64>, f64) {
        let mut total = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|count| {
                total += count.load(Ordering::Relaxed);
                total
            })
            .collect();
        let sum = self.sum_millionths.load(Ordering::Relaxed) as f64 / 1e6;
        (cumulative, sum)
    }
}

/// A snapshot of [`ModelCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub running: u64,
    pub waiting: u64,
    pub kv_tokens: u64,
    pub requests_total: u64,
    pub cancelled_total: u64,
    pub running_peak: u64,
}

/// One served model.
#[derive(Debug)]
pub struct ModelEngine {
    pub name: String,
    /// `name` as a JSON string literal (quotes and escapes included), serialized once at start-up
    /// and pasted into every response.
    pub name_json: String,
    /// Concurrency permits; `None` when unlimited (`--max-concurrency 0`).
    permits: Option<Semaphore>,
    /// Bound on `waiting`; beyond it a request is rejected with 503.
    waiting_max: u64,
    /// KV cache size in tokens (`--kv-capacity-tokens`).
    pub kv_capacity_tokens: u64,
    /// Tokens per prefix-cache block (`--block-tokens`).
    block_tokens: u64,
    /// `None` when prefix caching is off (`--prefix-cache-blocks 0`).
    prefix_cache: Option<Mutex<PrefixCache>>,
    pub counters: ModelCounters,
}

impl ModelEngine {
    pub fn new(
        name: String,
        concurrency_max: usize,
        waiting_max: usize,
        kv_capacity_tokens: u64,
    ) -> ModelEngine {
        let name_json = serde_json::to_string(&name).expect("a string always serializes");
        ModelEngine {
            name,
            name_json,
            permits: (concurrency_max > 0).then(|| Semaphore::new(concurrency_max)),
            waiting_max: waiting_max as u64,
            kv_capacity_tokens,
            block_tokens: 1,
            prefix_cache: None,
            counters: ModelCounters::default(),
        }
    }

    /// Turns prefix caching on: blocks of `block_tokens` tokens, at most `capacity_blocks` of
    /// them cached. A capacity of 0 leaves it off.
    pub fn with_prefix_cache(mut self, block_tokens: u64, capacity_blocks: usize) -> ModelEngine {
        assert!(block_tokens >= 1, "a cache block holds at least one token");
        self.block_tokens = block_tokens;
        self.prefix_cache =
            (capacity_blocks > 0).then(|| Mutex::new(PrefixCache::new(capacity_blocks)));
        self
    }

    /// Tokens per prefix-cache block when prefix caching is on; `None` when it is off, so callers
    /// can skip cutting prompts into blocks.
    pub fn prefix_cache_block_tokens(&self) -> Option<u64> {
        self.prefix_cache.as_ref().map(|_| self.block_tokens)
    }

    /// Looks up an admitted request's prompt in the prefix cache, records its blocks there, and
    /// returns how many of its `prompt_tokens` were cached: the leading cached blocks times the
    /// block size, at most `prompt_tokens`. `block_keys` are the prompt's full blocks in order.
    /// Returns 0, and counts nothing, when prefix caching is off.
    pub fn look_up_prefix(&self, block_keys: &[BlockKey], prompt_tokens: u64) -> u64 {
        let Some(cache) = &self.prefix_cache else {
            return 0;
        };
        let hit_blocks = cache
            .lock()
            // The cache's maps stay consistent between statements; a panic elsewhere while the
            // lock was held leaves nothing half-done.
            .unwrap_or_else(PoisonError::into_inner)
            .look_up_and_record(block_keys);
        let cached_tokens = (hit_blocks as u64)
            .saturating_mul(self.block_tokens)
            .min(prompt_tokens);
        let counters = &self.counters;
        counters
            .prefix_cache_queries_total
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        counters
            .prefix_cache_hits_total
            .fetch_add(cached_tokens, Ordering::Relaxed);
        cached_tokens
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        let counters = &self.counters;
        CountersSnapshot {
            running: counters.running.load(Ordering::Relaxed),
            waiting: counters.waiting.load(Ordering::Relaxed),
            kv_tokens: counters.kv_tokens.load(Ordering::Relaxed),
            requests_total: counters.requests_total.load(Ordering::Relaxed),
            cancelled_total: counters.cancelled_total.load(Ordering::Relaxed),
            running_peak: counters.running_peak.load(Ordering::Relaxed),
        }
    }

    /// Counts a request that needs no concurrency permit (embeddings, rerank, token counting).
    pub fn count_request(&self) {
        self.counters.requests_total.fetch_add(1, Ordering::Relaxed);
    }

    /// Admits a generation request: immediately when a permit is free, otherwise after every request
    /// queued before it (FIFO). Fails fast with [`SimError::QueueFull`] when `waiting_max` requests
    /// are already queued. Dropping the returned future while queued counts as a cancellation.
    pub async fn admit(&self, prompt_tokens: u64) -> Result<Generation<'_>, SimError> {
        let permit = match &self.permits {
            None => None,
            Some(permits) => match permits.try_acquire() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    let queued = self.enqueue()?;
                    let permit = permits
                        .acquire()
                        .await
                        .expect("the semaphore is never closed");
                    queued.leave();
                    Some(permit)
                }
            },
        };
        self.counters.requests_total.fetch_add(1, Ordering::Relaxed);
        let running = self.counters.running.fetch_add(1, Ordering::Relaxed) + 1;
        self.counters
            .running_peak
            .fetch_max(running, Ordering::Relaxed);
        self.counters
            .kv_tokens
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        Ok(Generation {
            engine: self,
            _permit: permit,
            kv_tokens_held: prompt_tokens,
            prompt_tokens,
            finished: false,
            admitted_at: Some(std::time::Instant::now()),
            last_token_at: None,
        })
    }

    fn enqueue(&self) -> Result<Queued<'_>, SimError> {
        let waiting_before = self.counters.waiting.fetch_add(1, Ordering::Relaxed);
        if waiting_before >= self.waiting_max {
            self.counters.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(SimError::QueueFull {
                waiting_max: self.waiting_max,
            });
        }
        Ok(Queued {
            engine: self,
            admitted: false,
        })
    }
}

/// A request waiting for a concurrency permit.
struct Queued<'a> {
    engine: &'a ModelEngine,
    admitted: bool,
}

impl Queued<'_> {
    fn leave(mut self) {
        self.admitted = true;
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let counters = &self.engine.counters;
        counters.waiting.fetch_sub(1, Ordering::Relaxed);
        if !self.admitted {
            // Counted here because an abandoned queued request never reaches `requests_total`.
            counters.requests_total.fetch_add(1, Ordering::Relaxed);
            counters.cancelled_total.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An admitted request: holds its concurrency permit and its share of the KV cache until dropped.
#[derive(Debug)]
pub struct Generation<'a> {
    engine: &'a ModelEngine,
    _permit: Option<SemaphorePermit<'a>>,
    kv_tokens_held: u64,
    finished: bool,
    prompt_tokens: u64,
    /// When it was admitted, until its first token (then `None`).
    admitted_at: Option<std::time::Instant>,
    /// When its latest token came, after the first.
    last_token_at: Option<std::time::Instant>,
}

impl Generation<'_> {
    /// Records generated tokens: each one grows the request's KV footprint.
    pub fn advance(&mut self, tokens: u64) {
        let now = std::time::Instant::now();
        if let Some(admitted_at) = self.admitted_at.take() {
            let ttft = now.duration_since(admitted_at).as_secs_f64();
            self.engine.counters.ttft.observe(ttft);
        } else if let Some(last) = self.last_token_at {
            let itl = now.duration_since(last).as_secs_f64();
            self.engine.counters.itl.observe(itl);
        }
        self.last_token_at = Some(now);
        self.kv_tokens_held += tokens;
        self.engine
            .counters
            .kv_tokens
            .fetch_add(tokens, Ordering::Relaxed);
    }

    /// Marks the answer complete, so dropping the generation is not a cancellation.
    pub fn finish(mut self) {
        self.finished = true;
        let counters = &self.engine.counters;
        counters.finished_total.fetch_add(1, Ordering::Relaxed);
        counters.prompt_tokens.observe(self.prompt_tokens as f64);
        let generated = self.kv_tokens_held.saturating_sub(self.prompt_tokens);
        counters.generation_tokens.observe(generated as f64);
    }
}

impl Drop for Generation<'_> {
    fn drop(&mut self) {
        let counters = &self.engine.counters;
        counters.running.fetch_sub(1, Ordering::Relaxed);
        counters
            .kv_tokens
            .fetch_sub(self.kv_tokens_held, Ordering::Relaxed);
        if !self.finished {
            counters.cancelled_total.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn kv_fraction_is_tokens_over_capacity_clamped() {
        assert_eq!(kv_usage_fraction(0, 100, None), 0.0);
        assert_eq!(kv_usage_fraction(25, 100, None), 0.25);
        assert_eq!(kv_usage_fraction(100, 100, None), 1.0);
        assert_eq!(kv_usage_fraction(500, 100, None), 1.0);
        assert_eq!(kv_usage_fraction(0, 0, None), 0.0);
        assert_eq!(kv_usage_fraction(1, 0, None), 1.0);
    }

    #[test]
    fn pinned_kv_fraction_wins_and_is_clamped() {
        assert_eq!(kv_usage_fraction(0, 100, Some(0.95)), 0.95);
        assert_eq!(kv_usage_fraction(50, 100, Some(1.5)), 1.0);
    }

    #[test]
    fn generation_holds_prompt_and_generated_tokens_until_dropped() {
        let engine = ModelEngine::new("m".into(), 0, 0, 1000);
        let mut admit = pin!(engine.admit(10));
        let Poll::Ready(Ok(mut generation)) = poll_once(admit.as_mut()) else {
            panic!("unlimited admission must not wait");
        };
        generation.advance(1);
        generation.advance(2);
        assert_eq!(engine.snapshot().kv_tokens, 13);
        assert_eq!(engine.snapshot().running, 1);
        generation.finish();
        let after = engine.snapshot();
        assert_eq!((after.running, after.kv_tokens), (0, 0));
        assert_eq!((after.requests_total, after.cancelled_total), (1, 0));
    }

    #[test]
    fn prefix_lookup_counts_queried_and_cached_tokens() {
        let keys = [BlockKey(1), BlockKey(2), BlockKey(3)];
        let engine = ModelEngine::new("m".into(), 0, 0, 1000).with_prefix_cache(16, 8);
        assert_eq!(engine.prefix_cache_block_tokens(), Some(16));
        assert_eq!(engine.look_up_prefix(&keys, 50), 0);
        assert_eq!(engine.look_up_prefix(&keys, 50), 48);
        // Cached tokens never exceed the prompt.
        assert_eq!(engine.look_up_prefix(&keys, 40), 40);
        let counters = &engine.counters;
        assert_eq!(
            counters.prefix_cache_queries_total.load(Ordering::Relaxed),
            140
        );
        assert_eq!(counters.prefix_cache_hits_total.load(Ordering::Relaxed), 88);
    }

    #[test]
    fn prefix_lookup_without_a_cache_counts_nothing() {
        let engine = ModelEngine::new("m".into(), 0, 0, 1000).with_prefix_cache(16, 0);
        assert_eq!(engine.prefix_cache_block_tokens(), None);
        assert_eq!(engine.look_up_prefix(&[BlockKey(1)], 50), 0);
        assert_eq!(engine.look_up_prefix(&[BlockKey(1)], 50), 0);
        let counters = &engine.counters;
        assert_eq!(
            counters.prefix_cache_queries_total.load(Ordering::Relaxed),
            0
        );
        assert_eq!(counters.prefix_cache_hits_total.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn dropped_generation_counts_as_cancelled() {
        let engine = ModelEngine::new("m".into(), 1, 4, 1000);
        let mut admit = pin!(engine.admit(10));
        let Poll::Ready(Ok(generation)) = poll_once(admit.as_mut()) else {
            panic!("a free permit must admit at once");
        };
        drop(generation);
        let after = engine.snapshot();
        assert_eq!((after.running, after.cancelled_total), (0, 1));
    }

    #[test]
    fn queue_is_fifo_bounded_and_cancellable() {
        let engine = ModelEngine::new("m".into(), 1, 1, 1000);
        let mut first = pin!(engine.admit(1));
        let Poll::Ready(Ok(first_generation)) = poll_once(first.as_mut()) else {
            panic!("first request must be admitted");
        };
        let mut second = Box::pin(engine.admit(1));
        assert!(poll_once(second.as_mut()).is_pending());
        assert_eq!(engine.snapshot().waiting, 1);

        // The queue holds one request; the next is rejected, not queued.
        let mut third = pin!(engine.admit(1));
        assert!(matches!(
            poll_once(third.as_mut()),
            Poll::Ready(Err(SimError::QueueFull { waiting_max: 1 }))
        ));

        // Abandoning the queued request frees its place and counts a cancellation.
        drop(second);
        let after = engine.snapshot();
        assert_eq!((after.waiting, after.cancelled_total), (0, 1));

        // Once the running request ends, a newcomer gets the permit.
        first_generation.finish();
        let mut fourth = pin!(engine.admit(1));
        assert!(matches!(poll_once(fourth.as_mut()), Poll::Ready(Ok(_))));
    }

    #[test]
    fn waiters_are_admitted_in_arrival_order_whatever_the_poll_order() {
        let engine = ModelEngine::new("m".into(), 1, 8, 1000);
        let mut first = Box::pin(engine.admit(1));
        let Poll::Ready(Ok(first_generation)) = poll_once(first.as_mut()) else {
            panic!("first request must be admitted");
        };
        let mut second = Box::pin(engine.admit(1));
        let mut third = Box::pin(engine.admit(1));
        assert!(poll_once(second.as_mut()).is_pending());
        assert!(poll_once(third.as_mut()).is_pending());
        first_generation.finish();
        // The permit went to the earliest waiter, even though the later one is polled first.
        assert!(poll_once(third.as_mut()).is_pending());
        assert!(matches!(poll_once(second.as_mut()), Poll::Ready(Ok(_))));
    }

    /// One step of the accounting property test.
    #[derive(Debug, Clone)]
    enum Step {
        /// Start a request with this many prompt tokens.
        Admit(u64),
        /// Generate tokens on the request at this index (modulo the live ones).
        Advance(usize, u64),
        /// Complete the request at this index.
        Finish(usize),
        /// Abandon the request at this index (client gone).
        Abandon(usize),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0u64..50).prop_map(Step::Admit),
            (any::<usize>(), 0u64..5).prop_map(|(index, tokens)| Step::Advance(index, tokens)),
            any::<usize>().prop_map(Step::Finish),
            any::<usize>().prop_map(Step::Abandon),
        ]
    }

    proptest::proptest! {
        /// Whatever requests do, the gauges track the live requests exactly, the concurrency and
        /// queue limits hold, and once all are gone every gauge is back to zero and every accepted
        /// request is either finished or cancelled.
        #[test]
        fn accounting_returns_to_zero(steps in proptest::collection::vec(step(), 0..80)) {
            const CONCURRENCY_MAX: usize = 3;
            const WAITING_MAX: usize = 4;
            let engine = ModelEngine::new("m".into(), CONCURRENCY_MAX, WAITING_MAX, 100);
            // Arrival order; each with its prompt tokens.
            let mut queued = Vec::new();
            // Each with the KV tokens it should hold.
            let mut live: Vec<(Generation<'_>, u64)> = Vec::new();
            let mut finished = 0u64;
            for step in steps {
                match step {
                    Step::Admit(prompt_tokens) => {
                        queued.push((Box::pin(engine.admit(prompt_tokens)), prompt_tokens));
                    }
                    Step::Advance(index, tokens) if !live.is_empty() => {
                        let position = index % live.len();
                        let (generation, held) = &mut live[position];
                        generation.advance(tokens);
                        *held += tokens;
                    }
                    Step::Finish(index) if !live.is_empty() => {
                        let position = index % live.len();
                        live.remove(position).0.finish();
                        finished += 1;
                    }
                    Step::Abandon(index) if index % 2 == 0 && !queued.is_empty() => {
                        let position = index % queued.len();
                        drop(queued.remove(position));
                    }
                    Step::Abandon(index) if !live.is_empty() => {
                        let position = index % live.len();
                        drop(live.remove(position));
                    }
                    _ => {}
                }
                // Poll in arrival order, as the runtime would wake them.
                let mut still_queued = Vec::new();
                for (mut future, prompt_tokens) in queued.drain(..) {
                    match poll_once(future.as_mut()) {
                        Poll::Ready(Ok(generation)) => live.push((generation, prompt_tokens)),
                        Poll::Ready(Err(SimError::QueueFull { .. })) => {}
                        Poll::Ready(Err(error)) => panic!("unexpected refusal {error}"),
                        Poll::Pending => still_queued.push((future, prompt_tokens)),
                    }
                }
                queued = still_queued;
                let snapshot = engine.snapshot();
                proptest::prop_assert_eq!(snapshot.running, live.len() as u64);
                proptest::prop_assert_eq!(snapshot.waiting, queued.len() as u64);
                proptest::prop_assert_eq!(
                    snapshot.kv_tokens,
                    live.iter().map(|(_, held)| held).sum::<u64>()
                );
                proptest::prop_assert!(live.len() <= CONCURRENCY_MAX);
                proptest::prop_assert!(queued.len() <= WAITING_MAX);
            }
            drop(live);
            drop(queued);
            let after = engine.snapshot();
            proptest::prop_assert_eq!((after.running, after.waiting, after.kv_tokens), (0, 0, 0));
            proptest::prop_assert_eq!(after.requests_total, finished + after.cancelled_total);
        }
    }
}
