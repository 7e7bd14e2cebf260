//! Per-agent lifetime counters the router observes (observability reference, "Per-agent
//! metrics"): requests answered with success or failure, the exact tokens they used, and the
//! smoothed request latency (SRTT/RTTVAR, latency-tracking reference). One [`AgentCounters`] per
//! (agent peer ID, model), shared by every shard that forwards to the agent and read by the
//! control core when `/metrics` is scraped.
//!
//! Counting costs no contention: each shard owns one cache-line-aligned [`ShardSlot`] and is its
//! only writer (relaxed atomic adds); a scrape sums the slots. The two exceptions are rare and
//! stated where they happen: the latency estimator is one word per agent updated with a
//! compare-and-swap (one update per request that reached the agent; RFC 6298 smoothing is a
//! sequence, so per-shard estimators would not add up), and [`AgentCounters::reset`]
//! (`POST /admin/metrics/reset`) stores zeros from the control core.
//!
//! Lifetime: the control core keeps one `AgentCounters` per (peer ID, model) for the life of the
//! process and hands the same one back when the agent registers again, so its totals continue
//! (reference, "Persistence and resets"); only a reset zeroes them. Memory: `shards` slots of 128
//! bytes per (agent, model) ever registered, until a reset forgets the ones not registered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::ids::ModelId;

/// One agent's counters, per model it serves, as the shards receive them with its profile.
/// Two sets are equal when they hold the same counters (the same `Arc`s), not equal counts.
#[derive(Debug, Clone, Default)]
pub struct CountersByModel(pub Box<[(ModelId, Arc<AgentCounters>)]>);

impl CountersByModel {
    /// The counters of `model` (at most a few models per agent: a linear search).
    pub fn of(&self, model: ModelId) -> Option<&AgentCounters> {
        self.0
            .iter()
            .find(|(served, _)| *served == model)
            .map(|(_, counters)| &**counters)
    }
}

impl PartialEq for CountersByModel {
    fn eq(&self, other: &CountersByModel) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(other.0.iter())
                .all(|(a, b)| a.0 == b.0 && Arc::ptr_eq(&a.1, &b.1))
    }
}

impl Eq for CountersByModel {}

/// One shard's part of an agent's counters; only that shard adds to it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardSlot {
    success: AtomicU64,
    failed: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    rejected: AtomicU64,
    /// Requests cut mid-request, by [`ResetReason`].
    resets: [AtomicU64; ResetReason::ALL.len()],
}

/// What broke under a request the agent had ([`AgentCounters::reset_under`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// The tunnel between router and agent, or the agent itself, was lost.
    Tunnel,
    /// The agent's connection to its engine broke (the agent reset the stream saying so).
    Engine,
}

impl ResetReason {
    pub const ALL: [ResetReason; 2] = [ResetReason::Tunnel, ResetReason::Engine];

    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::Tunnel => "tunnel",
            ResetReason::Engine => "engine",
        }
    }
}

/// The counters of one (agent, model): one slot per shard, the latency estimator, and the
/// control core's own counts (disconnections, heartbeat failures).
#[derive(Debug)]
pub struct AgentCounters {
    slots: Box<[ShardSlot]>,
    /// SRTT and RTTVAR in milliseconds as two `f32` bit patterns (high: SRTT, low: RTTVAR);
    /// [`LATENCY_UNKNOWN`] before the first sample.
    latency: AtomicU64,
    /// Sessions of this agent that ended while it served this model (control core only).
    disconnections: AtomicU64,
    /// Times the agent left the routing pool because its heartbeats stopped (control core only).
    failures: AtomicU64,
}

/// No latency sample yet (no `f32` pair the estimator produces has this pattern: both halves
/// are NaN).
const LATENCY_UNKNOWN: u64 = u64::MAX;

/// What a scrape reads of one (agent, model).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AgentTotals {
    pub success: u64,
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub disconnections: u64,
    pub failures: u64,
    /// Attempts the agent or its engine refused for capacity or readiness (429, 503).
    pub rejected: u64,
    /// Requests cut mid-request, per [`ResetReason::ALL`].
    pub resets: [u64; ResetReason::ALL.len()],
    /// `(srtt_ms, rttvar_ms)`; `None` before the first latency sample.
    pub latency_ms: Option<(f64, f64)>,
}

impl AgentTotals {
    /// Successes over finished requests, `0.0..=1.0`; `None` before any request finished (the
    /// reference: a new agent has no meaningful success rate).
    pub fn success_rate(&self) -> Option<f64> {
        let finished = self.success + self.failed;
        (finished > 0).then(|| self.success as f64 / finished as f64)
    }
}

