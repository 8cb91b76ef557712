//! The sidecar index parser on arbitrary bytes: errors, never panics; what parses re-encodes
//! to the same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker::source::shards::{decode_index, encode_index};

fuzz_target!(|data: &[u8]| {
    if let Ok((entries, size)) = decode_index(data, std::path::Path::new("fuzz.idx")) {
        assert_eq!(encode_index(&entries, size), data);
    }
});
