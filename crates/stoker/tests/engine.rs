//! Integration tests of the engine: decode fidelity, determinism, resume, bad input, shutdown.

mod common;

use common::*;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::decode::{DecodeOptions, Decoder};
use stoker::ops::{Resampler, TransformPlan};
use stoker::rng::Rng;
use stoker::shell::sampled::SampledState;
use stoker::*;

fn uint8_spec(ops: Vec<OpSpec>, layout: Layout) -> TransformSpec {
    TransformSpec { ops, dtype: DType::Uint8, layout, apply_exif: true }
}

fn digest_all(loader: &Loader) -> (String, usize) {
    let mut d = Digest::new();
    let mut n = 0;
    for b in loader.iter().unwrap() {
        d.update(&b.unwrap());
        n += 1;
    }
    (d.hex(), n)
}

#[test]
fn pixels_equal_libjpeg_full_decode_when_nothing_scales() {
    let d = tempfile::tempdir().unwrap();
    let (w, h) = (320, 240);
    let data = jpeg(&photo_sized("chelsea", w, h), w, h, 90);
    std::fs::create_dir_all(d.path().join("c")).unwrap();
    std::fs::write(d.path().join("c/a.jpg"), &data).unwrap();
    let (reference, rw, rh) = reference_decode(&data);
    assert_eq!((rw, rh), (w, h));

    // The decoder alone.
    let (px, _, _) = Decoder::new(DecodeOptions::default()).unwrap().decode_full(&data, Path::new("a.jpg")).unwrap();
    assert_eq!(px, reference);

    // The whole pipeline: a center crop of the full size is an identity transform.
    let spec = uint8_spec(vec![OpSpec::CenterCrop { size: [h, w] }], Layout::NHWC);
    let loader = Loader::new(Arc::new(ImageFolder::new(d.path()).unwrap()), LoaderConfig::new(1, spec)).unwrap();
    let b = loader.iter().unwrap().next().unwrap().unwrap();
    assert_eq!(b.shape(), [1, h, w, 3]);
    assert_eq!(b.data(), &reference[..]);
}

#[test]
fn scaled_and_cropped_decode_stays_close_to_full_decode() {
    // A large photo-like JPEG: RandomResizedCrop to 224 picks DCT scales 1/2..1/8 for most
    // boxes and always decodes only the box's region.
    let (w, h) = (1600, 1200);
    let data = jpeg(&photo_sized("coffee", w, h), w, h, 90);
    let spec = TransformSpec::preset("imagenet-train").unwrap().with_dtype(DType::Uint8);
    let plan = TransformPlan::compile(&spec).unwrap();
    let mut fast = Decoder::new(DecodeOptions::default()).unwrap();
    let mut full =
        Decoder::new(DecodeOptions { apply_exif: true, dct_scaling: false, roi: false, ..DecodeOptions::default() })
            .unwrap();
    let (mut rs1, mut rs2) = (Resampler::new(), Resampler::new());
    let mut scaled = 0;
    let mut worst: f64 = 0.0;
    for i in 0..60 {
        let info = fast.info(&data, Path::new("x")).unwrap();
        let g = plan.geometry(info.width, info.height, &mut Rng::new(3, 2, i));
        let a = fast.decode(&data, Path::new("x"), &info, g.bbox, (224, 224)).unwrap();
        if a.scale_num < 8 {
            scaled += 1;
        }
        let (aw, ah, abox) = (a.width, a.height, a.bbox);
        let out_a = rs1.resample(g.filter, a.pixels, aw, ah, abox, g.hard, g.dst, 224, 224).unwrap().to_vec();
        let b = full.decode(&data, Path::new("x"), &info, g.bbox, (224, 224)).unwrap();
        assert_eq!((b.width, b.height, b.scale_num), (w, h, 8));
        let out_b = rs2.resample(g.filter, b.pixels, b.width, b.height, b.bbox, g.hard, g.dst, 224, 224).unwrap();
        let err = mean_abs(&out_a, out_b);
        worst = worst.max(err);
        assert!(err <= 2.0, "sample {i}: mean abs error {err:.3} > 2 (scale {}/8, box {:?})", 8, g.bbox);
    }
    assert!(scaled >= 20, "only {scaled} of 60 decodes used DCT scaling");
    eprintln!("worst mean abs error over 60 RRC samples: {worst:.3}");
}

