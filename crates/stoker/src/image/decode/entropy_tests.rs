//! The vendored libjpeg-turbo's baseline Huffman decoder (`jdhuff.c`, changed by stoker:
//! `vendor/README.md`) against an independent one: the same file losslessly transformed into a
//! progressive JPEG holds the same DCT coefficients, and libjpeg-turbo decodes it with its
//! progressive decoder (`jdphuff.c`, upstream's, untouched), so the pixels must be identical.
//!
//! The files exercise what the fast decoder's shortcuts depend on: coefficients whose code and
//! value bits fit the whole-coefficient table and those that do not (noise at quality 100 gives
//! values of 10 bits and codes of 16), long zero runs (ZRL) and early end-of-block (flat areas),
//! stuffed `FF 00` bytes (noise), every subsampling, widths that are not a multiple of the MCU,
//! and restart markers after 1 MCU, 3 MCUs and each MCU row (the fast decoder reads into a
//! marker and must keep or redo the MCU exactly as upstream's slow decoder would decode it).

use super::intervals::tests::with_restarts;
use super::restart::tests::picture;
use turbojpeg::{Compressor, Image, PixelFormat, Subsamp, Transform};

/// `w x h` RGB pixels: `kind` 0 is uniform noise (the largest coefficients), 1 the smooth test
/// picture, 2 bands of flat colour alternating with noise (long runs of zeros, then large values).
fn pixels(w: usize, h: usize, kind: u32, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    match kind {
        0 => (0..w * h * 3).map(|_| next() as u8).collect(),
        1 => picture(w, h, seed),
        _ => (0..w * h * 3)
            .map(|i| {
                let row = i / 3 / w;
                let r = next() as u8;
                if (row / 13).is_multiple_of(2) {
                    90 + (i % 3) as u8 * 40
                } else {
                    r
                }
            })
            .collect(),
    }
}

fn compress(px: &[u8], w: usize, h: usize, sub: Subsamp, quality: i32) -> Vec<u8> {
    let mut c = Compressor::new().unwrap();
    c.set_quality(quality).unwrap();
    c.set_subsamp(sub).unwrap();
    let gray: Vec<u8>;
    let image = if sub == Subsamp::Gray {
        gray = px.iter().step_by(3).copied().collect();
        Image { pixels: &gray[..], width: w, pitch: w, height: h, format: PixelFormat::GRAY }
    } else {
        Image { pixels: px, width: w, pitch: w * 3, height: h, format: PixelFormat::RGB }
    };
    c.compress_to_vec(image).unwrap()
}

fn progressive(data: &[u8]) -> Vec<u8> {
    let mut t = Transform::default();
    t.progressive = true;
    turbojpeg::transform(&t, data).unwrap().to_vec()
}

fn decode(data: &[u8]) -> Vec<u8> {
    turbojpeg::decompress(data, PixelFormat::RGB).unwrap().pixels
}

#[test]
fn the_fast_baseline_decoder_gives_the_progressive_decoder_s_pixels() {
    let subs = [Subsamp::None, Subsamp::Sub2x1, Subsamp::Sub2x2, Subsamp::Sub1x2, Subsamp::Sub4x1, Subsamp::Gray];
    let mut files = 0;
    for (i, &(w, h)) in [(160usize, 96usize), (97, 61), (600, 24)].iter().enumerate() {
        for (j, &sub) in subs.iter().enumerate() {
            for kind in 0..3 {
                for quality in [100, 93, 75, 30, 4] {
                    let seed = (i * 1000 + j * 100 + kind as usize * 10) as u32 + quality as u32;
                    let jpeg = compress(&pixels(w, h, kind, seed), w, h, sub, quality);
                    let want = decode(&progressive(&jpeg));
                    let label = format!("{w}x{h} {sub:?} kind {kind} quality {quality}");
                    assert!(decode(&jpeg) == want, "{label}: baseline differs from progressive");
                    for (blocks, rows) in [(1, 0), (3, 0), (0, 1)] {
                        let restarted = with_restarts(&jpeg, blocks, rows);
                        assert!(decode(&restarted) == want, "{label}: restarts {blocks} MCUs / {rows} rows differ");
                    }
                    files += 1;
                }
            }
        }
    }
    assert_eq!(files, 3 * 6 * 3 * 5);
}
