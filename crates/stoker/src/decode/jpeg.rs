//! A thin, safe wrapper over libjpeg-turbo's TurboJPEG 3 API for partial, scaled decoding.
//!
//! The `turbojpeg` crate's safe API has no cropping region and allocates an error string on every
//! failure, so the decoder talks to `turbojpeg-sys` directly. One [`JpegDecoder`] per worker.

use std::ffi::CStr;
use turbojpeg_sys as tj;

/// What the JPEG header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// TurboJPEG subsampling code (`TJSAMP_*`), -1 when unknown.
    pub subsamp: i32,
    /// TurboJPEG colorspace code (`TJCS_*`).
    pub colorspace: i32,
    /// Whether the image is lossless JPEG (no DCT scaling, no cropping).
    pub lossless: bool,
}

impl JpegHeader {
    /// Whether the pixels are CMYK/YCCK (decoded as CMYK and converted).
    pub fn is_cmyk(&self) -> bool {
        self.colorspace == tj::TJCS_TJCS_CMYK as i32 || self.colorspace == tj::TJCS_TJCS_YCCK as i32
    }

    /// The iMCU width at scale `num/8` (the alignment of a cropping region's left edge), or
    /// `None` when cropping is not possible.
    pub fn scaled_mcu_width(&self, num: usize) -> Option<usize> {
        if self.lossless || !(0..7).contains(&self.subsamp) {
            return None;
        }
        let w = MCU_WIDTH[self.subsamp as usize];
        Some((w * num).div_ceil(8))
    }
}

/// iMCU width per `TJSAMP_*` code (444, 422, 420, GRAY, 440, 411, 441), as in `turbojpeg.h`
/// (a header-only table, not an exported symbol).
const MCU_WIDTH: [usize; 7] = [8, 16, 16, 8, 8, 32, 8];

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Dimension after DCT scaling by `num/8`, as libjpeg-turbo computes it (`TJSCALED`).
pub fn scaled(dim: usize, num: usize) -> usize {
    (dim * num).div_ceil(8)
}

/// An owned TurboJPEG decompression handle.
#[derive(Debug)]
pub struct JpegDecoder {
    handle: tj::tjhandle,
}

// SAFETY: a TurboJPEG handle is an independent heap object with no thread affinity; it is used
// from one thread at a time (every method takes `&mut self`).
unsafe impl Send for JpegDecoder {}

/// A decode failure: the message, and whether libjpeg called it a warning (data still produced).
#[derive(Debug, Clone)]
pub struct JpegError {
    /// libjpeg-turbo's message.
    pub message: String,
    /// `true` for a warning (e.g. corrupt data that was still decoded), `false` for a fatal error.
    pub warning: bool,
}

impl JpegDecoder {
    /// A new decompressor.
    pub fn new() -> Result<Self, String> {
        // SAFETY: plain FFI constructor; a null return is handled below.
        let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if handle.is_null() {
            return Err("libjpeg-turbo: cannot create a decompressor".into());
        }
        Ok(JpegDecoder { handle })
    }

