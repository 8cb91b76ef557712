//! A thin, safe wrapper over libjpeg-turbo's TurboJPEG 3 API for partial, scaled decoding.
//!
//! The `turbojpeg` crate's safe API has no cropping region, no pixel or memory limit (only a scan
//! limit) and allocates an error string on every failure, so the decoder talks to `turbojpeg-sys`
//! directly. One [`JpegDecoder`] per worker.
//!
//! Every handle carries libjpeg-turbo's own limits ([`JpegLimits`]), so a decompression bomb is
//! refused inside the library too, not only by the header check in [`super::Decoder::info`].
//!
//! libjpeg *warnings* (corrupt data it recovered from: extraneous bytes before a marker, a bad
//! Huffman code, a premature end of a data segment) are not errors here, in the header as in
//! the scan data, as for Pillow and torchvision; the first one is kept
//! ([`JpegDecoder::take_warning`]) so the caller can count it. TurboJPEG reports a warning and
//! a fatal error that follows one with the same code, so a failure is a warning only when its
//! message is one of libjpeg's warning messages ([`is_warning_message`]).

use std::ffi::CStr;
use turbojpeg_sys as tj;

/// A region `(x, y, width, height)` in pixels.
pub type Rect = (usize, usize, usize, usize);

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
    /// Bits per sample (8 for almost every JPEG; 12 or 16 for some medical and raw images).
    pub precision: i32,
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

/// The progressive scans a JPEG may have before decoding it is an error (`TJPARAM_SCANLIMIT`).
/// 500 is libjpeg-turbo's own choice for `TJFLAG_LIMITSCANS`: far above what encoders write
/// (about 10), far below the thousands of tiny scans that make a small file cost minutes of CPU.
pub const SCAN_LIMIT: i32 = 500;

/// The limits set on every TurboJPEG handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegLimits {
    /// The largest image (width x height, from the header) that is decoded.
    pub max_pixels: u64,
}

impl JpegLimits {
    /// `TJPARAM_MAXPIXELS`: `max_pixels`, or 0 (no limit in the library) when it does not fit
    /// the library's `int`; [`super::check_pixels`] still applies.
    pub fn tj_max_pixels(&self) -> i32 {
        i32::try_from(self.max_pixels).unwrap_or(0)
    }

    /// `TJPARAM_MAXMEMORY`, in MiB: the memory libjpeg may hold for intermediate buffers (the
    /// whole-image coefficient arrays of progressive and multi-scan JPEGs). Bound: 8 bytes per
    /// pixel of `max_pixels` (64 two-byte DCT coefficients per 8x8 block, for each of at most 4
    /// full-resolution components (CMYK 4:4:4)), plus 64 MiB for MCU padding and row buffers;
    /// with the default `max_pixels` that is 1430 MiB. Capped at the library's maximum; 0 (no
    /// limit) only if `max_pixels` is 0.
    pub fn tj_max_memory_mib(&self) -> i32 {
        if self.max_pixels == 0 {
            return 0;
        }
        let bytes = self.max_pixels.saturating_mul(8).saturating_add(64 << 20);
        i32::try_from(bytes.div_ceil(1 << 20)).unwrap_or(i32::MAX)
    }
}

/// An owned TurboJPEG decompression handle.
#[derive(Debug)]
pub struct JpegDecoder {
    handle: tj::tjhandle,
    limits: JpegLimits,
    /// The first libjpeg warning since [`JpegDecoder::take_warning`] was last called.
    warning: Option<String>,
}

// SAFETY: a TurboJPEG handle is an independent heap object with no thread affinity; it is used
// from one thread at a time (every method takes `&mut self`).
unsafe impl Send for JpegDecoder {}

/// A decode failure (always fatal: warnings are not errors, see [`JpegDecoder::take_warning`]).
#[derive(Debug, Clone)]
pub struct JpegError {
    /// libjpeg-turbo's message.
    pub message: String,
    /// Whether libjpeg had warned about this image before the fatal error.
    pub warning: bool,
}

