//! `stoker doctor`: what this machine offers a data loader, in three steps: [`collect`] the
//! facts (CPU allowance, memory, /dev/shm, SIMD, GPUs and their links, host-to-device
//! bandwidth), [`advise`] from them (a pure function, tested on made-up machines), [`print`]
//! them as a report or as JSON. GPUs are named by CUDA ordinal (`cuda:N`, after
//! `CUDA_VISIBLE_DEVICES`), and NVML's details are matched to them by PCI bus id.

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use stoker::cpu::CpuAllowance;
use stoker_cuda::CudaProbe;

/// Flags of `stoker doctor`.
#[derive(Args)]
pub struct DoctorArgs {
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Skip the host-to-device bandwidth measurement (256 MiB copies per GPU).
    #[arg(long)]
    pub no_bandwidth: bool,
    /// A `tokenizer.json` to check (repeatable): which engine encodes it (stoker's exact
    /// byte-level BPE or the `tokenizers` crate) and why.
    #[arg(long = "tokenizer", value_name = "TOKENIZER_JSON")]
    pub tokenizers: Vec<std::path::PathBuf>,
}

/// Which engine encodes a `tokenizer.json`, and why (or why it cannot be loaded).
#[derive(Serialize)]
pub struct TokenizerFact {
    path: std::path::PathBuf,
    /// `stoker byte-level BPE` or `tokenizers`; absent when the file cannot be loaded.
    engine: Option<&'static str>,
    /// Why that engine (or the error).
    why: String,
    vocab_size: Option<usize>,
}

/// The engine of each tokenizer file.
pub fn tokenizer_facts(paths: &[std::path::PathBuf]) -> Vec<TokenizerFact> {
    paths
        .iter()
        .map(|p| match stoker::tokens::TextTokenizer::from_file(p) {
            Ok(t) => {
                let (engine, why) = t.engine();
                TokenizerFact {
                    path: p.clone(),
                    engine: Some(engine),
                    why: why.to_string(),
                    vocab_size: Some(t.vocab_size()),
                }
            }
            Err(e) => TokenizerFact { path: p.clone(), engine: None, why: e.to_string(), vocab_size: None },
        })
        .collect()
}

/// Everything `doctor` knows about the machine.
#[derive(Serialize)]
pub struct Facts {
    stoker: &'static str,
    libjpeg_turbo: &'static str,
    cpu: CpuAllowance,
    decode_threads: usize,
    /// Whether a valid `STOKER_NUM_THREADS` set the thread count.
    #[serde(skip)]
    threads_from_env: bool,
    /// Why `STOKER_NUM_THREADS` is refused, when it is set to something loaders refuse.
    #[serde(skip_serializing_if = "Option::is_none")]
    threads_env_error: Option<String>,
    simd: serde_json::Value,
    memory: Memory,
    dev_shm: Option<Space>,
    gpu: CudaProbe,
    /// Why a GPU's bandwidth could not be measured.
    bandwidth_errors: Vec<String>,
    /// nvJPEG for `decode="gpu"`: `{path, version}` or `{error}`.
    nvjpeg: serde_json::Value,
    /// The tokenizers given with `--tokenizer`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tokenizers: Vec<TokenizerFact>,
}

#[derive(Serialize)]
struct Memory {
    total_bytes: Option<u64>,
    available_bytes: Option<u64>,
    cgroup_limit: Option<String>,
}

#[derive(Serialize)]
struct Space {
    size_bytes: u64,
    free_bytes: u64,
}

/// `(total, available)` bytes of RAM from /proc/meminfo.
fn meminfo() -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let get = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (get("MemTotal:"), get("MemAvailable:"))
}

/// Size and free bytes of a filesystem.
fn fs_space(path: &str) -> Option<Space> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: statvfs fills the zeroed struct; `c` is a valid NUL-terminated path.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    Some(Space { size_bytes: st.f_blocks * st.f_frsize, free_bytes: st.f_bavail * st.f_frsize })
}

