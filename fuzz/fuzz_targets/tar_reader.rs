//! The tar reader and the WebDataset grouping on arbitrary bytes: errors, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(members) = stoker::source::tar::list_members(data) {
        for m in &members {
            assert!(m.offset + m.size <= data.len() as u64);
        }
    }
    let _ = stoker::source::shards::index_members(data, std::path::Path::new("fuzz.tar"));
});
