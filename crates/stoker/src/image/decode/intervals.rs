//! Decoding only the restart intervals that a region touches.
//!
//! A baseline JPEG's entropy-coded data is one sequential bitstream: without restart markers,
//! decoding a crop means Huffman-decoding every block above it and beside it. With restart
//! markers every interval of MCUs starts from a clean state (byte-aligned, DC predictors at
//! zero), so it can be decoded alone. When the interval tiles the image (it divides the row of
//! MCUs, as `stoker pack --random-access` writes it, or it is a whole number of rows, as some
//! cameras write it), the intervals that a region touches form a smaller JPEG of their own:
//! the same tables, a frame of the sub-rectangle's size, and those intervals' data with their
//! restart markers renumbered. [`sub_image`] assembles it.
//!
//! The pixels are the same bit for bit as decoding the whole file and cropping: the IDCT works
//! per block and the colour conversion per pixel, and the only filter that reaches across
//! blocks, chroma upsampling, reaches one chroma sample. Vertically, where libjpeg-turbo
//! interpolates chroma between rows, the sub-image keeps one MCU row more above (below) the
//! region when the region starts (ends) on an MCU row's edge; horizontally it needs none, as
//! libjpeg-turbo upsamples a cropping region as an image of its own width (see
//! [`sub_image`]). So every pixel of the region sees the neighbours it sees in the whole
//! image. The caller decodes the region out of the sub-image with the same cropping region
//! (moved by the sub-image's offset) and the same DCT scale as it would the whole file.
//!
//! Anything unusual (a progressive, arithmetic or 12-bit frame, several scans, an interval
//! that does not tile the image, a restart marker missing or out of sequence, bytes libjpeg
//! would warn about between segments) gives `None`: the caller decodes the whole file as
//! before, and libjpeg reports what it reports there.

/// Marker codes.
const SOF0: u8 = 0xC0;
const SOF1: u8 = 0xC1;
const DHT: u8 = 0xC4;
const DQT: u8 = 0xDB;
const DRI: u8 = 0xDD;
const SOS: u8 = 0xDA;
const EOI: u8 = 0xD9;
const RST0: u8 = 0xD0;
/// JFIF and Adobe: the two APP segments libjpeg reads (colour space, transform); the other
/// APPn and COM segments (EXIF, ICC, XMP, comments) are not copied.
const APP0: u8 = 0xE0;
const APP14: u8 = 0xEE;

/// What the frame header and the scan header say.
#[derive(Debug, Clone, Copy)]
struct Frame {
    width: usize,
    height: usize,
    /// MCU width and height in pixels.
    mcu: (usize, usize),
    /// Each component's sampling factors (horizontal, vertical); unused entries are (0, 0).
    sampling: [(usize, usize); 4],
    /// Offset, in the assembled output, of the frame's height field.
    size_at: usize,
    /// MCUs per restart interval.
    interval: usize,
    /// First byte of the entropy-coded data.
    scan: usize,
}

impl Frame {
    /// Whether libjpeg-turbo, decoding at scale `num/8`, interpolates some component between
    /// rows (fancy upsampling by 2 vertically, which reads the row above and the row below).
    /// As `jdmaster.c` chooses each component's IDCT size (scaling chroma up by the IDCT
    /// where it can, so that it needs no upsampling) and `jdsample.c` its upsampler (fancy
    /// only when the smallest IDCT size is above 1).
    fn rows_interpolated(&self, num: usize) -> bool {
        let used = self.sampling.iter().filter(|s| s.0 > 0);
        let (hmax, vmax) = used.clone().fold((1, 1), |m, s| (m.0.max(s.0), m.1.max(s.1)));
        num > 1
            && used.clone().any(|&(h, v)| {
                let mut size = num;
                while size < 8 && (hmax * num).is_multiple_of(h * size * 2) && (vmax * num).is_multiple_of(v * size * 2)
                {
                    size *= 2;
                }
                v * size / num * 2 == vmax
            })
    }
}