    /// Takes the handle's error, then replaces the handle with a fresh one.
    ///
    /// After a failure (or a warning) a TurboJPEG 3.1 handle can keep stale state: its warning
    /// flag stays set, and the libjpeg state machine may resume mid-stream on the next header
    /// read, reporting the previous image's dimensions. Errors are rare, so a new handle is the
    /// simple, certain cure.
    fn error(&mut self) -> JpegError {
        // SAFETY: `handle` is valid; tj3GetErrorStr returns a NUL-terminated string owned by the
        // handle (or a static one), which is copied before the handle is destroyed.
        let message = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.handle)) }.to_string_lossy().into_owned();
        // SAFETY: `handle` is valid.
        let code = unsafe { tj::tj3GetErrorCode(self.handle) };
        // SAFETY: plain FFI constructor; a null return is handled below.
        let fresh = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if !fresh.is_null() {
            // SAFETY: the old handle is valid and destroyed exactly once; `fresh` replaces it.
            unsafe { tj::tj3Destroy(self.handle) };
            self.handle = fresh;
        }
        JpegError { message: message.trim().to_string(), warning: code == tj::TJERR_TJERR_WARNING as i32 }
    }

    fn get(&mut self, param: tj::TJPARAM) -> i32 {
        // SAFETY: `handle` is valid and `param` is a TurboJPEG parameter id.
        unsafe { tj::tj3Get(self.handle, param as i32) }
    }

    /// Reads the header of `data`.
    pub fn header(&mut self, data: &[u8]) -> Result<JpegHeader, JpegError> {
        // SAFETY: `data` is a live slice of `data.len()` bytes; libjpeg-turbo only reads it.
        let r = unsafe { tj::tj3DecompressHeader(self.handle, data.as_ptr(), data.len() as tj::size_t) };
        if r != 0 {
            return Err(self.error());
        }
        let h = JpegHeader {
            width: self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH).max(0) as usize,
            height: self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT).max(0) as usize,
            subsamp: self.get(tj::TJPARAM_TJPARAM_SUBSAMP),
            colorspace: self.get(tj::TJPARAM_TJPARAM_COLORSPACE),
            lossless: self.get(tj::TJPARAM_TJPARAM_LOSSLESS) != 0,
        };
        if h.width == 0 || h.height == 0 {
            return Err(JpegError { message: "JPEG header has a zero dimension".into(), warning: false });
        }
        Ok(h)
    }

    /// Decodes `data` at scale
    /// `num/8`, restricted to `region = (x, y, w, h)` in scaled coordinates (x aligned to
    /// [`JpegHeader::scaled_mcu_width`]), into `out` with `channels` = 3 (RGB) or 4 (CMYK) bytes
    /// per pixel and rows of `w * channels` bytes.
    pub fn decode(
        &mut self,
        data: &[u8],
        num: usize,
        region: (usize, usize, usize, usize),
        channels: usize,
        out: &mut [u8],
    ) -> Result<(), JpegError> {
        let (x, y, w, h) = region;
        let need = w * h * channels;
        if out.len() < need {
            return Err(JpegError { message: "output buffer too small".into(), warning: false });
        }
        // TurboJPEG matches factors exactly against its table of reduced fractions (1/1, 1/2, ...).
        let g = gcd(num, 8);
        // The cropping region needs the header of *this* image in the handle.
        self.header(data)?;
        let sf = tj::tjscalingfactor { num: (num / g) as i32, denom: (8 / g) as i32 };
        // SAFETY: `handle` is valid; the scaling factor is one of n/8, which TurboJPEG supports.
        if unsafe { tj::tj3SetScalingFactor(self.handle, sf) } != 0 {
            return Err(self.error());
        }
        let region = tj::tjregion { x: x as i32, y: y as i32, w: w as i32, h: h as i32 };
        // SAFETY: `handle` is valid and the header was read, as tj3SetCroppingRegion requires.
        if unsafe { tj::tj3SetCroppingRegion(self.handle, region) } != 0 {
            return Err(self.error());
        }
        let format = if channels == 4 { tj::TJPF_TJPF_CMYK } else { tj::TJPF_TJPF_RGB };
        // SAFETY: `out` holds at least `h` rows of `w * channels` bytes (checked above), which is
        // what tj3Decompress8 writes for the cropping region set above.
        let r = unsafe {
            tj::tj3Decompress8(
                self.handle,
                data.as_ptr(),
                data.len() as tj::size_t,
                out.as_mut_ptr(),
                (w * channels) as i32,
                format,
            )
        };
        if r != 0 {
            return Err(self.error());
        }
        // Reset the region so a later header()/decode() of another file starts clean.
        let none = tj::tjregion { x: 0, y: 0, w: 0, h: 0 };
        // SAFETY: `handle` is valid; an all-zero region means "uncropped".
        unsafe { tj::tj3SetCroppingRegion(self.handle, none) };
        Ok(())
    }
}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // SAFETY: `handle` came from tj3Init and is destroyed exactly once.
        unsafe { tj::tj3Destroy(self.handle) };
    }
}

/// The libjpeg-turbo version this build links (from the vendored sources).
pub const LIBJPEG_TURBO_VERSION: &str = "3.1.0";
