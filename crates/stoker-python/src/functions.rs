//! The module-level functions of `stoker._stoker`: the demo dataset, argument checks the Python
//! side asks for before it builds a loader, what the CPU and CUDA probes report, and the caption
//! encoder on a list of captions (for parity checks against open_clip and HuggingFace).

use crate::errors::{self, IntoPy};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use std::path::PathBuf;
use stoker::DType;

/// Adds the functions to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(make_demo, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_allowance, m)?)?;
    m.add_function(wrap_pyfunction!(parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_name, m)?)?;
    m.add_function(wrap_pyfunction!(local_rank, m)?)?;
    m.add_function(wrap_pyfunction!(preset_json, m)?)?;
    m.add_function(wrap_pyfunction!(normalize_table, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_probe_json, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_memory_in_use, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_bandwidth_json, m)?)?;
    m.add_function(wrap_pyfunction!(encode_captions, m)?)?;
    m.add_function(wrap_pyfunction!(nvjpeg_candidates, m)?)?;
    m.add_function(wrap_pyfunction!(nvjpeg_json, m)?)?;
    m.add_function(wrap_pyfunction!(augment_op, m)?)?;
    Ok(())
}
/// Builds the demo ImageFolder (embedded public-domain photos) under `root`; returns the number
/// of JPEGs written.
#[pyfunction]
#[pyo3(signature = (root, images=350, seed=0))]
pub fn make_demo(py: Python<'_>, root: PathBuf, images: usize, seed: u64) -> PyResult<usize> {
    if images == 0 {
        return Err(errors::config("images", "must be at least 1"));
    }
    let threads = stoker::cpu::allowance().effective;
    py.detach(|| stoker::demo::make_demo(&root, images, seed, threads)).py_err().map(|s| s.images)
}

/// torchrun's `LOCAL_RANK` (`None` when unset), checked by `stoker::args` (the one place that
/// reads it); a value that is not a GPU index is a `ConfigError`.
#[pyfunction]
pub fn local_rank() -> PyResult<Option<u32>> {
    stoker::args::local_rank_given().py_err()
}

/// The canonical name of an output dtype (`uint8`, `float16`, `float32`; aliases such as
/// `half` and `float` accepted), or a `ConfigError` naming `dtype`.
#[pyfunction]
pub fn dtype_name(name: &str) -> PyResult<&'static str> {
    Ok(DType::parse(name).py_err()?.name())
}

/// Checks a `device=` argument: `("cpu" | "cuda" | "auto", ordinal or None)`.
#[pyfunction]
pub fn parse_device(device: &Bound<'_, PyAny>) -> PyResult<(&'static str, Option<u32>)> {
    let text = device.extract::<String>().map_err(|_| {
        errors::config(
            "device",
            format!(
                "expected 'cpu', 'cuda', 'cuda:N' or 'auto', got {}",
                device.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    })?;
    Ok(match stoker::args::DeviceSpec::parse(&text).py_err()? {
        stoker::args::DeviceSpec::Cpu => ("cpu", None),
        stoker::args::DeviceSpec::Cuda(n) => ("cuda", n),
        stoker::args::DeviceSpec::Auto => ("auto", None),
    })
}

/// The process's CPU allowance as JSON (online, affinity, cgroup quota, effective).
#[pyfunction]
pub fn cpu_allowance() -> String {
    serde_json::to_string(&stoker::cpu::allowance()).unwrap_or_default()
}

/// A preset's transform as JSON (`imagenet-train`, `imagenet-val`).
#[pyfunction]
pub fn preset_json(name: &str) -> PyResult<String> {
    let spec = stoker::TransformSpec::preset(name).py_err()?;
    serde_json::to_string(&spec).map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string())))
}

/// The engine's normalisation table (`stoker::ops::normalize_table`): three rows of 256
/// float32 values as little-endian bytes, for the GPU normaliser's lookup.
#[pyfunction]
pub fn normalize_table<'py>(py: Python<'py>, mean: [f32; 3], std: [f32; 3]) -> Bound<'py, pyo3::types::PyBytes> {
    let bytes: Vec<u8> =
        stoker::ops::normalize_table(mean, std).iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    pyo3::types::PyBytes::new(py, &bytes)
}

/// What the CUDA probe found (driver, devices, or why there is none) as JSON.
#[pyfunction]
pub fn cuda_probe_json(py: Python<'_>) -> String {
    py.detach(|| serde_json::to_string(&stoker_cuda::probe()).unwrap_or_default())
}

/// `(device bytes, pinned host bytes)` allocated by stoker in this process right now.
#[pyfunction]
pub fn cuda_memory_in_use() -> (u64, u64) {
    stoker_cuda::memory_in_use()
}

/// Measured host-to-device bandwidth of `cuda:{ordinal}` (pinned and pageable) as JSON.
#[pyfunction]
#[pyo3(signature = (ordinal=0, bytes=268_435_456, repeats=10))]
pub fn cuda_bandwidth_json(py: Python<'_>, ordinal: u32, bytes: usize, repeats: usize) -> PyResult<String> {
    py.detach(|| -> stoker::Result<String> {
        let gpu = stoker_cuda::Gpu::open(ordinal)?;
        let bw = stoker_cuda::measure_h2d(&gpu, bytes, repeats)?;
        serde_json::to_string(&bw).map_err(|e| stoker::Error::Internal(e.to_string()))
    })
    .py_err()
}

