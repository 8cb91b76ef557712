//! Decoding: encoded bytes to RGB8 pixels, doing only the work the output needs.
//!
//! JPEG goes through libjpeg-turbo ([`jpeg`]): the decoder is told the source box the ops will
//! sample and the output size, then decodes only the rows and (iMCU-aligned) columns around that
//! box, at the smallest DCT scale (1/8, 1/4, 1/2 or 1) that still covers the output size. PNG goes
//! through the `png` crate (full decode). Grayscale and CMYK become RGB, alpha is dropped, and the
//! EXIF orientation (a JPEG's `Exif` APP1 segment, a PNG's `eXIf` chunk: what Pillow's
//! `ImageOps.exif_transpose` reads, XMP aside) is applied unless turned off (to match
//! torchvision's PIL loader, which ignores it).
//!
//! Whether a file is good is decided as Pillow decides it, and the same way whatever part of it
//! an epoch's crop decodes: libjpeg *warnings* (corrupt data it recovered from) are tolerated in
//! the header as in the scan data and counted ([`Decoder::take_warnings`]); a JPEG whose data
//! ends without an end-of-image marker is truncated, judged from its structure before any
//! decoding (a crop that stops above the missing rows would otherwise never notice); a JPEG of
//! more than 8 bits per sample is named as unsupported.
//!
//! Untrusted headers never size anything unchecked: an image over
//! [`DecodeOptions::max_pixels`] is refused from its header (JPEG SOF, PNG IHDR) before any
//! buffer is sized, libjpeg-turbo carries its own pixel, memory and progressive-scan limits
//! ([`jpeg::JpegLimits`]), the png crate its byte limit ([`PNG_LIMIT_BYTES`]), every size is
//! computed with checked arithmetic and every scratch buffer grows fallibly, so a
//! decompression bomb or an allocation failure is that sample's error, never an abort.
//!
//! | file | role |
//! |---|---|
//! | `jpeg.rs` | safe wrapper over TurboJPEG 3 with cropping and scaling |
//! | `markers.rs` | JPEG marker segments and PNG chunks: scan start, end marker, EXIF data |
//! | `exif.rs` | EXIF orientation parser |
//!
//! Owns: bytes of one file to pixels (its size checked before any allocation). May not touch:
//! where the bytes come from (sources), batches, threads, the cache.

pub mod exif;
pub mod intervals;
pub mod jpeg;
pub mod markers;
pub mod restart;

#[cfg(test)]
mod entropy_tests;

use crate::error::{Error, Result};
use jpeg::{JpegDecoder, JpegHeader};
use std::path::Path;

/// The container format, sniffed from the first bytes (never from the file name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JPEG (decoded).
    Jpeg,
    /// PNG (decoded).
    Png,
    /// A known image format that stoker does not decode.
    Unsupported(&'static str),
    /// Not an image at all.
    Unknown,
}

/// Identifies the format of `data`.
pub fn sniff(data: &[u8]) -> Format {
    match data {
        [0xFF, 0xD8, 0xFF, ..] => Format::Jpeg,
        [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A, ..] => Format::Png,
        [b'B', b'M', ..] => Format::Unsupported("BMP"),
        [b'G', b'I', b'F', b'8', ..] => Format::Unsupported("GIF"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Format::Unsupported("WebP"),
        [b'I', b'I', 0x2A, 0x00, ..] | [b'M', b'M', 0x00, 0x2A, ..] => Format::Unsupported("TIFF"),
        [b'P', b'1'..=b'6', ..] => Format::Unsupported("PNM"),
        _ => Format::Unknown,
    }
}

/// Size and orientation of an image, as the ops will see it (after EXIF orientation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// Width after orientation.
    pub width: usize,
    /// Height after orientation.
    pub height: usize,
    /// EXIF orientation applied (1 = none), for JPEG and PNG.
    pub orientation: u8,
    format: Format,
    header: Option<JpegHeader>,
}

/// A decoded region: RGB8 rows of `width * 3` bytes, and where the requested source box lies
/// inside it (in these pixels' coordinates, fractional).
#[derive(Debug)]
pub struct Region<'a> {
    /// RGB8 pixels, `width * height * 3` bytes.
    pub pixels: &'a [u8],
    /// Region width.
    pub width: usize,
    /// Region height.
    pub height: usize,
    /// The requested box `(left, top, width, height)` in region coordinates.
    pub bbox: [f64; 4],
    /// DCT scale numerator used (`num/8`).
    pub scale_num: usize,
}

