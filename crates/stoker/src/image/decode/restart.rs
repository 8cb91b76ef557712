//! Lossless re-coding of baseline JPEGs with restart markers (`stoker pack --random-access`).
//!
//! libjpeg-turbo's transformer rewrites a JPEG's entropy-coded data from its quantised DCT
//! coefficients (what `jpegtran -restart N -optimize` does): the decoded pixels are unchanged
//! bit for bit, the Huffman tables are optimised for the image (which usually saves more than
//! the markers cost), and a restart marker every few MCUs ([`choose_interval`]: one for most
//! photos) makes each interval decodable on its own. The interval divides the row of MCUs, so
//! the intervals form a grid of `interval x 1` MCU tiles: what a decoder needs to decode only
//! the tiles a crop touches.
//! Every marker of the source (EXIF orientation, ICC profile, comments) is kept. Progressive,
//! arithmetic-coded and lossless JPEGs are left as they are (the reason is returned).

use turbojpeg_sys as tj;

/// The fewest entropy-coded bytes an interval should hold (on average): a restart marker
/// costs about 2.5 bytes (the marker and the padding to a byte) and about 200 instructions to
/// decode (the marker, the DC predictors' reset), so an interval of fewer bytes grows the file
/// and the decode time by more than a few percent.
pub const MIN_INTERVAL_BYTES: f64 = 100.0;

/// The restart interval for an image of `mcu_columns` x `mcu_rows` MCUs whose file is `bytes`
/// long: the smallest divisor of the row of MCUs whose intervals hold at least
/// [`MIN_INTERVAL_BYTES`] on average (one MCU for photos like ImageNet's, about 130 bytes per
/// 16 x 16 MCU), or the whole row.
///
/// The smallest tile is best for crops. Measured (BENCHMARKS.md, "Decode only the crop"), 210
/// ImageNet-like JPEGs, callgrind, with the vendored libjpeg-turbo, which decodes every MCU
/// of an interval with its fast Huffman decoder (`vendor/README.md`): one-MCU intervals take
/// 4.4% fewer instructions per train image and 4.5% per val image than the 2-5-MCU intervals
/// of the earlier cost model, and 0.9% more for a whole-image decode; those files shrink by
/// 0.6% instead of 2.4%. Smooth images (few bytes per MCU) get longer intervals, so that the
/// markers do not outweigh what the optimised Huffman tables save.
pub fn choose_interval(mcu_columns: u32, mcu_rows: u32, bytes: usize) -> u32 {
    let cols = mcu_columns.max(1);
    let per_mcu = bytes as f64 / (cols as f64 * mcu_rows.max(1) as f64);
    (1..=cols).find(|&d| cols.is_multiple_of(d) && d as f64 * per_mcu >= MIN_INTERVAL_BYTES).unwrap_or(cols)
}

/// A JPEG re-coded with restart markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recoded {
    /// The new file.
    pub data: Vec<u8>,
    /// MCUs between restart markers (a divisor of `mcu_columns`).
    pub interval_mcus: u32,
    /// MCUs in a row of the image.
    pub mcu_columns: u32,
    /// MCU width and height in pixels.
    pub mcu_size: (u32, u32),
}

/// A TurboJPEG transform handle, destroyed on drop.
struct Handle(tj::tjhandle);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is not used after this.
        unsafe { tj::tj3Destroy(self.0) };
    }
}

impl Handle {
    fn error(&self) -> String {
        // SAFETY: the handle is valid; tj3GetErrorStr returns a NUL-terminated string owned by
        // TurboJPEG, copied here before any other call on the handle.
        unsafe { std::ffi::CStr::from_ptr(tj::tj3GetErrorStr(self.0)) }.to_string_lossy().trim().to_string()
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: the handle is valid and `param` a TurboJPEG parameter id.
        unsafe { tj::tj3Get(self.0, param as i32) }
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), String> {
        // SAFETY: the handle is valid, `param` a parameter id, `value` within its range.
        if unsafe { tj::tj3Set(self.0, param as i32, value) } != 0 {
            return Err(self.error());
        }
        Ok(())
    }
}

