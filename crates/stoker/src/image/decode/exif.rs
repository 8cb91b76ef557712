//! EXIF orientation: from a JPEG's first `Exif` APP1 segment or a PNG's `eXIf` chunk (found by
//! [`super::markers`]), read from the TIFF structure's first IFD as Pillow's `getexif()` reads
//! it. A bounds-checked parser of untrusted bytes: anything malformed is "no orientation".
//!
//! Orientation stored elsewhere (XMP `tiff:Orientation`, a PNG text chunk "Raw profile type
//! exif") is not read.

use super::markers;

/// The EXIF orientation (1..=8) of a JPEG, or `None` when absent or malformed.
pub fn jpeg_orientation(data: &[u8]) -> Option<u8> {
    markers::jpeg_layout(data).exif.and_then(app1_orientation)
}

/// The orientation in the EXIF data of a JPEG's APP1 segment, after its `Exif\0\0` prefix
/// ([`markers::JpegLayout::exif`]).
pub fn app1_orientation(tiff: &[u8]) -> Option<u8> {
    // Pillow strips up to two `Exif\0\0` prefixes; the segment's own was the first.
    tiff_orientation(tiff.strip_prefix(b"Exif\0\0").unwrap_or(tiff))
}

/// The EXIF orientation (1..=8) of a PNG (its `eXIf` chunk), or `None` when absent or malformed.
pub fn png_orientation(data: &[u8]) -> Option<u8> {
    markers::png_exif(data).and_then(exif_orientation)
}

/// The orientation in EXIF data that may start with one or two `Exif\0\0` prefixes (Pillow
/// strips up to two; PNG writers differ on whether the chunk has one).
fn exif_orientation(mut data: &[u8]) -> Option<u8> {
    for _ in 0..2 {
        data = data.strip_prefix(b"Exif\0\0").unwrap_or(data);
    }
    tiff_orientation(data)
}

fn tiff_orientation(t: &[u8]) -> Option<u8> {
    if t.len() < 8 {
        return None;
    }
    let le = match &t[..2] {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    let u16_at = |o: usize| -> Option<u16> {
        let b = t.get(o..o + 2)?;
        Some(if le { u16::from_le_bytes([b[0], b[1]]) } else { u16::from_be_bytes([b[0], b[1]]) })
    };
    let u32_at = |o: usize| -> Option<u32> {
        let b = t.get(o..o + 4)?;
        let a = [b[0], b[1], b[2], b[3]];
        Some(if le { u32::from_le_bytes(a) } else { u32::from_be_bytes(a) })
    };
    if u16_at(2)? != 42 {
        return None;
    }
    let ifd = u32_at(4)? as usize;
    let n = u16_at(ifd)? as usize;
    for k in 0..n.min(512) {
        let e = ifd + 2 + k * 12;
        if u16_at(e)? == 0x0112 {
            // The value as its field type says (SHORT as the standard has it; BYTE, LONG and
            // their signed kinds are read too, as Pillow does).
            let v = match u16_at(e + 2)? {
                1 | 6 => u32::from(*t.get(e + 8)?),
                3 | 8 => u32::from(u16_at(e + 8)?),
                4 | 9 => u32_at(e + 8)?,
                _ => return None,
            };
            return (1..=8).contains(&v).then_some(v as u8);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal JPEG prefix with an EXIF APP1 segment carrying `orientation`.
    pub(crate) fn exif_prefix(orientation: u16, little_endian: bool) -> Vec<u8> {
        let mut tiff = vec![];
        type W16 = fn(u16) -> [u8; 2];
        type W32 = fn(u32) -> [u8; 4];
        let (w16, w32): (W16, W32) =
            if little_endian { (u16::to_le_bytes, u32::to_le_bytes) } else { (u16::to_be_bytes, u32::to_be_bytes) };
        tiff.extend_from_slice(if little_endian { b"II" } else { b"MM" });
        tiff.extend_from_slice(&w16(42));
        tiff.extend_from_slice(&w32(8));
        tiff.extend_from_slice(&w16(1));
        tiff.extend_from_slice(&w16(0x0112));
        tiff.extend_from_slice(&w16(3));
        tiff.extend_from_slice(&w32(1));
        tiff.extend_from_slice(&w16(orientation));
        tiff.extend_from_slice(&[0, 0]);
        tiff.extend_from_slice(&w32(0));
        let mut seg = b"Exif\0\0".to_vec();
        seg.extend_from_slice(&tiff);
        let mut out = vec![0xFF, 0xD8, 0xFF, 0xE1];
        out.extend_from_slice(&((seg.len() + 2) as u16).to_be_bytes());
        out.extend_from_slice(&seg);
        out
    }

    #[test]
    fn reads_orientation_both_endians() {
        for o in 1..=8 {
            assert_eq!(jpeg_orientation(&exif_prefix(o, true)), Some(o as u8));
            assert_eq!(jpeg_orientation(&exif_prefix(o, false)), Some(o as u8));
        }
    }

    #[test]
    fn png_exif_chunks_and_other_field_types() {
        let jpeg = exif_prefix(6, false);
        let tiff = &jpeg[12..]; // after SOI, APP1, length and "Exif\0\0"
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for prefix in [&b""[..], b"Exif\0\0", b"Exif\0\0Exif\0\0"] {
            let data = [prefix, tiff].concat();
            let mut p = png.clone();
            p.extend_from_slice(&(data.len() as u32).to_be_bytes());
            p.extend_from_slice(b"eXIf");
            p.extend_from_slice(&data);
            p.extend_from_slice(&[0; 4]);
            assert_eq!(png_orientation(&p), Some(6), "prefix {prefix:?}");
        }
        png.extend_from_slice(b"garbage");
        assert_eq!(png_orientation(&png), None);
        // The value as a LONG (type 4), big-endian: its low half is the orientation.
        let mut long = exif_prefix(0, false);
        let e = 12 + 10; // tiff start + IFD offset 8 + entry count 2
        long[e + 2..e + 4].copy_from_slice(&4u16.to_be_bytes());
        long[e + 8..e + 12].copy_from_slice(&3u32.to_be_bytes());
        assert_eq!(jpeg_orientation(&long), Some(3));
        // Bytes that are not a marker before the APP1 segment are skipped, as libjpeg and
        // Pillow skip them.
        let p = exif_prefix(8, true);
        let junk = [&p[..2], &[0x00, 0x11, 0x22, 0x33][..], &p[2..]].concat();
        assert_eq!(jpeg_orientation(&junk), Some(8));
    }

    #[test]
    fn garbage_is_none_not_panic() {
        assert_eq!(jpeg_orientation(b""), None);
        assert_eq!(jpeg_orientation(&[0xFF, 0xD8, 0xFF, 0xE1, 0xFF, 0xFF, b'E']), None);
        let mut p = exif_prefix(6, true);
        for cut in 0..p.len() {
            let _ = jpeg_orientation(&p[..cut]);
        }
        p[20] = 0xFF;
        let _ = jpeg_orientation(&p);
    }
}