/// Decoding options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Apply EXIF orientation (JPEG).
    pub apply_exif: bool,
    /// Allow DCT-scaled decoding when the output is smaller than the source box.
    pub dct_scaling: bool,
    /// Allow decoding only the region around the source box.
    pub roi: bool,
    /// With `roi`: when a JPEG has restart markers that tile it, Huffman-decode only the
    /// intervals the region touches ([`intervals`]); the pixels are the same.
    pub restart: bool,
    /// The largest image (width x height, from its header) that is decoded; larger ones are
    /// that sample's error, refused before any pixel buffer is sized.
    pub max_pixels: u64,
}

/// Refuses an image whose header claims more than `max` pixels, before anything is sized
/// from it: "image too large: 100000x100000 > max_pixels (178956970)".
pub fn check_pixels(path: &Path, width: usize, height: usize, max: u64) -> Result<()> {
    match (width as u64).checked_mul(height as u64) {
        Some(n) if n <= max => Ok(()),
        _ => Err(Error::decode(path, format!("image too large: {width}x{height} > max_pixels ({max})"))),
    }
}

/// The default pixel limit: Pillow's decompression-bomb error threshold (2 x
/// `Image.MAX_IMAGE_PIXELS`), so what Pillow opens, stoker decodes.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { apply_exif: true, dct_scaling: true, roi: true, restart: true, max_pixels: DEFAULT_MAX_PIXELS }
    }
}

/// What the png crate itself may allocate per image (`png::Limits::bytes`): metadata chunks
/// (text, ICC profiles, including decompressed zTXt/iCCP) and chunk buffers; the crate's own
/// default, set explicitly. The decoded image is not part of it: its buffer is sized by stoker
/// after the IHDR check against `max_pixels`.
pub const PNG_LIMIT_BYTES: usize = 64 << 20;

/// The product of `dims` (a buffer size computed from a header), or that sample's error.
fn checked_size(path: &Path, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::decode(path, format!("image too large: buffer size {dims:?} overflows")))
}

/// `buf[..n]`, growing `buf` fallibly (to a power of two while that is affordable, so a stream
/// of slightly different sizes reallocates only a few times): an allocation failure is an
/// error naming the size, not an abort.
fn scratch<'b>(buf: &'b mut Vec<u8>, n: usize, path: &Path) -> Result<&'b mut [u8]> {
    if buf.capacity() < n {
        let rounded = n.checked_next_power_of_two().unwrap_or(n);
        let len = buf.len();
        if buf.try_reserve_exact(rounded - len).is_err() {
            buf.try_reserve_exact(n - len)
                .map_err(|e| Error::decode(path, format!("cannot allocate {n} bytes to decode this image: {e}")))?;
        }
    }
    if buf.len() < n {
        buf.resize(n, 0); // within capacity: allocates nothing
    }
    Ok(&mut buf[..n])
}

/// Per-worker decoder with reusable scratch buffers (no allocation per image once warm).
pub struct Decoder {
    jpeg: JpegDecoder,
    opts: DecodeOptions,
    scratch: Vec<u8>,
    aux: Vec<u8>,
    /// The sub-image of restart intervals ([`intervals::sub_image`]) and its marker offsets.
    sub: Vec<u8>,
    marks: Vec<u32>,
    png_dims: (usize, usize),
    /// Whether libjpeg warned about the image in hand (its header or its data).
    warned: bool,
    /// Images decoded despite a libjpeg warning, since [`Decoder::take_warnings`].
    warnings: u64,
    /// Regions decoded from their restart intervals alone, since
    /// [`Decoder::take_restart_decodes`].
    restart_decodes: u64,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("opts", &self.opts).finish()
    }
}

impl Decoder {
    /// A decoder with options `opts`.
    pub fn new(opts: DecodeOptions) -> Result<Self> {
        let jpeg = JpegDecoder::new(opts.max_pixels).map_err(Error::Internal)?;
        let (scratch, aux, sub, marks) = (vec![], vec![], vec![], vec![]);
        let (warned, warnings, restart_decodes) = (false, 0, 0);
        Ok(Decoder { jpeg, opts, scratch, aux, sub, marks, png_dims: (0, 0), warned, warnings, restart_decodes })
    }

    /// The options.
    pub fn options(&self) -> DecodeOptions {
        self.opts
    }

    /// How many images were decoded despite a libjpeg warning (corrupt data that libjpeg
    /// recovered from, in the header or the scan data, as Pillow does) since the last call;
    /// resets the count. An image counts once per successful [`Decoder::decode`].
    pub fn take_warnings(&mut self) -> u64 {
        std::mem::take(&mut self.warnings)
    }

    /// How many regions were decoded from their restart intervals alone
    /// ([`intervals::sub_image`]) since the last call; resets the count.
    pub fn take_restart_decodes(&mut self) -> u64 {
        std::mem::take(&mut self.restart_decodes)
    }

