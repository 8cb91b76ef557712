//! A small tar reader/writer for WebDataset shards: enough to write deterministic shards and to
//! index shards written by other tools (ustar, GNU and pax: GNU long names, pax `path` and
//! `size` records, so names of any length and any UTF-8). Every field of a header is untrusted
//! input: parsing is bounds-checked, the size of a long-name or pax record is capped
//! ([`MAX_META`]) and errors say what is wrong and at which byte.
//!
//! Hard links are members too: GNU tar and Python's `tarfile` store the second and later names
//! of a file with several links as a link header (type `1`) naming the first, without data. The
//! reader resolves such a link to the data of the earlier member it names; a link it cannot
//! resolve (its target is not an earlier file of the archive), a symbolic link, a device or a
//! FIFO has no data to read, and is listed with the reason ([`Reader::take_unread`]) instead of
//! being dropped in silence.
//!
//! The [`Reader`] streams: it reads headers and skips member data with a seek, so listing a
//! shard costs its headers, not its size, in memory and I/O. The [`Writer`] uses a plain ustar
//! header when a name fits one (ASCII, at most 100 bytes, or split at a '/' into the 155-byte
//! prefix and the 100-byte name) and otherwise a pax extended header with a `path` record,
//! followed by the member's ustar header with an ASCII placeholder name.
//!
//! Every regular-file header has a [fingerprint](Header::fingerprint): a hash of the name *as
//! stored in that header* and of its size field. A shard index records it, so a read can check
//! that the header in front of an indexed offset is the one that was indexed, whether the
//! member's name came from that header or from a long-name record before it.

use std::io::{self, Read, Seek, SeekFrom, Write};

/// One regular-file member: name, offset of its data in the archive, length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Member name (a key plus extension in WebDataset layout), from a pax `path` record, a GNU
    /// long name or the ustar header; bytes that are not UTF-8 become U+FFFD. Never used as a
    /// filesystem path.
    pub name: String,
    /// Byte offset of the member's data (its ustar header is the block before).
    pub offset: u64,
    /// Data length in bytes.
    pub size: u64,
    /// [`Header::fingerprint`] of the ustar header in front of the data.
    pub fingerprint: u64,
}

/// Block size of tar.
pub const BLOCK: usize = 512;

/// Largest GNU long-name or pax extended header accepted, in bytes (real ones hold a few
/// hundred bytes; the size field is untrusted).
pub const MAX_META: u64 = 1 << 20;

/// Largest value of an 11-digit octal size field; larger sizes are written in base-256.
const OCTAL_MAX: u64 = (1 << 33) - 1;

/// The name a pax extended header itself carries (as Python's `tarfile` writes it).
const PAX_NAME: &str = "././@PaxHeader";

/// A member that has a name but no data stoker reads (see [`Reader::take_unread`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unread {
    /// Member name (as for [`Member::name`]).
    pub name: String,
    /// Offset just after its header (where its data would be; it has none to read).
    pub offset: u64,
    /// Why it is not read ("a symbolic link to ...", "a hard link to ..., which is not an
    /// earlier member of this shard", ...).
    pub reason: String,
}

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

/// The bytes of a NUL-terminated (or full-width) header field.
fn field(f: &[u8]) -> &[u8] {
    &f[..f.iter().position(|&b| b == 0).unwrap_or(f.len())]
}

fn checksum_ok(h: &[u8]) -> bool {
    let Some(stored) = octal(&h[148..156]) else { return false };
    let byte = |i: usize, b: u8| if (148..156).contains(&i) { b' ' } else { b };
    let unsigned: u64 = h.iter().enumerate().map(|(i, &b)| byte(i, b) as u64).sum();
    // Some old writers summed signed bytes.
    let signed: i64 = h.iter().enumerate().map(|(i, &b)| byte(i, b) as i8 as i64).sum();
    unsigned == stored || signed == stored as i64
}

/// The fields of one ustar header block that the reader and the index use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The name as stored in this header (the POSIX prefix, when present, joined with '/'):
    /// for a member named by a pax or GNU long-name record, the writer's placeholder.
    pub name: Vec<u8>,
    /// The size field.
    pub size: u64,
    /// The type flag (`b'0'` or 0 for a regular file, `b'x'` pax, `b'L'` GNU long name, ...).
    pub typeflag: u8,
    /// The link target field (hard and symbolic links), as stored in this header.
    pub linkname: Vec<u8>,
}

