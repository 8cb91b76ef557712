//! The structure of JPEG and PNG files, walked over untrusted bytes: where a JPEG's first scan
//! starts, whether an end-of-image marker follows it, and where the EXIF data of a JPEG (APP1)
//! or a PNG (`eXIf` chunk) lies. Every access is bounds-checked; a malformed file ends the
//! walk, it never panics.
//!
//! The JPEG walk reads markers as libjpeg does (`jdmarker.c`, `next_marker`): bytes before a
//! marker that are not `0xFF` are skipped (libjpeg warns "extraneous bytes before marker" and
//! goes on), runs of `0xFF` are fill bytes, `FF 00` is not a marker, and a segment is skipped by
//! its length field. So the walk finds what libjpeg finds in files that libjpeg accepts with a
//! warning.

/// What a walk of a JPEG's marker segments found, up to its first scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JpegLayout<'a> {
    /// The TIFF data of the first APP1 segment that starts with `Exif\0\0` (as Pillow reads
    /// it), without that prefix.
    pub exif: Option<&'a [u8]>,
    /// Offset of the first scan's entropy-coded data (the byte after its SOS segment); `None`
    /// when the walk found no SOS.
    pub scan_data: Option<usize>,
    /// The frame header: its marker (`0xC0` baseline, `0xC2` progressive, ...), sample
    /// precision and component count.
    pub frame: Option<(u8, u8, u8)>,
    /// Whether an Adobe `APP14` segment is present (its transform decides RGB/YCbCr/CMYK).
    pub adobe: bool,
    /// Whether the three components are named `R`, `G`, `B` (an RGB JPEG).
    pub rgb_ids: bool,
}

/// Walks the marker segments of `data` (a JPEG: `FF D8` first) up to the first SOS.
pub fn jpeg_layout(data: &[u8]) -> JpegLayout<'_> {
    let mut out = JpegLayout::default();
    if !data.starts_with(&[0xFF, 0xD8]) {
        return out;
    }
    let n = data.len();
    let mut pos = 2;
    loop {
        // libjpeg's next_marker: skip to an 0xFF, skip fill bytes; `FF 00` is data, go on.
        let marker = loop {
            while pos < n && data[pos] != 0xFF {
                pos += 1;
            }
            while pos < n && data[pos] == 0xFF {
                pos += 1;
            }
            if pos >= n {
                return out;
            }
            let c = data[pos];
            pos += 1;
            if c != 0 {
                break c;
            }
        };
        match marker {
            // Markers without a segment: SOI, TEM, RSTn.
            0xD8 | 0x01 | 0xD0..=0xD7 => continue,
            // End of image before any scan.
            0xD9 => return out,
            _ => {}
        }
        let Some(len) = data.get(pos..pos + 2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize) else {
            return out;
        };
        if len < 2 {
            return out;
        }
        let end = pos + len;
        if marker == 0xDA {
            out.scan_data = Some(end.min(n));
            return out;
        }
        let seg = &data[(pos + 2).min(n)..end.min(n)];
        if matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC) && out.frame.is_none() {
            if let [p, _, _, _, _, nc, rest @ ..] = seg {
                out.frame = Some((marker, *p, *nc));
                out.rgb_ids = *nc == 3 && rest.len() >= 9 && [rest[0], rest[3], rest[6]] == *b"RGB";
            }
        }
        if marker == 0xEE && seg.starts_with(b"Adobe") {
            out.adobe = true;
        }
        if marker == 0xE1 && out.exif.is_none() {
            let seg = &data[pos + 2..end.min(n)];
            if let Some(tiff) = seg.strip_prefix(b"Exif\0\0") {
                out.exif = Some(tiff);
            }
        }
        pos = end;
    }
}

/// Whether an end-of-image marker (`FF D9`) lies in `data[scan_data..]`. Inside entropy-coded
/// data every `0xFF` byte is followed by `0x00` (byte stuffing) or a restart marker
/// (`D0`..`D7`), so after the first scan's start `FF D9` is the end of the image (or lies in
/// whatever follows it); a file without one was cut short. Searched from the end: a whole file
/// is found at once.
pub fn has_end_marker(data: &[u8], scan_data: usize) -> bool {
    data.get(scan_data..).is_some_and(|rest| rest.windows(2).rev().any(|w| w == [0xFF, 0xD9]))
}

