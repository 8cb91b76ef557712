//! The image loader's rule book: its arguments ([`loader_config`]), the transform they name,
//! its failure budget, and what the GPU side normalises when batches go to a GPU
//! ([`image_config`]).

use super::env::{apply_env, budget_registry_path, Env};
use super::shared::{cache, common, sampler, shard_cache, trace};
use super::{Args, Taker};
use crate::error::{Error, Result};
use crate::image::gpu_job::DecodeOn;
use crate::image::ops::{DType, Layout, OpSpec, TransformSpec};
use crate::image::pipeline::{ErrorPolicy, LoaderConfig, MaxFailures};
use crate::values::{batch_bytes, boolean, bytes, cpu_budget, positive, shown, text, thread_count};
use serde_json::Value;

/// The transform: `preset` (`imagenet-train`, `imagenet-val`) or `ops` (a list of op specs,
/// what `stoker.transforms` compiles to), then `interpolation` (the resize's or crop's filter),
/// `dtype`, `layout`, `apply_exif`.
fn transform(a: &mut Taker) -> Result<TransformSpec> {
    let mut spec = match (a.take("preset"), a.take("ops")) {
        (Some(_), Some(_)) => {
            return Err(Error::config("preset", "give a preset or an explicit transforms list, not both"))
        }
        (Some(p), None) => TransformSpec::preset(text("preset", &p, "imagenet-train or imagenet-val")?)?,
        (None, Some(ops)) => {
            let ops: Vec<OpSpec> = serde_json::from_value(ops)
                .map_err(|e| Error::config("transforms", format!("not a list of transforms: {e}")))?;
            // Explicit transforms without ToTensor/ToDtype give raw uint8 pixels.
            TransformSpec { ops, dtype: DType::Uint8, layout: Layout::NCHW, apply_exif: true }
        }
        (None, None) => {
            return Err(Error::config(
                "preset",
                "give preset='imagenet-train' or 'imagenet-val', or an explicit transforms list",
            ))
        }
    };
    if let Some(i) = a.take("interpolation") {
        let i: crate::image::ops::Interpolation =
            serde_json::from_value(i).map_err(|e| Error::config("interpolation", e.to_string()))?;
        spec = spec.with_interpolation(i);
    }
    if let Some(d) = a.take("dtype") {
        let dtype = DType::parse(text("dtype", &d, "uint8, float16 or float32")?)?;
        spec = spec.with_dtype(dtype);
    }
    if let Some(l) = a.take("layout") {
        spec.layout = Layout::parse(text("layout", &l, "NCHW or NHWC")?)?;
    }
    if let Some(e) = a.typed("apply_exif") {
        spec.apply_exif = boolean("apply_exif", &e)?;
    }
    Ok(spec)
}

/// The config of an image loader whose batches go to a GPU (`on_gpu`) or stay on the host, and
/// how the GPU side normalises them: the one place where that is decided. On a GPU, images
/// cross the bus as uint8 and are normalised there into the asked `dtype` (`float32` by
/// default for the presets, `float16`, `bfloat16`; `uint8` for none); `bfloat16` is made only
/// there, so on the host it is an error naming `dtype`. A batch mixing (`batch_transform`) then
/// mixes the images on the GPU, after their normalisation ([`crate::image::ops::mix::MixImages`]);
/// the host still makes the soft labels. Otherwise as [`loader_config`].
pub fn image_config(
    mut args: Args,
    on_gpu: bool,
) -> Result<(LoaderConfig, Option<crate::image::ops::DeviceNormalize>)> {
    let bf16 = args.get("dtype").and_then(Value::as_str).is_some_and(|d| d.eq_ignore_ascii_case("bfloat16"));
    if bf16 {
        if !on_gpu {
            return Err(Error::config(
                "dtype",
                "bfloat16 is produced on the GPU; use device='cuda' (or float16/float32 on the CPU)",
            ));
        }
        args.insert("dtype".into(), Value::String("float32".into()));
    }
    let mut config = loader_config(args)?;
    config.decode = decode_where(config.decode, on_gpu, &config)?;
    if let Some(mix) = config.mix.as_mut().filter(|_| on_gpu) {
        // The images cross the bus as uint8 and are normalised on the GPU: they are mixed there,
        // after that (the host makes only the soft labels).
        mix.images = crate::image::ops::mix::MixImages::Device;
    }
    if !on_gpu || config.transform.dtype == DType::Uint8 {
        return Ok((config, None));
    }
    let dtype = if bf16 { "bfloat16" } else { config.transform.dtype.name() };
    let normalize = config.transform.split_for_device(dtype);
    Ok((config, Some(normalize)))
}