    /// Reads the size (after orientation) of the image in `data`; `path` names it in errors.
    ///
    /// The verdict on a file (good, or why not) is made here, from the whole file, so it does
    /// not depend on what part of it [`Decoder::decode`] is then asked for.
    pub fn info(&mut self, data: &[u8], path: &Path) -> Result<ImageInfo> {
        self.warned = false;
        let _ = self.jpeg.take_warning();
        match sniff(data) {
            Format::Jpeg => {
                let h =
                    self.jpeg.header(data).map_err(|e| Error::decode(path, format!("invalid JPEG: {}", e.message)))?;
                self.warned = self.jpeg.take_warning().is_some();
                if h.precision > 8 {
                    return Err(Error::decode(
                        path,
                        format!("unsupported: {}-bit JPEG (stoker decodes 8-bit JPEG)", h.precision),
                    ));
                }
                check_pixels(path, h.width, h.height, self.opts.max_pixels)?;
                let layout = markers::jpeg_layout(data);
                if let Some(scan) = layout.scan_data {
                    if !markers::has_end_marker(data, scan) {
                        return Err(Error::decode(
                            path,
                            "corrupt JPEG: truncated file (the data ends without an end-of-image marker)",
                        ));
                    }
                }
                let orientation =
                    if self.opts.apply_exif { layout.exif.and_then(exif::app1_orientation).unwrap_or(1) } else { 1 };
                let (width, height) = if orientation >= 5 { (h.height, h.width) } else { (h.width, h.height) };
                Ok(ImageInfo { width, height, orientation, format: Format::Jpeg, header: Some(h) })
            }
            Format::Png => {
                let orientation = if self.opts.apply_exif { exif::png_orientation(data).unwrap_or(1) } else { 1 };
                let (w, h) = self.decode_png(data, path, orientation)?;
                Ok(ImageInfo { width: w, height: h, orientation, format: Format::Png, header: None })
            }
            Format::Unsupported(name) => {
                Err(Error::decode(path, format!("unsupported image format {name} (stoker decodes JPEG and PNG)")))
            }
            Format::Unknown if data.is_empty() => Err(Error::decode(path, "empty file (0 bytes)")),
            Format::Unknown => Err(Error::decode(
                path,
                format!("not an image: unrecognised leading bytes {:02x?}", &data[..data.len().min(8)]),
            )),
        }
    }