/// Copies the header segments libjpeg needs from `data` into `out` (after SOI) and reads the
/// frame, the restart interval and where the scan's data starts; `None` for any JPEG this
/// module does not handle.
fn read_header(data: &[u8], out: &mut Vec<u8>) -> Option<Frame> {
    if !data.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    out.extend_from_slice(&[0xFF, 0xD8]);
    let mut pos = 2;
    // The frame so far (its `interval` and `scan` are set at the scan header), and how many
    // components it has.
    let mut sof: Option<(Frame, usize)> = None;
    let mut interval = 0usize;
    loop {
        // Segments follow each other directly (fill bytes allowed); anything else is left to
        // libjpeg's own recovery on the whole file.
        if *data.get(pos)? != 0xFF {
            return None;
        }
        while *data.get(pos)? == 0xFF {
            pos += 1;
        }
        let marker = data[pos];
        pos += 1;
        let len = u16::from_be_bytes([*data.get(pos)?, *data.get(pos + 1)?]) as usize;
        let seg = data.get(pos..pos.checked_add(len)?)?;
        if len < 2 {
            return None;
        }
        let body = &seg[2..];
        let keep = match marker {
            SOF0 | SOF1 => {
                let (&p, rest) = body.split_first()?;
                let h = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]) as usize;
                let w = u16::from_be_bytes([*rest.get(2)?, *rest.get(3)?]) as usize;
                let n = *rest.get(4)? as usize;
                if p != 8 || w == 0 || h == 0 || !(1..=4).contains(&n) || sof.is_some() || rest.len() != 5 + 3 * n {
                    return None;
                }
                let (mut max, mut sampling) = ((1, 1), [(0, 0); 4]);
                for (k, c) in rest[5..].chunks_exact(3).enumerate() {
                    let (hs, vs) = ((c[1] >> 4) as usize, (c[1] & 15) as usize);
                    if !(1..=4).contains(&hs) || !(1..=4).contains(&vs) {
                        return None;
                    }
                    max = (max.0.max(hs), max.1.max(vs));
                    sampling[k] = (hs, vs);
                }
                let mcu = if n == 1 { (8, 8) } else { (8 * max.0, 8 * max.1) };
                let size_at = out.len() + 5;
                let frame = Frame { width: w, height: h, mcu, sampling, size_at, interval: 0, scan: 0 };
                sof = Some((frame, n));
                true
            }
            DRI => {
                if body.len() != 2 {
                    return None;
                }
                interval = u16::from_be_bytes([body[0], body[1]]) as usize;
                true
            }
            DHT | DQT | APP0 | APP14 => true,
            SOS => {
                let (frame, n) = sof?;
                let ns = *body.first()? as usize;
                // One scan with every component (interleaved), or the only one.
                if ns != n || body.len() != 1 + 2 * ns + 3 {
                    return None;
                }
                out.extend_from_slice(&data[pos - 2..pos + len]);
                return (interval > 0).then_some(Frame { interval, scan: pos + len, ..frame });
            }
            0xE1..=0xED | 0xEF | 0xFE => false,
            // Progressive, lossless, arithmetic, hierarchical frames, DNL, anything else.
            _ => return None,
        };
        if keep {
            out.extend_from_slice(&data[pos - 2..pos + len]);
        }
        pos += len;
    }
}

/// Bit `i` set where `c[i]` is `0xFF`.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn ff_mask(c: &[u8; 64]) -> u64 {
    use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8};
    let mut m = 0u64;
    for k in 0..4 {
        // SAFETY: SSE2 is enabled at compile time (the `cfg` above; every x86_64 CPU has it).
        // Bytes `16 * k .. 16 * k + 16` lie inside `c` (64 bytes), and `_mm_loadu_si128`
        // reads 16 bytes with no alignment requirement.
        let bits = unsafe {
            let v = _mm_loadu_si128(c.as_ptr().add(16 * k).cast::<__m128i>());
            _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(-1)))
        };
        m |= u64::from(bits as u16) << (16 * k);
    }
    m
}

/// Bit `i` set where `c[i]` is `0xFF`.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
fn ff_mask(c: &[u8; 64]) -> u64 {
    ff_bits(c)
}

/// Bit `i` set where `bytes[i]` is `0xFF`, one byte at a time (`bytes` up to 64 long).
fn ff_bits(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0, |m, (i, &b)| m | u64::from(b == 0xFF) << i)
}

/// Finds the restart markers of the scan starting at `scan`: pushes onto `marks` the offset
/// of each one's `FF` and checks they come in sequence (RST0..RST7 cyclically). With `stop`,
/// returns the offset of the `stop`-th marker once found (the data after it is not needed);
/// without, the offset of the end-of-image marker that ends the scan. `None` when another
/// marker ends the scan, or the end comes before the `stop`-th marker.
///
/// Entropy-coded data holds an `FF` every 80 bytes or so (most of them stuffed `FF 00`
/// pairs, the rest markers), so the scan compares 64 bytes at once and then visits each `FF`
/// of the block, rather than searching afresh from each one. A fill byte (`FF FF`) is passed
/// over as the `FF` after it is visited in turn.
fn find_markers(data: &[u8], scan: usize, marks: &mut Vec<u32>, stop: Option<usize>) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked on the line above).
        return unsafe { find_markers_avx2(data, scan, marks, stop) };
    }
    markers_with(data, scan, marks, stop, ff_mask)
}

/// [`find_markers`] with 32-byte comparisons.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn find_markers_avx2(data: &[u8], scan: usize, marks: &mut Vec<u32>, stop: Option<usize>) -> Option<usize> {
    use std::arch::x86_64::{__m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_set1_epi8};
    #[target_feature(enable = "avx2")]
    fn ff_mask_avx2(c: &[u8; 64]) -> u64 {
        let ff = _mm256_set1_epi8(-1);
        // SAFETY: bytes `0..32` and `32..64` lie inside `c`; `_mm256_loadu_si256` reads 32
        // bytes with no alignment requirement.
        let (lo, hi) = unsafe {
            (_mm256_loadu_si256(c.as_ptr().cast::<__m256i>()), _mm256_loadu_si256(c.as_ptr().add(32).cast::<__m256i>()))
        };
        let lo = _mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, ff)) as u32;
        let hi = _mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, ff)) as u32;
        u64::from(lo) | u64::from(hi) << 32
    }
    markers_with(data, scan, marks, stop, |c| ff_mask_avx2(c))
}