/// A [`LoaderConfig`] from named arguments: `batch_size`, `preset` or `ops`, `dtype`,
/// `layout`, `apply_exif`, `shuffle` (`False`, `True`, `global`, `shards`), `shard_window`,
/// `seed`, `drop_last`, `rank`, `world_size` (torchrun's environment by default), `threads`,
/// `io_threads`, `prefetch` (a number or `auto`), `cpu_budget`, `memory_limit`, `on_error`
/// (`skip`, `raise`), `dct_scaling`, `roi`, `max_pixels`, `max_file_bytes`, `max_failures`,
/// `cache`, `cache_bytes`, `cache_max_side`, `shard_cache`, `shard_cache_bytes`, `trace`, `trace_events`, `decode` and `gpu_share`
/// (where JPEGs are decoded, checked against the device by [`image_config`]), and for image-text pairs
/// `captions` ([`super::captions()`]). An unknown name is an
/// error. The environment ([`super::Env`]) is read, checked and applied first.
pub fn loader_config(args: Args) -> Result<LoaderConfig> {
    loader_config_in(args, &apply_env()?)
}

/// [`loader_config`] with the environment `env`.
pub(super) fn loader_config_in(args: Args, env: &Env) -> Result<LoaderConfig> {
    let mut a = Taker::new(args);
    let transform = transform(&mut a)?;
    let global = matches!(a.args.get("shuffle"), Some(Value::String(s)) if s == "global");
    let sampler = sampler(&mut a, true, env)?;
    let mut c = LoaderConfig::new(sampler.batch_size, transform);
    c.sampler = sampler;
    c.shuffle_global = global;
    c.cpu_registry = budget_registry_path(&env.budget);
    let prefetch;
    (c.threads, prefetch, c.memory_limit) = common(&mut a, env)?;
    match prefetch {
        Some(n) => c.prefetch = n,
        None => c.prefetch_auto = true,
    }
    c.cpu_budget = a.typed("cpu_budget").map(|v| cpu_budget("cpu_budget", &v)).transpose()?;
    c.io_threads = a.typed("io_threads").map(|v| thread_count("io_threads", &v)).transpose()?;
    if let Some(p) = a.take("on_error") {
        c.on_error = ErrorPolicy::parse(text("on_error", &p, "skip or raise")?)?;
    }
    if let Some(v) = a.typed("dct_scaling") {
        c.dct_scaling = boolean("dct_scaling", &v)?;
    }
    if let Some(v) = a.typed("roi") {
        c.roi = boolean("roi", &v)?;
    }
    if let Some(v) = a.typed("max_pixels") {
        c.max_pixels = positive("max_pixels", &v)? as u64;
    }
    if let Some(v) = a.typed("max_file_bytes") {
        c.max_file_bytes = bytes("max_file_bytes", &v)?;
    }
    if let Some(v) = a.typed("max_failures") {
        c.max_failures = max_failures(&v)?;
    }
    c.cache = cache(&mut a, env)?;
    c.shard_cache = shard_cache(&mut a, env)?;
    c.trace = trace(&mut a)?;
    c.decode = decode(&mut a)?;
    if let Some(v) = a.take("mixture") {
        let (spec, sources) = super::mixture::mixture(&v)?;
        c.parts = sources.into_iter().map(image_part).collect::<Result<_>>()?;
        c.sampler.mixture = Some(spec);
    }
    if let Some(v) = a.take("captions") {
        if c.sampler.mixture.is_some() {
            return Err(Error::config("root", "a pair loader reads one dataset of shards, not a mixture"));
        }
        c.captions = Some(super::captions::captions(&v)?);
    }
    if let Some(v) = a.take("batch_transform") {
        let mix: crate::image::ops::mix::MixSpec = serde_json::from_value(v).map_err(|e| {
            Error::config("batch_transform", format!("expected stoker.transforms.MixUp, CutMix or Mixup: {e}"))
        })?;
        mix.check()?;
        if c.captions.is_some() {
            return Err(Error::config("batch_transform", "a pair loader's batches are not mixed (no labels)"));
        }
        c.mix = Some(mix);
    }
    a.finish()?;
    batch_bytes(c.sampler.batch_size, sample_bytes(&c.transform)?)?;
    Ok(c)
}