    /// Decodes what is needed to resample the source box `bbox = (left, top, width, height)`
    /// (in oriented image coordinates) to an output of `out = (width, height)` pixels, the
    /// filter free to read around the box (a window into a resize of the whole image).
    pub fn decode<'a>(
        &'a mut self,
        data: &[u8],
        path: &Path,
        info: &ImageInfo,
        bbox: [f64; 4],
        out: (usize, usize),
    ) -> Result<Region<'a>> {
        self.decode_box(data, path, info, bbox, out, false)
    }

    /// [`Decoder::decode`] for a box that is `hard` or not (see
    /// [`Geometry::hard`](crate::image::ops::Geometry::hard)): the resampler reads nothing
    /// outside a hard box's integer hull ([`clip_window`](crate::image::ops::clip_window)), so
    /// its region needs no margin for the filter's reach.
    pub fn decode_box<'a>(
        &'a mut self,
        data: &[u8],
        path: &Path,
        info: &ImageInfo,
        bbox: [f64; 4],
        out: (usize, usize),
        hard: bool,
    ) -> Result<Region<'a>> {
        match info.format {
            Format::Png => {
                let (w, h) = self.png_dims;
                Ok(Region { pixels: &self.scratch[..w * h * 3], width: w, height: h, bbox, scale_num: 8 })
            }
            Format::Jpeg => self.decode_jpeg(data, path, info, bbox, out, hard),
            _ => Err(Error::Internal("decode() called on an unsupported format".into())),
        }
    }

    fn decode_jpeg<'a>(
        &'a mut self,
        data: &[u8],
        path: &Path,
        info: &ImageInfo,
        bbox: [f64; 4],
        out: (usize, usize),
        hard: bool,
    ) -> Result<Region<'a>> {
        let h = info.header.expect("jpeg info has a header");
        let [bx, by, bw, bh] = bbox;
        // Smallest DCT scale whose scaled box still covers the output in both directions.
        let mut num = 8;
        if self.opts.dct_scaling && !h.lossless {
            for n in [1usize, 2, 4] {
                if bw * n as f64 / 8.0 >= out.0 as f64 && bh * n as f64 / 8.0 >= out.1 as f64 {
                    num = n;
                    break;
                }
            }
        }
        let (sw, sh) = (jpeg::scaled(h.width, num), jpeg::scaled(h.height, num));
        let channels = if h.is_cmyk() { 4 } else { 3 };
        let orientation = info.orientation;

        if orientation != 1 {
            // Rare: decode the whole (scaled) image, then orient it.
            let n = self.jpeg_full(data, path, num, (sw, sh), channels)?;
            let (ow, oh) = if orientation >= 5 { (sh, sw) } else { (sw, sh) };
            let dst = scratch(&mut self.aux, n, path)?;
            orient(&self.scratch[..n], sw, sh, orientation, dst);
            let (fx, fy) = (ow as f64 / info.width as f64, oh as f64 / info.height as f64);
            let bbox = [bx * fx, by * fy, bw * fx, bh * fy];
            return Ok(Region { pixels: &self.aux[..n], width: ow, height: oh, bbox, scale_num: num });
        }

        let (fx, fy) = (sw as f64 / h.width as f64, sh as f64 / h.height as f64);
        let sbox = [bx * fx, by * fy, bw * fx, bh * fy];
        let (mut x0, mut y0, mut x1, mut y1) = (0usize, 0usize, sw, sh);
        if self.opts.roi {
            // Margin: the resampling filter's reach, so pixels near the box edge see the same
            // neighbours as in a full decode. A hard box's filter reads only the box's integer
            // hull: two pixels on the left and right, where libjpeg-turbo upsamples chroma at
            // a cropping region's edges as at an image's (replicating the edge sample), and
            // none above and below, where it upsamples from the rows of the whole image.
            let (mx, my) = if hard {
                (2.0, 0.0)
            } else {
                let m = crate::image::ops::resample::filter_margin;
                (m(sbox[2], out.0), m(sbox[3], out.1))
            };
            y0 = (sbox[1] - my).floor().max(0.0) as usize;
            y1 = ((sbox[1] + sbox[3] + my).ceil() as usize).min(sh);
            if let Some(align) = h.scaled_mcu_width(num) {
                x0 = (sbox[0] - mx).floor().max(0.0) as usize / align * align;
                x1 = ((sbox[0] + sbox[2] + mx).ceil() as usize).min(sw);
            }
            if y1 <= y0 || x1 <= x0 {
                (x0, y0, x1, y1) = (0, 0, sw, sh);
            }
        }
        let (rw, rh) = (x1 - x0, y1 - y0);
        let n = self.jpeg_region(data, path, num, (x0, y0, rw, rh), channels)?;
        let bbox = [sbox[0] - x0 as f64, sbox[1] - y0 as f64, sbox[2], sbox[3]];
        Ok(Region { pixels: &self.scratch[..n], width: rw, height: rh, bbox, scale_num: num })
    }

    /// Whole image at scale `num/8` into `self.scratch` as RGB; returns its size in bytes.
    fn jpeg_full(
        &mut self,
        data: &[u8],
        path: &Path,
        num: usize,
        (sw, sh): (usize, usize),
        channels: usize,
    ) -> Result<usize> {
        self.jpeg_region(data, path, num, (0, 0, sw, sh), channels)
    }

    /// `region = (x, y, w, h)` at scale `num/8` into `self.scratch` as RGB (through `self.aux`
    /// for CMYK); returns its size in bytes. Counts the image as decoded with warnings when
    /// libjpeg warned about its header ([`Decoder::info`]) or its data.
    fn jpeg_region(
        &mut self,
        data: &[u8],
        path: &Path,
        num: usize,
        region: (usize, usize, usize, usize),
        channels: usize,
    ) -> Result<usize> {
        let (x, y, w, h) = region;
        let max = self.opts.max_pixels;
        let err = |e: jpeg::JpegError| Error::decode(path, jpeg_reason(&e.message, max));
        let n = checked_size(path, &[w, h, 3])?;
        let sub = (self.opts.roi && self.opts.restart)
            .then(|| intervals::sub_image(data, num, region, &mut self.sub, &mut self.marks))
            .flatten()
            .map(|(ox, oy)| (&self.sub[..], (x - ox, y - oy, w, h)));
        let (warned, from_sub) = if channels == 4 {
            let cmyk = scratch(&mut self.aux, checked_size(path, &[w, h, 4])?, path)?;
            let r = decode_parts(&mut self.jpeg, sub, data, num, region, 4, cmyk).map_err(err)?;
            let rgb = scratch(&mut self.scratch, n, path)?;
            cmyk_to_rgb(&self.aux, rgb);
            r
        } else {
            let rgb = scratch(&mut self.scratch, n, path)?;
            decode_parts(&mut self.jpeg, sub, data, num, region, 3, rgb).map_err(err)?
        };
        self.restart_decodes += from_sub as u64;
        if std::mem::take(&mut self.warned) || warned {
            self.warnings += 1;
        }
        Ok(n)
    }

    /// Decodes a whole JPEG or PNG to RGB8 at full size, honouring EXIF orientation per the
    /// options (a reference path for tests and tools). Returns `(pixels, width, height)`.
    pub fn decode_full(&mut self, data: &[u8], path: &Path) -> Result<(Vec<u8>, usize, usize)> {
        let info = self.info(data, path)?;
        let saved = self.opts;
        self.opts.dct_scaling = false;
        self.opts.roi = false;
        let r = self.decode(
            data,
            path,
            &info,
            [0.0, 0.0, info.width as f64, info.height as f64],
            (info.width, info.height),
        );
        let out = r.map(|r| (r.pixels.to_vec(), r.width, r.height));
        self.opts = saved;
        out
    }

    /// Decodes a whole PNG into `self.scratch` as RGB8, oriented by EXIF `orientation`; returns
    /// its size (after orientation).
    fn decode_png(&mut self, data: &[u8], path: &Path, orientation: u8) -> Result<(usize, usize)> {
        let perr = |e: png::DecodingError| Error::decode(path, format!("invalid PNG: {e}"));
        let limits = png::Limits { bytes: PNG_LIMIT_BYTES };
        let mut dec = png::Decoder::new_with_limits(std::io::Cursor::new(data), limits);
        dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        // The IHDR alone first: a bomb is refused before the png crate or we size anything.
        let ihdr = dec.read_header_info().map_err(perr)?;
        check_pixels(path, ihdr.width as usize, ihdr.height as usize, self.opts.max_pixels)?;
        let mut reader = dec.read_info().map_err(perr)?;
        let size = reader
            .output_buffer_size()
            .ok_or_else(|| Error::decode(path, "image too large: PNG buffer size overflows"))?;
        let raw = scratch(&mut self.aux, size, path)?;
        let frame = reader.next_frame(raw).map_err(perr)?;
        let (w, h) = (frame.width as usize, frame.height as usize);
        let ch = match frame.color_type {
            png::ColorType::Grayscale => 1,
            png::ColorType::GrayscaleAlpha => 2,
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            png::ColorType::Indexed => return Err(Error::decode(path, "PNG palette was not expanded")),
        };
        if frame.bit_depth != png::BitDepth::Eight {
            return Err(Error::decode(path, format!("PNG bit depth {:?} not supported", frame.bit_depth)));
        }
        let line = frame.line_size;
        // The frame must lie inside the buffer the png crate filled (an APNG frame control
        // cannot make the copy below read past it).
        let inside = checked_size(path, &[w, ch])
            .ok()
            .filter(|&row| row <= line)
            .and_then(|row| h.checked_sub(1).map_or(Some(0), |last| last.checked_mul(line)?.checked_add(row)));
        if inside.is_none_or(|end| end > size) {
            return Err(Error::decode(path, format!("invalid PNG: frame {w}x{h} does not fit its buffer")));
        }
        let rgb = scratch(&mut self.scratch, checked_size(path, &[w, h, 3])?, path)?;
        for y in 0..h {
            let src = &self.aux[y * line..y * line + w * ch];
            let dst = &mut rgb[y * w * 3..(y + 1) * w * 3];
            match ch {
                3 => dst.copy_from_slice(src),
                1 | 2 => {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(ch)) {
                        d.fill(s[0]);
                    }
                }
                _ => {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                        d.copy_from_slice(&s[..3]);
                    }
                }
            }
        }
        let (w, h) = if orientation != 1 {
            let n = w * h * 3; // the size of `rgb`, checked above
            let dst = scratch(&mut self.aux, n, path)?;
            orient(&self.scratch[..n], w, h, orientation, dst);
            std::mem::swap(&mut self.scratch, &mut self.aux);
            if orientation >= 5 {
                (h, w)
            } else {
                (w, h)
            }
        } else {
            (w, h)
        };
        self.png_dims = (w, h);
        Ok((w, h))
    }
}