impl AgentCounters {
    /// Counters for a router of `shards` shards (at least 1).
    pub fn new(shards: usize) -> AgentCounters {
        AgentCounters {
            slots: (0..shards.max(1)).map(|_| ShardSlot::default()).collect(),
            latency: AtomicU64::new(LATENCY_UNKNOWN),
            disconnections: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    fn slot(&self, shard: usize) -> &ShardSlot {
        &self.slots[shard % self.slots.len()]
    }

    /// A request served by this agent finished on `shard` with `status` (2xx: success; anything
    /// else, or no answer, a failure).
    pub fn finished(&self, shard: usize, status: u16) {
        let slot = self.slot(shard);
        let counter = if (200..300).contains(&status) {
            &slot.success
        } else {
            &slot.failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The agent or its engine refused an attempt for capacity or readiness: the answer's status
    /// was 429 (rate-limited, overloaded) or 503 (unavailable: an engine not ready, or one the
    /// agent cannot reach). The attempt also counts as failed.
    pub fn rejected(&self, shard: usize) {
        self.slot(shard).rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// A request the agent had was cut because `reason` broke, before its answer ended.
    pub fn reset_under(&self, shard: usize, reason: ResetReason) {
        self.slot(shard).resets[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Exact tokens a request served by this agent used, counted on `shard`.
    pub fn tokens(&self, shard: usize, input: u64, output: u64) {
        let slot = self.slot(shard);
        slot.input_tokens.fetch_add(input, Ordering::Relaxed);
        slot.output_tokens.fetch_add(output, Ordering::Relaxed);
    }

    /// One latency sample (request sent to response headers), in milliseconds. Samples that are
    /// not positive and finite are ignored (the reference: no sample for work that never reached
    /// the agent).
    pub fn latency_sample(&self, sample_ms: f64) {
        if !(sample_ms.is_finite() && sample_ms > 0.0) {
            return;
        }
        let _ = self
            .latency
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |packed| {
                let previous = unpack(packed);
                Some(pack(smooth(previous, sample_ms)))
            });
    }

    /// The agent's session ended (control core).
    pub fn disconnected(&self) {
        self.disconnections.fetch_add(1, Ordering::Relaxed);
    }

    /// The agent left the pool because its heartbeats stopped (control core).
    pub fn heartbeat_failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `totals` (kept from an earlier run of the router: the disk database) to these
    /// counters, in the first shard's slot; the latency becomes `totals`' when none was sampled
    /// yet. Control core, at start-up.
    pub fn add_totals(&self, totals: &AgentTotals) {
        let slot = self.slot(0);
        for (counter, value) in [
            (&slot.success, totals.success),
            (&slot.failed, totals.failed),
            (&slot.input_tokens, totals.input_tokens),
            (&slot.output_tokens, totals.output_tokens),
            (&slot.rejected, totals.rejected),
            (&self.disconnections, totals.disconnections),
            (&self.failures, totals.failures),
        ]
        .into_iter()
        .chain(slot.resets.iter().zip(totals.resets))
        {
            counter.fetch_add(value, Ordering::Relaxed);
        }
        if let Some(latency) = totals.latency_ms {
            let _ = self.latency.compare_exchange(
                LATENCY_UNKNOWN,
                pack(latency),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// The sums over every shard.
    /// The smoothed latency in milliseconds; `None` before the first sample (`lowest-srtt`:
    /// one relaxed load).
    pub fn srtt_ms(&self) -> Option<f64> {
        unpack(self.latency.load(Ordering::Relaxed)).map(|(srtt, _)| srtt)
    }

    pub fn totals(&self) -> AgentTotals {
        let mut totals = AgentTotals {
            disconnections: self.disconnections.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            latency_ms: unpack(self.latency.load(Ordering::Relaxed)),
            ..AgentTotals::default()
        };
        for slot in &self.slots {
            totals.success += slot.success.load(Ordering::Relaxed);
            totals.failed += slot.failed.load(Ordering::Relaxed);
            totals.input_tokens += slot.input_tokens.load(Ordering::Relaxed);
            totals.output_tokens += slot.output_tokens.load(Ordering::Relaxed);
            totals.rejected += slot.rejected.load(Ordering::Relaxed);
            for (sum, count) in totals.resets.iter_mut().zip(&slot.resets) {
                *sum += count.load(Ordering::Relaxed);
            }
        }
        totals
    }

    /// `POST /admin/metrics/reset`: every count back to zero and the latency unknown. Written
    /// from the control core; an add racing with it on a shard lands either before (and is
    /// cleared) or after (and is kept), never torn.
    pub fn reset(&self) {
        for slot in &self.slots {
            for counter in [
                &slot.success,
                &slot.failed,
                &slot.input_tokens,
                &slot.output_tokens,
                &slot.rejected,
            ]
            .into_iter()
            .chain(&slot.resets)
            {
                counter.store(0, Ordering::Relaxed);
            }
        }
        self.latency.store(LATENCY_UNKNOWN, Ordering::Relaxed);
        self.disconnections.store(0, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
    }
}

/// The latency-tracking reference's estimator: the first sample `R` gives `SRTT = R`,
/// `RTTVAR = R / 2`; later ones update RTTVAR first (`0.75 RTTVAR + 0.25 |SRTT - R|`), then SRTT
/// with weight 1/2 for a faster sample and 1/8 for an equal or slower one.
pub fn smooth(previous: Option<(f64, f64)>, sample_ms: f64) -> (f64, f64) {
    match previous {
        None => (sample_ms, sample_ms / 2.0),
        Some((srtt, rttvar)) => {
            let rttvar = 0.75 * rttvar + 0.25 * (srtt - sample_ms).abs();
            let weight = if sample_ms < srtt { 0.5 } else { 0.125 };
            (srtt + weight * (sample_ms - srtt), rttvar)
        }
    }
}

fn pack((srtt, rttvar): (f64, f64)) -> u64 {
    (u64::from((srtt as f32).to_bits()) << 32) | u64::from((rttvar as f32).to_bits())
}

fn unpack(packed: u64) -> Option<(f64, f64)> {
    (packed != LATENCY_UNKNOWN).then(|| {
        (
            f64::from(f32::from_bits((packed >> 32) as u32)),
            f64::from(f32::from_bits(packed as u32)),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_count_apart_and_a_scrape_sums_them() {
        let counters = AgentCounters::new(3);
        counters.finished(0, 200);
        counters.finished(2, 201);
        counters.finished(1, 502);
        counters.finished(1, 0);
        counters.tokens(0, 10, 20);
        counters.tokens(2, 1, 2);
        counters.rejected(1);
        counters.rejected(2);
        counters.reset_under(0, ResetReason::Engine);
        counters.reset_under(2, ResetReason::Tunnel);
        counters.reset_under(1, ResetReason::Tunnel);
        let totals = counters.totals();
        assert_eq!((totals.success, totals.failed), (2, 2));
        assert_eq!(totals.rejected, 2);
        assert_eq!(totals.resets, [2, 1]);
        assert_eq!((totals.input_tokens, totals.output_tokens), (11, 22));
        assert_eq!(totals.success_rate(), Some(0.5));
        assert_eq!(totals.latency_ms, None);
    }

    /// Totals kept from an earlier run add to what this run counted; a latency sampled in this
    /// run stays.
    #[test]
    fn kept_totals_add_to_the_counts() {
        let kept = AgentTotals {
            success: 5,
            failed: 1,
            input_tokens: 50,
            output_tokens: 20,
            disconnections: 2,
            failures: 1,
            rejected: 1,
            resets: [1, 2],
            latency_ms: Some((40.0, 10.0)),
        };
        let fresh = AgentCounters::new(2);
        fresh.add_totals(&kept);
        assert_eq!(fresh.totals(), kept);
        let counting = AgentCounters::new(2);
        counting.finished(1, 200);
        counting.latency_sample(100.0);
        counting.add_totals(&kept);
        let totals = counting.totals();
        assert_eq!(totals.success, 6);
        assert_eq!(totals.latency_ms, Some((100.0, 50.0)));
    }

    #[test]
    fn no_request_no_success_rate() {
        assert_eq!(AgentCounters::new(1).totals().success_rate(), None);
    }

    #[test]
    fn slots_do_not_share_a_cache_line() {
        assert!(std::mem::align_of::<ShardSlot>() >= 128);
        assert_eq!(std::mem::size_of::<ShardSlot>() % 128, 0);
    }

    /// The latency-tracking reference's worked example.
    #[test]
    fn estimator_follows_the_reference_example() {
        assert_eq!(smooth(None, 200.0), (200.0, 100.0));
        let (srtt, rttvar) = smooth(Some((200.0, 50.0)), 5000.0);
        assert_eq!((srtt, rttvar), (800.0, 1237.5));
        let mut srtt_after = Vec::new();
        let mut state = (srtt, rttvar);
        for _ in 0..5 {
            state = smooth(Some(state), 200.0);
            srtt_after.push(state.0);
        }
        assert_eq!(srtt_after, [500.0, 350.0, 275.0, 237.5, 218.75]);
    }

    #[test]
    fn latency_samples_pack_and_reset_clears_everything() {
        let counters = AgentCounters::new(2);
        counters.latency_sample(0.0);
        counters.latency_sample(f64::NAN);
        assert_eq!(counters.totals().latency_ms, None);
        counters.latency_sample(200.0);
        counters.latency_sample(100.0);
        assert_eq!(counters.totals().latency_ms, Some((150.0, 100.0)));
        counters.finished(1, 200);
        counters.rejected(0);
        counters.reset_under(1, ResetReason::Engine);
        counters.disconnected();
        counters.heartbeat_failed();
        counters.reset();
        assert_eq!(counters.totals(), AgentTotals::default());
    }
}
