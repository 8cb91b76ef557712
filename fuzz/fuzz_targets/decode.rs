//! The whole decode path on untrusted bytes: sniff -> header (`Decoder::info`, with the
//! `max_pixels` check) -> decode (libjpeg-turbo with its limits, or png) -> region, in every
//! decode mode, with a small `max_pixels` so bombs are cheap to find and must be refused.
//!
//! Input: one control byte (bits 0-2: EXIF, DCT scaling, ROI; bits 3-7: crop and output size),
//! one byte choosing the payload, then the payload: raw bytes (any file), or byte patches
//! `(offset: u16 le, value)` applied to a small valid seed image (baseline JPEG, progressive
//! JPEG, EXIF-rotated JPEG or PNG, made once), so the fuzzer spends its time near real images
//! with broken headers, sizes and scans. One seed carries restart markers (`stoker pack
//! --random-access`), so crops go through the restart-interval path ([`stoker::decode::intervals`]);
//! every input is decoded with that path on and off, and where neither warned the two must give
//! the same pixels.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;
use stoker::decode::{DecodeOptions, Decoder};

/// Small enough that every accepted image decodes fast, large enough for the seeds.
const MAX_PIXELS: u64 = 1 << 16;

fn pixels(w: usize, h: usize) -> Vec<u8> {
    (0..w * h * 3).map(|i| ((i * 7) ^ (i / 97)) as u8).collect()
}

fn jpeg(w: usize, h: usize, progressive: bool) -> Vec<u8> {
    let mut c = turbojpeg::Compressor::new().expect("compressor");
    c.set_quality(80).expect("quality");
    c.set_subsamp(turbojpeg::Subsamp::Sub2x2).expect("subsamp");
    c.set_progressive(progressive).expect("progressive");
    let px = pixels(w, h);
    c.compress_to_vec(turbojpeg::Image {
        pixels: &px[..],
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    })
    .expect("encode")
}

fn with_exif(jpeg: &[u8], orientation: u8) -> Vec<u8> {
    let mut seg = b"Exif\0\0II\x2a\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0".to_vec();
    seg.extend_from_slice(&[orientation, 0, 0, 0, 0, 0, 0, 0]);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((seg.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&seg);
    out.extend_from_slice(&jpeg[2..]);
    out
}

fn png(w: usize, h: usize) -> Vec<u8> {
    let mut out = vec![];
    let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    e.write_header().expect("png header").write_image_data(&pixels(w, h)).expect("png data");
    out
}

fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let base = jpeg(40, 24, false);
        let wide = jpeg(160, 48, false);
        let restart = stoker::decode::restart::add_restart_markers(&wide, MAX_PIXELS).expect("re-code").data;
        vec![base.clone(), jpeg(40, 24, true), with_exif(&base, 6), png(24, 16), restart]
    })
}

fuzz_target!(|input: &[u8]| {
    let [ctl, pick, payload @ ..] = input else { return };
    let data = match pick % 6 {
        5 => payload.to_vec(),
        n => {
            let mut data = seeds()[n as usize].clone();
            for p in payload.chunks_exact(3) {
                let at = u16::from_le_bytes([p[0], p[1]]) as usize;
                if let Some(b) = data.get_mut(at) {
                    *b = p[2];
                }
            }
            data
        }
    };
    let run = |restart: bool| {
        let opts = DecodeOptions {
            apply_exif: ctl & 1 != 0,
            dct_scaling: ctl & 2 != 0,
            roi: ctl & 4 != 0,
            restart,
            max_pixels: MAX_PIXELS,
        };
        let mut d = Decoder::new(opts).expect("decoder");
        let path = Path::new("fuzz");
        // Twice: a decoder reused after an error or a success must behave the same.
        let mut first = None;
        let mut warned = false;
        for _ in 0..2 {
            let got = d.info(&data, path).and_then(|info| {
                assert!((info.width * info.height) as u64 <= MAX_PIXELS, "{info:?} over max_pixels");
                let (w, h) = (info.width as f64, info.height as f64);
                let f = (ctl >> 3) as f64 / 31.0 * 0.9 + 0.1;
                let bbox = [w * (1.0 - f) / 2.0, h * (1.0 - f) / 2.0, w * f, h * f];
                let out = (1 + (ctl >> 3) as usize, 1 + (ctl >> 4) as usize * 3);
                let r = d.decode(&data, path, &info, bbox, out)?;
                assert_eq!(r.pixels.len(), r.width * r.height * 3);
                assert!(r.width > 0 && r.height > 0);
                Ok((r.width, r.height, r.pixels.to_vec()))
            });
            warned |= d.take_warnings() > 0;
            let got = got.map_err(|e| e.to_string());
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(f, &got, "second decode differs"),
            }
        }
        (first.expect("decoded twice"), warned)
    };
    let (whole, whole_warned) = run(false);
    let (parts, parts_warned) = run(true);
    if let (Ok(a), Ok(b), false, false) = (&whole, &parts, whole_warned, parts_warned) {
        assert!(a == b, "the restart-interval path gives other pixels");
    }
});
