//! Per-sample work on a decode thread: decode (or read the decoded-pixel cache), run the ops
//! and write the sample straight into its slot of the batch buffer.

use super::shared::{sample_args, Images, Task};
use super::*;

pub(super) fn process(
    sh: &Images,
    dec: &mut Decoder,
    rs: &mut Resampler,
    epoch: u64,
    task: &Task,
    data: &[u8],
) -> Result<i64> {
    if let Some(cache) = &sh.cache {
        return process_cached(sh, cache, dec, rs, epoch, task, data);
    }
    let t0 = Instant::now();
    let nopath = Path::new("");
    let info = dec.info(data, nopath)?;
    let g = sh.plan.geometry(info.width, info.height, &mut augment_rng(sh, epoch, task));
    if let Some(share) = sh.gpu.get() {
        if share.takes(task.pos) && defer(sh, task, data, &info, &g) {
            let t1 = Instant::now();
            sh.counters.decode.record(t1 - t0);
            if let Some((d, tally)) = sh.mixed(task.slot.index(task.pos)) {
                tally.worked(d, (t1 - t0).as_nanos() as u64);
            }
            if let Some(t) = &sh.tracer {
                t.span("gpu", "sample", t0, t1, sample_args(task));
            }
            return Ok(sh.source.label(task.slot.index(task.pos) as usize));
        }
    }
    let region = dec.decode_box(data, nopath, &info, g.bbox, (g.dst[2], g.dst[3]), g.hard)?;
    finish(sh, rs, task, epoch, t0, "decode", region.pixels, (region.width, region.height), region.bbox, &g)
}

/// Leaves a sample to GPU decode: writes its record and JPEG into its slot and marks the
/// position. `false` (nothing written) when the image is not one nvJPEG decodes as the CPU
/// would, or its bytes do not fit in the slot: the sample is then decoded here.
fn defer(
    sh: &Images,
    task: &Task,
    data: &[u8],
    info: &crate::image::decode::ImageInfo,
    g: &crate::image::ops::Geometry,
) -> bool {
    use crate::image::gpu_job::{gpu_decodable, GpuJob};
    // The GPU resampler's taps per axis end at a downscale of 32x bilinear, 16x bicubic (as do
    // few real crops), and images past GPU_MAX_PIXELS (a small JPEG can still claim a huge
    // image) stay here.
    let most = crate::image::gpu_job::gpu_max_downscale(g.filter.interpolation);
    let reach = |len: f64, out: usize| out > 0 && len / out as f64 <= most;
    if !gpu_decodable(data, info.orientation)
        || !reach(g.bbox[2], g.dst[2])
        || !reach(g.bbox[3], g.dst[3])
        || (info.width as u64) * (info.height as u64) > crate::image::gpu_job::GPU_MAX_PIXELS
    {
        return false;
    }
    let (oh, ow) = sh.plan.output_size();
    let clip = crate::image::ops::clip_window(g.bbox, g.hard, info.width, info.height);
    let u = |v: usize| v as u32;
    let job = GpuJob {
        jpeg_len: 0,
        size: [u(info.width), u(info.height)],
        bbox: g.bbox,
        clip: clip.map(u),
        dst: g.dst.map(u),
        out: [u(ow), u(oh)],
        flip: g.flip,
        nhwc: sh.plan.spec().layout == Layout::NHWC,
        filter: g.filter,
    };
    // SAFETY: this worker owns position `task.pos` of the slot until `complete` is called.
    let out = unsafe { task.slot.sample_mut(task.pos) };
    if !job.write(data, out) {
        return false;
    }
    task.slot.defer(task.pos);
    true
}

/// An image-text pair's caption: taken from its member `text` and encoded into the sample's
/// rows of ids and mask (the slot's extra regions 0 and 1). Images alone: nothing. A caption
/// that is missing from its JSON member or not UTF-8 is the sample's error.
pub(super) fn caption(sh: &Images, task: &Task, text: &[u8]) -> Result<()> {
    let Some(c) = &sh.captions else { return Ok(()) };
    let t0 = Instant::now();
    let bad = |why: String| Error::decode("", format!("its caption: {why}"));
    let caption = c.field.caption(text).map_err(bad)?;
    let n = c.encoder.options().context_length;
    // SAFETY: this worker owns position `task.pos` of the slot until `complete` is called;
    // each region holds `n` int32 values per position at a 4-aligned offset of a 64-aligned
    // buffer, and regions 0 and 1 are distinct buffers.
    let (ids, mask) = unsafe {
        let rows = |k: usize| {
            let b = task.slot.extra_mut(k, task.pos);
            std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<i32>(), n)
        };
        (rows(0), rows(1))
    };
    c.encoder.encode_into(&caption, ids, mask).map_err(|e| match e {
        Error::Decode { reason, .. } => bad(reason),
        other => other,
    })?;
    sh.counters.caption.record(t0.elapsed());
    Ok(())
}