/// Encodes `captions` (each `str` or UTF-8 `bytes`) with the CLIP-style `tokenizer.json` at
/// `tokenizer` (`stoker::tokens::CaptionEncoder`): `(ids, mask)`, each `len(captions) *
/// context_length` little-endian int32 values as `bytes`, row by row
/// (`numpy.frombuffer(ids, "<i4").reshape(-1, context_length)`). The options are checked as
/// everywhere (`ConfigError`); a caption that is neither `str` nor `bytes` is a `ConfigError`,
/// one that is not UTF-8 a `DecodeError` naming its index. Loads the tokenizer on every call: a
/// tool for checks, not for a training loop.
#[pyfunction]
#[pyo3(signature = (tokenizer, captions, context_length=77, pad_id=0, clean="open_clip"))]
pub fn encode_captions<'py>(
    py: Python<'py>,
    tokenizer: PathBuf,
    captions: &Bound<'py, PyAny>,
    context_length: i64,
    pad_id: i64,
    clean: &str,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let options = stoker::args::caption_options(
        Some(&context_length.into()),
        Some(&pad_id.into()),
        Some(&serde_json::Value::from(clean)),
    )
    .py_err()?;
    let mut texts: Vec<Vec<u8>> = vec![];
    for (i, item) in captions.try_iter()?.enumerate() {
        let item = item?;
        if let Ok(b) = item.cast::<PyBytes>() {
            texts.push(b.as_bytes().to_vec());
        } else if let Ok(s) = item.cast::<PyString>() {
            texts.push(s.to_cow()?.as_bytes().to_vec());
        } else {
            let ty = item.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            return Err(errors::config("captions", format!("captions[{i}]: expected str or bytes, got {ty}")));
        }
    }
    let (ids, mask) = py
        .detach(|| -> stoker::Result<(Vec<u8>, Vec<u8>)> {
            let t = stoker::tokens::TextTokenizer::from_file(&tokenizer)?;
            let enc = stoker::tokens::CaptionEncoder::new(t, options)?;
            let n = options.context_length;
            let (mut ids, mut mask) = (vec![0i32; texts.len() * n], vec![0i32; texts.len() * n]);
            for (i, ((text, row), m)) in texts.iter().zip(ids.chunks_mut(n)).zip(mask.chunks_mut(n)).enumerate() {
                enc.encode_into(text, row, m).map_err(|e| match e {
                    stoker::Error::Decode { reason, .. } => stoker::Error::decode(format!("captions[{i}]"), reason),
                    e => e,
                })?;
            }
            let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            Ok((bytes(&ids), bytes(&mask)))
        })
        .py_err()?;
    Ok((PyBytes::new(py, &ids), PyBytes::new(py, &mask)))
}

/// Further places to look for libnvjpeg (the copies PyTorch's and torchvision's wheels
/// install), before the system's library path; only calls before GPU decode first loads the
/// library count.
#[pyfunction]
pub fn nvjpeg_candidates(paths: Vec<PathBuf>) {
    stoker_cuda::gpu_decode::add_candidates(paths);
}

/// nvJPEG as `stoker doctor` sees it, as JSON: `{path, version}` or `{error}`.
#[pyfunction]
pub fn nvjpeg_json(py: Python<'_>) -> String {
    let v = match py.detach(stoker_cuda::gpu_decode::describe) {
        Ok((path, version)) => serde_json::json!({"path": path, "version": version}),
        Err(e) => serde_json::json!({"error": e}),
    };
    v.to_string()
}

/// Applies one augmentation op with explicit parameters to an RGB8 image (`height` x `width` x
/// 3 bytes, row-major) and returns the result: the engine's kernels, for the reference tests
/// against torchvision. `op` is one of torchvision's auto-augment ids with its `magnitude` as
/// torchvision's `_apply_image_or_video_transform` takes it (`Brightness`, `Color`, `Contrast`,
/// `Sharpness`: factor `1 + magnitude`; `Posterize`: bits; `Solarize`: threshold `255 *
/// magnitude`; `Rotate`: degrees; `ShearX`/`ShearY`: `atan` in degrees; `TranslateX`/`Y`:
/// pixels), or `Hue` (the hue factor) or `Grayscale`. `fill` as torchvision's (none, one value
/// or three). Unknown ops and sizes that do not match are a `ConfigError`.
#[pyfunction]
#[pyo3(signature = (op, magnitude, image, height, width, fill=None))]
pub fn augment_op<'py>(
    py: Python<'py>,
    op: &str,
    magnitude: f64,
    image: &[u8],
    height: usize,
    width: usize,
    fill: Option<Vec<f64>>,
) -> PyResult<Bound<'py, PyBytes>> {
    use stoker::ops::augment;
    if height.checked_mul(width).and_then(|n| n.checked_mul(3)) != Some(image.len()) {
        return Err(errors::config("image", format!("{} bytes for a {height}x{width} RGB image", image.len())));
    }
    let fill = stoker::args::fill_bytes("augment_op", fill.as_deref()).py_err()?;
    let mut img = image.to_vec();
    let mut scratch = vec![];
    match op {
        "Hue" => stoker::ops::color::hue(&mut img, magnitude),
        "Grayscale" => stoker::ops::color::grayscale(&mut img),
        _ => {
            let o = augment::AugOp::parse(op).ok_or_else(|| errors::config("op", format!("unknown op {op:?}")))?;
            py.detach(|| augment::apply_op(o, magnitude, &mut img, width, height, fill, &mut scratch));
        }
    }
    Ok(PyBytes::new(py, &img))
}
