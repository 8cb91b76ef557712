//! The tar reader and the WebDataset grouping on arbitrary bytes: errors, never panics; every
//! member's header is where the reader says, with the fingerprint it reports; and whatever name
//! the writer is given, it reads back the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker::source::tar::{append_member, finish, list_members, Header, BLOCK};

fuzz_target!(|data: &[u8]| {
    if let Ok(members) = list_members(data) {
        for m in &members {
            assert!(m.offset >= BLOCK as u64 && m.offset + m.size <= data.len() as u64);
            let h = Header::parse(&data[m.offset as usize - BLOCK..m.offset as usize]).expect("the member's header");
            assert!(h.is_file() && h.fingerprint() == m.fingerprint);
        }
    }
    let _ = stoker::source::shards::index_members(data, std::path::Path::new("fuzz.tar"));
    if let Ok(name) = std::str::from_utf8(&data[..data.len().min(400)]) {
        let mut t = vec![];
        let written = append_member(&mut t, name, &data[data.len().min(400)..]);
        finish(&mut t);
        assert_eq!(list_members(&t).expect("our own archive"), vec![written]);
    }
});