/// The random stream of one sample's augmentations (seed, epoch, dataset index).
pub(super) fn augment_rng(sh: &Images, epoch: u64, task: &Task) -> Rng {
    let index = task.slot.index(task.pos);
    Rng::new(sh.sampler.spec().seed, rng::stream::AUGMENT ^ (epoch << 8), u64::from(index))
}

/// The random stream of one sample's photometric and policy augmentations and its erase (seed,
/// epoch, dataset index), apart from the geometry's so that adding an augmentation does not
/// change the crops.
pub(super) fn photometric_rng(sh: &Images, epoch: u64, task: &Task) -> Rng {
    let index = task.slot.index(task.pos);
    Rng::new(sh.sampler.spec().seed, rng::stream::PHOTOMETRIC ^ (epoch << 8), u64::from(index))
}

/// The ops of one sample whose pixels (`size` RGB8) are ready: resamples `bbox` of them as `g`
/// says into the sample's slot, records the decode time (since `t0`; traced as `got`:
/// `decode`, or `cache` for pixels read from the cache) and the ops time, and returns the label.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
    sh: &Images,
    rs: &mut Resampler,
    task: &Task,
    epoch: u64,
    t0: Instant,
    got: &'static str,
    pixels: &[u8],
    size: (usize, usize),
    bbox: [f64; 4],
    g: &crate::image::ops::Geometry,
) -> Result<i64> {
    let t1 = Instant::now();
    sh.counters.decode.record(t1 - t0);
    let (oh, ow) = sh.plan.output_size();
    rs.resample(g.filter, pixels, size.0, size.1, bbox, g.hard, g.dst, ow, oh)?;
    // SAFETY: this worker owns position `task.pos` of the slot until `complete` is called.
    let out = unsafe { task.slot.sample_mut(task.pos) };
    let t2 = if sh.plan.augments() {
        // The augmentations: the crop in place, the write, then the erase on the slot; their
        // time (everything but the resample and the write) is the `augment` stage's.
        let ta = Instant::now();
        let mut rng = photometric_rng(sh, epoch, task);
        let mut timed = |kind: usize, d: Duration| sh.counters.augment_op(kind, d);
        let flip = sh.plan.augment(rs.output_mut(), g.flip, &mut rng, &mut timed);
        let tw = Instant::now();
        sh.plan.write(rs.output_mut(), flip, out);
        let te = Instant::now();
        sh.plan.erase(out, &mut rng, &mut timed);
        let t2 = Instant::now();
        sh.counters.augment.record((tw - ta) + (t2 - te));
        t2
    } else {
        sh.plan.write(rs.output_mut(), g.flip, out);
        Instant::now()
    };
    sh.counters.ops.record(t2 - t1);
    if let Some((d, tally)) = sh.mixed(task.slot.index(task.pos)) {
        tally.worked(d, (t2 - t0).as_nanos() as u64);
    }
    if let Some(t) = &sh.tracer {
        t.span(got, "sample", t0, t1, sample_args(task));
        t.span("ops", "sample", t1, t2, sample_args(task));
    }
    Ok(sh.source.label(task.slot.index(task.pos) as usize))
}

thread_local! {
    /// The rows of a cache entry that the sample in hand needs (one buffer per decode thread,
    /// reused: no allocation per sample once it has grown to the largest crop).
    static CACHE_ROWS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`process`] with a cache: the pixels of the whole image come from the cache entry of the
