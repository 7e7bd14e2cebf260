//! Metric gates: `exclude_if` (per agent, gate 7 of a routing step) and `shed_if` (the healthy
//! pool's average, admission gate B3). Both are a list of rules `metric → one comparison`.
//!
//! Owns: the metric names and units of the policy reference ("Metric units", "Universal
//! metrics", "Engine metrics", "Hardware metrics"), the four operators, and the evaluation rule
//! "an agent (or pool) fails when it violates any rule; a missing signal passes".
//!
//! Must not: read signals itself or normalise units. The caller fills [`Signals`] in policy
//! units (fractions `0.0`–`1.0`, SRTT in milliseconds, TTFT and ITL in seconds, temperature in
//! degrees Celsius, counts as counts).
//!
//! Invariants of a compiled [`Gates`]: at most one rule per metric (so at most
//! [`Metric::ALL`]`.len()` rules), every threshold finite; `shed_if` holds only
//! `kv_cache_utilization` and `waiting_requests`.

use std::fmt;

/// The unit a metric is compared in (policy reference, "Metric units").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// `0.0`–`1.0` (capacity, success rate, utilisation; hardware percentages normalised).
    Fraction,
    Milliseconds,
    Seconds,
    Celsius,
    /// Requests, queue lengths, failures.
    Count,
}

/// Every metric a gate may name. Preemption and throughput are observable but not valid gate
/// fields (policy reference, "Engine metrics").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    // Universal: need runtime history.
    CapacityUtilization,
    SuccessRate,
    Srtt,
    ConsecutiveFailures,
    // Engine: reported by the inference backend.
    KvCacheUtilization,
    RunningRequests,
    WaitingRequests,
    AvgTtftSeconds,
    P90TtftSeconds,
    AvgItlSeconds,
    P90ItlSeconds,
    // Hardware: the agent's latest snapshot; GPU values are the highest across GPUs.
    GpuTemperatureC,
    GpuUtilPercent,
    GpuVramUsedPercent,
    MemoryUsedPercent,
    CpuUsagePercent,
}

impl Metric {
    pub const ALL: [Metric; 16] = [
        Metric::CapacityUtilization,
        Metric::SuccessRate,
        Metric::Srtt,
        Metric::ConsecutiveFailures,
        Metric::KvCacheUtilization,
        Metric::RunningRequests,
        Metric::WaitingRequests,
        Metric::AvgTtftSeconds,
        Metric::P90TtftSeconds,
        Metric::AvgItlSeconds,
        Metric::P90ItlSeconds,
        Metric::GpuTemperatureC,
        Metric::GpuUtilPercent,
        Metric::GpuVramUsedPercent,
        Metric::MemoryUsedPercent,
        Metric::CpuUsagePercent,
    ];

    /// The only metrics `shed_if` accepts (policy reference, "`shed_if`").
    pub const SHED_IF: [Metric; 2] = [Metric::KvCacheUtilization, Metric::WaitingRequests];

    /// The field name in policy YAML.
    pub fn name(self) -> &'static str {
        match self {
            Metric::CapacityUtilization => "capacity_utilization",
            Metric::SuccessRate => "success_rate",
            Metric::Srtt => "srtt",
            Metric::ConsecutiveFailures => "consecutive_failures",
            Metric::KvCacheUtilization => "kv_cache_utilization",
            Metric::RunningRequests => "running_requests",
            Metric::WaitingRequests => "waiting_requests",
            Metric::AvgTtftSeconds => "avg_ttft_seconds",
            Metric::P90TtftSeconds => "p90_ttft_seconds",
            Metric::AvgItlSeconds => "avg_itl_seconds",
            Metric::P90ItlSeconds => "p90_itl_seconds",
            Metric::GpuTemperatureC => "gpu_temperature_c",
            Metric::GpuUtilPercent => "gpu_util_percent",
            Metric::GpuVramUsedPercent => "gpu_vram_used_percent",
            Metric::MemoryUsedPercent => "memory_used_percent",
            Metric::CpuUsagePercent => "cpu_usage_percent",
        }
    }

    /// Exact, case-sensitive, like every policy name.
    pub fn parse(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|metric| metric.name() == name)
    }

    pub fn unit(self) -> Unit {
        match self {
            Metric::CapacityUtilization
            | Metric::SuccessRate
            | Metric::KvCacheUtilization
            | Metric::GpuUtilPercent
            | Metric::GpuVramUsedPercent
            | Metric::MemoryUsedPercent
            | Metric::CpuUsagePercent => Unit::Fraction,
            Metric::Srtt => Unit::Milliseconds,
            Metric::AvgTtftSeconds
            | Metric::P90TtftSeconds
            | Metric::AvgItlSeconds
            | Metric::P90ItlSeconds => Unit::Seconds,
            Metric::GpuTemperatureC => Unit::Celsius,
            Metric::ConsecutiveFailures | Metric::RunningRequests | Metric::WaitingRequests => {
                Unit::Count
            }
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One comparison operator. Each names when the rule is *violated* (the agent is excluded, or
/// the pool is shed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// value > threshold
    Gt,
    /// value >= threshold
    Gte,
    /// value < threshold
    Lt,
    /// value <= threshold
    Lte,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Gt, Op::Gte, Op::Lt, Op::Lte];

    pub fn name(self) -> &'static str {
        match self {
            Op::Gt => "gt",
            Op::Gte => "gte",
            Op::Lt => "lt",
            Op::Lte => "lte",
        }
    }

    /// Whether `value` violates a rule with this operator and `threshold`. A NaN value violates
    /// nothing (every comparison with NaN is false), so it behaves like a missing signal.
    pub fn violated(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Gt => value > threshold,
            Op::Gte => value >= threshold,
            Op::Lt => value < threshold,
            Op::Lte => value <= threshold,
        }
    }
}