fn simd() -> serde_json::Value {
    #[cfg(target_arch = "x86_64")]
    return serde_json::json!({
        "sse4.1": std::arch::is_x86_feature_detected!("sse4.1"),
        "avx2": std::arch::is_x86_feature_detected!("avx2"),
        "avx512f": std::arch::is_x86_feature_detected!("avx512f"),
    });
    #[cfg(not(target_arch = "x86_64"))]
    serde_json::json!({})
}

/// Reads the machine; measures host-to-device bandwidth per GPU when `bandwidth`.
pub fn collect(bandwidth: bool) -> Facts {
    let (total_bytes, available_bytes) = meminfo();
    // Shown, not refused: a bad STOKER_NUM_THREADS is one of the facts doctor reports.
    let threads_from_env = stoker::args::env_threads();
    let mut gpu = stoker_cuda::probe();
    let mut bandwidth_errors = vec![];
    if bandwidth {
        for d in &mut gpu.devices {
            let measured = stoker_cuda::Gpu::open(d.index)
                .map_err(stoker::Error::from)
                .and_then(|g| stoker_cuda::measure_h2d(&g, 256 << 20, 10));
            match measured {
                Ok(bw) => {
                    d.h2d_pinned_gbps = Some(bw.pinned_gbps);
                    d.h2d_pageable_gbps = Some(bw.pageable_gbps);
                }
                Err(e) => bandwidth_errors.push(format!("cuda:{}: bandwidth not measured: {e}", d.index)),
            }
        }
    }
    Facts {
        stoker: env!("CARGO_PKG_VERSION"),
        libjpeg_turbo: stoker::decode::jpeg::LIBJPEG_TURBO_VERSION,
        cpu: stoker::cpu::allowance(),
        decode_threads: threads_from_env.as_ref().ok().copied().flatten().unwrap_or_else(stoker::cpu::default_threads),
        threads_from_env: matches!(threads_from_env, Ok(Some(_))),
        threads_env_error: threads_from_env.err().map(|e| e.to_string()),
        simd: simd(),
        memory: Memory {
            total_bytes,
            available_bytes,
            cgroup_limit: std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().map(|s| s.trim().to_string()),
        },
        dev_shm: fs_space("/dev/shm"),
        gpu,
        bandwidth_errors,
        nvjpeg: match stoker_cuda::gpu_decode::describe() {
            Ok((path, version)) => serde_json::json!({"path": path, "version": version}),
            Err(e) => serde_json::json!({"error": e}),
        },
        tokenizers: vec![],
    }
}

/// Bytes of one 224x224 RGB uint8 image: what crosses the bus per sample.
const IMAGE_BYTES: f64 = 224.0 * 224.0 * 3.0;