/// The body of [`find_markers`], with `ff_bytes` giving the `0xFF` bytes of 64 bytes.
#[inline(always)]
fn markers_with(
    data: &[u8],
    scan: usize,
    marks: &mut Vec<u32>,
    stop: Option<usize>,
    ff_bytes: impl Fn(&[u8; 64]) -> u64,
) -> Option<usize> {
    let mut base = scan;
    while let Some(tail) = data.get(base..).filter(|t| !t.is_empty()) {
        let mut mask = match tail.first_chunk::<64>() {
            Some(block) => ff_bytes(block),
            None => ff_bits(tail),
        };
        while mask != 0 {
            let pos = base + mask.trailing_zeros() as usize;
            mask &= mask - 1;
            match *data.get(pos + 1)? {
                0x00 | 0xFF => {}
                next @ RST0..=0xD7 => {
                    if (next - RST0) as usize != marks.len() % 8 {
                        return None;
                    }
                    marks.push(u32::try_from(pos).ok()?);
                    if Some(marks.len()) == stop {
                        return Some(pos);
                    }
                }
                EOI => return stop.is_none().then_some(pos),
                _ => return None,
            }
        }
        base += 64;
    }
    None
}

/// Assembles into `out` a JPEG of only the restart intervals of `data` that the region
/// `(x, y, w, h)` (at scale `num/8`, as for [`super::jpeg::JpegDecoder::decode`]) needs, and
/// returns the offset of the sub-image's top-left corner in the same scaled coordinates: the
/// region is `(x - ox, y - oy, w, h)` in the sub-image. `None` when `data` has no restart
/// interval that tiles the image, when anything about it is unusual (see the module), or when
/// the region needs the whole image anyway. `marks` is scratch space.
pub fn sub_image(
    data: &[u8],
    num: usize,
    region: (usize, usize, usize, usize),
    out: &mut Vec<u8>,
    marks: &mut Vec<u32>,
) -> Option<(usize, usize)> {
    out.clear();
    marks.clear();
    if !(1..=8).contains(&num) {
        return None;
    }
    let f = read_header(data, out)?;
    let (mw, mh) = f.mcu;
    let (cols, rows) = (f.width.div_ceil(mw), f.height.div_ceil(mh));
    let step = f.interval;
    // Intervals across a row (`tile` MCUs each) or rows per interval.
    let (tile, band) = if cols % step == 0 {
        (step, 1)
    } else if step % cols == 0 {
        (cols, step / cols)
    } else {
        return None;
    };
    let total = (cols * rows).div_ceil(step);
    // The MCUs the region covers, rounded out to whole intervals. Vertically, where a
    // component is interpolated between rows (4:2:0 and 4:4:0 at full scale; at 1/2, 1/4 and
    // 1/8 libjpeg-turbo's IDCT brings 4:2:0 chroma to full size instead), the first output
    // row of an MCU row reads the chroma row above it and the last one the chroma row below:
    // one MCU row more on that side when the region starts or ends there. Horizontally no
    // margin: libjpeg-turbo upsamples a cropping region as an image of its own width. At
    // least two MCUs wide, so that libjpeg-turbo picks the same upsampler for the sub-image
    // as for the whole image (its fancy upsampling wants rows of over 2 samples).
    let (x, y, w, h) = region;
    let (smw, smh) = (mw * num / 8, mh * num / 8);
    let interpolated = f.rows_interpolated(num);
    let above = usize::from(interpolated && y % smh == 0);
    let below = usize::from(interpolated && (y + h) % smh == 0);
    let mut c0 = x / smw / tile * tile;
    let c1 = (x + w).div_ceil(smw).max(c0 + 2).div_ceil(tile).saturating_mul(tile).min(cols);
    if c1 - c0 < 2 {
        c0 = c1.saturating_sub(2) / tile * tile;
    }
    let r0 = (y / smh).saturating_sub(above) / band * band;
    let r1 = ((y + h).div_ceil(smh) + below).div_ceil(band).saturating_mul(band).min(rows);
    if c0 >= c1 || r0 >= r1 || (c0, r0, c1, r1) == (0, 0, cols, rows) {
        return None;
    }
    // The markers up to the end of the last MCU row the region needs: as libjpeg, which
    // decodes whole MCU rows and skips to the end once the region is decoded, nothing below
    // is read (nor are libjpeg's warnings about it given). Above, every marker is checked.
    let last = r1.div_ceil(band) * (cols * band) / step - 1;
    let stop = (last + 1 < total).then_some(last + 1);
    let end = find_markers(data, f.scan, marks, stop)?;
    if stop.is_none() && marks.len() + 1 != total {
        return None;
    }
    let (px0, py0) = (c0 * mw, r0 * mh);
    let (sw, sh) = ((c1 * mw).min(f.width) - px0, (r1 * mh).min(f.height) - py0);
    out[f.size_at..f.size_at + 4].copy_from_slice(&[(sh >> 8) as u8, sh as u8, (sw >> 8) as u8, sw as u8]);
    // Intervals `j0..=j1` follow each other in the file: one copy of their data, from the
    // scan start or the marker before `j0` to the marker after `j1` or the end of the scan,
    // then the markers inside it renumbered in place; `written` intervals came before.
    let mut written = 0usize;
    let mut copy = |out: &mut Vec<u8>, j0: usize, j1: usize| {
        if written > 0 {
            out.extend_from_slice(&[0xFF, RST0 + ((written - 1) % 8) as u8]);
        }
        let from = if j0 == 0 { f.scan } else { marks[j0 - 1] as usize + 2 };
        let to = if j1 + 1 == total { end } else { marks[j1] as usize };
        let base = out.len();
        out.extend_from_slice(&data[from..to]);
        for (n, &m) in marks[j0..j1].iter().enumerate() {
            out[base + m as usize - from + 1] = RST0 + ((written + n) % 8) as u8;
        }
        written += j1 - j0 + 1;
    };
    if band == 1 {
        // Each row's intervals from column `c0` to `c1`.
        for r in r0..r1 {
            copy(out, (r * cols + c0) / step, (r * cols + c1) / step - 1);
        }
    } else {
        copy(out, r0 / band, r1.div_ceil(band) - 1);
    }
    out.extend_from_slice(&[0xFF, EOI]);
    Some((px0 * num / 8, py0 * num / 8))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::jpeg::{JpegDecoder, Rect};
    use super::super::restart::add_restart_markers;
    use super::super::restart::tests::picture;
    use super::*;
    use turbojpeg_sys as tj;

    /// A JPEG of `picture(w, h)`; `format` RGB, GRAY or CMYK (YCCK).
    fn compress(w: usize, h: usize, subsamp: i32, format: tj::TJPF, seed: u32) -> Vec<u8> {
        let rgb = picture(w, h, seed);
        let (px, ch): (Vec<u8>, usize) = match format {
            tj::TJPF_TJPF_GRAY => (rgb.iter().step_by(3).copied().collect(), 1),
            tj::TJPF_TJPF_CMYK => (rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], p[0] / 2 + p[1] / 3]).collect(), 4),
            _ => (rgb, 3),
        };
        // SAFETY: a fresh compressor; `px` holds `h` rows of `w * ch` bytes; the output buffer
        // is allocated by TurboJPEG and freed with tj3Free after copying.
        unsafe {
            let c = tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as i32);
            assert_eq!(tj::tj3Set(c, tj::TJPARAM_TJPARAM_QUALITY as i32, 87), 0);
            assert_eq!(tj::tj3Set(c, tj::TJPARAM_TJPARAM_SUBSAMP as i32, subsamp), 0);
            let (mut buf, mut size): (*mut u8, tj::size_t) = (std::ptr::null_mut(), 0);
            let r = tj::tj3Compress8(c, px.as_ptr(), w as i32, (w * ch) as i32, h as i32, format, &mut buf, &mut size);
            assert_eq!(r, 0, "compress {w}x{h}");
            let v = std::slice::from_raw_parts(buf, size as usize).to_vec();
            tj::tj3Free(buf.cast());
            tj::tj3Destroy(c);
            v
        }
    }

    /// `data` losslessly transformed with a restart marker every `blocks` MCUs, or every
    /// `rows` MCU rows when `rows > 0`.
    pub(in crate::image::decode) fn with_restarts(data: &[u8], blocks: i32, rows: i32) -> Vec<u8> {
        // SAFETY: a fresh transform handle; `data` is live; the output is copied, then freed.
        unsafe {
            let t = tj::tj3Init(tj::TJINIT_TJINIT_TRANSFORM as i32);
            assert_eq!(tj::tj3DecompressHeader(t, data.as_ptr(), data.len() as tj::size_t), 0);
            if rows > 0 {
                assert_eq!(tj::tj3Set(t, tj::TJPARAM_TJPARAM_RESTARTROWS as i32, rows), 0);
            } else {
                assert_eq!(tj::tj3Set(t, tj::TJPARAM_TJPARAM_RESTARTBLOCKS as i32, blocks), 0);
            }
            let mut xf: tj::tjtransform = std::mem::zeroed();
            xf.op = tj::TJXOP_TJXOP_NONE as i32;
            let (mut buf, mut size): (*mut u8, tj::size_t) = (std::ptr::null_mut(), 0);
            let r = tj::tj3Transform(t, data.as_ptr(), data.len() as tj::size_t, 1, &mut buf, &mut size, &xf);
            assert_eq!(r, 0);
            let v = std::slice::from_raw_parts(buf, size as usize).to_vec();
            tj::tj3Free(buf.cast());
            tj::tj3Destroy(t);
            v
        }
    }

    fn decode(
        dec: &mut JpegDecoder,
        data: &[u8],
        num: usize,
        region: (usize, usize, usize, usize),
        ch: usize,
    ) -> Vec<u8> {
        let mut out = vec![0u8; region.2 * region.3 * ch];
        dec.decode(data, num, region, ch, &mut out).unwrap();
        assert_eq!(dec.take_warning(), None);
        out
    }

    /// Regions at every edge, the corners, the middle, and `n` pseudo-random ones, at `num/8`.
    fn regions(sw: usize, sh: usize, (align, mh): (usize, usize), n: usize, seed: u64) -> Vec<Rect> {
        let mut s = seed | 1;
        let mut next = |m: usize| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % m.max(1) as u64) as usize
        };
        let mut v = vec![(0, 0, 1.min(sw), 1.min(sh)), (0, sh - 1, sw, 1), (0, 0, sw, sh / 2 + 1)];
        v.push(((sw - 1) / align * align, sh - 1, sw - (sw - 1) / align * align, 1));
        v.push(((sw / 2) / align * align, sh / 3, (sw - (sw / 2) / align * align).min(3), sh / 3 + 1));
        // Starting and ending on MCU rows' first and last rows, and one row inside them.
        for (y0, y1) in [(mh, 2 * mh), (mh + 1, 2 * mh - 1), (mh - 1, 2 * mh + 1), (2 * mh, 2 * mh + 1)] {
            if y0 < y1 && y1 <= sh {
                v.push((0, y0, sw.min(align * 3), y1 - y0));
            }
        }
        for _ in 0..n {
            let x = next(sw) / align * align;
            let y = next(sh);
            v.push((x, y, 1 + next(sw - x), 1 + next(sh - y)));
        }
        v
    }

    /// The region decoded out of the sub-image equals the region decoded from the whole file,
    /// with restart markers and without, for every scale and many regions; the sub-image is
    /// smaller than the file for small regions (the path is taken).
    fn check(src: &[u8], restarted: &[u8], w: usize, h: usize, ch: usize, label: &str) -> usize {
        let mut dec = JpegDecoder::new(1 << 28).unwrap();
        let hdr = dec.header(src).unwrap();
        let (mut out, mut marks, mut used) = (Vec::new(), Vec::new(), 0);
        for num in [1, 2, 3, 4, 5, 7, 8] {
            let (sw, sh) = (super::super::jpeg::scaled(w, num), super::super::jpeg::scaled(h, num));
            let align = hdr.scaled_mcu_width(num).unwrap();
            // MCU heights per TurboJPEG subsampling code, as the MCU widths in `jpeg.rs`.
            let mh = [8, 8, 16, 8, 16, 8, 32][hdr.subsamp as usize] * num / 8;
            for (k, region) in regions(sw, sh, (align, mh), 12, (w * 31 + h * 7 + num) as u64).into_iter().enumerate() {
                let want = decode(&mut dec, src, num, region, ch);
                assert!(decode(&mut dec, restarted, num, region, ch) == want, "{label} num {num} {region:?}");
                let Some((ox, oy)) = sub_image(restarted, num, region, &mut out, &mut marks) else {
                    continue;
                };
                assert!(out.len() < restarted.len(), "{label}: the sub-image is smaller");
                let (x, y, rw, rh) = region;
                let got = decode(&mut dec, &out, num, (x - ox, y - oy, rw, rh), ch);
                assert!(got == want, "{label} num {num} region {k} {region:?}: pixels differ");
                used += 1;
            }
        }
        used
    }

    #[test]
    fn sub_images_decode_to_the_same_pixels() {
        let rgb = tj::TJPF_TJPF_RGB;
        let cases = [
            (500, 375, tj::TJSAMP_TJSAMP_420, rgb, 3),
            (333, 257, tj::TJSAMP_TJSAMP_420, rgb, 3),
            (641, 480, tj::TJSAMP_TJSAMP_422, rgb, 3),
            (250, 199, tj::TJSAMP_TJSAMP_440, rgb, 3),
            (197, 161, tj::TJSAMP_TJSAMP_444, rgb, 3),
            (123, 77, tj::TJSAMP_TJSAMP_GRAY, tj::TJPF_TJPF_GRAY, 3),
            (160, 96, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_CMYK, 4),
            (130, 70, tj::TJSAMP_TJSAMP_411, rgb, 3),
        ];
        for (k, &(w, h, sub, format, ch)) in cases.iter().enumerate() {
            let src = compress(w, h, sub, format, k as u32 + 3);
            let label = format!("{w}x{h} subsamp {sub} format {format}");
            let packed = add_restart_markers(&src, 1 << 28).unwrap().data;
            assert!(check(&src, &packed, w, h, ch, &label) > 20, "{label}: the interval path is taken");
            // Whole rows per interval (as cameras write them), and one row per interval.
            let rows = with_restarts(&src, 0, 2);
            assert!(check(&src, &rows, w, h, ch, &format!("{label}, 2 rows")) > 10, "{label}: rows");
            let one = with_restarts(&src, 0, 1);
            assert!(check(&src, &one, w, h, ch, &format!("{label}, 1 row")) > 10, "{label}: rows");
            // A marker after every MCU (some cameras): sub-images one or two MCUs wide.
            let every = with_restarts(&src, 1, 0);
            assert!(check(&src, &every, w, h, ch, &format!("{label}, every MCU")) > 20, "{label}: every MCU");
        }
    }

    /// Through [`super::super::Decoder`] as the pipeline calls it (boxes, output sizes, DCT
    /// scaling, EXIF orientation): the same region, pixels and box with restart markers as
    /// without, and the intervals are used, except for rotated images (decoded whole).
    #[test]
    fn the_decoder_gives_the_same_regions() {
        use super::super::{DecodeOptions, Decoder};
        let path = std::path::Path::new("x.jpg");
        // An EXIF segment with orientation `o`, placed right after SOI.
        let exif = |o: u8| -> Vec<u8> {
            [
                &[0xFF, 0xE1, 0x00, 0x22][..],
                b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0",
                &[o],
                b"\0\0\0\0\0\0",
            ]
            .concat()
        };
        let (mut plain, mut fast) =
            (Decoder::new(DecodeOptions::default()).unwrap(), Decoder::new(DecodeOptions::default()).unwrap());
        let mut k = 0u64;
        for (w, h, sub) in
            [(500, 375, tj::TJSAMP_TJSAMP_420), (375, 500, tj::TJSAMP_TJSAMP_422), (640, 427, tj::TJSAMP_TJSAMP_444)]
        {
            for orientation in [1u8, 6] {
                let mut src = compress(w, h, sub, tj::TJPF_TJPF_RGB, w as u32);
                src.splice(2..2, exif(orientation));
                let packed = add_restart_markers(&src, 1 << 28).unwrap().data;
                let info = plain.info(&src, path).unwrap();
                for (bbox, out) in [
                    ([10.0, 20.0, 200.0, 150.0], (224, 224)),
                    ([0.0, 0.0, 120.0, 90.0], (32, 32)),
                    ([w as f64 * 0.5, 0.0, w as f64 * 0.3, h as f64 * 0.9], (50, 60)),
                    ([17.5, 33.25, 64.0, 64.0], (64, 64)),
                ] {
                    let [bx, by, bw, bh] = bbox;
                    let (iw, ih) = (info.width as f64, info.height as f64);
                    let bbox = [
                        bx.min(iw - 1.0),
                        by.min(ih - 1.0),
                        bw.min(iw - bx.min(iw - 1.0)),
                        bh.min(ih - by.min(ih - 1.0)),
                    ];
                    let a = plain.decode(&src, path, &info, bbox, out).unwrap();
                    let a = (a.pixels.to_vec(), a.width, a.height, a.bbox, a.scale_num);
                    let finfo = fast.info(&packed, path).unwrap();
                    let b = fast.decode(&packed, path, &finfo, bbox, out).unwrap();
                    let b = (b.pixels.to_vec(), b.width, b.height, b.bbox, b.scale_num);
                    assert!(a == b, "{w}x{h} orientation {orientation} {bbox:?} -> {out:?}");
                    k += 1;
                }
                let used = fast.take_restart_decodes();
                assert_eq!(plain.take_restart_decodes(), 0);
                if orientation == 1 {
                    assert!(used >= 3, "{w}x{h}: {used} of 4 regions from their intervals");
                } else {
                    assert_eq!(used, 0, "rotated images are decoded whole");
                }
            }
        }
        assert_eq!(k, 24);
    }

    /// A hard box (crop, then resize) is decoded with no margin for the filter's reach
    /// ([`Decoder::decode_box`](super::super::Decoder::decode_box)): resampled, its region gives
    /// the pixels the whole image gives, at every DCT scale, for every subsampling, with and
    /// without restart markers, for boxes at the image's edges and off the MCU grid.
    #[test]
    fn hard_boxes_resample_as_the_whole_image() {
        use super::super::{DecodeOptions, Decoder};
        use crate::image::ops::Resampler;
        let path = std::path::Path::new("x.jpg");
        let whole_opts = DecodeOptions { roi: false, restart: false, ..DecodeOptions::default() };
        let (mut whole, mut cropped) =
            (Decoder::new(whole_opts).unwrap(), Decoder::new(DecodeOptions::default()).unwrap());
        let (mut ra, mut rb) = (Resampler::new(), Resampler::new());
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let mut k = 0;
        for (w, h, sub, format) in [
            (333, 250, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_RGB),
            (250, 333, tj::TJSAMP_TJSAMP_422, tj::TJPF_TJPF_RGB),
            (301, 203, tj::TJSAMP_TJSAMP_444, tj::TJPF_TJPF_RGB),
            (203, 301, tj::TJSAMP_TJSAMP_440, tj::TJPF_TJPF_RGB),
            (299, 211, tj::TJSAMP_TJSAMP_411, tj::TJPF_TJPF_RGB),
            (211, 299, tj::TJSAMP_TJSAMP_GRAY, tj::TJPF_TJPF_GRAY),
        ] {
            let src = compress(w, h, sub, format, (w * h) as u32);
            let packed = add_restart_markers(&src, 1 << 28).unwrap().data;
            for _ in 0..24 {
                // Integer boxes, as RandomResizedCrop draws them; some touch the edges.
                let (bw, bh) = (1 + next(w), 1 + next(h));
                let (l, t) = match next(4) {
                    0 => (0, 0),
                    1 => (w - bw, h - bh),
                    _ => (next(w - bw + 1), next(h - bh + 1)),
                };
                let bbox = [l as f64, t as f64, bw as f64, bh as f64];
                // Outputs from 1/10 of the box (DCT-scaled) to larger than it.
                let out = ((bw * (1 + next(20)) / 10).max(1), (bh * (1 + next(20)) / 10).max(1));
                for data in [&src, &packed] {
                    let info = whole.info(data, path).unwrap();
                    let a = whole.decode(data, path, &info, bbox, out).unwrap();
                    let (f, dst) = (crate::image::ops::Filter::BILINEAR, [0, 0, out.0, out.1]);
                    let a = ra.resample(f, a.pixels, a.width, a.height, a.bbox, true, dst, out.0, out.1);
                    let b = cropped.decode_box(data, path, &info, bbox, out, true).unwrap();
                    let b = rb.resample(f, b.pixels, b.width, b.height, b.bbox, true, dst, out.0, out.1);
                    assert!(a.unwrap() == b.unwrap(), "{w}x{h} subsampling {sub}: {bbox:?} -> {out:?}");
                    k += 1;
                }
            }
        }
        assert_eq!(k, 6 * 24 * 2);
    }

    #[test]
    fn tiny_images_and_whole_image_regions() {
        for (w, h) in [(1, 1), (8, 8), (17, 9), (16, 300), (300, 16)] {
            let src = compress(w, h, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_RGB, 5);
            let packed = add_restart_markers(&src, 1 << 28).unwrap().data;
            check(&src, &packed, w, h, 3, &format!("{w}x{h}"));
        }
        let src = compress(200, 120, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_RGB, 6);
        let packed = add_restart_markers(&src, 1 << 28).unwrap().data;
        let (mut out, mut marks) = (Vec::new(), Vec::new());
        assert_eq!(sub_image(&packed, 8, (0, 0, 200, 120), &mut out, &mut marks), None, "the whole image");
        assert_eq!(sub_image(&src, 8, (0, 0, 10, 10), &mut out, &mut marks), None, "no restart markers");
        assert!(sub_image(&packed, 8, (0, 0, 10, 10), &mut out, &mut marks).is_some());
    }

    /// Offsets of the restart markers' `FF` bytes in `data`.
    fn rst_offsets(data: &[u8]) -> Vec<usize> {
        (0..data.len() - 1).filter(|&i| data[i] == 0xFF && (0xD0..=0xD7).contains(&data[i + 1])).collect()
    }

    /// The vendored libjpeg-turbo decodes an interval's last MCU with its fast Huffman decoder
    /// (`vendor/README.md`), keeping it only when the MCU took no bit past the restart marker:
    /// an interval cut short must still be reported as libjpeg reports it (the slow decoder's
    /// "premature end of data segment"), with every row above the damage as in the clean file.
    #[test]
    fn an_interval_cut_short_is_still_reported() {
        let (w, h) = (320, 240);
        let src = compress(w, h, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_RGB, 8);
        let mut dec = JpegDecoder::new(1 << 28).unwrap();
        let whole = (0, 0, w, h);
        for blocks in [1, 2, 4, 5] {
            let clean = with_restarts(&src, blocks, 0);
            let want = decode(&mut dec, &clean, 8, whole, 3);
            assert!(want == decode(&mut dec, &src, 8, whole, 3), "{blocks}-MCU intervals: clean file");
            let rst = rst_offsets(&clean);
            // Interval 30's last byte removed: its last MCU lacks data bits. 20 MCUs per row.
            let j = 30;
            let mut cut = clean.clone();
            cut.remove(rst[j - 1] - 1);
            let mut got = vec![0u8; w * h * 3];
            dec.decode(&cut, 8, whole, 3, &mut got).unwrap();
            let warning = dec.take_warning();
            assert!(
                warning.as_deref().is_some_and(|m| m.contains("premature end of data segment")),
                "{blocks}-MCU intervals: {warning:?}"
            );
            // The damaged MCU's row starts at pixel row 16 * (MCU index / 20); chroma reaches
            // 8 rows up.
            let top = 16 * ((j * blocks as usize - 1) / 20) - 8;
            assert!(got[..top * w * 3] == want[..top * w * 3], "{blocks}-MCU intervals: rows above");
        }
    }

    /// As libjpeg skips to the end once a region is decoded, the marker scan stops at the end
    /// of the last MCU row the region needs: damage below it changes nothing, on either path.
    #[test]
    fn damage_below_the_region_is_not_read() {
        let (w, h) = (320, 240);
        let src = compress(w, h, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_RGB, 9);
        let packed = with_restarts(&src, 1, 0);
        let rst = rst_offsets(&packed);
        let mut dec = JpegDecoder::new(1 << 28).unwrap();
        let (mut out, mut marks) = (Vec::new(), Vec::new());
        let region = (32, 40, 64, 50);
        let want = decode(&mut dec, &src, 8, region, 3);
        // One MCU per interval, 20 per row, 15 rows: the region needs rows 2-5, columns 2-5.
        let mut damaged = packed.clone();
        let below = rst[20 * 9];
        damaged[below + 1] = 0xD0 + (damaged[below + 1] - 0xD0 + 3) % 8;
        damaged.truncate(rst[20 * 12]);
        let (ox, oy) = sub_image(&damaged, 8, region, &mut out, &mut marks).expect("the interval path");
        let (x, y, rw, rh) = region;
        assert!(decode(&mut dec, &out, 8, (x - ox, y - oy, rw, rh), 3) == want, "from the intervals");
        assert!(decode(&mut dec, &damaged, 8, region, 3) == want, "the whole file, as libjpeg reads it");
        // The same damage in the last row the region needs, right of the region (libjpeg
        // decodes the whole row): the whole-file path.
        let mut inside = packed.clone();
        let at = rst[20 * 5 + 15];
        inside[at + 1] = 0xD0 + (inside[at + 1] - 0xD0 + 3) % 8;
        assert_eq!(sub_image(&inside, 8, region, &mut out, &mut marks), None);
    }

    /// The marker scan (64 bytes compared at once, with AVX2 where the CPU has it) finds the
    /// markers a byte-by-byte reading finds, wherever they fall in a block, and at every
    /// length of the last, partial block.
    #[test]
    fn the_marker_scan_matches_a_plain_reading() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut byte = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        };
        for len in [0usize, 1, 2, 63, 64, 65, 127, 128, 129, 1000, 4099] {
            // Random bytes with many `FF 00`, markers in sequence (some after fill bytes), EOI.
            let (mut data, mut n) = (Vec::new(), 0usize);
            while data.len() < len {
                match byte() % 16 {
                    0 => data.extend_from_slice(&[0xFF, 0x00]),
                    1 => {
                        data.extend_from_slice(&[0xFF, 0xD0 + (n % 8) as u8]);
                        n += 1;
                    }
                    2 => {
                        data.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xD0 + (n % 8) as u8]);
                        n += 1;
                    }
                    _ => data.push(byte() & 0xFE),
                }
            }
            data.extend_from_slice(&[0xFF, 0xD9]);
            let want: Vec<u32> = rst_offsets(&data).into_iter().map(|i| i as u32).collect();
            let mut marks = Vec::new();
            assert_eq!(markers_with(&data, 0, &mut marks, None, ff_mask), Some(data.len() - 2), "length {len}");
            assert_eq!(marks, want, "length {len}");
            marks.clear();
            assert_eq!(find_markers(&data, 0, &mut marks, None), Some(data.len() - 2), "length {len}");
            assert_eq!(marks, want, "length {len}");
            if want.len() > 2 {
                marks.clear();
                assert_eq!(find_markers(&data, 0, &mut marks, Some(2)), Some(want[1] as usize));
                assert_eq!(marks, want[..2]);
            }
        }
    }

    #[test]
    fn unusable_or_damaged_files_are_left_to_the_whole_file_path() {
        let src = compress(320, 240, tj::TJSAMP_TJSAMP_420, tj::TJPF_TJPF_RGB, 7);
        let (mut out, mut marks) = (Vec::new(), Vec::new());
        let region = (32, 32, 40, 40);
        // 20 MCUs per row: an interval of 7 neither divides it nor is whole rows.
        let odd = with_restarts(&src, 7, 0);
        assert_eq!(super::super::restart::restart_interval(&odd), Some(7));
        assert_eq!(sub_image(&odd, 8, region, &mut out, &mut marks), None);
        let packed = add_restart_markers(&src, 1 << 28).unwrap().data;
        assert!(sub_image(&packed, 8, region, &mut out, &mut marks).is_some());
        let rst = rst_offsets(&packed);
        // A marker out of sequence, a missing marker, a cut file, a second scan.
        let mut bad = packed.clone();
        bad[rst[5] + 1] = 0xD0 + ((bad[rst[5] + 1] - 0xD0 + 1) % 8);
        assert_eq!(sub_image(&bad, 8, region, &mut out, &mut marks), None, "out of sequence");
        let mut gone = packed.clone();
        gone.drain(rst[3]..rst[3] + 2);
        assert_eq!(sub_image(&gone, 8, region, &mut out, &mut marks), None, "missing");
        // The end of the scan matters to a region that reaches it (for one that does not, see
        // `damage_below_the_region_is_not_read`).
        let bottom = (240, 200, 80, 40);
        assert!(sub_image(&packed, 8, bottom, &mut out, &mut marks).is_some());
        assert_eq!(sub_image(&packed[..packed.len() - 2], 8, bottom, &mut out, &mut marks), None, "no EOI");
        let mut two = packed[..packed.len() - 2].to_vec();
        two.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00, 0xFF, 0xD9]);
        assert_eq!(sub_image(&two, 8, bottom, &mut out, &mut marks), None, "another scan");
        let mut extra = packed[..packed.len() - 2].to_vec();
        extra.extend_from_slice(&[0xFF, 0xD0 + (rst.len() % 8) as u8, 0x12, 0xFF, 0xD9]);
        assert_eq!(sub_image(&extra, 8, bottom, &mut out, &mut marks), None, "one interval too many");
        // Junk between header segments (libjpeg warns there): left to the whole-file path.
        let at = packed.windows(2).position(|w| w == [0xFF, 0xDB]).unwrap();
        let junk = [&packed[..at], &[0x11, 0x22], &packed[at..]].concat();
        assert_eq!(sub_image(&junk, 8, region, &mut out, &mut marks), None, "junk");
        // Cut anywhere: never a panic.
        for cut in (0..packed.len()).step_by(7) {
            let _ = sub_image(&packed[..cut], 8, region, &mut out, &mut marks);
        }
        // A progressive frame is refused by the header walk itself.
        let at = packed.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        let mut progressive = packed.clone();
        progressive[at + 1] = 0xC2;
        assert_eq!(sub_image(&progressive, 8, region, &mut out, &mut marks), None, "progressive");
    }
}