#[test]
fn region_decode_without_scaling_is_exact_within_the_box() {
    // At scale 1 a region decode gives the same pixels as a full decode (libjpeg-turbo's
    // cropping is lossless), so RRC output is bit-identical with and without ROI.
    let (w, h) = (640, 480);
    let data = jpeg(&photo_sized("rocket", w, h), w, h, 85);
    let spec = TransformSpec::preset("imagenet-train").unwrap().with_dtype(DType::Uint8);
    let plan = TransformPlan::compile(&spec).unwrap();
    let mut roi =
        Decoder::new(DecodeOptions { apply_exif: true, dct_scaling: false, roi: true, ..DecodeOptions::default() })
            .unwrap();
    let mut full =
        Decoder::new(DecodeOptions { apply_exif: true, dct_scaling: false, roi: false, ..DecodeOptions::default() })
            .unwrap();
    let (mut rs1, mut rs2) = (Resampler::new(), Resampler::new());
    for i in 0..30 {
        let info = roi.info(&data, Path::new("x")).unwrap();
        let g = plan.geometry(info.width, info.height, &mut Rng::new(5, 2, i));
        let a = roi.decode(&data, Path::new("x"), &info, g.bbox, (224, 224)).unwrap();
        let out_a =
            rs1.resample(g.filter, a.pixels, a.width, a.height, a.bbox, g.hard, g.dst, 224, 224).unwrap().to_vec();
        let b = full.decode(&data, Path::new("x"), &info, g.bbox, (224, 224)).unwrap();
        let out_b = rs2.resample(g.filter, b.pixels, b.width, b.height, b.bbox, g.hard, g.dst, 224, 224).unwrap();
        assert!(
            out_a == out_b,
            "sample {i}: ROI changed pixels (mean difference {}), box {:?}",
            mean_abs(&out_a, out_b),
            g.bbox
        );
    }
}