impl Header {
    /// Parses one 512-byte header block (checksum and size field checked).
    pub fn parse(h: &[u8]) -> Result<Header, String> {
        if h.len() != BLOCK {
            return Err(format!("a tar header is {BLOCK} bytes, got {}", h.len()));
        }
        if !checksum_ok(h) {
            return Err("bad header checksum (not a tar file, or corrupt)".into());
        }
        let size = octal(&h[124..136]).ok_or("bad size field in the header")?;
        let mut name = field(&h[0..100]).to_vec();
        // The prefix field exists in POSIX ustar only (old GNU headers keep times there).
        if &h[257..263] == b"ustar\0" {
            let prefix = field(&h[345..500]);
            if !prefix.is_empty() {
                name = [prefix, b"/", &name].concat();
            }
        }
        Ok(Header { name, size, typeflag: h[156], linkname: field(&h[157..257]).to_vec() })
    }

    /// Whether this header starts a regular file (`0`, NUL or contiguous `7`).
    pub fn is_file(&self) -> bool {
        matches!(self.typeflag, b'0' | 0 | b'7')
    }

    /// A hash of the stored name and the size field (never 0, so 0 can mean "unknown").
    pub fn fingerprint(&self) -> u64 {
        let mut b = Vec::with_capacity(self.name.len() + 9);
        b.extend_from_slice(&self.name);
        b.push(0);
        b.extend_from_slice(&self.size.to_le_bytes());
        xxhash_rust::xxh3::xxh3_64(&b).max(1)
    }
}

/// What pax and GNU records before a header say about it.
#[derive(Debug, Default)]
struct Overrides {
    /// The member name (pax `path`, GNU `L`).
    path: Option<Vec<u8>>,
    /// The link target (pax `linkpath`, GNU `K`).
    linkpath: Option<Vec<u8>>,
    /// The data size (pax `size`).
    size: Option<u64>,
}

/// Parses the records of a pax extended header (`LEN KEY=VALUE\n`, LEN counting the whole
/// record) and keeps `path`, `linkpath` and `size`.
fn parse_pax(raw: &[u8], over: &mut Overrides) -> Result<(), String> {
    let mut rest = raw;
    while !rest.is_empty() {
        if rest.iter().all(|&b| b == 0) {
            break; // NUL padding after the last record
        }
        let sp = rest.iter().position(|&b| b == b' ').ok_or("a record has no length")?;
        let len: usize = std::str::from_utf8(&rest[..sp])
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
            .ok_or("a record length is not a number")?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err(format!("a record length ({len}) does not match the record"));
        }
        let kv = &rest[sp + 1..len - 1];
        let eq = kv.iter().position(|&b| b == b'=').ok_or("a record has no '='")?;
        let (key, value) = (&kv[..eq], &kv[eq + 1..]);
        match key {
            // An empty value unsets the keyword (the header field applies again).
            b"path" => over.path = (!value.is_empty()).then(|| value.to_vec()),
            b"linkpath" => over.linkpath = (!value.is_empty()).then(|| value.to_vec()),
            b"size" if value.is_empty() => over.size = None,
            b"size" => {
                let v = std::str::from_utf8(value)
                    .ok()
                    .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse().ok())
                    .ok_or("the size record is not a number")?;
                over.size = Some(v);
            }
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok(())
}

/// Streams the regular-file members of a tar archive of `total` bytes (the caller knows the
/// size: a member extending past it means a truncated archive). Member data is skipped unless
/// asked for with [`Reader::read_data`].
#[derive(Debug)]
pub struct Reader<R> {
    inner: R,
    total: u64,
    /// Offset of the next header.
    next: u64,
    /// Position of `inner` (`None`: unknown, seek before reading).
    at: Option<u64>,
    /// Data offset and size of the member last returned.
    current: Option<(u64, u64)>,
    done: bool,
    /// Every file (and resolved hard link) so far by name: data offset, size, fingerprint (a
    /// hard link names an earlier member).
    files: std::collections::HashMap<Vec<u8>, (u64, u64, u64)>,
    /// Members with a name but nothing to read, since the last [`Reader::take_unread`].
    unread: Vec<Unread>,
}