/// The reason a libjpeg-turbo error is reported with: its limits by name, else "corrupt JPEG".
fn jpeg_reason(message: &str, max_pixels: u64) -> String {
    if message.contains("Image is too large") {
        format!("image too large: libjpeg-turbo refused it ({message}; max_pixels {max_pixels})")
    } else if message.contains("more than") && message.contains("scans") {
        format!("too many progressive scans: {message} (limit {})", jpeg::SCAN_LIMIT)
    } else if message.contains("Backing store") || message.contains("Insufficient memory") {
        format!("image needs more decoder memory than max_pixels allows: {message}")
    } else {
        format!("corrupt JPEG: {message}")
    }
}

/// Decodes, accepting libjpeg *warnings* (e.g. a bad Huffman code) except a premature end of
/// the file, which means it is truncated; returns whether libjpeg warned. Fatal errors are
/// errors. (A file without an end-of-image marker is refused by [`Decoder::info`] before any
/// decoding; this is the backstop for one whose end marker lies where libjpeg never reads.)
fn decode_tolerant(
    dec: &mut JpegDecoder,
    data: &[u8],
    num: usize,
    region: (usize, usize, usize, usize),
    channels: usize,
    out: &mut [u8],
) -> std::result::Result<bool, jpeg::JpegError> {
    dec.decode(data, num, region, channels, out)?;
    match dec.take_warning() {
        Some(w) if w.starts_with("Premature end") => {
            Err(jpeg::JpegError { message: format!("truncated file ({w})"), warning: true })
        }
        w => Ok(w.is_some()),
    }
}