/// Re-codes `data` (a JPEG) with optimised Huffman tables and restart markers every
/// [`choose_interval`] MCUs, losslessly; `Err` says why it is stored as it is instead.
pub fn add_restart_markers(data: &[u8], max_pixels: u64) -> Result<Recoded, String> {
    // SAFETY: plain FFI constructor; a null return is handled.
    let raw = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_TRANSFORM as i32) };
    if raw.is_null() {
        return Err("libjpeg-turbo could not make a transform handle".into());
    }
    let h = Handle(raw);
    let max = i32::try_from(max_pixels.min(i32::MAX as u64)).unwrap_or(i32::MAX);
    h.set(tj::TJPARAM_TJPARAM_MAXPIXELS, max)?;
    // SAFETY: `data` is a live slice for the call; TurboJPEG only reads it.
    if unsafe { tj::tj3DecompressHeader(h.0, data.as_ptr(), data.len() as tj::size_t) } != 0 {
        return Err(h.error());
    }
    if h.get(tj::TJPARAM_TJPARAM_PROGRESSIVE) == 1 {
        return Err("progressive JPEG".into());
    }
    if h.get(tj::TJPARAM_TJPARAM_ARITHMETIC) == 1 {
        return Err("arithmetic-coded JPEG".into());
    }
    if h.get(tj::TJPARAM_TJPARAM_LOSSLESS) == 1 {
        return Err("lossless JPEG".into());
    }
    let (width, subsamp) = (h.get(tj::TJPARAM_TJPARAM_JPEGWIDTH), h.get(tj::TJPARAM_TJPARAM_SUBSAMP));
    let height = h.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
    if width <= 0 || height <= 0 || !(0..7).contains(&subsamp) {
        return Err(format!("unusual layout ({width}x{height}, subsampling {subsamp})"));
    }
    if width as u64 * height as u64 > max_pixels {
        return Err(format!("{width}x{height} pixels: over the limit of {max_pixels}"));
    }
    // MCU sizes of TurboJPEG's subsampling codes (its `tjMCUWidth`/`tjMCUHeight`): 4:4:4, 4:2:2,
    // 4:2:0, gray, 4:4:0, 4:1:1, 4:4:1.
    const MCU: [(i32, i32); 7] = [(8, 8), (16, 8), (16, 16), (8, 8), (8, 16), (32, 8), (8, 32)];
    let (mw, mh) = MCU[subsamp as usize];
    let mcu_columns = (width as u32).div_ceil(mw as u32);
    let interval = choose_interval(mcu_columns, (height as u32).div_ceil(mh as u32), data.len());
    h.set(tj::TJPARAM_TJPARAM_RESTARTBLOCKS, interval as i32)?;
    h.set(tj::TJPARAM_TJPARAM_OPTIMIZE, 1)?;
    // SAFETY: a zeroed tjtransform is "no operation, no options, no crop, no filter".
    let mut xf: tj::tjtransform = unsafe { std::mem::zeroed() };
    xf.op = tj::TJXOP_TJXOP_NONE as i32;
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    // SAFETY: `data` is live for the call; `out`/`size` receive a buffer TurboJPEG allocates
    // (freed below with tj3Free); one transform is described by `xf`.
    let r = unsafe { tj::tj3Transform(h.0, data.as_ptr(), data.len() as tj::size_t, 1, &mut out, &mut size, &xf) };
    if r != 0 || out.is_null() {
        if !out.is_null() {
            // SAFETY: `out` was allocated by TurboJPEG.
            unsafe { tj::tj3Free(out.cast()) };
        }
        return Err(h.error());
    }
    // SAFETY: TurboJPEG wrote `size` bytes at `out`; they are copied before it is freed.
    let recoded = unsafe { std::slice::from_raw_parts(out, size as usize) }.to_vec();
    // SAFETY: `out` was allocated by TurboJPEG and is not used after this.
    unsafe { tj::tj3Free(out.cast()) };
    Ok(Recoded { data: recoded, interval_mcus: interval, mcu_columns, mcu_size: (mw as u32, mh as u32) })
}