/// What to change, from the facts.
pub fn advise(f: &Facts) -> Vec<String> {
    let mut advice = vec![format!(
        "stoker will use {} decode threads (the CPU allowance{}); set STOKER_NUM_THREADS or threads= to change it",
        f.decode_threads,
        if f.threads_from_env { ", overridden by STOKER_NUM_THREADS" } else { "" }
    )];
    if let Some(e) = &f.threads_env_error {
        advice.insert(0, format!("{e}: loaders refuse to start until it is fixed or unset"));
    }
    if f.cpu.effective < f.cpu.online {
        advice.push(format!(
            "this process may use {} of the machine's {} CPUs (affinity/cgroup quota): size num_workers-style settings by the allowance, not the core count",
            f.cpu.effective, f.cpu.online
        ));
    }
    if let Some(shm) = &f.dev_shm {
        if shm.size_bytes < 1 << 30 {
            advice.push(format!(
                "/dev/shm is only {:.0} MiB: stoker does not need it (threads, no shared memory), but a DataLoader with workers would fail or slow down",
                shm.size_bytes as f64 / 1048576.0
            ));
        }
    }
    if let Some(avail) = f.memory.available_bytes {
        advice.push(format!(
            "{:.1} GiB of RAM available: a memory_limit of a quarter of that ({:.1} GiB) leaves room for the training process",
            avail as f64 / 1073741824.0,
            avail as f64 / 4.0 / 1073741824.0
        ));
    }
    if !f.gpu.available() {
        advice.push(format!(
            "no GPU: {}; batches stay in host memory",
            f.gpu.unavailable_reason.clone().unwrap_or_default()
        ));
        return advice;
    }
    for d in &f.gpu.devices {
        if let (Some(g), Some(mg)) = (d.pcie_generation, d.pcie_max_generation) {
            if g < mg {
                advice.push(format!(
                    "cuda:{}: PCIe link at gen {g} of {mg} (idle links downshift; check under load)",
                    d.index
                ));
            }
        }
    }
    for d in &f.gpu.devices {
        if let (Some(w), Some(mw)) = (d.pcie_width, d.pcie_max_width) {
            if w < mw {
                advice.push(format!(
                    "cuda:{}: PCIe link runs x{w} of x{mw} lanes: host-to-device copies are capped",
                    d.index
                ));
            }
        }
        if let (Some(p), Some(q)) = (d.h2d_pinned_gbps, d.h2d_pageable_gbps) {
            advice.push(format!(
                "cuda:{}: host-to-device {p:.1} GB/s from pinned memory, {q:.1} GB/s from pageable: \
                 device='cuda' copies from pinned buffers on its own stream; batches cross as uint8 \
                 (224x224x3 = 147 KiB per image, so {:.0}k images/s fit through this link)",
                d.index,
                p * 1e9 / IMAGE_BYTES / 1e3
            ));
        }
    }
    if f.nvjpeg.get("version").is_some() {
        advice.push(
            "nvJPEG is usable: when the CPU cannot keep a light model (ResNet-18, ViT-S) fed, \
             decode='auto' tries a share of each batch on the GPU (its JPEG engines where it has them) and \
             keeps it only while the training loop gets its batches sooner"
                .into(),
        );
    }
    advice.extend(f.bandwidth_errors.iter().cloned());
    advice
}

fn gib(b: Option<u64>) -> String {
    b.map(|b| format!("{:.1} GiB", b as f64 / 1073741824.0)).unwrap_or_else(|| "?".into())
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
}

/// Prints the facts and the advice: a report, or one JSON object.
pub fn print(f: &Facts, advice: &[String], json: bool) -> Result<()> {
    if json {
        let mut out = serde_json::to_value(f)?;
        out["gpus"] = serde_json::to_value(&f.gpu.devices)?;
        out["recommendations"] = serde_json::to_value(advice)?;
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("stoker {} (libjpeg-turbo {})", f.stoker, f.libjpeg_turbo);
    let simd = f.simd.as_object().map(|m| {
        m.iter().filter(|(_, v)| v.as_bool() == Some(true)).map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(" ")
    });
    println!(
        "CPU: {} online, {} in the affinity mask, cgroup quota {}, allowance {}; SIMD: {}",
        f.cpu.online,
        f.cpu.affinity,
        f.cpu.cgroup_quota.map(|q| format!("{q:.2} CPUs")).unwrap_or_else(|| "none".into()),
        f.cpu.effective,
        simd.unwrap_or_default()
    );
    println!(
        "memory: {} total, {} available, cgroup limit {}",
        gib(f.memory.total_bytes),
        gib(f.memory.available_bytes),
        f.memory.cgroup_limit.clone().unwrap_or_else(|| "none".into())
    );
    match &f.dev_shm {
        Some(s) => println!("/dev/shm: {} ({} free)", gib(Some(s.size_bytes)), gib(Some(s.free_bytes))),
        None => println!("/dev/shm: not mounted"),
    }
    if f.gpu.available() {
        println!(
            "GPU driver {} (CUDA {})",
            f.gpu.nvidia_driver_version.clone().unwrap_or_default(),
            f.gpu.cuda_driver_version.map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)).unwrap_or_default()
        );
        if let Some(note) = &f.gpu.nvml_note {
            println!("GPU details: {note}");
        }
        // CUDA ordinals (what `device="cuda:N"` opens, after CUDA_VISIBLE_DEVICES), with the PCI
        // bus id that ties each to NVML's listing of every GPU.
        for d in &f.gpu.devices {
            println!(
                "cuda:{} ({}{}): {}, {} ({} free), PCIe gen {} x{} (max gen {} x{}){}",
                d.index,
                d.pci_bus_id.as_deref().unwrap_or("bus id unknown"),
                d.nvml_index.map(|i| format!(", NVML {i}")).unwrap_or_default(),
                d.name,
                gib(Some(d.memory_bytes)),
                gib(Some(d.free_bytes)),
                opt(d.pcie_generation),
                opt(d.pcie_width),
                opt(d.pcie_max_generation),
                opt(d.pcie_max_width),
                match (d.h2d_pinned_gbps, d.h2d_pageable_gbps) {
                    (Some(p), Some(q)) => format!(", host-to-device {p:.1} GB/s pinned, {q:.1} GB/s pageable"),
                    _ => String::new(),
                }
            );
        }
        match (f.nvjpeg["path"].as_str(), f.nvjpeg["version"].as_str()) {
            (Some(path), Some(v)) => println!("nvJPEG {v} ({path}): decode='gpu' and 'auto' can decode on the GPU"),
            _ => println!(
                "nvJPEG: not usable ({}): decode='gpu' is not available (install torchvision or nvidia-nvjpeg)",
                f.nvjpeg["error"].as_str().unwrap_or_default()
            ),
        }
    } else {
        println!("GPU: none ({})", f.gpu.unavailable_reason.clone().unwrap_or_default());
    }
    for t in &f.tokenizers {
        match t.engine {
            Some(e) => {
                println!("tokenizer {}: {e}, {} tokens ({})", t.path.display(), t.vocab_size.unwrap_or(0), t.why)
            }
            None => println!("tokenizer {}: cannot be loaded: {}", t.path.display(), t.why),
        }
    }
    println!("recommendations:");
    for a in advice {
        println!("  - {a}");
    }
    Ok(())
}

