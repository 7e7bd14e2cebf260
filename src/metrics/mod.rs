//! Per-shard counters and their Prometheus text exposition.
//!
//! Each shard owns one [`ShardMetrics`] and is its only writer (relaxed atomic adds on a cache line
//! no other core writes), so counting costs no contention; the control core reads them when
//! `/metrics` is scraped and labels every series with `shard`.

pub mod family;

pub use family::{Collect, Family, encode};

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// HTTP statuses the router answers with, for the `code` label; anything else is counted as other.
const STATUS_CODES: [u16; 17] = [
    200, 307, 400, 401, 403, 404, 405, 408, 413, 429, 431, 499, 500, 502, 503, 504, 505,
];

#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardMetrics {
    pub connections_accepted_total: AtomicU64,
    pub connections_open: AtomicI64,
    pub requests_total: AtomicU64,
    responses_by_status: [AtomicU64; STATUS_CODES.len()],
    responses_other_total: AtomicU64,
    pub upstream_errors_total: AtomicU64,
    pub client_disconnects_total: AtomicU64,
    pub queued_total: AtomicU64,
    pub queue_timeouts_total: AtomicU64,
    pub input_tokens_total: AtomicU64,
    pub output_tokens_total: AtomicU64,
    pub usage_missing_total: AtomicU64,
    pub mesh_full_total: AtomicU64,
    /// Messages to other shards waiting for room in a full ring (`shard::outbox`).
    pub mesh_deferred: AtomicI64,
    /// Messages to other shards dropped because the deferred queue was at its bound.
    pub mesh_dropped_total: AtomicU64,
    pub tunnels_open: AtomicI64,
    /// Requests forwarded and not yet finished on this shard.
    pub in_flight: AtomicI64,
    /// Requests being served on this shard, from their head to their last byte (queued, held
    /// and forwarded alike): what a graceful shutdown waits for.
    pub requests_open: AtomicI64,
    /// Requests that did not fit B2 at once and parked (counted on the model's owner).
    pub admission_parked_total: AtomicU64,
    /// Occupancy reservations the reaper released because their release was lost.
    pub admission_reaped_total: AtomicU64,
    /// Forwards that failed retryably and were tried again (another agent or step).
    pub forward_retries_total: AtomicU64,
    /// Hold at zero: how holds ended and how long they lasted (counted on the requester).
    pub holds: crate::hold::HoldMetrics,
}

impl ShardMetrics {
    pub fn count_response(&self, status: u16) {
        match STATUS_CODES.iter().position(|code| *code == status) {
            Some(index) => self.responses_by_status[index].fetch_add(1, Ordering::Relaxed),
            None => self.responses_other_total.fetch_add(1, Ordering::Relaxed),
        };
    }

    pub fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    pub fn gauge(gauge: &AtomicI64, delta: i64) {
        gauge.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicI64, value: i64) {
        gauge.store(value, Ordering::Relaxed);
    }
}

