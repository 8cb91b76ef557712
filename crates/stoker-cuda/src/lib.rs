//! # stoker-cuda
//!
//! The only crate of stoker that talks to CUDA and NVML. Both libraries are loaded at run time
//! (`cudarc` with dynamic loading, `nvml-wrapper`), so the workspace builds and every CPU test
//! runs on a machine with no CUDA at all; without a driver, [`probe`] reports why instead of
//! failing (cudarc panics when its library is missing, so every first call is gated by
//! `is_culib_present` and `catch_unwind`).
//!
//! - [`probe`]: which GPUs are here, on which PCIe link, with which driver (`stoker doctor`).
//! - [`place`]: turns `device="cpu" | "cuda" | "cuda:N" | "auto"` into a [`Placement`], with a
//!   clear error (or, for `auto`, a noted fallback to host batches) when CUDA is unusable.
//! - [`Target`]: the composition root: a resolved device plus a dataset (or arrays) and its
//!   config become a loader with its pool in the right memory and, on a GPU, its transfer
//!   stage; the CLI and the Python classes build loaders only here.
//! - [`PinnedAllocator`]: page-locked batch buffers for the engine's pool.
//! - [`DeviceStage`]: the transfer stage (own stream, events, device pool with release events).
//! - [`gpu_decode`]: nvJPEG (loaded at run time) and stoker's resampler decode the share of each
//!   batch the host leaves to the GPU, tuned for `decode="auto"`.
//! - [`measure_h2d`]: host-to-device bandwidth, pinned and pageable.
//! - [`GpuSampler`]: utilisation, memory, PCIe traffic and processes of every GPU, per tick
//!   (`stoker monitor`).
//!
//! Every raw driver call lives in the private `driver` module.

#![warn(missing_docs)]

mod bandwidth;
mod compose;
mod driver;
pub mod gpu_decode;
mod gpu_monitor;
mod pinned;
mod transfer;

pub use bandwidth::{measure_h2d, Bandwidth};
pub use compose::{OnDevice, Target};
pub use driver::{memory_in_use, Gpu, STREAM_LEGACY, STREAM_PER_THREAD};
pub use gpu_monitor::{pcie_lane_bytes_per_s, GpuSample, GpuSampler, GpuStatic};
pub use pinned::PinnedAllocator;
pub use transfer::{DeviceBatch, DeviceIter, DeviceRegion, DeviceStage, GpuDecode, GpuDecodeStats};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Errors of the CUDA layer.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No usable driver or device; the reason says which.
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    /// `cuda:N` with N at or above the number of devices.
    #[error("cuda:{ordinal} was asked for, but the driver sees {count} device(s) (cuda:0..cuda:{})", count.saturating_sub(1))]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
}

impl From<CudaError> for stoker::Error {
    fn from(e: CudaError) -> Self {
        stoker::Error::Device(e.to_string())
    }
}

/// Where a loader delivers its batches.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Host memory (pageable).
    Cpu,
    /// Device memory of this GPU, through pinned host buffers and the transfer stage.
    Cuda(Arc<Gpu>),
}

impl Placement {
    /// The host memory of the batch pool: page-locked for a GPU (so copies are asynchronous),
    /// the heap otherwise.
    pub fn allocator(&self) -> Arc<dyn stoker::buffer::HostAllocator> {
        match self {
            Placement::Cpu => Arc::new(stoker::buffer::HeapAllocator),
            Placement::Cuda(gpu) => Arc::new(PinnedAllocator::new(gpu.clone())),
        }
    }

    /// The transfer stage for batches of `capacities` regions (bytes each), or `None` on the
    /// host. Sized by the host pool's rule: `prefetch + 2` batches, capped by `memory_limit`,
    /// and grown as the host pool is (within `memory_limit`) while the consumer keeps batches.
    pub fn stage(
        &self,
        capacities: Vec<usize>,
        prefetch: usize,
        memory_limit: Option<u64>,
    ) -> stoker::Result<Option<DeviceStage>> {
        match self {
            Placement::Cpu => Ok(None),
            Placement::Cuda(gpu) => {
                let slots = stoker::buffer::BufferPool::plan(prefetch + 2, capacities.iter().sum(), memory_limit)?;
                DeviceStage::new(gpu.clone(), capacities, slots, memory_limit).map(Some)
            }
        }
    }
}