/// Whether `message` is one of libjpeg's warnings (`JWRN_*` in `jerror.h`): corrupt data that
/// libjpeg recovered from. None of its fatal errors (`JERR_*`) starts like one of these.
pub fn is_warning_message(message: &str) -> bool {
    const WARNINGS: [&str; 7] = [
        "Corrupt JPEG data: ",
        "Premature end of JPEG file",
        "Unknown Adobe color transform code",
        "Inconsistent progression sequence for component",
        "Warning: unknown JFIF revision number",
        "Invalid SOS parameters for sequential JPEG",
        "Application transferred too many scanlines",
    ];
    WARNINGS.iter().any(|w| message.starts_with(w))
}

/// A new decompression handle with `limits` set, or `None` if libjpeg-turbo refuses either.
fn limited_handle(limits: JpegLimits) -> Option<tj::tjhandle> {
    // SAFETY: plain FFI constructor; a null return is handled below.
    let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
    if handle.is_null() {
        return None;
    }
    let params = [
        (tj::TJPARAM_TJPARAM_MAXPIXELS, limits.tj_max_pixels()),
        (tj::TJPARAM_TJPARAM_MAXMEMORY, limits.tj_max_memory_mib()),
        (tj::TJPARAM_TJPARAM_SCANLIMIT, SCAN_LIMIT),
        // No marker is kept: the ICC profile (the default) is never used, and a malformed one
        // would only add a warning ("bad ICC marker") where Pillow loads the file silently.
        (tj::TJPARAM_TJPARAM_SAVEMARKERS, 0),
    ];
    for (param, value) in params {
        // SAFETY: `handle` is a valid decompression handle; `param` is a TurboJPEG parameter id
        // and `value` lies in its documented range (non-negative, within `int`).
        if unsafe { tj::tj3Set(handle, param as i32, value) } != 0 {
            // SAFETY: `handle` came from tj3Init above and is not used after this.
            unsafe { tj::tj3Destroy(handle) };
            return None;
        }
    }
    Some(handle)
}

impl JpegDecoder {
    /// A new decompressor that refuses images over `max_pixels` (see [`JpegLimits`]).
    pub fn new(max_pixels: u64) -> Result<Self, String> {
        let limits = JpegLimits { max_pixels };
        let handle = limited_handle(limits).ok_or("libjpeg-turbo: cannot create a decompressor with limits")?;
        Ok(JpegDecoder { handle, limits, warning: None })
    }

    /// The limits this decoder's handle carries.
    pub fn limits(&self) -> JpegLimits {
        self.limits
    }