/// The restart interval (in MCUs) a JPEG declares in its `DRI` marker before the first scan,
/// if any: what a decoder can use to decode only the intervals a crop touches.
pub fn restart_interval(data: &[u8]) -> Option<u32> {
    let mut i = 2;
    if data.get(..2) != Some(&[0xFF, 0xD8]) {
        return None;
    }
    while i + 4 <= data.len() {
        if data[i] != 0xFF {
            return None;
        }
        let marker = data[i + 1];
        if marker == 0xFF {
            i += 1;
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            return None; // a scan (or the end) before any DRI
        }
        let len = u16::from_be_bytes([data[i + 2], data[i + 3]]) as usize;
        if marker == 0xDD && len == 4 && i + 6 <= data.len() {
            let n = u16::from_be_bytes([data[i + 4], data[i + 5]]) as u32;
            return (n > 0).then_some(n);
        }
        i += 2 + len;
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn intervals_divide_the_mcu_row_and_hold_enough_bytes() {
        // A 500 x 375 4:2:0 photo like ImageNet's: 32 x 24 MCUs, 120 KB.
        assert_eq!(choose_interval(32, 24, 120_000), 1);
        // The same size, smooth (30 KB, 39 bytes per MCU): 3 MCUs do not divide 32, so 4.
        assert_eq!(choose_interval(32, 24, 30_000), 4);
        assert_eq!(choose_interval(38, 10, 38 * 10 * 60), 2, "2 x 19: 120 bytes");
        assert_eq!(choose_interval(31, 10, 31 * 10 * 10), 31, "a prime row: one interval per row");
        assert_eq!(choose_interval(1, 1, 10), 1);
        assert_eq!(choose_interval(0, 0, 0), 1, "no MCU: one, not a division by zero");
        for cols in 1..200u32 {
            for bytes in [0, 100, 5_000, 1 << 20] {
                let d = choose_interval(cols, 7, bytes);
                assert!(cols.is_multiple_of(d), "{cols} {bytes}: {d}");
            }
        }
    }

    /// A photo-like test image: smooth gradients with noise.
    pub(in crate::image::decode) fn picture(w: usize, h: usize, seed: u32) -> Vec<u8> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..w * h * 3)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let (px, c) = (i / 3, i % 3);
                let (col, row) = (px % w, px / w);
                ((col * 255 / w.max(1) + row * 97 / h.max(1) + c * 60) as u32 % 200 + (x % 48)) as u8
            })
            .collect()
    }

    fn compress(w: usize, h: usize, sub: turbojpeg::Subsamp, gray: bool, seed: u32) -> Vec<u8> {
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_quality(88).unwrap();
        c.set_subsamp(sub).unwrap();
        let px = picture(w, h, seed);
        let (pixels, format, pitch) = if gray {
            (px.iter().step_by(3).copied().collect(), turbojpeg::PixelFormat::GRAY, w)
        } else {
            (px, turbojpeg::PixelFormat::RGB, w * 3)
        };
        c.compress_to_vec(turbojpeg::Image { pixels: pixels.as_slice(), width: w, pitch, height: h, format }).unwrap()
    }

    fn decode(data: &[u8]) -> turbojpeg::Image<Vec<u8>> {
        turbojpeg::decompress(data, turbojpeg::PixelFormat::RGB).unwrap()
    }

    #[test]
    fn recoding_keeps_every_pixel_and_marker_and_adds_restarts() {
        use turbojpeg::Subsamp as S;
        let cases = [
            (500, 375, S::Sub2x2, false),
            (333, 257, S::Sub2x2, false),
            (640, 480, S::Sub2x1, false),
            (97, 61, S::None, false),
            (8, 8, S::Sub2x2, false),
            (1, 1, S::Sub2x2, false),
            (250, 199, S::Sub1x2, false),
            (123, 77, S::Gray, true),
        ];
        for (k, &(w, h, sub, gray)) in cases.iter().enumerate() {
            let mut src = compress(w, h, sub, gray, k as u32 + 1);
            // An EXIF segment (orientation 6) right after SOI must survive.
            let exif: Vec<u8> = [
                &[0xFF, 0xE1, 0x00, 0x22][..],
                b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0\0\0\0\0",
            ]
            .concat();
            src.splice(2..2, exif.iter().copied());
            let r = add_restart_markers(&src, 1 << 30).unwrap_or_else(|e| panic!("{w}x{h} {sub:?}: {e}"));
            assert_eq!(r.mcu_columns % r.interval_mcus, 0);
            assert_eq!(restart_interval(&r.data), Some(r.interval_mcus), "{w}x{h} {sub:?}");
            assert_eq!(restart_interval(&src), None);
            let (a, b) = (decode(&src), decode(&r.data));
            assert_eq!((a.width, a.height), (b.width, b.height));
            assert!(a.pixels == b.pixels, "{w}x{h} {sub:?}: pixels changed");
            assert!(r.data.windows(exif.len()).any(|x| x == &exif[..]), "{w}x{h}: the EXIF segment is kept");
        }
        // Optimised tables usually pay for the markers on photo-sized images.
        let src = compress(500, 375, S::Sub2x2, false, 9);
        let r = add_restart_markers(&src, 1 << 30).unwrap();
        assert!(r.data.len() < src.len() * 102 / 100, "{} -> {}", src.len(), r.data.len());
        assert!(add_restart_markers(b"\xFF\xD8 not a jpeg", 1 << 30).is_err());
        assert!(add_restart_markers(&src, 1000).unwrap_err().contains("pixels"), "the pixel limit holds");
    }

    #[test]
    fn a_dri_marker_is_found_before_the_scan() {
        let mut j = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0, 0, 0xFF, 0xDD, 0x00, 0x04, 0x00, 0x06];
        assert_eq!(restart_interval(&j), Some(6));
        j[13] = 0;
        assert_eq!(restart_interval(&j), None, "an interval of 0 is no restart");
        assert_eq!(restart_interval(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]), None);
        assert_eq!(restart_interval(b"not a jpeg"), None);
        assert_eq!(restart_interval(&[0xFF, 0xD8, 0xFF, 0xDD, 0x00]), None, "truncated");
    }
}
