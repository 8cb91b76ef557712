//! The `.npy` header parser and layout check on arbitrary bytes: errors, never panics; what is
//! accepted has every promised row inside the file, with sizes that did not overflow.
//!
//! Input that starts with the `\x93NUMPY` magic is a whole file; anything else is the header's
//! text, wrapped in a version-1 preamble and followed by 64 bytes of data, so mutations work on
//! the dictionary (`descr`, `shape`, ...) instead of rediscovering the preamble.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker::arrays::{descr_itemsize, npy_layout, NPY_HEADER_MAX};

fuzz_target!(|data: &[u8]| {
    let file: Vec<u8> = if data.starts_with(b"\x93NUMPY") || data.len() > usize::from(u16::MAX) {
        data.to_vec()
    } else {
        let mut f = b"\x93NUMPY\x01\x00".to_vec();
        f.extend_from_slice(&(data.len() as u16).to_le_bytes());
        f.extend_from_slice(data);
        f.extend_from_slice(&[0x5a; 64]);
        f
    };
    let path = std::path::Path::new("fuzz.npy");
    let head = &file[..file.len().min(NPY_HEADER_MAX)];
    if let Ok(l) = npy_layout(head, file.len(), path) {
        let item = descr_itemsize(&l.header.descr).expect("accepted dtype");
        let elems: u128 = l.header.shape[1..].iter().map(|&d| d as u128).product();
        assert_eq!(elems * item as u128, l.row_bytes as u128);
        assert_eq!(l.rows, l.header.shape[0]);
        assert!(l.header.data_offset as u128 + l.rows as u128 * l.row_bytes as u128 <= file.len() as u128);
    }
});
