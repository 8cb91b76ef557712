//! GPU sampling for `stoker monitor`: utilisation, memory, PCIe traffic and the processes on
//! each GPU, read from NVML at every tick. NVML is loaded at run time (`nvml-wrapper`), so the
//! monitor works, GPU-blind, on a machine without a driver; [`GpuSampler::open`] then says why.
//!
//! NVML lists every GPU of the machine (it ignores `CUDA_VISIBLE_DEVICES`), which is what a
//! monitor wants: a job's processes are found on whichever GPU they use, by process id.

use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::Nvml;

/// What does not change while a GPU is watched.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuStatic {
    /// NVML's index.
    pub index: u32,
    /// The product name.
    pub name: String,
    /// Device memory, bytes (0 if NVML does not say).
    pub memory_total_bytes: u64,
    /// The PCIe link's rated host-to-device rate in bytes/s, from its current generation and
    /// width (the figure `stoker doctor` measures for real), if NVML reports the link.
    pub pcie_link_bytes_per_s: Option<f64>,
    /// The link as `gen4 x16`, if known.
    pub pcie_link: Option<String>,
}

/// One reading of one GPU. Fields NVML could not give are `None`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GpuSample {
    /// NVML's index.
    pub index: u32,
    /// Fraction of the last sample period in which a kernel ran (0..=1).
    pub util: Option<f64>,
    /// Fraction of the period in which device memory was read or written (0..=1).
    pub mem_util: Option<f64>,
    /// Device memory in use, bytes.
    pub mem_used_bytes: Option<u64>,
    /// PCIe receive (host to device) throughput, bytes/s.
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// PCIe transmit (device to host) throughput, bytes/s.
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// Processes with a compute context on this GPU: `(pid, device memory bytes)`.
    pub processes: Vec<(u32, u64)>,
}

/// An open NVML session over every GPU of the machine.
pub struct GpuSampler {
    nvml: Nvml,
    gpus: Vec<GpuStatic>,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSampler").field("gpus", &self.gpus).finish()
    }
}

/// Bytes per second one PCIe lane carries at generation `gen` (after line coding).
pub fn pcie_lane_bytes_per_s(gen: u32) -> Option<f64> {
    Some(match gen {
        1 => 250e6,
        2 => 500e6,
        3 => 984.6e6,
        4 => 1969.2e6,
        5 => 3938.5e6,
        6 => 7563e6,
        _ => return None,
    })
}

impl GpuSampler {
    /// Loads NVML and lists the GPUs; the error says why there is no GPU view (no library, no
    /// driver, no device).
    pub fn open() -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML is not available: {e}"))?;
        let n = nvml.device_count().map_err(|e| format!("NVML cannot count the GPUs: {e}"))?;
        if n == 0 {
            return Err("NVML reports no GPU".into());
        }
        let mut gpus = Vec::new();
        for index in 0..n {
            let d = nvml.device_by_index(index).map_err(|e| format!("NVML cannot open GPU {index}: {e}"))?;
            let (gen, width) = (d.current_pcie_link_gen().ok(), d.current_pcie_link_width().ok());
            let rate = match (gen, width) {
                (Some(g), Some(w)) => pcie_lane_bytes_per_s(g).map(|r| r * w as f64),
                _ => None,
            };
            gpus.push(GpuStatic {
                index,
                name: d.name().unwrap_or_else(|_| format!("GPU {index}")),
                memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
                pcie_link_bytes_per_s: rate,
                pcie_link: gen.zip(width).map(|(g, w)| format!("gen{g} x{w}")),
            });
        }
        Ok(GpuSampler { nvml, gpus })
    }

    /// The GPUs found when opened.
    pub fn gpus(&self) -> &[GpuStatic] {
        &self.gpus
    }

    /// Reads every GPU once. Never fails: what NVML refuses is left `None`.
    pub fn sample(&self) -> Vec<GpuSample> {
        self.gpus
            .iter()
            .map(|g| {
                let mut s = GpuSample { index: g.index, ..GpuSample::default() };
                let Ok(d) = self.nvml.device_by_index(g.index) else { return s };
                if let Ok(u) = d.utilization_rates() {
                    s.util = Some(u.gpu.min(100) as f64 / 100.0);
                    s.mem_util = Some(u.memory.min(100) as f64 / 100.0);
                }
                s.mem_used_bytes = d.memory_info().ok().map(|m| m.used);
                // NVML reports KB/s (1024 bytes).
                s.pcie_rx_bytes_per_s = d.pcie_throughput(PcieUtilCounter::Receive).ok().map(|k| k as f64 * 1024.0);
                s.pcie_tx_bytes_per_s = d.pcie_throughput(PcieUtilCounter::Send).ok().map(|k| k as f64 * 1024.0);
                if let Ok(ps) = d.running_compute_processes() {
                    s.processes = ps
                        .iter()
                        .map(|p| {
                            let mem = match p.used_gpu_memory {
                                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                            };
                            (p.pid, mem)
                        })
                        .collect();
                }
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_rates_double_per_generation_from_gen3() {
        let x16 = |g| pcie_lane_bytes_per_s(g).unwrap() * 16.0 / 1e9;
        assert!((x16(3) - 15.75).abs() < 0.01, "{}", x16(3));
        assert!((x16(4) / x16(3) - 2.0).abs() < 0.01);
        assert!((x16(5) / x16(4) - 2.0).abs() < 0.01);
        assert_eq!(pcie_lane_bytes_per_s(0), None);
    }
}