    /// The first libjpeg warning since the last call (header reads and decodes both note
    /// theirs), or `None`.
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    /// The outcome of a TurboJPEG call that returned `r`: `Ok(true)` when it succeeded with a
    /// libjpeg warning (noted for [`JpegDecoder::take_warning`]), `Ok(false)` without one, or
    /// the fatal error.
    ///
    /// After a fatal error a TurboJPEG 3.1 handle can keep stale state: the libjpeg state
    /// machine may resume mid-stream on the next header read, reporting the previous image's
    /// dimensions. Errors are rare, so a new handle (with the same limits) replaces it, the
    /// simple, certain cure. After a warning libjpeg has finished or aborted the image
    /// (`jpeg_abort_decompress`) and the handle is clean.
    fn outcome(&mut self, r: std::ffi::c_int) -> Result<bool, JpegError> {
        if r == 0 {
            return Ok(false);
        }
        // SAFETY: `handle` is valid; tj3GetErrorStr returns a NUL-terminated string owned by the
        // handle (or a thread-local one), which is copied before the handle is destroyed.
        let message = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.handle)) }.to_string_lossy().trim().to_string();
        // SAFETY: `handle` is valid.
        let code = unsafe { tj::tj3GetErrorCode(self.handle) };
        if code == tj::TJERR_TJERR_WARNING as i32 && is_warning_message(&message) {
            self.warning.get_or_insert(message);
            return Ok(true);
        }
        if let Some(fresh) = limited_handle(self.limits) {
            // SAFETY: the old handle is valid and destroyed exactly once; `fresh` replaces it.
            unsafe { tj::tj3Destroy(self.handle) };
            self.handle = fresh;
        }
        Err(JpegError { message, warning: code == tj::TJERR_TJERR_WARNING as i32 })
    }

    fn get(&mut self, param: tj::TJPARAM) -> i32 {
        // SAFETY: `handle` is valid and `param` is a TurboJPEG parameter id.
        unsafe { tj::tj3Get(self.handle, param as i32) }
    }

    /// Reads the header of `data`. A libjpeg warning while reading it (e.g. "4 extraneous
    /// bytes before marker 0xdb") is noted, not an error: libjpeg read the whole header.
    pub fn header(&mut self, data: &[u8]) -> Result<JpegHeader, JpegError> {
        // SAFETY: `data` is a live slice of `data.len()` bytes; libjpeg-turbo only reads it.
        let r = unsafe { tj::tj3DecompressHeader(self.handle, data.as_ptr(), data.len() as tj::size_t) };
        self.outcome(r)?;
        let h = JpegHeader {
            width: self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH).max(0) as usize,
            height: self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT).max(0) as usize,
            subsamp: self.get(tj::TJPARAM_TJPARAM_SUBSAMP),
            colorspace: self.get(tj::TJPARAM_TJPARAM_COLORSPACE),
            lossless: self.get(tj::TJPARAM_TJPARAM_LOSSLESS) != 0,
            precision: self.get(tj::TJPARAM_TJPARAM_PRECISION),
        };
        if h.width == 0 || h.height == 0 {
            return Err(JpegError { message: "JPEG header has a zero dimension".into(), warning: false });
        }
        if h.colorspace < 0 {
            let message = "could not determine the colorspace of the JPEG image".into();
            return Err(JpegError { message, warning: false });
        }
        Ok(h)
    }

    /// Decodes `data` at scale
    /// `num/8`, restricted to `region = (x, y, w, h)` in scaled coordinates (x aligned to
    /// [`JpegHeader::scaled_mcu_width`]), into `out` with `channels` = 3 (RGB) or 4 (CMYK) bytes
    /// per pixel and rows of `w * channels` bytes. A libjpeg warning is noted (see
    /// [`JpegDecoder::take_warning`]), not an error: the pixels were produced.
    pub fn decode(
        &mut self,
        data: &[u8],
        num: usize,
        region: (usize, usize, usize, usize),
        channels: usize,
        out: &mut [u8],
    ) -> Result<(), JpegError> {
        let (x, y, w, h) = region;
        let fatal = |message: &str| JpegError { message: message.into(), warning: false };
        if w == 0 || h == 0 {
            // TurboJPEG reads a width or height of 0 as "to the image's edge".
            return Err(fatal("empty region"));
        }
        let pitch = w.checked_mul(channels).filter(|&p| i32::try_from(p).is_ok());
        let need = pitch.and_then(|p| p.checked_mul(h)).ok_or_else(|| fatal("region too large"))?;
        if out.len() < need {
            return Err(fatal("output buffer too small"));
        }
        let int = |v: usize| i32::try_from(v).map_err(|_| fatal("region too large"));
        let region = tj::tjregion { x: int(x)?, y: int(y)?, w: int(w)?, h: int(h)? };
        // TurboJPEG matches factors exactly against its table of reduced fractions (1/1, 1/2, ...).
        let g = gcd(num, 8);
        // The cropping region needs the header of *this* image in the handle.
        self.header(data)?;
        let sf = tj::tjscalingfactor { num: (num / g) as i32, denom: (8 / g) as i32 };
        // SAFETY: `handle` is valid; the scaling factor is one of n/8, which TurboJPEG supports.
        let r = unsafe { tj::tj3SetScalingFactor(self.handle, sf) };
        self.outcome(r)?;
        // SAFETY: `handle` is valid and the header was read, as tj3SetCroppingRegion requires.
        let r = unsafe { tj::tj3SetCroppingRegion(self.handle, region) };
        self.outcome(r)?;
        let format = if channels == 4 { tj::TJPF_TJPF_CMYK } else { tj::TJPF_TJPF_RGB };
        // SAFETY: `out` holds at least `h` rows of `w * channels` bytes (checked above), which is
        // what tj3Decompress8 writes for the cropping region set above.
        let r = unsafe {
            tj::tj3Decompress8(
                self.handle,
                data.as_ptr(),
                data.len() as tj::size_t,
                out.as_mut_ptr(),
                (w * channels) as i32, // fits: checked above
                format,
            )
        };
        self.outcome(r)?;
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
