//! The untrusted-byte parsers around the decoders: EXIF orientation, .npy headers, and the
//! JPEG/PNG decode entry points (libjpeg-turbo and png behind our wrappers).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use stoker::decode::{DecodeOptions, Decoder};

fuzz_target!(|data: &[u8]| {
    let _ = stoker::decode::exif::jpeg_orientation(data);
    let _ = stoker::arrays::parse_npy_header(data, Path::new("fuzz.npy"));
    if data.len() < 1 << 16 {
        // A small pixel limit: the decoder itself must refuse larger images (see also `decode`).
        let mut d = Decoder::new(DecodeOptions { max_pixels: 1 << 22, ..DecodeOptions::default() }).expect("decoder");
        if let Ok(info) = d.info(data, Path::new("fuzz")) {
            assert!(info.width * info.height <= 1 << 22, "{info:?} over max_pixels");
            let b = [0.0, 0.0, info.width as f64, info.height as f64];
            let _ = d.decode(data, Path::new("fuzz"), &info, b, (16, 16));
        }
    }
});