impl<R: Read + Seek> Reader<R> {
    /// A reader of the archive in `inner` (read from offset 0), `total` bytes long.
    pub fn new(inner: R, total: u64) -> Self {
        Reader {
            inner,
            total,
            next: 0,
            at: None,
            current: None,
            done: false,
            files: std::collections::HashMap::new(),
            unread: vec![],
        }
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        if self.at != Some(offset) {
            self.at = None;
            self.inner.seek(SeekFrom::Start(offset)).map_err(|e| format!("cannot seek to byte {offset}: {e}"))?;
        }
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                format!("truncated: the archive ends before byte {}", offset + buf.len() as u64)
            }
            _ => format!("cannot read {} bytes at byte {offset}: {e}", buf.len()),
        })?;
        self.at = Some(offset + buf.len() as u64);
        Ok(())
    }

    /// The next regular-file member (or hard link resolved to an earlier one), `None` at the end
    /// of the archive. Long-name and pax records are applied; directories are skipped; symbolic
    /// links, devices, FIFOs and hard links that cannot be resolved are noted for
    /// [`Reader::take_unread`].
    pub fn next_member(&mut self) -> Result<Option<Member>, String> {
        let r = self.advance();
        if r.is_err() {
            self.done = true;
        }
        r
    }

    /// The members since the last call that have a name but nothing stoker reads (symbolic
    /// links, devices, FIFOs, hard links to no earlier member), each with the reason, in
    /// archive order.
    pub fn take_unread(&mut self) -> Vec<Unread> {
        std::mem::take(&mut self.unread)
    }

    fn advance(&mut self) -> Result<Option<Member>, String> {
        self.current = None;
        let mut over = Overrides::default();
        let block = BLOCK as u64;
        loop {
            if self.done {
                return Ok(None);
            }
            let (pos, total) = (self.next, self.total);
            if pos.checked_add(block).is_none_or(|end| end > total) {
                if pos == total {
                    self.done = true; // no end-of-archive blocks: tolerated
                    return Ok(None);
                }
                return Err(format!("truncated: a header at byte {pos} runs past the end ({total} bytes)"));
            }
            let mut h = [0u8; BLOCK];
            self.read_at(pos, &mut h)?;
            if h.iter().all(|&b| b == 0) {
                self.done = true; // end-of-archive marker
                return Ok(None);
            }
            let hd = Header::parse(&h).map_err(|e| match e.strip_prefix("bad header checksum") {
                Some(rest) => format!("bad header checksum at byte {pos}{rest}"),
                None => format!("{e} at byte {pos}"),
            })?;
            // A pax `size` applies to the header that follows the pax records, whatever its type.
            let meta = matches!(hd.typeflag, b'L' | b'K' | b'x' | b'g');
            let size = if meta { hd.size } else { over.size.unwrap_or(hd.size) };
            let data = pos + block;
            if data.checked_add(size).is_none_or(|end| end > total) {
                return Err(format!(
                    "truncated: member at byte {pos} declares {size} bytes but the archive ends at {total}"
                ));
            }
            self.next = data + size.div_ceil(block) * block;
            match hd.typeflag {
                b'L' | b'K' | b'x' => {
                    let what = match hd.typeflag {
                        b'L' => "GNU long name",
                        b'K' => "GNU long link name",
                        _ => "pax header",
                    };
                    if size > MAX_META {
                        return Err(format!("{what} of {size} bytes at byte {pos} (at most {MAX_META} accepted)"));
                    }
                    let mut raw = vec![0u8; size as usize];
                    self.read_at(data, &mut raw)?;
                    match hd.typeflag {
                        b'L' => over.path = Some(field(&raw).to_vec()),
                        b'K' => over.linkpath = Some(field(&raw).to_vec()),
                        _ => parse_pax(&raw, &mut over)
                            .map_err(|e| format!("malformed pax header at byte {pos}: {e}"))?,
                    }
                }
                // A pax global header: nothing a sample needs.
                b'g' => {}
                _ if hd.is_file() => {
                    let name = over.path.take().unwrap_or_else(|| hd.name.clone());
                    let fingerprint = hd.fingerprint();
                    self.files.insert(name.clone(), (data, size, fingerprint));
                    self.current = Some((data, size));
                    return Ok(Some(Member {
                        name: String::from_utf8_lossy(&name).into_owned(),
                        offset: data,
                        size,
                        fingerprint,
                    }));
                }
                // A directory: not a sample, nothing lost.
                b'5' => over = Overrides::default(),
                kind => {
                    let name = over.path.take().unwrap_or_else(|| hd.name.clone());
                    let target = over.linkpath.take().unwrap_or_else(|| hd.linkname.clone());
                    over = Overrides::default();
                    let shown = String::from_utf8_lossy(&target).into_owned();
                    if kind == b'1' {
                        if let Some(&(offset, size, fingerprint)) = self.files.get(&target) {
                            // A hard link reads the data of the member it names.
                            self.files.insert(name.clone(), (offset, size, fingerprint));
                            self.current = Some((offset, size));
                            let name = String::from_utf8_lossy(&name).into_owned();
                            return Ok(Some(Member { name, offset, size, fingerprint }));
                        }
                    }
                    let reason = match kind {
                        b'1' => format!("a hard link to {shown:?}, which is not an earlier file of this shard"),
                        b'2' => {
                            format!("a symbolic link to {shown:?} (shards are read by member, links are not followed)")
                        }
                        b'3' | b'4' => "a device file, not data".to_string(),
                        b'6' => "a FIFO, not data".to_string(),
                        k => format!("a tar member of type {:?}, not a regular file", k as char),
                    };
                    self.unread.push(Unread {
                        name: String::from_utf8_lossy(&name).into_owned(),
                        offset: data,
                        reason,
                    });
                }
            }
        }
    }

    /// Reads the data of the member last returned by [`Reader::next_member`]; a member larger
    /// than `max` bytes is an error (nothing is allocated for it).
    pub fn read_data(&mut self, max: u64) -> Result<Vec<u8>, String> {
        let (offset, size) = self.current.ok_or("no member to read")?;
        if size > max {
            return Err(format!("{size} bytes (at most {max} accepted)"));
        }
        let mut data = vec![0u8; size as usize];
        self.read_at(offset, &mut data)?;
        Ok(data)
    }
}