/// Decodes `region` of `data` as [`decode_tolerant`] does, from the sub-image of its restart
/// intervals when there is one (`sub`: its bytes and the region within it). Anything but a
/// clean decode of the sub-image (an error, a warning) decodes the whole file instead, so that
/// libjpeg reports about a damaged file what it always reports. Returns whether libjpeg
/// warned and whether the sub-image was decoded.
fn decode_parts(
    dec: &mut JpegDecoder,
    sub: Option<(&[u8], jpeg::Rect)>,
    data: &[u8],
    num: usize,
    region: (usize, usize, usize, usize),
    channels: usize,
    out: &mut [u8],
) -> std::result::Result<(bool, bool), jpeg::JpegError> {
    if let Some((sub, sub_region)) = sub {
        if let Ok(false) = decode_tolerant(dec, sub, num, sub_region, channels, out) {
            return Ok((false, true));
        }
        dec.take_warning();
    }
    Ok((decode_tolerant(dec, data, num, region, channels, out)?, false))
}

/// Adobe-style (inverted) CMYK to RGB, as PIL does for Photoshop CMYK JPEGs.
fn cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    for (d, s) in rgb.chunks_exact_mut(3).zip(cmyk.chunks_exact(4)) {
        let k = s[3] as u32;
        for c in 0..3 {
            d[c] = ((s[c] as u32 * k + 127) / 255) as u8;
        }
    }
}

