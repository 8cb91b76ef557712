//! EXIF orientation from a JPEG's APP1 segment: a bounds-checked parser of untrusted bytes.

/// The EXIF orientation (1..=8) of a JPEG, or `None` when absent or malformed.
pub fn jpeg_orientation(data: &[u8]) -> Option<u8> {
    if data.len() < 4 || data[0] != 0xFF || data[1] != 0xD8 {
        return None;
    }
    let mut pos = 2;
    while pos + 4 <= data.len() {
        if data[pos] != 0xFF {
            return None;
        }
        let marker = data[pos + 1];
        if marker == 0xFF {
            pos += 1;
            continue;
        }
        // Start of scan or end of image: no more metadata.
        if marker == 0xDA || marker == 0xD9 {
            return None;
        }
        let len = u16::from_be_bytes([data[pos + 2], data[pos + 3]]) as usize;
        if len < 2 {
            return None;
        }
        let seg_start = pos + 4;
        let seg_end = (pos + 2 + len).min(data.len());
        if marker == 0xE1 {
            let seg = &data[seg_start..seg_end];
            if seg.len() > 6 && &seg[..6] == b"Exif\0\0" {
                if let Some(o) = tiff_orientation(&seg[6..]) {
                    return Some(o);
                }
            }
        }
        pos += 2 + len;
    }
    None
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
            let v = u16_at(e + 8)?;
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