#[test]
fn grayscale_cmyk_png_and_alpha_become_rgb() {
    let (w, h) = (64, 48);
    let rgb = photo_sized("astronaut", w, h);
    let mut dec = Decoder::new(DecodeOptions::default()).unwrap();

    // Grayscale JPEG: R = G = B.
    let gray: Vec<u8> = rgb.chunks(3).map(|p| p[1]).collect();
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_subsamp(turbojpeg::Subsamp::Gray).unwrap();
    let g = c
        .compress_to_vec(turbojpeg::Image {
            pixels: &gray[..],
            width: w,
            pitch: w,
            height: h,
            format: turbojpeg::PixelFormat::GRAY,
        })
        .unwrap();
    let (px, _, _) = dec.decode_full(&g, Path::new("g.jpg")).unwrap();
    assert!(px.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    assert!(mean_abs(&px.chunks(3).map(|p| p[0]).collect::<Vec<_>>(), &gray) < 3.0);

    // CMYK JPEG (inverted, Adobe style): pure cyan-free white and a dark patch.
    let mut cmyk = vec![0u8; w * h * 4];
    for (k, p) in cmyk.chunks_mut(4).enumerate() {
        // Inverted CMYK: 255 = no ink. Left half white, right half black ink.
        let dark = (k % w) >= w / 2;
        p.copy_from_slice(&[255, 255, 255, if dark { 0 } else { 255 }]);
    }
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(95).unwrap();
    let cm = c
        .compress_to_vec(turbojpeg::Image {
            pixels: &cmyk[..],
            width: w,
            pitch: w * 4,
            height: h,
            format: turbojpeg::PixelFormat::CMYK,
        })
        .unwrap();
    let (px, _, _) = dec.decode_full(&cm, Path::new("c.jpg")).unwrap();
    let (left, right) =
        (&px[(h / 2 * w + 2) * 3..(h / 2 * w + 2) * 3 + 3], &px[(h / 2 * w + w - 3) * 3..(h / 2 * w + w - 3) * 3 + 3]);
    assert!(left.iter().all(|&v| v > 245), "white side {left:?}");
    assert!(right.iter().all(|&v| v < 10), "black side {right:?}");

    // PNG: RGBA drops alpha, 16-bit keeps the high byte, grayscale replicates.
    for (color, depth, bytes_pp) in [
        (png::ColorType::Rgba, png::BitDepth::Eight, 4),
        (png::ColorType::Rgb, png::BitDepth::Sixteen, 6),
        (png::ColorType::Grayscale, png::BitDepth::Eight, 1),
    ] {
        let mut raw = vec![0u8; w * h * bytes_pp];
        for (k, v) in raw.iter_mut().enumerate() {
            *v = (k * 7 % 251) as u8;
        }
        let mut out = vec![];
        {
            let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
            e.set_color(color);
            e.set_depth(depth);
            let mut wr = e.write_header().unwrap();
            wr.write_image_data(&raw).unwrap();
        }
        let (px, pw, ph) = dec.decode_full(&out, Path::new("p.png")).unwrap();
        assert_eq!((pw, ph, px.len()), (w, h, w * h * 3));
        let expect: Vec<u8> = match bytes_pp {
            4 => raw.chunks(4).flat_map(|p| p[..3].to_vec()).collect(),
            6 => raw.chunks(6).flat_map(|p| [p[0], p[2], p[4]]).collect(),
            _ => raw.iter().flat_map(|&v| [v, v, v]).collect(),
        };
        assert_eq!(px, expect, "{color:?} {depth:?}");
    }
}

#[test]
fn exif_orientation_is_applied_or_ignored() {
    let (w, h) = (96, 64);
    let plain = jpeg(&photo_sized("rocket", w, h), w, h, 90);
    let (base, _, _) = reference_decode(&plain);
    for o in 2..=8u8 {
        let data = with_exif(&plain, o as u16);
        let mut on = Decoder::new(DecodeOptions::default()).unwrap();
        let (px, pw, ph) = on.decode_full(&data, Path::new("o.jpg")).unwrap();
        let swapped = o >= 5;
        assert_eq!((pw, ph), if swapped { (h, w) } else { (w, h) }, "orientation {o}");
        let mut expect = vec![0u8; w * h * 3];
        stoker::decode::orient(&base, w, h, o, &mut expect);
        assert_eq!(px, expect, "orientation {o}");
        let mut off = Decoder::new(DecodeOptions { apply_exif: false, ..DecodeOptions::default() }).unwrap();
        let (px, pw, ph) = off.decode_full(&data, Path::new("o.jpg")).unwrap();
        assert_eq!((pw, ph), (w, h));
        assert_eq!(px, base);
    }
}

fn loader_for(root: &Path, bs: usize, shuffle: bool, threads: usize, preset: &str) -> Loader {
    let mut c = shuffled(bs, preset, threads);
    c.sampler.shuffle = shuffle;
    c.sampler.seed = 1234;
    folder_loader(root, c)
}

#[test]
fn batches_are_identical_whatever_the_thread_count() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 48);
    let (one, n1) = digest_all(&loader_for(&root, 8, true, 1, "imagenet-train"));
    let (four, n4) = digest_all(&loader_for(&root, 8, true, 4, "imagenet-train"));
    let (three, _) = digest_all(&loader_for(&root, 8, true, 3, "imagenet-train"));
    assert_eq!((n1, n4), (6, 6));
    assert_eq!(one, four);
    assert_eq!(one, three);
    // A different epoch or seed changes the batches.
    let l = loader_for(&root, 8, true, 2, "imagenet-train");
    l.set_epoch(1);
    assert_ne!(digest_all(&l).0, one);
}

#[test]
fn exact_batch_contents_for_a_seed() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 30);
    let folder = ImageFolder::new(&root).unwrap();
    let loader = loader_for(&root, 7, true, 2, "imagenet-val");
    let sampler = Sampler::new(30, loader.sampler().spec().clone()).unwrap();
    let order = sampler.epoch_order(0);
    let mut seen = vec![];
    for (b, batch) in loader.iter().unwrap().enumerate() {
        let batch = batch.unwrap();
        assert_eq!(batch.index(), b);
        assert_eq!(batch.indices(), sampler.batch(&order, b));
        let expect: Vec<i64> = batch.indices().iter().map(|&i| stoker::Source::label(&folder, i as usize)).collect();
        assert_eq!(batch.labels(), &expect[..]);
        seen.extend(batch.indices());
    }
    assert_eq!(seen.len(), 30); // no drop_last: 4 batches of 7 and one of 2
                                // Float32 values: normalised ImageNet statistics are within their theoretical range.
    let b = loader.iter().unwrap().next().unwrap().unwrap();
    let data = b.data();
    let f: Vec<f32> = data.chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
    assert!(f.iter().all(|v| (-2.2..=2.7).contains(v)));
}

