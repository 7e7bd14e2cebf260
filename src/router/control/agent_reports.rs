//! Bounds on what agents report about their host and engine (`Heartbeat.host`,
//! `RoutingSignal.engine`) before the registry keeps it: every list has a cap, every label value
//! a length, and non-finite numbers are dropped (absent, not zero). Pure: message in, message
//! out.

use crate::wire::proto::{EngineHistogram, EngineReport, GpuStats, HostStats};

/// GPUs kept from one heartbeat (an 8-GPU host is common; 64 covers any one machine).
pub const GPUS_MAX: usize = 64;
/// Finish reasons kept from one signal (vLLM reports about five).
pub const FINISH_REASONS_MAX: usize = 16;
/// Buckets kept per histogram (vLLM's longest bucket list has about 30).
pub const BUCKETS_MAX: usize = 64;
/// Longest label value kept (a GPU UUID is 40 bytes; a finish reason a word).
const LABEL_BYTES_MAX: usize = 128;

/// The raw engine histograms the router re-exports, by the name the agent sends.
pub const HISTOGRAM_NAMES: [&str; 4] = [
    "ttft_seconds",
    "itl_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
];

fn finite(value: Option<f64>) -> Option<f64> {
    value.filter(|value| value.is_finite())
}

fn short_label(value: &str) -> bool {
    !value.is_empty() && value.len() <= LABEL_BYTES_MAX
}

/// `hivenet_agent_engine_request_success_total{finished_reason}` of one agent session: the
/// router's counter of the changes between the engine's cumulative counts (engine-metrics
/// reference, "Finish reasons"). The first count of a reason is the baseline (earlier lifetime is
/// not imported); a count that falls (the engine restarted) is all new activity. At most
/// [`FINISH_REASONS_MAX`] reasons.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinishTally {
    /// Reason → (the engine's last cumulative count, what the router has counted).
    reasons: std::collections::BTreeMap<String, (f64, f64)>,
}

impl FinishTally {
    /// Counts the changes since the last report.
    pub fn observe(&mut self, finished: &[crate::wire::proto::FinishReason]) {
        for reason in finished {
            let known = self.reasons.len();
            match self.reasons.get_mut(&reason.reason) {
                Some((last, counted)) => {
                    *counted += if reason.count >= *last {
                        reason.count - *last
                    } else {
                        reason.count
                    };
                    *last = reason.count;
                }
                None if known < FINISH_REASONS_MAX => {
                    self.reasons
                        .insert(reason.reason.clone(), (reason.count, 0.0));
                }
                None => {}
            }
        }
    }

    /// (reason, counted) in reason order.
    pub fn counts(&self) -> impl Iterator<Item = (&str, f64)> {
        self.reasons
            .iter()
            .map(|(reason, (_, counted))| (reason.as_str(), *counted))
    }