/// Applies EXIF orientation `o` to `src` (`w` x `h` RGB8) into `dst`.
pub fn orient(src: &[u8], w: usize, h: usize, o: u8, dst: &mut [u8]) {
    let (ow, oh) = if o >= 5 { (h, w) } else { (w, h) };
    for y in 0..oh {
        for x in 0..ow {
            let (row, col) = match o {
                2 => (y, w - 1 - x),
                3 => (h - 1 - y, w - 1 - x),
                4 => (h - 1 - y, x),
                5 => (x, y),
                6 => (h - 1 - x, y),
                7 => (h - 1 - x, w - 1 - y),
                8 => (x, w - 1 - y),
                _ => (y, x),
            };
            let s = (row * w + col) * 3;
            let d = (y * ow + x) * 3;
            dst[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_formats() {
        assert_eq!(sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Format::Jpeg);
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\nxxxx"), Format::Png);
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Format::Unsupported("WebP"));
        assert_eq!(sniff(b"hello"), Format::Unknown);
        assert_eq!(sniff(b""), Format::Unknown);
    }

    #[test]
    fn orientation_6_rotates_clockwise() {
        // 2x1 image: red, green -> rotated 90° clockwise becomes 1x2: red on top, green below.
        let src = [255, 0, 0, 0, 255, 0];
        let mut dst = [0u8; 6];
        orient(&src, 2, 1, 6, &mut dst);
        assert_eq!(dst, [255, 0, 0, 0, 255, 0]);
        orient(&src, 2, 1, 8, &mut dst);
        assert_eq!(dst, [0, 255, 0, 255, 0, 0]);
        orient(&src, 2, 1, 2, &mut dst);
        assert_eq!(dst, [0, 255, 0, 255, 0, 0]);
    }
}

/// Decoding decided as Pillow decides, and the same way for every crop (issue 19, item 8).
#[cfg(test)]
mod reference_tests {
    use super::*;

    /// A smooth, photo-like RGB8 test image.
    fn pattern(w: usize, h: usize) -> Vec<u8> {
        let mut px = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                px.extend_from_slice(&[(x * 255 / w) as u8, (y * 255 / h) as u8, ((x + y) * 127 / (w + h)) as u8]);
            }
        }
        px
    }

    fn jpeg(w: usize, h: usize) -> Vec<u8> {
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_quality(90).unwrap();
        c.set_subsamp(turbojpeg::Subsamp::Sub2x2).unwrap();
        let px = pattern(w, h);
        let img = turbojpeg::Image {
            pixels: &px[..],
            width: w,
            pitch: w * 3,
            height: h,
            format: turbojpeg::PixelFormat::RGB,
        };
        c.compress_to_vec(img).unwrap()
    }

    /// `data` with `insert` placed before its first `FF marker`.
    fn insert_before(data: &[u8], marker: u8, insert: &[u8]) -> Vec<u8> {
        let at = data.windows(2).position(|w| w == [0xFF, marker]).unwrap();
        [&data[..at], insert, &data[at..]].concat()
    }

    fn decoder() -> Decoder {
        Decoder::new(DecodeOptions::default()).unwrap()
    }

    /// Decodes like the pipeline: info, then the box `bbox` to `out`.
    fn crop(dec: &mut Decoder, data: &[u8], bbox: [f64; 4], out: (usize, usize)) -> Result<Vec<u8>> {
        let info = dec.info(data, Path::new("x.jpg"))?;
        dec.decode(data, Path::new("x.jpg"), &info, bbox, out).map(|r| r.pixels.to_vec())
    }

    #[test]
    fn a_warning_in_the_header_is_tolerated_and_counted() {
        let good = jpeg(96, 64);
        let (want, w, h) = decoder().decode_full(&good, Path::new("good.jpg")).unwrap();
        // libjpeg: "Corrupt JPEG data: 4 extraneous bytes before marker 0xdb" while reading the
        // header (Pillow loads the file).
        let junk = insert_before(&good, 0xDB, &[0x00, 0x11, 0x22, 0x33]);
        let mut dec = decoder();
        assert_eq!(dec.decode_full(&junk, Path::new("junk.jpg")).unwrap(), (want.clone(), w, h));
        assert_eq!(dec.take_warnings(), 1);
        assert_eq!(dec.take_warnings(), 0);
        // Every path: a cropped, DCT-scaled region too; a clean file is not counted.
        crop(&mut dec, &junk, [10.0, 20.0, 64.0, 40.0], (16, 10)).unwrap();
        crop(&mut dec, &good, [10.0, 20.0, 64.0, 40.0], (16, 10)).unwrap();
        assert_eq!(dec.take_warnings(), 1);
        // The handle is clean afterwards: the next file decodes exactly.
        assert_eq!(dec.decode_full(&good, Path::new("good.jpg")).unwrap(), (want, w, h));
    }

    #[test]
    fn a_bad_icc_marker_is_not_even_read() {
        // An APP2 ICC_PROFILE chunk numbered 2 of 1 ("bad ICC marker" if libjpeg assembled ICC
        // profiles; stoker never uses them, and Pillow loads the file).
        let good = jpeg(48, 32);
        let mut app2 = vec![0xFF, 0xE2, 0x00, 0x14];
        app2.extend_from_slice(b"ICC_PROFILE\0");
        app2.extend_from_slice(&[2, 1, 9, 9, 9, 9]);
        let bad = [&good[..2], &app2[..], &good[2..]].concat();
        let mut dec = decoder();
        assert_eq!(
            dec.decode_full(&bad, Path::new("icc.jpg")).unwrap(),
            decoder().decode_full(&good, Path::new("g")).unwrap()
        );
        assert_eq!(dec.take_warnings(), 0);
    }

    #[test]
    fn a_fatal_error_after_a_warning_is_an_error() {
        // Extraneous bytes (a warning), then a SOF segment whose length is wrong (fatal:
        // "Bogus marker length"). TurboJPEG gives both the same error code.
        let good = jpeg(48, 32);
        let mut bad = insert_before(&good, 0xDB, &[0x00, 0x11, 0x22, 0x33]);
        let sof = bad.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        bad[sof + 3] += 3;
        let e = decoder().info(&bad, Path::new("bad.jpg")).unwrap_err().to_string();
        assert!(e.contains("invalid JPEG") && e.contains("Bogus marker length"), "{e}");
    }

    #[test]
    fn a_truncated_jpeg_is_refused_whatever_the_crop() {
        // The file without its final two bytes (the end-of-image marker): Pillow refuses it
        // ("image file is truncated"). A crop of the top rows never reads the end of the data;
        // the verdict must not depend on it.
        let good = jpeg(256, 192);
        let cut = &good[..good.len() - 2];
        let mut dec = decoder();
        for (bbox, out) in [
            ([0.0, 0.0, 64.0, 32.0], (64, 32)),
            ([100.0, 150.0, 150.0, 42.0], (150, 42)),
            ([0.0, 0.0, 256.0, 192.0], (32, 24)),
            ([8.0, 8.0, 16.0, 16.0], (16, 16)),
        ] {
            let e = crop(&mut dec, cut, bbox, out).unwrap_err().to_string();
            assert!(e.contains("truncated") && e.contains("corrupt JPEG"), "{bbox:?}: {e}");
            crop(&mut dec, &good, bbox, out).unwrap();
        }
        // Bytes after the end marker (camera trailers) are fine.
        let trailer = [&good[..], b"trailing data"].concat();
        crop(&mut dec, &trailer, [0.0, 0.0, 64.0, 32.0], (64, 32)).unwrap();
    }

    #[test]
    fn a_12_bit_jpeg_is_named_unsupported() {
        use turbojpeg_sys as tj;
        let (w, h) = (32usize, 24usize);
        let px: Vec<i16> = pattern(w, h).iter().map(|&v| i16::from(v) * 16).collect();
        // SAFETY: plain FFI constructor; checked for null.
        let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as i32) };
        assert!(!handle.is_null());
        let (mut buf, mut size): (*mut u8, tj::size_t) = (std::ptr::null_mut(), 0);
        // SAFETY: `handle` is a valid compressor; `px` holds `h` rows of `w * 3` samples; TurboJPEG
        // allocates `buf` (freed below with tj3Free) and writes its size to `size`.
        let data = unsafe {
            assert_eq!(tj::tj3Set(handle, tj::TJPARAM_TJPARAM_SUBSAMP as i32, tj::TJSAMP_TJSAMP_444), 0);
            assert_eq!(tj::tj3Set(handle, tj::TJPARAM_TJPARAM_QUALITY as i32, 90), 0);
            let r =
                tj::tj3Compress12(handle, px.as_ptr(), w as i32, 0, h as i32, tj::TJPF_TJPF_RGB, &mut buf, &mut size);
            assert_eq!(r, 0);
            let data = std::slice::from_raw_parts(buf, size as usize).to_vec();
            tj::tj3Free(buf.cast());
            tj::tj3Destroy(handle);
            data
        };
        let e = decoder().info(&data, Path::new("deep.jpg")).unwrap_err().to_string();
        assert!(e.contains("unsupported: 12-bit JPEG"), "{e}");
        assert!(e.contains("deep.jpg"), "{e}");
    }

    fn png_with_exif(w: usize, h: usize, exif: Option<(&[u8], bool)>) -> Vec<u8> {
        let mut out = vec![];
        {
            let mut enc = png::Encoder::new(&mut out, w as u32, h as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut wr = enc.write_header().unwrap();
            if let Some((e, false)) = exif {
                wr.write_chunk(png::chunk::eXIf, e).unwrap();
            }
            wr.write_image_data(&pattern(w, h)).unwrap();
            if let Some((e, true)) = exif {
                wr.write_chunk(png::chunk::eXIf, e).unwrap();
            }
            wr.finish().unwrap();
        }
        out
    }

    /// Little-endian TIFF data with one IFD entry: orientation `o`.
    fn tiff(o: u16) -> Vec<u8> {
        let mut t = b"II*\0".to_vec();
        t.extend_from_slice(&8u32.to_le_bytes());
        t.extend_from_slice(&1u16.to_le_bytes());
        t.extend_from_slice(&0x0112u16.to_le_bytes());
        t.extend_from_slice(&3u16.to_le_bytes());
        t.extend_from_slice(&1u32.to_le_bytes());
        t.extend_from_slice(&o.to_le_bytes());
        t.extend_from_slice(&[0; 6]);
        t
    }

    #[test]
    fn png_exif_orientation_is_applied() {
        let (w, h) = (12, 7);
        let plain = pattern(w, h);
        for o in 1..=8u16 {
            for after_idat in [false, true] {
                let t = tiff(o);
                let data = png_with_exif(w, h, Some((&t, after_idat)));
                let mut dec = decoder();
                let (px, pw, ph) = dec.decode_full(&data, Path::new("o.png")).unwrap();
                let mut want = vec![0; w * h * 3];
                orient(&plain, w, h, o as u8, &mut want);
                let dims = if o >= 5 { (h, w) } else { (w, h) };
                assert_eq!(((pw, ph), &px), (dims, &want), "orientation {o}, after IDAT {after_idat}");
                // Off: the stored pixels.
                let mut off = Decoder::new(DecodeOptions { apply_exif: false, ..DecodeOptions::default() }).unwrap();
                assert_eq!(off.decode_full(&data, Path::new("o.png")).unwrap(), (plain.clone(), w, h));
            }
        }
        let none = png_with_exif(w, h, None);
        assert_eq!(decoder().decode_full(&none, Path::new("n.png")).unwrap(), (plain, w, h));
    }
}