#[test]
fn resume_from_every_batch_boundary_gives_the_remaining_batches() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let base = loader_for(&root, 4, true, 2, "imagenet-train");
    base.set_epoch(3);
    // Digest of each batch, in order.
    let per_batch: Vec<String> = base
        .iter()
        .unwrap()
        .map(|b| {
            let mut d = Digest::new();
            d.update(&b.unwrap());
            d.hex()
        })
        .collect();
    assert_eq!(per_batch.len(), 10);
    for start in 0..=10 {
        // Stop an iteration after `start` batches, save the state, restore it in a new loader.
        let a = loader_for(&root, 4, true, 2, "imagenet-train");
        a.set_epoch(3);
        {
            let mut it = a.iter().unwrap();
            for _ in 0..start {
                it.next().unwrap().unwrap();
            }
        }
        let st = a.state();
        assert_eq!(st.state, SamplerState { seed: 1234, epoch: 3, next_batch: start });
        assert_eq!(st.elastic, None);
        let json = serde_json::to_string(&st).unwrap();
        let b = loader_for(&root, 4, true, 1, "imagenet-train");
        b.load_state(serde_json::from_str(&json).unwrap()).unwrap();
        b.set_epoch(3); // the usual call at the top of an epoch loop keeps the position
        let rest: Vec<String> = if start == 10 {
            vec![]
        } else {
            b.iter()
                .unwrap()
                .map(|x| {
                    let mut d = Digest::new();
                    d.update(&x.unwrap());
                    d.hex()
                })
                .collect()
        };
        assert_eq!(rest, per_batch[start..], "resume at {start}");
    }
    // A state from another seed is refused.
    let other = SampledState { state: SamplerState { seed: 1, epoch: 0, next_batch: 0 }, elastic: None };
    let e = base.load_state(other).unwrap_err();
    assert!(e.to_string().contains("seed"), "{e}");
}

fn bad_folder(dir: &Path) -> std::path::PathBuf {
    bad_folder_of(dir, 14)
}

fn bad_folder_of(dir: &Path, good: usize) -> std::path::PathBuf {
    let root = demo_folder(dir, good);
    let good = std::fs::read(std::fs::read_dir(root.join("rocket")).unwrap().next().unwrap().unwrap().path()).unwrap();
    let c = root.join("chelsea");
    std::fs::write(c.join("zz_zero.jpg"), b"").unwrap();
    std::fs::write(c.join("zz_text.jpg"), b"this is not an image at all").unwrap();
    std::fs::write(c.join("zz_truncated.jpg"), &good[..good.len() / 2]).unwrap();
    let mut corrupt = good.clone();
    for b in corrupt[good.len() / 3..].iter_mut() {
        *b = 0x5a;
    }
    std::fs::write(c.join("zz_corrupt.jpg"), &corrupt).unwrap();
    std::fs::write(c.join("zz_bitmap.bmp"), b"BM\x00\x00\x00\x00rest").unwrap();
    std::os::unix::fs::symlink(c.join("does-not-exist.jpg"), c.join("zz_unreadable.jpg")).unwrap();
    root
}

#[test]
fn bad_samples_are_skipped_counted_and_listed() {
    let d = tempfile::tempdir().unwrap();
    let root = bad_folder(d.path());
    let mut c = LoaderConfig::new(5, TransformSpec::preset("imagenet-val").unwrap());
    c.sampler.drop_last = false;
    let loader = folder_loader(&root, c);
    assert_eq!(loader.len(), 4); // 20 files
    let mut delivered = 0;
    for b in loader.iter().unwrap() {
        let b = b.unwrap();
        assert_eq!(b.shape()[0], b.labels().len());
        delivered += b.len();
    }
    assert_eq!(delivered, 14);
    let r = loader.report();
    assert_eq!(r.skipped_count, 6);
    let reasons: std::collections::HashMap<String, String> = r
        .skipped
        .iter()
        .map(|s| (Path::new(&s.path).file_name().unwrap().to_string_lossy().into_owned(), s.reason.clone()))
        .collect();
    let expect = [
        ("zz_zero.jpg", "empty file"),
        ("zz_text.jpg", "not an image"),
        ("zz_truncated.jpg", "truncated"),
        ("zz_corrupt.jpg", "corrupt JPEG"),
        ("zz_bitmap.bmp", "unsupported image format BMP"),
        ("zz_unreadable.jpg", "No such file"),
    ];
    for (file, why) in expect {
        let got = reasons.get(file).unwrap_or_else(|| panic!("{file} not reported; got {reasons:?}"));
        assert!(got.contains(why), "{file}: {got}");
    }
    assert!(r.skipped.iter().all(|s| s.path.starts_with(root.to_str().unwrap())));
    assert!(r.to_text().contains("skipped 6 bad sample(s)"));
}

