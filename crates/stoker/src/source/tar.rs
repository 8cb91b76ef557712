//! A small USTAR reader/writer for WebDataset shards: enough to write deterministic shards and
//! to index existing ones (GNU long names and pax `path` records included). Every field of a
//! header is untrusted input: parsing is bounds-checked and errors say what is wrong.

/// One regular-file member: name, offset of its data in the archive, length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Member name (a key plus extension in WebDataset layout). Never used as a filesystem path.
    pub name: String,
    /// Byte offset of the member's data.
    pub offset: u64,
    /// Data length in bytes.
    pub size: u64,
}

/// Block size of tar.
pub const BLOCK: usize = 512;

fn octal(field: &[u8]) -> Option<u64> {
    // Base-256 (GNU) for large values: high bit set in the first byte.
    if let Some(&first) = field.first() {
        if first & 0x80 != 0 {
            let mut v: u64 = (first & 0x7f) as u64;
            for &b in &field[1..] {
                v = v.checked_mul(256)?.checked_add(b as u64)?;
            }
            return Some(v);
        }
    }
    let s: Vec<u8> = field.iter().copied().take_while(|&b| b != 0).filter(|&b| b != b' ').collect();
    if s.is_empty() {
        return Some(0);
    }
    let mut v: u64 = 0;
    for b in s {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add((b - b'0') as u64)?;
    }
    Some(v)
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn checksum_ok(h: &[u8]) -> bool {
    let stored = match octal(&h[148..156]) {
        Some(v) => v,
        None => return false,
    };
    let sum: u64 =
        h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { b' ' as u64 } else { b as u64 }).sum();
    sum == stored
}

/// Lists the regular-file members of a tar archive held in `data` (or read block by block by
/// the caller). `total` is the archive's size: a member extending past it means a truncated
/// shard.
pub fn list_members(data: &[u8]) -> Result<Vec<Member>, String> {
    let total = data.len() as u64;
    let mut out = vec![];
    let mut pos: u64 = 0;
    let mut long_name: Option<String> = None;
    loop {
        if pos + BLOCK as u64 > total {
            if pos == total {
                break; // no end-of-archive blocks: tolerated
            }
            return Err(format!("truncated: a header at byte {pos} runs past the end ({total} bytes)"));
        }
        let h = &data[pos as usize..pos as usize + BLOCK];
        if h.iter().all(|&b| b == 0) {
            break; // end-of-archive marker
        }
        if !checksum_ok(h) {
            return Err(format!("bad header checksum at byte {pos} (not a tar file, or corrupt)"));
        }
        let size = octal(&h[124..136]).ok_or_else(|| format!("bad size field in the header at byte {pos}"))?;
        let typeflag = h[156];
        let data_start = pos + BLOCK as u64;
        let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        if data_start.checked_add(size).is_none_or(|end| end > total) {
            return Err(format!(
                "truncated: member at byte {pos} declares {size} bytes but the archive ends at {total}"
            ));
        }
        let mut name = cstr(&h[0..100]);
        let prefix = cstr(&h[345..500]);
        if &h[257..262] == b"ustar" && !prefix.is_empty() {
            name = format!("{prefix}/{name}");
        }
        match typeflag {
            b'L' => {
                // GNU long name: the data is the name of the next member.
                let raw = &data[data_start as usize..(data_start + size) as usize];
                long_name = Some(cstr(raw));
            }
            b'x' => {
                // pax extended header: look for a `path` record.
                let raw = &data[data_start as usize..(data_start + size) as usize];
                for rec in String::from_utf8_lossy(raw).split('\n') {
                    if let Some((_, kv)) = rec.split_once(' ') {
                        if let Some(p) = kv.strip_prefix("path=") {
                            long_name = Some(p.to_string());
                        }
                    }
                }
            }
            b'0' | 0 | b'7' => {
                let name = long_name.take().unwrap_or(name);
                out.push(Member { name, offset: data_start, size });
            }
            _ => {
                long_name = None; // directories, links, ...: not samples
            }
        }
        pos = data_start + padded;
    }
    Ok(out)
}

/// Appends one regular-file member to `out` (USTAR, deterministic: mode 0644, uid/gid 0,
/// mtime 0). Names longer than 100 bytes use the ustar prefix field when they can be split at a
/// '/', otherwise an error.
pub fn append_member(out: &mut Vec<u8>, name: &str, data: &[u8]) -> Result<(), String> {
    let mut h = [0u8; BLOCK];
    let bytes = name.as_bytes();
    if bytes.len() <= 100 {
        h[..bytes.len()].copy_from_slice(bytes);
    } else {
        let split = name[..name.len().min(156)].rfind('/').ok_or_else(|| format!("member name too long: {name}"))?;
        let (prefix, rest) = (&name[..split], &name[split + 1..]);
        if prefix.len() > 155 || rest.len() > 100 {
            return Err(format!("member name too long: {name}"));
        }
        h[..rest.len()].copy_from_slice(rest.as_bytes());
        h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    }
    let put_octal = |h: &mut [u8; BLOCK], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}", w = width - 1);
        h[at..at + width - 1].copy_from_slice(s.as_bytes());
        h[at + width - 1] = 0;
    };
    put_octal(&mut h, 100, 8, 0o644);
    put_octal(&mut h, 108, 8, 0);
    put_octal(&mut h, 116, 8, 0);
    put_octal(&mut h, 124, 12, data.len() as u64);
    put_octal(&mut h, 136, 12, 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
    out.extend(std::iter::repeat_n(0u8, pad));
    Ok(())
}

/// Appends the end-of-archive marker (two zero blocks).
pub fn finish(out: &mut Vec<u8>) {
    out.extend(std::iter::repeat_n(0u8, 2 * BLOCK));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_long_names() {
        let mut t = vec![];
        append_member(&mut t, "a/one.jpg", b"hello").unwrap();
        let long = format!("{}/{}.cls", "d".repeat(120), "k".repeat(60));
        append_member(&mut t, &long, b"3").unwrap();
        finish(&mut t);
        let m = list_members(&t).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0], Member { name: "a/one.jpg".into(), offset: 512, size: 5 });
        assert_eq!(m[1].name, long);
        assert_eq!(&t[m[1].offset as usize..m[1].offset as usize + 1], b"3");
    }

    #[test]
    fn truncation_and_garbage_are_errors_not_panics() {
        let mut t = vec![];
        append_member(&mut t, "x.jpg", &[7u8; 3000]).unwrap();
        finish(&mut t);
        for cut in [100, 600, 2000, 3000] {
            let e = list_members(&t[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
        let mut bad = t.clone();
        bad[10] ^= 0xff;
        assert!(list_members(&bad).unwrap_err().contains("checksum"));
        assert!(list_members(&[0x41; 700]).is_err());
    }
}
