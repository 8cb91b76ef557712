//! The sidecar index parser on arbitrary bytes: errors, never panics; what parses re-encodes
//! to the same bytes (an index of an earlier format re-encodes in the current format, to the same
//! entries).
#![no_main]
use libfuzzer_sys::fuzz_target;
use stoker::source::shards::{decode_index, encode_index};

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.idx");
    if let Ok((entries, size)) = decode_index(data, path) {
        let again = encode_index(&entries, size);
        if data.starts_with(b"STKIDX3\0") {
            assert_eq!(again, data);
        } else {
            assert_eq!(decode_index(&again, path).expect("re-encoded index"), (entries, size));
        }
    }
});