#[test]
fn raise_policy_stops_with_the_file_and_reason() {
    let d = tempfile::tempdir().unwrap();
    let root = bad_folder(d.path());
    let mut c = LoaderConfig::new(4, TransformSpec::preset("imagenet-val").unwrap());
    c.on_error = ErrorPolicy::Raise;
    let loader = folder_loader(&root, c);
    let mut err = None;
    for b in loader.iter().unwrap() {
        if let Err(e) = b {
            err = Some(e);
        }
    }
    let e = err.expect("an error was raised");
    let msg = e.to_string();
    assert!(msg.contains("chelsea/zz_"), "{msg}");
    assert!(matches!(e, Error::Decode { .. } | Error::Io { .. }), "{e:?}");
}

/// A consumer that keeps every batch (`list(loader)`) is served as long as the batches fit in
/// `memory_limit`: the pool grows past its base slots, each batch keeps its own contents, and
/// the batches are the same as those of a consumer that keeps none.
#[test]
fn a_consumer_that_keeps_batches_grows_the_pool_within_memory_limit() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let sample = 3 * 224 * 224;
    let mut c = LoaderConfig::new(4, TransformSpec::preset("imagenet-val").unwrap().with_dtype(DType::Uint8));
    c.prefetch = 1;
    c.threads = Some(2);
    c.memory_limit = Some((4 * sample * 10) as u64);
    let folder = Arc::new(ImageFolder::new(&root).unwrap());
    let loader = Loader::new(folder.clone(), c.clone()).unwrap();
    assert_eq!(loader.pool().slots(), 3);
    let streamed: Vec<Vec<u8>> = loader.iter().unwrap().map(|b| b.unwrap().data().to_vec()).collect();
    let kept: Vec<Batch> = loader.iter().unwrap().map(|b| b.unwrap()).collect();
    assert_eq!(kept.len(), 10);
    assert_eq!(kept.iter().map(|b| b.data().to_vec()).collect::<Vec<_>>(), streamed);
    drop(kept);
    // One batch less room: the tenth batch is refused, saying how much is held.
    c.memory_limit = Some((4 * sample * 9) as u64);
    let loader = Loader::new(folder, c).unwrap();
    let mut it = loader.iter().unwrap();
    let kept: Vec<Batch> = (0..9).map(|_| it.next().unwrap().unwrap()).collect();
    let e = it.next().unwrap().unwrap_err().to_string();
    assert!(e.contains("the consumer holds all 9 batch buffers (5.2 MiB, 602112 bytes each)"), "{e}");
    drop(kept);
}

#[test]
fn memory_limit_caps_the_pool_and_held_batches_error_instead_of_hanging() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let sample = 3 * 224 * 224 * 4;
    let mut c = LoaderConfig::new(4, TransformSpec::preset("imagenet-val").unwrap());
    c.memory_limit = Some((4 * sample * 2 + 100) as u64);
    let folder = Arc::new(ImageFolder::new(&root).unwrap());
    let loader = Loader::new(folder.clone(), c.clone()).unwrap();
    assert_eq!(loader.pool().slots(), 2);
    let mut it = loader.iter().unwrap();
    let a = it.next().unwrap().unwrap();
    let b = it.next().unwrap().unwrap();
    let t = Instant::now();
    let e = it.next().unwrap().unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(e.to_string().contains("the consumer holds all 2 batch buffers"), "{e}");
    assert!(
        e.to_string().contains(&format!(
            "one more would pass memory_limit of {:.1} MiB",
            (4 * sample * 2 + 100) as f64 / 1048576.0
        )),
        "{e}"
    );
    // Held batches kept their contents while we waited.
    assert_eq!(a.index(), 0);
    assert_eq!(b.index(), 1);
    drop((a, b));
    c.memory_limit = Some(1000);
    let e = Loader::new(folder, c).unwrap_err();
    assert!(e.to_string().contains("cannot hold one batch"), "{e}");
}