/// The `# HELP` and `# TYPE` lines of one metric family.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders every shard's series.
pub fn render_shards(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    type Getter = fn(&ShardMetrics) -> i128;
    let simple: [(&str, &str, &str, Getter); 18] = [
        (
            "hivenet_shard_connections_accepted_total",
            "counter",
            "Client connections accepted by the shard.",
            |m| m.connections_accepted_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_connections_open",
            "gauge",
            "Client connections open on the shard.",
            |m| m.connections_open.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_requests_total",
            "counter",
            "Client requests parsed by the shard.",
            |m| m.requests_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_upstream_errors_total",
            "counter",
            "Forwards that failed on the tunnel or at the agent.",
            |m| m.upstream_errors_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_client_disconnects_total",
            "counter",
            "Requests whose client went away before the response ended.",
            |m| m.client_disconnects_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_queued_total",
            "counter",
            "Requests that waited in a model capacity queue (counted on the model's owner shard).",
            |m| m.queued_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_queue_timeouts_total",
            "counter",
            "Requests whose capacity wait reached the request timeout.",
            |m| m.queue_timeouts_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_input_tokens_total",
            "counter",
            "Exact input tokens read from responses.",
            |m| m.input_tokens_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_output_tokens_total",
            "counter",
            "Exact output tokens read from responses.",
            |m| m.output_tokens_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_usage_missing_total",
            "counter",
            "Successful responses that carried no usage.",
            |m| m.usage_missing_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_mesh_full_total",
            "counter",
            "Messages refused because a mesh ring was full.",
            |m| m.mesh_full_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_mesh_deferred",
            "gauge",
            "Messages to other shards waiting for room in a full mesh ring.",
            |m| m.mesh_deferred.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_mesh_dropped_total",
            "counter",
            "Messages to other shards dropped because the deferred queue was at its bound.",
            |m| m.mesh_dropped_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_tunnels_open",
            "gauge",
            "Tunnel connections from agents held by the shard.",
            |m| m.tunnels_open.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_in_flight",
            "gauge",
            "Requests forwarded by the shard and not yet finished.",
            |m| m.in_flight.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_admission_parked_total",
            "counter",
            "Requests that waited for room in a model's occupancy budget (B2).",
            |m| m.admission_parked_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_admission_reaped_total",
            "counter",
            "Occupancy reservations released by the reaper because their release was lost.",
            |m| m.admission_reaped_total.load(Ordering::Relaxed) as i128,
        ),
        (
            "hivenet_shard_forward_retries_total",
            "counter",
            "Forwards that failed before answering and were tried again on another agent or step.",
            |m| m.forward_retries_total.load(Ordering::Relaxed) as i128,
        ),
    ];
    for (name, kind, help, get) in simple {
        family(out, name, kind, help);
        for (shard, metrics) in shards.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", get(metrics));
        }
    }
    let name = "hivenet_shard_responses_total";
    family(out, name, "counter", "Responses by HTTP status.");
    for (shard, metrics) in shards.iter().enumerate() {
        for (index, code) in STATUS_CODES.iter().enumerate() {
            let value = metrics.responses_by_status[index].load(Ordering::Relaxed);
            if value > 0 {
                let _ = writeln!(out, "{name}{{shard=\"{shard}\",code=\"{code}\"}} {value}");
            }
        }
        let other = metrics.responses_other_total.load(Ordering::Relaxed);
        if other > 0 {
            let _ = writeln!(out, "{name}{{shard=\"{shard}\",code=\"other\"}} {other}");
        }
    }
}

/// `hivenet_wake_holds_total{outcome}` and the `hivenet_wake_hold_seconds` histogram, summed
/// over the shards (a hold is one router's, whichever shard held it).
pub fn render_holds(out: &mut String, shards: &[std::sync::Arc<ShardMetrics>]) {
    use crate::hold::{HOLD_SECONDS_BUCKETS, HoldEnded};
    let name = "hivenet_wake_holds_total";
    family(
        out,
        name,
        "counter",
        "Hold-at-zero requests by how their hold ended (released, expired, full, cancelled).",
    );
    for outcome in HoldEnded::ALL {
        let total: u64 = shards
            .iter()
            .map(|metrics| metrics.holds.outcome(outcome))
            .sum();
        let _ = writeln!(out, "{name}{{outcome=\"{}\"}} {total}", outcome.as_str());
    }
    let name = "hivenet_wake_hold_seconds";
    family(
        out,
        name,
        "histogram",
        "How long requests were held for a model waking from zero.",
    );
    let mut buckets = [0u64; HOLD_SECONDS_BUCKETS.len() + 1];
    let mut sum = 0.0;
    for metrics in shards {
        let (counts, seconds) = metrics.holds.durations();
        for (total, count) in buckets.iter_mut().zip(counts) {
            *total += count;
        }
        sum += seconds;
    }
    let mut cumulative = 0;
    for (bound, count) in HOLD_SECONDS_BUCKETS.iter().zip(buckets) {
        cumulative += count;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    cumulative += buckets[HOLD_SECONDS_BUCKETS.len()];
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {cumulative}");
}

/// Escapes a Prometheus label value.
pub fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn renders_shard_label() {
        let metrics = Arc::new(ShardMetrics::default());
        metrics.count_response(200);
        metrics.count_response(418);
        let mut out = String::new();
        render_shards(
            &mut out,
            &[metrics.clone(), Arc::new(ShardMetrics::default())],
        );
        assert!(out.contains("hivenet_shard_responses_total{shard=\"0\",code=\"200\"} 1"));
        assert!(out.contains("hivenet_shard_responses_total{shard=\"0\",code=\"other\"} 1"));
        assert!(out.contains("hivenet_shard_requests_total{shard=\"1\"} 0"));
        assert_eq!(label("a\"b"), "a\\\"b");
    }
}
