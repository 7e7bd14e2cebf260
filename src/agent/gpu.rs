//! The agent host's GPUs through NVML (observability reference, "GPU metrics"): utilization,
//! VRAM, temperature and power of every device, for the router's `hivenet_agent_gpu_*`.
//!
//! NVML is loaded at run time (`nvml-wrapper` opens `libnvidia-ml.so`): a host without the NVIDIA
//! driver has no such library, [`Gpus::open`] finds none, and every sample is an empty list, so
//! the router prints no GPU series — absent, not zero, as the reference says of CPU-only agents.
//! A reading one device refuses (an older GPU has no power sensor) is absent for that device only.

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;

use crate::wire::proto::GpuStats;

/// Devices read per sample at most (as the router keeps: `control::agent_reports::GPUS_MAX`).
const DEVICES_MAX: u32 = 64;

/// NVML, when this host has it.
pub struct Gpus {
    nvml: Option<Nvml>,
}

impl Gpus {
    /// Loads NVML once; without it (no driver, no GPU) the agent reports no GPUs.
    pub fn open() -> Gpus {
        let nvml = match Nvml::init() {
            Ok(nvml) => Some(nvml),
            Err(error) => {
                tracing::info!(%error, "NVML unavailable: no GPU metrics from this host");
                None
            }
        };
        Gpus { nvml }
    }

    /// Every device's readings now; empty without NVML.
    pub fn sample(&mut self) -> Vec<GpuStats> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0).min(DEVICES_MAX);
        (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                let memory = device.memory_info().ok();
                Some(GpuStats {
                    index,
                    uuid: device.uuid().unwrap_or_default(),
                    utilization_percent: device
                        .utilization_rates()
                        .ok()
                        .map(|rates| f64::from(rates.gpu)),
                    vram_used_bytes: memory.as_ref().map(|memory| memory.used),
                    vram_free_bytes: memory.as_ref().map(|memory| memory.free),
                    vram_total_bytes: memory.as_ref().map(|memory| memory.total),
                    temperature_celsius: device
                        .temperature(TemperatureSensor::Gpu)
                        .ok()
                        .map(f64::from),
                    // NVML reports milliwatts.
                    power_watts: device
                        .power_usage()
                        .ok()
                        .map(|milliwatts| f64::from(milliwatts) / 1000.0),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a host without the NVIDIA driver (CI, this project's test machines) NVML does not load
    /// and no GPU is reported; on one with it, every device has a UUID.
    #[test]
    fn gpus_are_absent_without_nvml() {
        let mut gpus = Gpus::open();
        let sampled = gpus.sample();
        if gpus.nvml.is_none() {
            assert!(sampled.is_empty());
        } else {
            assert!(sampled.iter().all(|gpu| !gpu.uuid.is_empty()));
        }
    }
}