#[test]
fn bad_arguments_and_datasets_have_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 8);
    let folder = Arc::new(ImageFolder::new(&root).unwrap());
    let mut c = LoaderConfig::new(100, TransformSpec::preset("imagenet-val").unwrap());
    c.sampler.drop_last = true;
    let e = Loader::new(folder.clone(), c).unwrap_err();
    assert!(e.to_string().contains("batch_size"), "{e}");
    let mut c = LoaderConfig::new(2, TransformSpec::preset("imagenet-val").unwrap());
    c.threads = Some(0);
    assert!(Loader::new(folder, c).unwrap_err().to_string().contains("threads"));
}

#[test]
fn a_decoder_recovers_after_every_kind_of_bad_file() {
    // Regression: a TurboJPEG handle reused after a failed header read must decode the next
    // good file exactly as a fresh handle does.
    let d = tempfile::tempdir().unwrap();
    let root = bad_folder(d.path());
    let spec = TransformSpec::preset("imagenet-val").unwrap().with_dtype(DType::Uint8);
    let plan = TransformPlan::compile(&spec).unwrap();
    let mut goods = vec![];
    for class in ["rocket", "hubble", "coffee", "astronaut"] {
        for e in std::fs::read_dir(root.join(class)).unwrap() {
            goods.push(std::fs::read(e.unwrap().path()).unwrap());
        }
    }
    let bads: Vec<_> = std::fs::read_dir(root.join("chelsea"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("zz_"))
        .filter_map(|p| std::fs::read(p).ok())
        .collect();
    let run = |dec: &mut Decoder, data: &[u8]| -> stoker::Result<Vec<u8>> {
        let info = dec.info(data, Path::new("x"))?;
        let g = plan.geometry(info.width, info.height, &mut Rng::new(0, 2, 0));
        let r = dec.decode(data, Path::new("x"), &info, g.bbox, (g.dst[2], g.dst[3]))?;
        Ok(r.pixels.to_vec())
    };
    // Random sequences of good and bad files through one decoder must give, file by file,
    // what a fresh decoder gives.
    let all: Vec<&Vec<u8>> = goods.iter().chain(bads.iter()).collect();
    let fresh: Vec<Option<Vec<u8>>> =
        all.iter().map(|f| run(&mut Decoder::new(DecodeOptions::default()).unwrap(), f).ok()).collect();
    for round in 0..40u64 {
        let mut order: Vec<usize> = (0..all.len()).collect();
        stoker::rng::shuffle(&mut order, &mut Rng::new(round, 9, 0));
        let mut reused = Decoder::new(DecodeOptions::default()).unwrap();
        for &k in &order {
            assert_eq!(run(&mut reused, all[k]).ok(), fresh[k], "round {round}, file {k}");
        }
    }
}

#[test]
fn skip_counts_are_stable_across_runs() {
    // Regression: good samples were occasionally reported as corrupt after a bad one.
    let d = tempfile::tempdir().unwrap();
    let root = bad_folder_of(d.path(), 96);
    for round in 0..30 {
        let mut c = LoaderConfig::new(8, TransformSpec::preset("imagenet-val").unwrap());
        c.threads = Some(2);
        let loader = folder_loader(&root, c);
        let mut it = loader.iter().unwrap();
        let mut n = 0;
        loop {
            // Short polls, as the Python binding does, on odd rounds.
            let next = if round % 2 == 1 {
                it.next_timeout(Duration::from_millis(1))
            } else {
                it.next().map_or(Next::End, Next::Item)
            };
            match next {
                Next::NotYet => continue,
                Next::End => break,
                Next::Item(b) => n += b.unwrap().len(),
            }
        }
        let r = loader.report();
        let names: Vec<_> = r.skipped.iter().map(|s| format!("{}: {}", s.path, s.reason)).collect();
        assert_eq!((n, r.skipped_count), (96, 6), "round {round}: {names:#?}");
    }
}