/// The data of the first `eXIf` chunk of a PNG (before or after the image data, as Pillow
/// reads it), or `None` when there is none or the chunk structure breaks before one.
pub fn png_exif(data: &[u8]) -> Option<&[u8]> {
    const SIGNATURE: usize = 8;
    let mut pos = SIGNATURE;
    loop {
        let head = data.get(pos..pos.checked_add(8)?)?;
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let kind = &head[4..8];
        let start = pos + 8;
        let end = start.checked_add(len)?;
        if kind == b"eXIf" {
            return data.get(start..end);
        }
        if kind == b"IEND" {
            return None;
        }
        pos = end.checked_add(4)?; // the CRC
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SOI, an APP1 Exif segment holding `tiff`, a DQT-like segment, SOS, scan bytes, EOI.
    fn tiny_jpeg(tiff: &[u8], junk_before_dqt: usize) -> Vec<u8> {
        let mut j = vec![0xFF, 0xD8, 0xFF, 0xE1];
        j.extend_from_slice(&((tiff.len() + 8) as u16).to_be_bytes());
        j.extend_from_slice(b"Exif\0\0");
        j.extend_from_slice(tiff);
        j.extend(std::iter::repeat_n(0x11, junk_before_dqt));
        j.extend_from_slice(&[0xFF, 0xFF, 0xDB, 0x00, 0x04, 0xFF, 0xD9]); // payload holds FF D9
        j.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x03, 0x00]);
        j.extend_from_slice(&[0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD3, 0x56, 0xFF, 0xD9]);
        j
    }

    #[test]
    fn finds_exif_and_the_scan_like_libjpeg() {
        for junk in [0, 4] {
            let j = tiny_jpeg(b"II*\0tiff", junk);
            let l = jpeg_layout(&j);
            assert_eq!(l.exif, Some(&b"II*\0tiff"[..]), "junk {junk}");
            let sos = j.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
            assert_eq!(l.scan_data, Some(sos + 5), "junk {junk}");
            assert!(has_end_marker(&j, sos + 5));
            // Cut anywhere after the scan started: no end marker (the one in the DQT payload
            // lies before the scan and does not count).
            for cut in sos + 5..j.len() - 1 {
                assert!(!has_end_marker(&j[..cut], sos + 5), "cut {cut}");
            }
        }
    }

    #[test]
    fn malformed_jpegs_end_the_walk_without_panicking() {
        let j = tiny_jpeg(b"II*\0tiff", 0);
        for cut in 0..j.len() {
            let _ = jpeg_layout(&j[..cut]);
        }
        assert_eq!(jpeg_layout(b"not a jpeg"), JpegLayout::default());
        assert_eq!(jpeg_layout(&[0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x01]).scan_data, None); // length < 2
        assert_eq!(jpeg_layout(&[0xFF, 0xD8, 0xFF, 0xD9, 0xFF, 0xDA, 0, 2]).scan_data, None);
        assert!(!has_end_marker(&[0xFF, 0xD9], 5));
    }

    fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend_from_slice(kind);
        c.extend_from_slice(data);
        c.extend_from_slice(&[0; 4]);
        c
    }

    #[test]
    fn finds_png_exif_before_or_after_the_image_data() {
        let sig = b"\x89PNG\r\n\x1a\n".to_vec();
        let ihdr = chunk(b"IHDR", &[0; 13]);
        let idat = chunk(b"IDAT", &[1, 2, 3]);
        let exif = chunk(b"eXIf", b"MM\0*rest");
        let iend = chunk(b"IEND", b"");
        let before = [&sig[..], &ihdr, &exif, &idat, &iend].concat();
        let after = [&sig[..], &ihdr, &idat, &exif, &iend].concat();
        let none = [&sig[..], &ihdr, &idat, &iend, &exif].concat();
        assert_eq!(png_exif(&before), Some(&b"MM\0*rest"[..]));
        assert_eq!(png_exif(&after), Some(&b"MM\0*rest"[..]));
        assert_eq!(png_exif(&none), None, "nothing after IEND");
        for cut in 0..after.len() {
            let _ = png_exif(&after[..cut]);
        }
        let mut huge = [&sig[..], &ihdr].concat();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        huge.extend_from_slice(b"eXIf");
        assert_eq!(png_exif(&huge), None);
    }
}
