//! The agent host's CPU and memory, read from `/proc` (observability reference, "CPU and memory
//! metrics"), for the router's `hivenet_agent_cpu_usage_percent` and `hivenet_agent_memory_*`.
//! The parsers are pure (text in, numbers out); [`run`] samples every [`HOST_SAMPLE_INTERVAL`]
//! and publishes the latest [`HostStats`] for the heartbeats, with the GPUs `agent::gpu` reads.
//!
//! What cannot be read is absent, never zero: a host without `/proc` (or a kernel without
//! `MemAvailable`) sends no such field, and the router prints no such series. CPU usage needs two
//! samples, so the first heartbeats after start carry none.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::wire::proto::HostStats;

/// How often the host is sampled; CPU usage is the busy share over this window.
pub const HOST_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// Cumulative CPU time of every CPU, in clock ticks (the first line of `/proc/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks spent on anything but idle and I/O wait.
    pub busy: u64,
    pub total: u64,
}

/// Parses the aggregate `cpu` line of `/proc/stat` (`cpu user nice system idle iowait irq
/// softirq steal guest guest_nice`). Guest time is already inside user and nice, so it is not
/// added again. `None` when the line is missing or has fewer than four numbers.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_ascii_whitespace()
        .skip(1)
        .map_while(|field| field.parse().ok())
        .take(8)
        .collect();
    if fields.len() < 4 {
        return None;
    }
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    let total: u64 = fields.iter().sum();
    Some(CpuTimes {
        busy: total - idle,
        total,
    })
}

/// The busy share of the CPUs between two samples, 0 to 100; `None` when no time passed (or the
/// counters went back, after a CPU went offline).
pub fn cpu_usage_percent(earlier: CpuTimes, later: CpuTimes) -> Option<f64> {
    let total = later.total.checked_sub(earlier.total)?;
    let busy = later.busy.checked_sub(earlier.busy)?;
    (total > 0).then(|| (busy as f64 / total as f64 * 100.0).clamp(0.0, 100.0))
}

/// System memory from `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub total_bytes: u64,
    /// `MemAvailable`: what can be given to new work without swapping.
    pub available_bytes: u64,
}

impl Memory {
    /// `(total - available) / total`, 0 to 100.
    pub fn used_percent(&self) -> Option<f64> {
        (self.total_bytes > 0).then(|| {
            let used = self.total_bytes.saturating_sub(self.available_bytes);
            used as f64 / self.total_bytes as f64 * 100.0
        })
    }
}

/// Parses `MemTotal` and `MemAvailable` (kB) from `/proc/meminfo`; `None` without both.
pub fn parse_meminfo(text: &str) -> Option<Memory> {
    let kilobytes = |key: &str| -> Option<u64> {
        let line = text.lines().find(|line| line.starts_with(key))?;
        let value = line[key.len()..]
            .trim_start_matches(':')
            .split_ascii_whitespace();
        value
            .into_iter()
            .next()?
            .parse::<u64>()
            .ok()?
            .checked_mul(1024)
    };
    Some(Memory {
        total_bytes: kilobytes("MemTotal:")?,
        available_bytes: kilobytes("MemAvailable:")?,
    })
}

/// Reads the host once; `previous_cpu` is the last sample's CPU times, replaced by this one's.
fn sample(previous_cpu: &mut Option<CpuTimes>, gpus: &mut crate::agent::gpu::Gpus) -> HostStats {
    let cpu = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| parse_proc_stat(&text));
    let cpu_usage_percent = match (*previous_cpu, cpu) {
        (Some(earlier), Some(later)) => cpu_usage_percent(earlier, later),
        _ => None,
    };
    *previous_cpu = cpu;
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_meminfo(&text));
    HostStats {
        cpu_usage_percent,
        memory_used_percent: memory.and_then(|memory| memory.used_percent()),
        memory_available_bytes: memory.map(|memory| memory.available_bytes),
        memory_total_bytes: memory.map(|memory| memory.total_bytes),
        gpus: gpus.sample(),
    }
}

/// Samples the host every [`HOST_SAMPLE_INTERVAL`] until the receivers are gone. Reading `/proc`
/// and NVML blocks for microseconds to milliseconds, so each sample runs on the blocking pool.
pub async fn run(to_heartbeats: watch::Sender<Option<HostStats>>) {
    let mut state = Some((None, crate::agent::gpu::Gpus::open()));
    let mut tick = tokio::time::interval(HOST_SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some((mut previous_cpu, mut gpus)) = state.take() else {
            return;
        };
        let sampled = tokio::task::spawn_blocking(move || {
            let stats = sample(&mut previous_cpu, &mut gpus);
            (stats, previous_cpu, gpus)
        })
        .await;
        let Ok((stats, previous_cpu, gpus)) = sampled else {
            return;
        };
        if to_heartbeats.send(Some(stats)).is_err() {
            return;
        }
        state = Some((previous_cpu, gpus));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  4705 150 1120 16250 520 0 45 10 30 0\ncpu0 2350 75 560 8125 260 0 22 5 15 0\nintr 1 2 3\n";

    #[test]
    fn proc_stat_counts_idle_and_iowait_as_idle() {
        let times = parse_proc_stat(STAT).expect("parses");
        // user nice system idle iowait irq softirq steal; guest is inside user.
        assert_eq!(times.total, 4705 + 150 + 1120 + 16250 + 520 + 45 + 10);
        assert_eq!(times.busy, 4705 + 150 + 1120 + 45 + 10);
    }

    #[test]
    fn proc_stat_without_the_aggregate_line() {
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None);
        assert_eq!(parse_proc_stat(""), None);
    }

    #[test]
    fn cpu_usage_is_the_busy_share_between_samples() {
        let earlier = CpuTimes {
            busy: 100,
            total: 1000,
        };
        let later = CpuTimes {
            busy: 175,
            total: 1100,
        };
        assert_eq!(cpu_usage_percent(earlier, later), Some(75.0));
        assert_eq!(cpu_usage_percent(earlier, earlier), None);
        assert_eq!(cpu_usage_percent(later, earlier), None);
    }

    #[test]
    fn meminfo_total_and_available() {
        let text = "MemTotal:       16318480 kB\nMemFree:         1200000 kB\nMemAvailable:    4079620 kB\n";
        let memory = parse_meminfo(text).expect("parses");
        assert_eq!(memory.total_bytes, 16_318_480 * 1024);
        assert_eq!(memory.available_bytes, 4_079_620 * 1024);
        assert_eq!(memory.used_percent(), Some(75.0));
        assert_eq!(parse_meminfo("MemTotal: 10 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: x kB\nMemAvailable: 1 kB\n"), None);
    }

    #[test]
    fn this_host_reads_when_it_has_proc() {
        if let Ok(text) = std::fs::read_to_string("/proc/meminfo") {
            let memory = parse_meminfo(&text).expect("a Linux meminfo parses");
            assert!(memory.total_bytes >= memory.available_bytes);
        }
    }
}