    pub fn is_empty(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// `host` with its GPU list capped, over-long GPU UUIDs and non-finite values dropped.
pub fn bound_host(host: HostStats) -> HostStats {
    HostStats {
        cpu_usage_percent: finite(host.cpu_usage_percent),
        memory_used_percent: finite(host.memory_used_percent),
        memory_available_bytes: host.memory_available_bytes,
        memory_total_bytes: host.memory_total_bytes,
        gpus: host
            .gpus
            .into_iter()
            .filter(|gpu| gpu.uuid.len() <= LABEL_BYTES_MAX)
            .take(GPUS_MAX)
            .map(|gpu| GpuStats {
                utilization_percent: finite(gpu.utilization_percent),
                temperature_celsius: finite(gpu.temperature_celsius),
                power_watts: finite(gpu.power_watts),
                ..gpu
            })
            .collect(),
    }
}

/// `report` with its lists capped, unknown histograms and malformed entries dropped.
pub fn bound_engine(report: EngineReport) -> EngineReport {
    EngineReport {
        preemptions_total: finite(report.preemptions_total),
        avg_ttft_seconds: finite(report.avg_ttft_seconds),
        p90_ttft_seconds: finite(report.p90_ttft_seconds),
        avg_itl_seconds: finite(report.avg_itl_seconds),
        p90_itl_seconds: finite(report.p90_itl_seconds),
        predicted_tps: finite(report.predicted_tps),
        prompt_tps: finite(report.prompt_tps),
        prefix_cache_queries_total: finite(report.prefix_cache_queries_total),
        prefix_cache_hits_total: finite(report.prefix_cache_hits_total),
        // A rate: outside 0..=1 it is not one.
        prefix_cache_hit_rate: finite(report.prefix_cache_hit_rate)
            .filter(|rate| (0.0..=1.0).contains(rate)),
        finished: report
            .finished
            .into_iter()
            .filter(|reason| short_label(&reason.reason) && reason.count.is_finite())
            .take(FINISH_REASONS_MAX)
            .collect(),
        histograms: report
            .histograms
            .into_iter()
            .filter(|histogram| HISTOGRAM_NAMES.contains(&histogram.name.as_str()))
            .filter_map(bound_histogram)
            .take(HISTOGRAM_NAMES.len())
            .collect(),
    }
}

/// A histogram whose bucket bounds ascend and counts never fall, capped at [`BUCKETS_MAX`];
/// `None` when it is not one (a malformed scrape is dropped whole, not half-shown).
fn bound_histogram(histogram: EngineHistogram) -> Option<EngineHistogram> {
    if histogram.buckets.is_empty()
        || histogram.buckets.len() > BUCKETS_MAX
        || !histogram.sum.is_finite()
    {
        return None;
    }
    let ordered = histogram
        .buckets
        .windows(2)
        .all(|pair| pair[0].le < pair[1].le && pair[0].count <= pair[1].count);
    (ordered && !histogram.buckets.iter().any(|bucket| bucket.le.is_nan())).then_some(histogram)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::proto::{FinishReason, HistogramBucket};

    fn bucket(le: f64, count: u64) -> HistogramBucket {
        HistogramBucket { le, count }
    }

    #[test]
    fn non_finite_values_become_absent_and_lists_are_capped() {
        let host = bound_host(HostStats {
            cpu_usage_percent: Some(f64::NAN),
            memory_used_percent: Some(12.5),
            gpus: (0..100)
                .map(|index| GpuStats {
                    index,
                    power_watts: Some(f64::INFINITY),
                    ..GpuStats::default()
                })
                .collect(),
            ..HostStats::default()
        });
        assert_eq!(host.cpu_usage_percent, None);
        assert_eq!(host.memory_used_percent, Some(12.5));
        assert_eq!(host.gpus.len(), GPUS_MAX);
        assert_eq!(host.gpus[0].power_watts, None);
    }

    #[test]
    fn finish_reasons_count_changes_after_a_baseline() {
        let reasons = |stop: f64, length: f64| {
            vec![
                FinishReason {
                    reason: "stop".into(),
                    count: stop,
                },
                FinishReason {
                    reason: "length".into(),
                    count: length,
                },
            ]
        };
        let mut tally = FinishTally::default();
        tally.observe(&reasons(100.0, 5.0));
        assert_eq!(
            tally.counts().collect::<Vec<_>>(),
            [("length", 0.0), ("stop", 0.0)]
        );
        tally.observe(&reasons(103.0, 5.0));
        // The engine restarted: its new count is all new activity.
        tally.observe(&reasons(2.0, 6.0));
        assert_eq!(
            tally.counts().collect::<Vec<_>>(),
            [("length", 1.0), ("stop", 5.0)]
        );
    }

    #[test]
    fn histograms_must_be_known_and_cumulative() {
        let good = EngineHistogram {
            name: "ttft_seconds".into(),
            buckets: vec![bucket(0.1, 1), bucket(f64::INFINITY, 3)],
            sum: 0.5,
            count: 3,
        };
        let falling = EngineHistogram {
            name: "itl_seconds".into(),
            buckets: vec![bucket(0.1, 4), bucket(f64::INFINITY, 3)],
            ..good.clone()
        };
        let unknown = EngineHistogram {
            name: "queue_seconds".into(),
            ..good.clone()
        };
        let report = bound_engine(EngineReport {
            histograms: vec![good.clone(), falling, unknown],
            finished: vec![
                FinishReason {
                    reason: "stop".into(),
                    count: 2.0,
                },
                FinishReason {
                    reason: String::new(),
                    count: 1.0,
                },
            ],
            ..EngineReport::default()
        });
        assert_eq!(report.histograms, vec![good]);
        assert_eq!(report.finished.len(), 1);
        // A hit rate is a fraction: anything else is dropped, not shown.
        for (rate, kept) in [
            (0.5, Some(0.5)),
            (1.5, None),
            (-0.1, None),
            (f64::NAN, None),
        ] {
            let report = bound_engine(EngineReport {
                prefix_cache_hit_rate: Some(rate),
                ..EngineReport::default()
            });
            assert_eq!(report.prefix_cache_hit_rate, kept, "{rate}");
        }
    }
}