/// One rule: `metric: {op: threshold}`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate {
    pub metric: Metric,
    pub op: Op,
    /// In the metric's [`Unit`]; finite.
    pub threshold: f64,
}

impl Gate {
    /// `Some(true)` when the signal is present and violates the rule, `Some(false)` when present
    /// and within it, `None` when missing (the rule is skipped).
    pub fn check(&self, signals: &Signals) -> Option<bool> {
        signals
            .get(self.metric)
            .map(|value| self.op.violated(value, self.threshold))
    }
}

/// The rules of one `exclude_if` or `shed_if`, in file order. Empty: nothing is ever excluded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gates {
    rules: Box<[Gate]>,
}

impl Gates {
    /// No rules.
    pub fn none() -> Gates {
        Gates::default()
    }

    /// Built by the compiler, which guarantees one rule per metric and finite thresholds.
    pub(crate) fn from_rules(rules: Vec<Gate>) -> Gates {
        debug_assert!(rules.iter().all(|rule| rule.threshold.is_finite()));
        Gates {
            rules: rules.into_boxed_slice(),
        }
    }

    pub fn rules(&self) -> &[Gate] {
        &self.rules
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether the signals violate any rule. A missing signal passes its rule (policy reference,
    /// "Missing metrics"). Allocates nothing.
    pub fn fails(&self, signals: &Signals) -> bool {
        self.first_violation(signals).is_some()
    }

    /// The first rule (in file order) the signals violate, for diagnostics such as
    /// `gate[7] exclude_if [kv_cache_utilization=2]`.
    pub fn first_violation(&self, signals: &Signals) -> Option<&Gate> {
        self.rules
            .iter()
            .find(|rule| rule.check(signals) == Some(true))
    }
}

/// Live values for one agent (for `exclude_if`) or the healthy pool's averages (for `shed_if`),
/// in policy units. `None`: not reported (yet), and every rule on it passes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// Active requests / declared capacity, `0.0`–`1.0`.
    pub capacity_utilization: Option<f64>,
    /// Lifetime successful forwards / completed forwards, `0.0`–`1.0`; `None` before any.
    pub success_rate: Option<f64>,
    /// Smoothed round-trip time, milliseconds.
    pub srtt: Option<f64>,
    /// Forward failures since the last success.
    pub consecutive_failures: Option<f64>,
    /// KV or token-cache fraction in use, `0.0`–`1.0`.
    pub kv_cache_utilization: Option<f64>,
    /// Requests the engine is processing.
    pub running_requests: Option<f64>,
    /// Requests waiting in the engine's scheduler.
    pub waiting_requests: Option<f64>,
    /// Seconds.
    pub avg_ttft_seconds: Option<f64>,
    /// Seconds.
    pub p90_ttft_seconds: Option<f64>,
    /// Seconds.
    pub avg_itl_seconds: Option<f64>,
    /// Seconds.
    pub p90_itl_seconds: Option<f64>,
    /// Highest across the host's GPUs, degrees Celsius.
    pub gpu_temperature_c: Option<f64>,
    /// Highest GPU compute utilisation, `0.0`–`1.0` (not `0`–`100`).
    pub gpu_util_percent: Option<f64>,
    /// Highest GPU VRAM-used fraction, `0.0`–`1.0`.
    pub gpu_vram_used_percent: Option<f64>,
    /// System memory-used fraction, `0.0`–`1.0`.
    pub memory_used_percent: Option<f64>,
    /// CPU utilisation fraction, `0.0`–`1.0`.
    pub cpu_usage_percent: Option<f64>,
}

impl Signals {
    pub fn get(&self, metric: Metric) -> Option<f64> {
        match metric {
            Metric::CapacityUtilization => self.capacity_utilization,
            Metric::SuccessRate => self.success_rate,
            Metric::Srtt => self.srtt,
            Metric::ConsecutiveFailures => self.consecutive_failures,
            Metric::KvCacheUtilization => self.kv_cache_utilization,
            Metric::RunningRequests => self.running_requests,
            Metric::WaitingRequests => self.waiting_requests,
            Metric::AvgTtftSeconds => self.avg_ttft_seconds,
            Metric::P90TtftSeconds => self.p90_ttft_seconds,
            Metric::AvgItlSeconds => self.avg_itl_seconds,
            Metric::P90ItlSeconds => self.p90_itl_seconds,
            Metric::GpuTemperatureC => self.gpu_temperature_c,
            Metric::GpuUtilPercent => self.gpu_util_percent,
            Metric::GpuVramUsedPercent => self.gpu_vram_used_percent,
            Metric::MemoryUsedPercent => self.memory_used_percent,
            Metric::CpuUsagePercent => self.cpu_usage_percent,
        }
    }