/// Resolves a device string. `cuda` means `cuda:{default_ordinal}` (the caller passes
/// torchrun's `LOCAL_RANK` or the framework's current device). `cuda`/`cuda:N` without a usable
/// GPU is an error naming the reason; `auto` falls back to the host and says why in the
/// returned report.
pub fn place(requested: &str, default_ordinal: u32) -> stoker::Result<(Placement, stoker::report::DeviceReport)> {
    use stoker::report::DeviceReport;
    let report = |used: String, note: Option<String>| DeviceReport { requested: requested.to_string(), used, note };
    let spec = stoker::args::DeviceSpec::parse(requested)?;
    if spec == stoker::args::DeviceSpec::Auto {
        return Ok(match Gpu::open(default_ordinal) {
            Ok(gpu) => {
                let used = format!("cuda:{}", gpu.ordinal());
                (Placement::Cuda(gpu), report(used, None))
            }
            Err(e) => (
                Placement::Cpu,
                report(
                    "cpu".into(),
                    Some(format!("device='auto' found no usable GPU ({e}); batches stay on the host")),
                ),
            ),
        });
    }
    let n = match spec {
        stoker::args::DeviceSpec::Cuda(n) => n.unwrap_or(default_ordinal),
        _ => return Ok((Placement::Cpu, report("cpu".into(), None))),
    };
    let gpu = Gpu::open(n).map_err(|e| match e {
        CudaError::Unavailable(why) => stoker::Error::Device(format!(
            "device={requested:?} needs CUDA, which is not available: {why}; use device=\"cpu\" or \"auto\""
        )),
        other => other.into(),
    })?;
    Ok((Placement::Cuda(gpu), report(format!("cuda:{n}"), None)))
}

/// One GPU as the driver and NVML report it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuInfo {
    /// CUDA ordinal (what `cuda:N` means: after `CUDA_VISIBLE_DEVICES`).
    pub index: u32,
    /// PCI bus id as CUDA reports it (`domain:bus:device.function`).
    pub pci_bus_id: Option<String>,
    /// NVML's index of the same device (matched by PCI bus id; NVML lists every GPU of the
    /// machine, whatever `CUDA_VISIBLE_DEVICES` says).
    pub nvml_index: Option<u32>,
    /// Product name.
    pub name: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Free memory in bytes.
    pub free_bytes: u64,
    /// Current PCIe generation.
    pub pcie_generation: Option<u32>,
    /// Current PCIe link width (lanes).
    pub pcie_width: Option<u32>,
    /// Maximum PCIe generation.
    pub pcie_max_generation: Option<u32>,
    /// Maximum PCIe link width.
    pub pcie_max_width: Option<u32>,
    /// Measured host-to-device bandwidth from page-locked memory, GB/s (when measured).
    pub h2d_pinned_gbps: Option<f64>,
    /// Measured host-to-device bandwidth from ordinary (pageable) memory, GB/s.
    pub h2d_pageable_gbps: Option<f64>,
}

/// What this machine offers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CudaProbe {
    /// Whether `libcuda` could be loaded.
    pub driver_library: bool,
    /// CUDA driver API version (e.g. 12040), when a driver answered.
    pub cuda_driver_version: Option<i32>,
    /// NVIDIA driver version string from NVML.
    pub nvidia_driver_version: Option<String>,
    /// Devices CUDA sees, by CUDA ordinal.
    pub devices: Vec<GpuInfo>,
    /// Why there is no usable GPU, when there is none.
    pub unavailable_reason: Option<String>,
    /// Why NVML's link and memory details are missing, when they are.
    pub nvml_note: Option<String>,
}

impl CudaProbe {
    /// Whether at least one GPU is usable.
    pub fn available(&self) -> bool {
        !self.devices.is_empty()
    }
}

/// `(CUDA driver version, device count)`, or why the driver cannot answer; never panics.
pub(crate) fn cuda_device_count() -> Result<(i32, usize), String> {
    // SAFETY: only tries to dlopen the candidate library names; no other state is touched.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no NVIDIA driver: libcuda.so could not be loaded".into());
    }
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(i32, usize), String> {
        let n = cudarc::driver::CudaContext::device_count().map_err(|e| format!("{e:?}"))?;
        let mut v: std::ffi::c_int = 0;
        // SAFETY: the library is loaded (checked above); the call writes one int.
        let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuDriverGetVersion: {r:?}"));
        }
        Ok((v, n.max(0) as usize))
    }));
    match r {
        Ok(x) => x,
        Err(_) => Err("libcuda lacks a required symbol (a stub or mismatched driver library)".into()),
    }
}

/// A PCI bus id as numbers `(domain, bus, device, function)`: CUDA writes `0000:17:00.0`,
/// NVML `00000000:17:00.0`; both name the same device.
pub fn parse_pci_bus_id(id: &str) -> Option<(u32, u32, u32, u32)> {
    let id = id.trim().trim_end_matches('\0');
    let (domain, rest) = id.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s.trim(), 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// The devices CUDA sees (ordinal, name, PCI bus id); never panics.
fn cuda_devices(count: usize) -> Vec<(u32, String, Option<String>)> {
    (0..count as u32)
        .map(|i| {
            let ident =
                catch_unwind(AssertUnwindSafe(|| driver::device_handle(i).and_then(driver::device_identity).ok()))
                    .ok()
                    .flatten();
            match ident {
                Some((name, bus)) => (i, name, Some(bus)),
                None => (i, format!("CUDA device {i}"), None),
            }
        })
        .collect()
}

/// NVML's view of the GPU at `bus` (a CUDA PCI bus id): `(nvml index, info)`.
fn nvml_match<'n>(nvml: &'n nvml_wrapper::Nvml, bus: &str) -> Option<(u32, nvml_wrapper::Device<'n>)> {
    let want = parse_pci_bus_id(bus)?;
    let n = nvml.device_count().ok()?;
    (0..n).find_map(|i| {
        let d = nvml.device_by_index(i).ok()?;
        let id = d.pci_info().ok()?.bus_id;
        (parse_pci_bus_id(&id) == Some(want)).then_some((i, d))
    })
}