/// Runs `stoker doctor`.
pub fn run(a: &DoctorArgs) -> Result<()> {
    let mut facts = collect(!a.no_bandwidth);
    facts.tokenizers = tokenizer_facts(&a.tokenizers);
    let advice = advise(&facts);
    print(&facts, &advice, a.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(online: usize, effective: usize, shm: u64) -> Facts {
        let mut f = collect(false);
        f.cpu.online = online;
        f.cpu.effective = effective;
        f.decode_threads = effective;
        f.dev_shm = Some(Space { size_bytes: shm, free_bytes: shm });
        f.memory.available_bytes = Some(16 << 30);
        f
    }

    #[test]
    fn advice_follows_the_facts() {
        let a = advise(&machine(64, 8, 64 << 20));
        assert!(a[0].contains("8 decode threads"), "{a:?}");
        assert!(a.iter().any(|l| l.contains("8 of the machine's 64 CPUs")), "{a:?}");
        assert!(a.iter().any(|l| l.contains("/dev/shm is only 64 MiB")), "{a:?}");
        assert!(a.iter().any(|l| l.contains("16.0 GiB of RAM available") && l.contains("4.0 GiB")), "{a:?}");
        let a = advise(&machine(8, 8, 8 << 30));
        assert!(!a.iter().any(|l| l.contains("of the machine's") || l.contains("/dev/shm")), "{a:?}");
        // A value loaders refuse is said first, not counted as "set".
        let mut f = machine(8, 8, 8 << 30);
        f.threads_env_error = Some("invalid argument `STOKER_NUM_THREADS`: ...".into());
        let a = advise(&f);
        assert!(a[0].contains("STOKER_NUM_THREADS") && a[0].contains("refuse"), "{a:?}");
        assert!(!a[1].contains("overridden"), "{a:?}");
    }

    #[test]
    fn tokenizers_are_named_with_their_engine() {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text");
        let missing = data.join("no-such-tokenizer.json");
        let facts = tokenizer_facts(&[data.join("tokenizer-gpt2.json"), missing]);
        assert_eq!(facts[0].engine, Some("stoker byte-level BPE"), "{}", facts[0].why);
        assert_eq!(facts[0].vocab_size, Some(50257));
        assert_eq!(facts[1].engine, None);
        assert!(facts[1].why.contains("no-such-tokenizer.json"), "{}", facts[1].why);
    }
}