    pub fn set(&mut self, metric: Metric, value: Option<f64>) {
        let slot = match metric {
            Metric::CapacityUtilization => &mut self.capacity_utilization,
            Metric::SuccessRate => &mut self.success_rate,
            Metric::Srtt => &mut self.srtt,
            Metric::ConsecutiveFailures => &mut self.consecutive_failures,
            Metric::KvCacheUtilization => &mut self.kv_cache_utilization,
            Metric::RunningRequests => &mut self.running_requests,
            Metric::WaitingRequests => &mut self.waiting_requests,
            Metric::AvgTtftSeconds => &mut self.avg_ttft_seconds,
            Metric::P90TtftSeconds => &mut self.p90_ttft_seconds,
            Metric::AvgItlSeconds => &mut self.avg_itl_seconds,
            Metric::P90ItlSeconds => &mut self.p90_itl_seconds,
            Metric::GpuTemperatureC => &mut self.gpu_temperature_c,
            Metric::GpuUtilPercent => &mut self.gpu_util_percent,
            Metric::GpuVramUsedPercent => &mut self.gpu_vram_used_percent,
            Metric::MemoryUsedPercent => &mut self.memory_used_percent,
            Metric::CpuUsagePercent => &mut self.cpu_usage_percent,
        };
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(rules: &[(Metric, Op, f64)]) -> Gates {
        Gates::from_rules(
            rules
                .iter()
                .map(|&(metric, op, threshold)| Gate {
                    metric,
                    op,
                    threshold,
                })
                .collect(),
        )
    }

    #[test]
    fn names_round_trip_and_are_unique() {
        for metric in Metric::ALL {
            assert_eq!(Metric::parse(metric.name()), Some(metric));
        }
        assert_eq!(Metric::parse("sucess_rate"), None);
        assert_eq!(Metric::parse("Success_Rate"), None);
        let mut names: Vec<&str> = Metric::ALL.iter().map(|m| m.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Metric::ALL.len());
    }

    #[test]
    fn every_metric_reads_back_what_was_set() {
        let mut signals = Signals::default();
        for (index, metric) in Metric::ALL.into_iter().enumerate() {
            signals.set(metric, Some(index as f64));
        }
        for (index, metric) in Metric::ALL.into_iter().enumerate() {
            assert_eq!(signals.get(metric), Some(index as f64), "{metric}");
        }
    }

    #[test]
    fn operators_at_the_boundary() {
        assert!(Op::Gt.violated(0.91, 0.9));
        assert!(!Op::Gt.violated(0.9, 0.9));
        assert!(Op::Gte.violated(0.9, 0.9));
        assert!(!Op::Gte.violated(0.89, 0.9));
        assert!(Op::Lt.violated(0.94, 0.95));
        assert!(!Op::Lt.violated(0.95, 0.95));
        assert!(Op::Lte.violated(0.95, 0.95));
        assert!(!Op::Lte.violated(0.96, 0.95));
        for op in Op::ALL {
            assert!(!op.violated(f64::NAN, 1.0), "{op:?} with NaN");
        }
    }

    #[test]
    fn any_violation_fails_and_missing_signals_pass() {
        let rules = gates(&[
            (Metric::KvCacheUtilization, Op::Gt, 0.85),
            (Metric::SuccessRate, Op::Lt, 0.95),
        ]);
        // Nothing reported (a new Ollama agent): passes every rule.
        assert!(!rules.fails(&Signals::default()));
        let healthy = Signals {
            kv_cache_utilization: Some(0.5),
            success_rate: Some(0.99),
            ..Signals::default()
        };
        assert!(!rules.fails(&healthy));
        let hot = Signals {
            kv_cache_utilization: Some(0.9),
            ..healthy
        };
        assert!(rules.fails(&hot));
        assert_eq!(
            rules.first_violation(&hot).map(|gate| gate.metric),
            Some(Metric::KvCacheUtilization)
        );
        let flaky = Signals {
            success_rate: Some(0.5),
            kv_cache_utilization: None,
            ..healthy
        };
        assert!(rules.fails(&flaky));
        assert!(!Gates::none().fails(&hot));
    }
}