/// Lists the regular-file members of a tar archive held in `data`.
pub fn list_members(data: &[u8]) -> Result<Vec<Member>, String> {
    let mut r = Reader::new(io::Cursor::new(data), data.len() as u64);
    let mut out = vec![];
    while let Some(m) = r.next_member()? {
        out.push(m);
    }
    Ok(out)
}

/// The (prefix, name) ustar fields of `name`, when it fits them.
fn ustar_fields(name: &str) -> Option<(&str, &str)> {
    if !name.is_ascii() || name.contains('\0') {
        return None;
    }
    if name.len() <= 100 {
        return Some(("", name));
    }
    let split = name[..name.len().min(156)].rfind('/')?;
    let (prefix, rest) = (&name[..split], &name[split + 1..]);
    (!prefix.is_empty() && prefix.len() <= 155 && !rest.is_empty() && rest.len() <= 100).then_some((prefix, rest))
}

/// One deterministic ustar header block (mode 0644, uid/gid 0, mtime 0).
fn ustar_header(name: &[u8], prefix: &[u8], size: u64, typeflag: u8) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name);
    h[345..345 + prefix.len()].copy_from_slice(prefix);
    let put_octal = |h: &mut [u8; BLOCK], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}", w = width - 1);
        h[at..at + width - 1].copy_from_slice(s.as_bytes());
        h[at + width - 1] = 0;
    };
    put_octal(&mut h, 100, 8, 0o644);
    put_octal(&mut h, 108, 8, 0);
    put_octal(&mut h, 116, 8, 0);
    if size <= OCTAL_MAX {
        put_octal(&mut h, 124, 12, size);
    } else {
        // GNU base-256: high bit of the first byte set, big-endian value after it.
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    put_octal(&mut h, 136, 12, 0);
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

/// One pax record `LEN KEY=VALUE\n` (LEN counts the whole record, its own digits included).
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=' and '\n'
    let mut len = body + 1;
    while body + len.to_string().len() != len {
        len = body + len.to_string().len();
    }
    [format!("{len} {key}=").as_bytes(), value, b"\n"].concat()
}