/// file's bytes, or from a decode of the whole image that is then stored. The ops see the same
/// pixels and the same source box either way, so batches do not depend on what the cache
/// holds. At full resolution they equal those of the uncached path with `dct_scaling` and
/// `roi` off, whose region is the whole image with the box unchanged; a miss that the budget
/// cannot store is decoded around the crop only, which at full resolution gives the same pixels
/// within it. With a `max_side`, the box is drawn on the source image's size (the same crops as
/// without a cache) and scaled to the stored pixels.
pub(super) fn process_cached(
    sh: &Images,
    cache: &crate::image::cache::Cache,
    dec: &mut Decoder,
    rs: &mut Resampler,
    epoch: u64,
    task: &Task,
    data: &[u8],
) -> Result<i64> {
    let t0 = Instant::now();
    let nopath = Path::new("");
    let mut rng = augment_rng(sh, epoch, task);
    let key = crate::image::cache::Cache::key(data);
    // The source box on the stored pixels: unchanged (exact) at full resolution.
    let scaled = |b: [f64; 4], (w, h): (usize, usize), (sw, sh): (usize, usize)| {
        if (w, h) == (sw, sh) {
            return b;
        }
        let (fx, fy) = (w as f64 / sw as f64, h as f64 / sh as f64);
        [b[0] * fx, b[1] * fy, b[2] * fx, b[3] * fy]
    };
    // The rows of the stored image the resampler reads, `y0..y1`. A crop box (hard) reads
    // nothing outside its integer hull, so at full resolution (integer boxes) a window around it
    // gives exactly the same pixels as the whole image. With a `max_side` (fractional boxes) a
    // window with the filter's reach as margin is used for hits and misses alike, so they agree.
    // Otherwise (a resize window at full resolution), every row.
    let window = |[_, by, _, bh]: [f64; 4], g: &crate::image::ops::Geometry, height: usize| {
        if !(g.hard || cache.max_side().is_some()) {
            return (0, height);
        }
        let my = crate::image::ops::resample::filter_margin(bh, g.dst[3].max(1));
        let y0 = ((by - my).floor().max(0.0) as usize).min(height - 1);
        (y0, ((by + bh + my).ceil() as usize).clamp(y0 + 1, height))
    };
    if let Some(e) = cache.get(key, sh.decode_opts.max_pixels, t0.elapsed()) {
        let g = sh.plan.geometry(e.source_width, e.source_height, &mut rng);
        let [bx, by, bw, bh] = scaled(g.bbox, (e.width, e.height), (e.source_width, e.source_height));
        let (y0, y1) = window([bx, by, bw, bh], &g, e.height);
        let read = CACHE_ROWS.with_borrow_mut(|buf| -> std::result::Result<i64, Option<std::io::Error>> {
            let rows = match cache.read_rows(&e, y0..y1, buf) {
                Ok(rows) => rows,
                Err(err) => return Err(Some(err)),
            };
            finish(sh, rs, task, epoch, t0, "cache", rows, (e.width, y1 - y0), [bx, by - y0 as f64, bw, bh], &g)
                .map_err(|_| None)
        });
        match read {
            Ok(label) => return Ok(label),
            // Pixels that fail their checksums, or an entry truncated since it was checked:
            // discarded, then decoded and rewritten below.
            Err(Some(_)) => cache.discard(&e, key),
            Err(None) => {}
        }
        rng = augment_rng(sh, epoch, task);
    }
    let info = dec.info(data, nopath)?;
    let g = sh.plan.geometry(info.width, info.height, &mut rng);
    let source = (info.width, info.height);
    let (tw, th) = cache.stored_size(info.width, info.height);
    if cache.max_side().is_none() && !cache.may_store(key, tw, th) {
        // Full resolution and no room left: decode as the uncached path does with
        // `dct_scaling` off.
        let region = dec.decode(data, nopath, &info, g.bbox, (g.dst[2], g.dst[3]))?;
        return finish(
            sh,
            rs,
            task,
            epoch,
            t0,
            "decode",
            region.pixels,
            (region.width, region.height),
            region.bbox,
            &g,
        );
    }
    let whole = [0.0, 0.0, info.width as f64, info.height as f64];
    let td = Instant::now();
    // At full resolution, the whole image; with a `max_side`, the smallest DCT scale that
    // still covers the stored size, then resampled to it.
    let region = dec.decode(data, nopath, &info, whole, (tw, th))?;
    let reduced;
    let pixels = if (region.width, region.height) == (tw, th) {
        region.pixels
    } else if (tw, th) == source {
        return Err(Error::Internal("a full decode returned a part of the image".into()));
    } else {
        let whole = [0.0, 0.0, region.width as f64, region.height as f64];
        // The stored pixels are a bilinear reduction whatever the transform's filter.
        let (w, h) = (region.width, region.height);
        let bilinear = crate::image::ops::Filter::BILINEAR;
        reduced = rs.resample(bilinear, region.pixels, w, h, whole, false, [0, 0, tw, th], tw, th)?.to_vec();
        &reduced[..]
    };
    cache.put(key, pixels, tw, th, source, td.elapsed());
    let [bx, by, bw, bh] = scaled(g.bbox, (tw, th), source);
    let (y0, y1) = window([bx, by, bw, bh], &g, th);
    let rows = &pixels[y0 * tw * 3..y1 * tw * 3];
    finish(sh, rs, task, epoch, t0, "decode", rows, (tw, y1 - y0), [bx, by - y0 as f64, bw, bh], &g)
}