/// Looks for a driver and GPUs; never fails and never panics. Devices are listed by CUDA
/// ordinal (what `cuda:N` opens, after `CUDA_VISIBLE_DEVICES`); NVML's details are matched to
/// them by PCI bus id, so an NVML index is never taken for a CUDA ordinal.
pub fn probe() -> CudaProbe {
    let mut p = CudaProbe {
        driver_library: false,
        cuda_driver_version: None,
        nvidia_driver_version: None,
        devices: vec![],
        unavailable_reason: None,
        nvml_note: None,
    };
    let (version, count) = match cuda_device_count() {
        Err(e) => {
            p.unavailable_reason = Some(e);
            return p;
        }
        Ok(x) => x,
    };
    p.driver_library = true;
    p.cuda_driver_version = Some(version);
    if count == 0 {
        p.unavailable_reason = Some("the driver reports no CUDA device".into());
        return p;
    }
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"));
    match &nvml {
        Ok(n) => p.nvidia_driver_version = n.sys_driver_version().ok(),
        Err(e) => p.nvml_note = Some(format!("{e}; link and memory details unavailable")),
    }
    for (index, name, bus) in cuda_devices(count) {
        let mut info = GpuInfo {
            index,
            pci_bus_id: bus.clone(),
            nvml_index: None,
            name,
            memory_bytes: 0,
            free_bytes: 0,
            pcie_generation: None,
            pcie_width: None,
            pcie_max_generation: None,
            pcie_max_width: None,
            h2d_pinned_gbps: None,
            h2d_pageable_gbps: None,
        };
        if let (Ok(nvml), Some(bus)) = (&nvml, bus.as_deref()) {
            if let Some((i, d)) = nvml_match(nvml, bus) {
                let mem = d.memory_info().ok();
                info.nvml_index = Some(i);
                info.memory_bytes = mem.as_ref().map(|m| m.total).unwrap_or(0);
                info.free_bytes = mem.as_ref().map(|m| m.free).unwrap_or(0);
                info.pcie_generation = d.current_pcie_link_gen().ok();
                info.pcie_width = d.current_pcie_link_width().ok();
                info.pcie_max_generation = d.max_pcie_link_gen().ok();
                info.pcie_max_width = d.max_pcie_link_width().ok();
            }
        }
        p.devices.push(info);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_without_a_gpu_is_an_error_or_a_noted_fallback() {
        if probe().available() {
            eprintln!("skipped: a GPU is present (the no-GPU paths are tested on machines without one)");
            return;
        }
        let e = place("cuda", 0).unwrap_err();
        assert!(matches!(e, stoker::Error::Device(_)), "{e}");
        assert!(e.to_string().contains("needs CUDA"), "{e}");
        let e = place("cuda:1", 0).unwrap_err();
        assert!(matches!(e, stoker::Error::Device(_)), "{e}");
        let (p, r) = place("auto", 0).unwrap();
        assert!(matches!(p, Placement::Cpu));
        assert_eq!((r.requested.as_str(), r.used.as_str()), ("auto", "cpu"));
        assert!(r.note.unwrap().contains("no usable GPU"));
        let (p, r) = place("cpu", 0).unwrap();
        assert!(matches!(p, Placement::Cpu) && r.note.is_none());
        let e = place("gpu", 0).unwrap_err();
        assert!(e.to_string().contains("invalid argument `device`"), "{e}");
        assert_eq!(memory_in_use(), (0, 0));
    }

    #[test]
    fn pci_bus_ids_of_cuda_and_nvml_compare_equal() {
        assert_eq!(parse_pci_bus_id("0000:17:00.0"), parse_pci_bus_id("00000000:17:00.0"));
        assert_eq!(parse_pci_bus_id("0000:1a:00.0"), Some((0, 0x1a, 0, 0)));
        assert_ne!(parse_pci_bus_id("0000:17:00.0"), parse_pci_bus_id("0000:18:00.0"));
        assert_eq!(parse_pci_bus_id("garbage"), None);
    }

    #[test]
    fn probe_never_panics_and_explains_a_missing_gpu() {
        let p = probe();
        if !p.available() {
            let why = p.unavailable_reason.expect("a reason when no GPU");
            eprintln!("no GPU here: {why}");
            assert!(!why.is_empty());
        }
    }
}