/// `decode` (`cpu`, `gpu`, `auto`) and `gpu_share` (the fixed share of each batch for `gpu`,
/// 0 < share <= 1, default 0.5).
fn decode(a: &mut Taker) -> Result<DecodeOn> {
    let share = a.typed("gpu_share").map(|v| match v.as_f64() {
        Some(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(Error::config("gpu_share", format!("expected a fraction in (0, 1], got {}", shown(&v)))),
    });
    let on = match a.take("decode") {
        None => "cpu".to_string(),
        Some(v) => text("decode", &v, "cpu, gpu or auto")?.to_ascii_lowercase(),
    };
    match (on.as_str(), share) {
        ("cpu", None) => Ok(DecodeOn::Cpu),
        ("gpu", s) => Ok(DecodeOn::Gpu(s.transpose()?.unwrap_or(0.5))),
        ("auto", None) => Ok(DecodeOn::Auto),
        ("cpu" | "auto", Some(_)) => Err(Error::config("gpu_share", "a fixed share is for decode='gpu' only")),
        (other, _) => Err(Error::config("decode", format!("unknown value {other:?}; allowed: cpu, gpu, auto"))),
    }
}

/// GPU decode where batches go: `gpu` needs a GPU device, no cache (cached pixels are the
/// CPU's) and no augmentations past the crop and flip (they run on the CPU's crop); `auto`
/// falls back to the CPU where `gpu` could not run. Every filter resamples on the GPU
/// (`kernels/resize.cu` has the CPU's bilinear, bicubic and nearest).
pub fn decode_where(d: DecodeOn, on_gpu: bool, c: &LoaderConfig) -> Result<DecodeOn> {
    let why = if !on_gpu {
        Some("device='cuda' (the batches are decoded where they go)".to_string())
    } else if c.cache.is_some() {
        Some("no cache (a cache holds pixels the CPU decoded)".to_string())
    } else if c.transform.ops.iter().any(|o| o.is_augmentation() || matches!(o, OpSpec::RandomErasing { .. })) {
        Some("no augmentations (they run on the CPU's crop)".to_string())
    } else {
        None
    };
    match (d, why) {
        (DecodeOn::Gpu(_), Some(why)) => Err(Error::config("decode", format!("decode='gpu' needs {why}"))),
        (DecodeOn::Auto, Some(_)) => Ok(DecodeOn::Cpu),
        (d, _) => Ok(d),
    }
}

/// One image source of a mixture: `root` (what [`crate::source::detect`] opens: a path, a
/// URL, a glob, or a list of shards) and `label_offset` (added to its labels, default 0).
fn image_part(mut s: super::mixture::SourceArgs) -> Result<crate::source::mix::PartSpec> {
    let roots = s.paths("root", "expected a path, a URL or a list of shards")?;
    let label_offset = match s.typed("label_offset") {
        None => 0,
        Some(v) => v
            .as_i64()
            .filter(|&n| (0..1 << 40).contains(&n))
            .ok_or_else(|| s.error("label_offset", format!("expected a non-negative integer, got {v}")))?,
    };
    s.finish()?;
    Ok(crate::source::mix::PartSpec { roots, label_offset })
}

/// Bytes of one output sample of `spec` (compiling it, which checks the ops), or an error when
/// the output size does not fit in 64 bits.
fn sample_bytes(spec: &TransformSpec) -> Result<u64> {
    let plan = crate::image::ops::TransformPlan::compile(spec)?;
    let (h, w) = plan.output_size();
    (h as u64)
        .checked_mul(w as u64)
        .and_then(|p| p.checked_mul(3 * spec.dtype.size() as u64))
        .ok_or_else(|| Error::config("transforms", format!("an output of {h}x{w} pixels does not fit in memory")))
}

/// A failure budget: a count (`100`) or a fraction of the pass's samples (`0.05`, `"5%"`).
pub fn max_failures(v: &Value) -> Result<MaxFailures> {
    let bad = || {
        Error::config(
            "max_failures",
            format!(
                "expected a count (an integer >= 0) or a fraction in (0, 1] such as 0.05 or '5%', got {}",
                shown(v)
            ),
        )
    };
    let fraction = |f: f64| if f > 0.0 && f <= 1.0 { Ok(MaxFailures::Fraction(f)) } else { Err(bad()) };
    match v {
        Value::Number(n) if n.is_u64() => Ok(MaxFailures::Count(n.as_u64().unwrap_or(0))),
        Value::Number(n) => fraction(n.as_f64().ok_or_else(bad)?),
        Value::String(s) => match s.trim().strip_suffix('%') {
            Some(p) => fraction(p.trim().parse::<f64>().map_err(|_| bad())? / 100.0),
            None => Err(bad()),
        },
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{args, array_config, from_text, token_config, DEFAULT_SHARD_WINDOW};
    use crate::image::cache::CacheSpec;
    use crate::shell::store::CacheLocation;
    use serde_json::json;

    #[test]
    fn decode_is_checked_once_against_the_device_and_the_cache() {
        let cfg = |v: Value, on_gpu: bool| {
            let mut m = args(v);
            m.insert("batch_size".into(), json!(8));
            m.insert("preset".into(), json!("imagenet-val"));
            image_config(m, on_gpu).map(|c| c.0.decode)
        };
        assert_eq!(cfg(json!({}), true).unwrap(), DecodeOn::Cpu);
        assert_eq!(cfg(json!({"decode": "gpu"}), true).unwrap(), DecodeOn::Gpu(0.5));
        assert_eq!(cfg(json!({"decode": "GPU", "gpu_share": 0.25}), true).unwrap(), DecodeOn::Gpu(0.25));
        assert_eq!(cfg(json!({"decode": "gpu", "gpu_share": 1}), true).unwrap(), DecodeOn::Gpu(1.0));
        assert_eq!(cfg(json!({"decode": "auto"}), true).unwrap(), DecodeOn::Auto);
        // `auto` without a GPU, or with a cache, decodes on the CPU; `gpu` says what it needs.
        assert_eq!(cfg(json!({"decode": "auto"}), false).unwrap(), DecodeOn::Cpu);
        let e = cfg(json!({"decode": "gpu"}), false).unwrap_err().to_string();
        assert!(e.contains("`decode`") && e.contains("device='cuda'"), "{e}");
        let cached = json!({"decode": "gpu", "cache": "ram", "cache_bytes": "1MiB"});
        let e = cfg(cached, true).unwrap_err().to_string();
        assert!(e.contains("no cache"), "{e}");
        // The GPU resampler has every filter; augmentations past the crop run on the CPU's
        // crop, so `gpu` refuses them and `auto` decodes on the CPU.
        let with = |decode: &str, extra: Value| {
            let mut ops = vec![json!({"op": "RandomResizedCrop", "size": [8, 8], "scale": [0.5, 1.0],
                                      "ratio": [1.0, 1.0], "interpolation": "bicubic"})];
            ops.extend(extra.as_array().cloned().unwrap_or_default());
            let mut m = args(json!({"batch_size": 8, "decode": decode, "ops": ops}));
            m.remove("preset");
            image_config(m, true).map(|c| c.0.decode)
        };
        assert_eq!(with("gpu", json!([])).unwrap(), DecodeOn::Gpu(0.5));
        assert_eq!(with("auto", json!([])).unwrap(), DecodeOn::Auto);
        let jitter = json!([{"op": "RandomGrayscale", "p": 0.5}]);
        let e = with("gpu", jitter.clone()).unwrap_err().to_string();
        assert!(e.contains("`decode`") && e.contains("no augmentations"), "{e}");
        assert_eq!(with("auto", jitter).unwrap(), DecodeOn::Cpu);
        // Batch mixing is checked once; on a GPU the images are mixed there, after their
        // normalisation (the host makes the soft labels), whatever the dtype.
        let mix = |spec: Value, on_gpu: bool| {
            let mut m = args(json!({"batch_size": 8, "preset": "imagenet-train"}));
            m.insert("batch_transform".into(), spec);
            image_config(m, on_gpu).map(|c| c.0.mix)
        };
        let good = json!({"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "prob": 1.0, "switch_prob": 0.5,
                          "label_smoothing": 0.1, "num_classes": 1000, "style": "timm"});
        use crate::image::ops::mix::MixImages;
        let host = mix(good.clone(), false).unwrap().unwrap();
        assert_eq!((host.num_classes, host.images), (1000, MixImages::Host));
        let device = mix(good.clone(), true).unwrap().unwrap();
        // Where the images are mixed is not in the spec's JSON (the fingerprint): the batches are
        // the same, so a state saved on a GPU resumes on the host.
        assert_eq!(serde_json::to_value(&device).unwrap(), serde_json::to_value(&host).unwrap());
        assert_eq!(device, crate::image::ops::mix::MixSpec { images: MixImages::Device, ..host });
        for dtype in ["uint8", "float16", "bfloat16"] {
            let mut m = args(json!({"batch_size": 8, "preset": "imagenet-train", "dtype": dtype}));
            m.insert("batch_transform".into(), good.clone());
            let (c, norm) = image_config(m, true).unwrap();
            assert_eq!(c.mix.unwrap().images, MixImages::Device, "{dtype}");
            assert_eq!((c.transform.dtype, norm.is_some()), (DType::Uint8, dtype != "uint8"), "{dtype}");
        }
        let mut both = good.clone();
        both["style"] = json!("torchvision");
        assert!(mix(both, false).is_ok(), "torchvision's RandomChoice([MixUp, CutMix])");
        let e = mix(json!({"mixup_alpha": 1.0}), false).unwrap_err().to_string();
        assert!(e.contains("`batch_transform`") && e.contains("MixUp"), "{e}");
        for (bad, name) in [
            (json!({"decode": "gpu", "gpu_share": 0}), "gpu_share"),
            (json!({"decode": "gpu", "gpu_share": 1.5}), "gpu_share"),
            (json!({"decode": "gpu", "gpu_share": "half"}), "gpu_share"),
            (json!({"decode": "auto", "gpu_share": 0.5}), "gpu_share"),
            (json!({"decode": "nvjpeg"}), "decode"),
            (json!({"decode": 1}), "decode"),
        ] {
            let e = cfg(bad.clone(), true).unwrap_err();
            assert!(matches!(&e, Error::Config { .. }) && e.to_string().contains(&format!("`{name}`")), "{bad}: {e}");
        }
    }

    #[test]
    fn interpolation_sets_the_presets_filter_and_is_checked() {
        use crate::image::ops::Interpolation;
        let cfg = |i: &str| {
            loader_config(from_text([
                ("batch_size", Some("8".to_string())),
                ("preset", Some("imagenet-val".to_string())),
                ("interpolation", Some(i.to_string())),
            ]))
        };
        assert_eq!(cfg("bicubic").unwrap().transform.interpolation(), Interpolation::Bicubic);
        assert_eq!(cfg("nearest").unwrap().transform.interpolation(), Interpolation::Nearest);
        let e = cfg("cubic").unwrap_err().to_string();
        assert!(e.contains("`interpolation`") && e.contains("allowed: bilinear, bicubic, nearest"), "{e}");
    }

    #[test]
    fn the_gpu_normalises_what_the_host_would() {
        use crate::image::ops::{OpSpec, IMAGENET_MEAN, IMAGENET_STD};
        let a = |v: Value| {
            let mut m = args(v);
            m.insert("batch_size".into(), json!(8));
            m
        };
        let norm_ops =
            |c: &LoaderConfig| c.transform.ops.iter().filter(|o| matches!(o, OpSpec::Normalize { .. })).count();
        // On the host: the transform as asked, nothing for a GPU; bfloat16 is refused there.
        let (host, n) = image_config(a(json!({"preset": "imagenet-train"})), false).unwrap();
        assert!(n.is_none() && host.transform.dtype == DType::Float32 && norm_ops(&host) == 1);
        let e = image_config(a(json!({"preset": "imagenet-val", "dtype": "bfloat16"})), false).unwrap_err();
        assert!(matches!(&e, Error::Config { .. }) && e.to_string().contains("bfloat16"), "{e}");
        // On a GPU: uint8 over the bus, Normalize's mean and std (and the dtype) for the GPU side.
        for (dtype, want) in [(None, "float32"), (Some("float16"), "float16"), (Some("bfloat16"), "bfloat16")] {
            let mut v = json!({"preset": "imagenet-train", "layout": "NHWC"});
            if let Some(d) = dtype {
                v["dtype"] = d.into();
            }
            let (gpu, n) = image_config(a(v), true).unwrap();
            let n = n.expect("normalised on the GPU");
            assert_eq!((n.mean, n.std, n.dtype.as_str(), n.channels_last), (IMAGENET_MEAN, IMAGENET_STD, want, true));
            assert!(gpu.transform.dtype == DType::Uint8 && norm_ops(&gpu) == 0, "{:?}", gpu.transform);
            let host = image_config(a(json!({"preset": "imagenet-train"})), false).unwrap().0;
            assert_eq!(gpu.transform.ops.len(), host.transform.ops.len() - 1, "only Normalize is dropped");
        }
        // uint8 asked: nothing to normalise anywhere.
        let (gpu, n) = image_config(a(json!({"preset": "imagenet-val", "dtype": "uint8"})), true).unwrap();
        assert!(n.is_none() && gpu.transform.dtype == DType::Uint8);
        // Transforms to [0, 1] floats without Normalize: mean 0, std 1 on the GPU.
        let ops = json!([{"op": "CenterCrop", "size": [8, 8]}]);
        let (_, n) = image_config(a(json!({"ops": ops, "dtype": "float32"})), true).unwrap();
        let n = n.unwrap();
        assert_eq!((n.mean, n.std, n.channels_last), ([0.0; 3], [1.0; 3], false));
    }

    #[test]
    fn loader_arguments() {
        let c = loader_config(args(json!({"batch_size": 8, "preset": "imagenet-val", "shuffle": "shards",
            "memory_limit": "1MiB", "threads": "auto", "rank": 1, "world_size": 2, "dtype": "uint8"})))
        .unwrap();
        assert_eq!(c.sampler.batch_size, 8);
        assert_eq!(c.sampler.shard_window, Some(DEFAULT_SHARD_WINDOW));
        assert_eq!(c.memory_limit, Some(1 << 20));
        assert_eq!((c.sampler.rank, c.sampler.world_size), (1, 2));
        assert_eq!(c.transform.dtype, DType::Uint8);
        // The same from flag text.
        let t = loader_config(from_text([
            ("batch_size", Some("8".to_string())),
            ("preset", Some("imagenet-val".into())),
            ("shuffle", Some("true".into())),
            ("world_size", Some("1".into())),
        ]))
        .unwrap();
        assert!(t.sampler.shuffle && t.sampler.shard_window.is_none());
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        assert!(err(json!({"preset": "imagenet-val", "rank": 2, "world_size": 2})).contains("`rank`"));
        assert!(err(json!({"preset": "imagenet-val", "batch_sise": 2})).contains("`batch_sise`: unknown argument"));
        assert!(err(json!({"preset": "nope"})).contains("imagenet-train"));
        assert!(err(json!({})).contains("`preset`"));
        assert!(err(json!({"preset": "imagenet-val", "shuffle": "yes"})).contains("'shards'"));
        // Python's text, floats and booleans for numbers are refused, naming the argument;
        // a flag's text for a text argument stays text even when it looks like a number.
        for (k, v) in [("batch_size", json!("8")), ("seed", json!(1.0)), ("prefetch", json!(true))] {
            let e = err(json!({"preset": "imagenet-val", k: v}));
            assert!(e.starts_with(&format!("invalid argument `{k}`")), "{e}");
        }
        let e = token_config(args(json!({"seq_len": "128"}))).unwrap_err().to_string();
        assert!(e.contains("`seq_len`") && e.contains("(a str)"), "{e}");
        let (t, _) =
            token_config(from_text([("text_key", Some("123".into())), ("seq_len", Some("64".into()))])).unwrap();
        assert_eq!((t.text_key.as_str(), t.seq_len), ("123", 64));
        assert!(err(json!({"preset": "imagenet-val", "on_error": "ignore"})).contains("skip, raise"));
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "ram", "cache_bytes": "8GiB"}))).unwrap();
        assert_eq!(
            c.cache,
            Some(CacheSpec { location: CacheLocation::Ram, bytes: Some(8 << 30), max_side: None, ttl: None })
        );
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "/tmp/c"}))).unwrap();
        assert_eq!(
            c.cache,
            Some(CacheSpec { location: CacheLocation::Dir("/tmp/c".into()), bytes: None, max_side: None, ttl: None })
        );
        assert!(err(json!({"preset": "imagenet-val", "cache": "ram", "cache_bytes": "8 parsecs"}))
            .contains("`cache_bytes`"));
        assert!(err(json!({"preset": "imagenet-val", "cache_bytes": "1GiB"})).contains("`cache_bytes`: needs cache"));
        assert!(err(json!({"preset": "imagenet-val", "cache": 3})).contains("`cache`: expected None, 'ram'"));
        assert!(err(json!({"preset": "imagenet-val", "cache": ""})).contains("`cache`"));
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "ram", "cache_max_side": 320}))).unwrap();
        assert_eq!(c.cache.unwrap().max_side, Some(320));
        assert!(err(json!({"preset": "imagenet-val", "cache_max_side": 320})).contains("`cache_max_side`: needs cache"));
        assert!(err(json!({"preset": "imagenet-val", "cache": "ram", "cache_max_side": 0})).contains("at least 1"));
        assert!(array_config(args(json!({"shuffle": "shards"}))).unwrap_err().to_string().contains("False or True"));
        // The shard cache, by the same rules; `shuffle="global"` is remembered apart from True.
        let c = loader_config(args(
            json!({"preset": "imagenet-val", "shard_cache": "/nvme/s", "shard_cache_bytes": "2GiB"}),
        ))
        .unwrap();
        let want = crate::shell::store::StoreSpec {
            location: CacheLocation::Dir("/nvme/s".into()),
            bytes: Some(2 << 30),
            ttl: None,
        };
        assert_eq!(c.shard_cache, Some(want));
        assert!(
            err(json!({"preset": "imagenet-val", "shard_cache_bytes": "1GiB"})).contains("`shard_cache_bytes`: needs")
        );
        assert!(
            err(json!({"preset": "imagenet-val", "shard_cache": 1})).contains("`shard_cache`: expected None, 'ram'")
        );
        let global = loader_config(args(json!({"preset": "imagenet-val", "shuffle": "global"}))).unwrap();
        let plain = loader_config(args(json!({"preset": "imagenet-val", "shuffle": true}))).unwrap();
        assert!(global.shuffle_global && !plain.shuffle_global && global.sampler == plain.sampler);
    }

    #[test]
    fn autotune_arguments() {
        let c = loader_config(args(json!({"preset": "imagenet-val", "prefetch": "auto", "cpu_budget": 1.5}))).unwrap();
        assert!(c.prefetch_auto);
        assert_eq!(c.cpu_budget, Some(1.5));
        let c = loader_config(from_text([
            ("preset", Some("imagenet-val".to_string())),
            ("cpu_budget", Some("3".into())),
            ("prefetch", Some("4".into())),
        ]))
        .unwrap();
        assert_eq!((c.cpu_budget, c.prefetch, c.prefetch_auto), (Some(3.0), 4, false));
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        for bad in [json!(0), json!(-1), json!("lots"), json!(true), json!(1e9)] {
            let e = err(json!({"preset": "imagenet-val", "cpu_budget": bad}));
            assert!(e.contains("`cpu_budget`") && e.contains("number of cores"), "{e}");
        }
        assert!(err(json!({"preset": "imagenet-val", "prefetch": "soon"})).contains("`prefetch`"));
        assert!(array_config(args(json!({"prefetch": "auto"}))).unwrap_err().to_string().contains("`prefetch`"));
    }

    #[test]
    fn failure_budgets() {
        assert_eq!(max_failures(&json!(100)).unwrap(), MaxFailures::Count(100));
        assert_eq!(max_failures(&json!("5%")).unwrap(), MaxFailures::Fraction(0.05));
        assert_eq!(max_failures(&json!(0.5)).unwrap(), MaxFailures::Fraction(0.5));
        for bad in [json!("100"), json!(1.5), json!("0%"), json!(-1), json!(true)] {
            let e = max_failures(&bad).unwrap_err().to_string();
            assert!(e.contains("`max_failures`") && e.contains("a fraction in (0, 1]"), "{bad}: {e}");
        }
    }
}