/// The header blocks in front of a member's data, and the fingerprint of the last one.
fn headers(name: &str, size: u64) -> (Vec<u8>, u64) {
    let (h, out) = match ustar_fields(name) {
        Some((prefix, rest)) => {
            let h = ustar_header(rest.as_bytes(), prefix.as_bytes(), size, b'0');
            (h, h.to_vec())
        }
        None => {
            // pax: a `path` record, then the member's header with an ASCII placeholder name.
            let record = pax_record("path", name.as_bytes());
            let mut out = ustar_header(PAX_NAME.as_bytes(), b"", record.len() as u64, b'x').to_vec();
            out.extend_from_slice(&record);
            out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
            let mut placeholder: Vec<u8> =
                name.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c as u8 } else { b'_' }).collect();
            placeholder.truncate(100);
            let h = ustar_header(&placeholder, b"", size, b'0');
            out.extend_from_slice(&h);
            (h, out)
        }
    };
    let fingerprint = Header::parse(&h).expect("a header we wrote parses").fingerprint();
    (out, fingerprint)
}

/// Bytes a member named `name` with `size` bytes of data takes in an archive (headers, data,
/// padding).
pub fn member_len(name: &str, size: u64) -> u64 {
    let header = match ustar_fields(name) {
        Some(_) => BLOCK as u64,
        None => {
            2 * BLOCK as u64 + (pax_record("path", name.as_bytes()).len() as u64).div_ceil(BLOCK as u64) * BLOCK as u64
        }
    };
    header + size.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// Writes a tar archive to `W`, member by member (see the module doc for the header kinds).
#[derive(Debug)]
pub struct Writer<W> {
    inner: W,
    pos: u64,
}

impl<W: Write> Writer<W> {
    /// A writer of a new archive.
    pub fn new(inner: W) -> Self {
        Writer { inner, pos: 0 }
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Appends one regular file (deterministic: mode 0644, uid/gid 0, mtime 0); any name.
    pub fn append(&mut self, name: &str, data: &[u8]) -> io::Result<Member> {
        let (headers, fingerprint) = headers(name, data.len() as u64);
        self.inner.write_all(&headers)?;
        self.inner.write_all(data)?;
        let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
        self.inner.write_all(&[0u8; BLOCK][..pad])?;
        let offset = self.pos + headers.len() as u64;
        self.pos = offset + (data.len() + pad) as u64;
        Ok(Member { name: name.to_string(), offset, size: data.len() as u64, fingerprint })
    }

    /// Writes the end-of-archive marker (two zero blocks) and returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.inner.write_all(&[0u8; 2 * BLOCK])?;
        Ok(self.inner)
    }
}

/// Appends one regular-file member to the archive in `out` (see [`Writer::append`]); the
/// returned offset is in `out`.
pub fn append_member(out: &mut Vec<u8>, name: &str, data: &[u8]) -> Member {
    let pos = out.len() as u64;
    let mut w = Writer { inner: out, pos };
    w.append(name, data).expect("writing to a Vec does not fail")
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
        let a = append_member(&mut t, "a/one.jpg", b"hello");
        let prefixed = format!("{}/{}.cls", "d".repeat(120), "k".repeat(60));
        let long = format!("{}.jpg", "é".repeat(150));
        let flat = format!("{}.cls", "x".repeat(200));
        for name in [&prefixed, &long, &flat] {
            assert_eq!(append_member(&mut t, name, b"3").size, 1);
        }
        let lens: u64 = [&prefixed, &long, &flat].iter().map(|n| member_len(n, 1)).sum();
        assert_eq!(t.len() as u64, member_len("a/one.jpg", 5) + lens);
        finish(&mut t);
        let m = list_members(&t).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0], a);
        assert_eq!(m[0].offset, 512);
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a/one.jpg", &prefixed, &long, &flat]);
        for m in &m[1..] {
            assert_eq!(&t[m.offset as usize..m.offset as usize + 1], b"3");
            let h = Header::parse(&t[m.offset as usize - BLOCK..m.offset as usize]).unwrap();
            assert!(h.is_file() && h.size == 1 && h.fingerprint() == m.fingerprint);
        }
        // The pax placeholder is ASCII and at most 100 bytes.
        let h = Header::parse(&t[m[2].offset as usize - BLOCK..m[2].offset as usize]).unwrap();
        assert!(h.name.is_ascii() && h.name.len() == 100, "{:?}", h.name);
    }

    #[test]
    fn tricky_names_round_trip() {
        let names = [
            String::new(),
            "a\nb c.jpg".into(),
            "x".repeat(100),
            "x".repeat(101),
            format!("{}/{}", "p".repeat(155), "n".repeat(100)),
            format!("{}/{}", "p".repeat(156), "n".repeat(10)),
            format!("/{}", "n".repeat(100)),
            format!("{}/", "d".repeat(120)),
            "nul\0inside.jpg".into(),
            "é".repeat(5000),
        ];
        for name in &names {
            let mut t = vec![];
            let m = append_member(&mut t, name, b"data");
            finish(&mut t);
            assert_eq!(list_members(&t).unwrap(), vec![m], "{name:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_name_reads_back(name in ".{0,300}", size in 0usize..1100) {
            let mut t = vec![];
            let m = append_member(&mut t, &name, &vec![7u8; size]);
            finish(&mut t);
            proptest::prop_assert_eq!(list_members(&t).unwrap(), vec![m]);
        }

        #[test]
        fn arbitrary_bytes_are_errors_or_consistent_members(mut data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000), at in 0usize..3000) {
            // Half the cases start from a valid archive with one byte changed.
            if at % 2 == 0 {
                let mut t = vec![];
                append_member(&mut t, &"é".repeat(at % 90), &data);
                finish(&mut t);
                let i = at % t.len();
                t[i] = t[i].wrapping_add(data.first().copied().unwrap_or(1));
                data = t;
            }
            if let Ok(members) = list_members(&data) {
                for m in &members {
                    proptest::prop_assert!(m.offset >= BLOCK as u64 && m.offset + m.size <= data.len() as u64);
                    let h = Header::parse(&data[m.offset as usize - BLOCK..m.offset as usize]).unwrap();
                    proptest::prop_assert!(h.is_file() && h.fingerprint() == m.fingerprint);
                }
            }
        }
    }

    #[test]
    fn pax_records() {
        for n in [0, 1, 80, 91, 92, 93, 990, 995, 9990] {
            let v = vec![b'a'; n];
            let r = pax_record("path", &v);
            let (len, _) = std::str::from_utf8(&r).unwrap().split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), r.len(), "{n}");
            let mut o = Overrides::default();
            parse_pax(&r, &mut o).unwrap();
            assert_eq!(o.path, (n > 0).then_some(v));
        }
        let mut o = Overrides::default();
        let raw = b"30 mtime=1350244992.023960108\n16 path=a\nb.jpg\n11 size=42\n18 linkpath=t.jpg\n\0\0";
        parse_pax(raw, &mut o).unwrap();
        assert_eq!((o.path.as_deref(), o.size), (Some(&b"a\nb.jpg"[..]), Some(42)));
        assert_eq!(o.linkpath.as_deref(), Some(&b"t.jpg"[..]));
        for bad in [&b"5 path=abc\n"[..], b"x path=a\n", b"9 patha\n", b"99 path=a\n", b"10 size=x\n"] {
            assert!(parse_pax(bad, &mut Overrides::default()).is_err(), "{bad:?}");
        }
    }

    /// A header block of type `typeflag` linking to `target`.
    fn link_header(name: &str, target: &str, typeflag: u8) -> [u8; BLOCK] {
        let mut h = ustar_header(name.as_bytes(), b"", 0, typeflag);
        h[157..157 + target.len()].copy_from_slice(target.as_bytes());
        h[148..156].fill(b' ');
        let sum: u64 = h.iter().map(|&b| b as u64).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        h
    }

    #[test]
    fn hard_links_read_the_earlier_member_and_other_links_are_listed() {
        let mut t = vec![];
        let first = append_member(&mut t, "a/one.jpg", b"the pixels");
        t.extend_from_slice(&link_header("a/two.jpg", "a/one.jpg", b'1'));
        t.extend_from_slice(&link_header("a/three.jpg", "a/two.jpg", b'1')); // a link to a link
        t.extend_from_slice(&link_header("a/early.jpg", "a/later.jpg", b'1'));
        t.extend_from_slice(&link_header("a/sym.jpg", "one.jpg", b'2'));
        t.extend_from_slice(&ustar_header(b"a/dir.jpg/", b"", 0, b'5'));
        append_member(&mut t, "a/later.jpg", b"x");
        finish(&mut t);
        let mut r = Reader::new(io::Cursor::new(&t), t.len() as u64);
        let mut got = vec![];
        while let Some(m) = r.next_member().unwrap() {
            got.push((m.name.clone(), m.offset, m.size, m.fingerprint, r.read_data(100).unwrap()));
        }
        let same = |name: &str| (name.to_string(), first.offset, first.size, first.fingerprint, b"the pixels".to_vec());
        assert_eq!(got[..3], [same("a/one.jpg"), same("a/two.jpg"), same("a/three.jpg")]);
        assert_eq!(got.len(), 4);
        let unread = r.take_unread();
        let names: Vec<&str> = unread.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["a/early.jpg", "a/sym.jpg"]);
        assert!(
            unread[0].reason.contains("hard link to \"a/later.jpg\"") && unread[0].reason.contains("not an earlier")
        );
        assert!(unread[1].reason.contains("symbolic link"), "{}", unread[1].reason);
        assert!(r.take_unread().is_empty());
        // Every listed member's header is a file header with the member's fingerprint.
        for m in list_members(&t).unwrap() {
            let h = Header::parse(&t[m.offset as usize - BLOCK..m.offset as usize]).unwrap();
            assert!(h.is_file() && h.fingerprint() == m.fingerprint);
        }
    }

    #[test]
    fn long_link_targets_from_gnu_and_pax_records() {
        let long = format!("{}/one.jpg", "d".repeat(120));
        let mut t = vec![];
        let first = append_member(&mut t, &long, b"data");
        // GNU: a `K` record holds the target.
        let target = [long.as_bytes(), b"\0"].concat();
        t.extend_from_slice(&ustar_header(b"././@LongLink", b"", target.len() as u64, b'K'));
        t.extend_from_slice(&target);
        t.resize(t.len().div_ceil(BLOCK) * BLOCK, 0);
        t.extend_from_slice(&link_header("gnu.jpg", &long[..100], b'1'));
        // pax: a `linkpath` record.
        let rec = pax_record("linkpath", long.as_bytes());
        t.extend_from_slice(&ustar_header(PAX_NAME.as_bytes(), b"", rec.len() as u64, b'x'));
        t.extend_from_slice(&rec);
        t.resize(t.len().div_ceil(BLOCK) * BLOCK, 0);
        t.extend_from_slice(&link_header("pax.jpg", "cut", b'1'));
        finish(&mut t);
        let m = list_members(&t).unwrap();
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, [long.as_str(), "gnu.jpg", "pax.jpg"]);
        assert!(m.iter().all(|m| (m.offset, m.size, m.fingerprint) == (first.offset, 4, first.fingerprint)));
    }

    #[test]
    fn base256_sizes_round_trip() {
        let h = ustar_header(b"big.jpg", b"", OCTAL_MAX + 10, b'0');
        assert_eq!(Header::parse(&h).unwrap().size, OCTAL_MAX + 10);
    }

    #[test]
    fn truncation_and_garbage_are_errors_not_panics() {
        let mut t = vec![];
        append_member(&mut t, "x.jpg", &[7u8; 3000]);
        finish(&mut t);
        for cut in [100, 600, 2000, 3000] {
            let e = list_members(&t[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
        let mut bad = t.clone();
        bad[10] ^= 0xff;
        assert!(list_members(&bad).unwrap_err().contains("checksum"));
        assert!(list_members(&[0x41; 700]).is_err());
        // An oversized long-name record is refused before anything is allocated for it.
        let mut huge = ustar_header(b"././@LongLink", b"", 1 << 40, b'L').to_vec();
        huge.resize(4096, 0);
        let e = Reader::new(io::Cursor::new(&huge), 2 << 40).next_member().unwrap_err();
        assert!(e.contains("GNU long name") && e.contains("at most"), "{e}");
    }
}
