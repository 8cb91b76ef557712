//! Limits before allocation, and only real files are samples: decompression bombs (JPEG SOF and
//! PNG IHDR claiming huge sizes, a progressive JPEG with endless scans) are each sample's error
//! in every decode mode, and an ImageFolder holding FIFOs, devices, sockets, a 1 TiB sparse file,
//! symlink loops and repeated folders indexes exactly its real files and never hangs or aborts.
//! Every bomb here is made by the test itself from a small valid image.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::decode::jpeg::JpegDecoder;
use stoker::decode::{DecodeOptions, Decoder, DEFAULT_MAX_PIXELS};
use stoker::source::Source;
use stoker::*;

// ---------------------------------------------------------------------------------------------
// Bombs.

/// `(marker, offset of the 0xFF)` of every segment before the first scan's data, and the offset
/// of the first SOS.
fn segments(jpeg: &[u8]) -> Vec<(u8, usize)> {
    let mut out = vec![];
    let mut pos = 2;
    while pos + 4 <= jpeg.len() && jpeg[pos] == 0xFF {
        let marker = jpeg[pos + 1];
        out.push((marker, pos));
        if marker == 0xDA {
            break;
        }
        pos += 2 + u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]]) as usize;
    }
    out
}

/// `jpeg` with its SOF (any of SOF0..SOF2) claiming `w` x `h`.
fn claim_jpeg(jpeg: &[u8], w: u16, h: u16) -> Vec<u8> {
    let (_, at) = *segments(jpeg).iter().find(|(m, _)| matches!(m, 0xC0..=0xC2)).expect("a SOF segment");
    let mut out = jpeg.to_vec();
    // FF Cn, length (2), precision (1), height (2), width (2).
    out[at + 5..at + 7].copy_from_slice(&h.to_be_bytes());
    out[at + 7..at + 9].copy_from_slice(&w.to_be_bytes());
    out
}

/// `jpeg` (progressive) with its last scan repeated until it has `scans` scans or more.
fn many_scans(jpeg: &[u8], scans: usize) -> Vec<u8> {
    let sos: Vec<usize> = (0..jpeg.len() - 1).filter(|&i| jpeg[i] == 0xFF && jpeg[i + 1] == 0xDA).collect();
    let last = *sos.last().unwrap();
    let eoi = jpeg.len() - 2;
    assert_eq!(&jpeg[eoi..], &[0xFF, 0xD9]);
    let mut out = jpeg[..eoi].to_vec();
    for _ in sos.len()..scans {
        out.extend_from_slice(&jpeg[last..eoi]);
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

/// A small RGB PNG.
fn png(px: &[u8], w: usize, h: usize) -> Vec<u8> {
    let mut out = vec![];
    let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    e.write_header().unwrap().write_image_data(px).unwrap();
    out
}

/// CRC-32 (ISO-HDLC), as PNG chunks use.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// `png` with its IHDR claiming `w` x `h` (and a valid CRC, so only the size is wrong).
fn claim_png(png: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = png.to_vec();
    assert_eq!(&out[12..16], b"IHDR");
    out[16..20].copy_from_slice(&w.to_be_bytes());
    out[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&out[12..29]);
    out[29..33].copy_from_slice(&crc.to_be_bytes());
    out
}

/// The bombs: `(file name, bytes, width x height it claims)`.
fn bombs() -> Vec<(&'static str, Vec<u8>, String)> {
    let (w, h) = (64, 48);
    let px = photo_sized("rocket", w, h);
    let base = jpeg(&px, w, h, 90);
    let prog = progressive_jpeg(&px, w, h);
    vec![
        ("bomb_baseline.jpg", claim_jpeg(&base, 65500, 65500), "65500x65500".into()),
        ("bomb_progressive.jpg", claim_jpeg(&prog, 65500, 65500), "65500x65500".into()),
        ("bomb_exif.jpg", with_exif(&claim_jpeg(&base, 65500, 65500), 6), "65500x65500".into()),
        ("bomb.png", claim_png(&png(&px, w, h), 100_000, 100_000), "100000x100000".into()),
    ]
}

/// Every decode mode: EXIF, DCT scaling, ROI and restart intervals each on and off.
fn modes(max_pixels: u64) -> Vec<DecodeOptions> {
    let mut out = vec![];
    for bits in 0..16 {
        out.push(DecodeOptions {
            apply_exif: bits & 1 != 0,
            dct_scaling: bits & 2 != 0,
            roi: bits & 4 != 0,
            restart: bits & 8 != 0,
            max_pixels,
        });
    }
    out
}

/// Decodes `data` as the pipeline does (a centre crop to 32x32), returning the output size.
fn decode_like_pipeline(dec: &mut Decoder, data: &[u8]) -> Result<(usize, usize)> {
    let path = Path::new("x");
    let info = dec.info(data, path)?;
    let (w, h) = (info.width as f64, info.height as f64);
    let bbox = [w / 4.0, h / 4.0, w / 2.0, h / 2.0];
    let r = dec.decode(data, path, &info, bbox, (8, 8))?;
    assert_eq!(r.pixels.len(), r.width * r.height * 3);
    Ok((info.width, info.height))
}

#[test]
fn bombs_are_refused_from_the_header_in_every_decode_mode() {
    for opts in modes(DEFAULT_MAX_PIXELS) {
        let mut dec = Decoder::new(opts).unwrap();
        for (name, data, claim) in bombs() {
            let e = decode_like_pipeline(&mut dec, &data).unwrap_err();
            let want = format!("image too large: {claim} > max_pixels ({DEFAULT_MAX_PIXELS})");
            assert!(e.to_string().contains(&want), "{name} {opts:?}: {e}");
            assert!(matches!(e, Error::Decode { .. }), "{name}: {e:?}");
            let e = dec.decode_full(&data, Path::new(name)).unwrap_err();
            assert!(e.to_string().contains(&want), "{name} {opts:?} full: {e}");
        }
        // The decoder is still good afterwards.
        let (w, h) = (64, 48);
        let good = jpeg(&photo_sized("rocket", w, h), w, h, 90);
        assert_eq!(decode_like_pipeline(&mut dec, &good).unwrap(), (w, h));
    }
}

#[test]
fn max_pixels_is_exact_for_jpeg_and_png_in_every_mode() {
    let (w, h) = (64, 48);
    let px = photo_sized("chelsea", w, h);
    let files = [
        ("baseline", jpeg(&px, w, h, 90)),
        ("progressive", progressive_jpeg(&px, w, h)),
        ("exif", with_exif(&jpeg(&px, w, h, 90), 6)),
        ("png", png(&px, w, h)),
    ];
    let n = (w * h) as u64;
    for (name, data) in &files {
        for opts in modes(n) {
            let got = decode_like_pipeline(&mut Decoder::new(opts).unwrap(), data).unwrap();
            let expect = if opts.apply_exif && *name == "exif" { (h, w) } else { (w, h) };
            assert_eq!(got, expect, "{name} {opts:?}");
        }
        for opts in modes(n - 1) {
            let e = decode_like_pipeline(&mut Decoder::new(opts).unwrap(), data).unwrap_err();
            assert!(e.to_string().contains(&format!("image too large: 64x48 > max_pixels ({})", n - 1)), "{name}: {e}");
        }
    }
}

#[test]
fn libjpeg_turbo_carries_the_pixel_limit_itself() {
    // Below the header check: the library's own TJPARAM_MAXPIXELS refuses the decode.
    let (w, h) = (64, 48);
    let data = jpeg(&photo_sized("rocket", w, h), w, h, 90);
    let mut out = vec![0u8; w * h * 3];
    let mut small = JpegDecoder::new((w * h - 1) as u64).unwrap();
    assert_eq!(small.limits().tj_max_pixels(), (w * h - 1) as i32);
    let e = small.decode(&data, 8, (0, 0, w, h), 3, &mut out).unwrap_err();
    assert!(e.message.contains("too large"), "{}", e.message);
    assert!(!e.warning);
    // After the error the (fresh) handle still has the limit, and a fitting decoder decodes.
    assert!(small.decode(&data, 8, (0, 0, w, h), 3, &mut out).is_err());
    JpegDecoder::new((w * h) as u64).unwrap().decode(&data, 8, (0, 0, w, h), 3, &mut out).unwrap();
    // The memory bound: 8 bytes per pixel + 64 MiB, in MiB.
    assert_eq!(JpegDecoder::new(DEFAULT_MAX_PIXELS).unwrap().limits().tj_max_memory_mib(), 1430);
    assert_eq!(JpegDecoder::new(u64::MAX).unwrap().limits().tj_max_pixels(), 0);
    assert_eq!(JpegDecoder::new(u64::MAX).unwrap().limits().tj_max_memory_mib(), i32::MAX);
}

#[test]
fn a_progressive_jpeg_with_endless_scans_is_refused_in_every_mode() {
    let (w, h) = (64, 48);
    let prog = progressive_jpeg(&photo_sized("rocket", w, h), w, h);
    let bomb = many_scans(&prog, 600);
    for opts in modes(DEFAULT_MAX_PIXELS) {
        let mut dec = Decoder::new(opts).unwrap();
        let t = Instant::now();
        let e = decode_like_pipeline(&mut dec, &bomb).unwrap_err();
        assert!(e.to_string().contains("too many progressive scans"), "{opts:?}: {e}");
        assert!(e.to_string().contains("more than 500 scans"), "{opts:?}: {e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        // Below the limit the same construction decodes (libjpeg only warns).
        decode_like_pipeline(&mut dec, &many_scans(&prog, 400)).unwrap();
    }
}

#[test]
fn a_loader_skips_each_bomb_with_its_reason_and_delivers_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 14);
    let mut bombs = bombs();
    bombs.sort_by_key(|b| b.0);
    for (name, data, _) in &bombs {
        std::fs::write(root.join("chelsea").join(name), data).unwrap();
    }
    std::fs::write(
        root.join("rocket/zz_scans.jpg"),
        many_scans(&progressive_jpeg(&photo_sized("rocket", 64, 48), 64, 48), 600),
    )
    .unwrap();
    for (dct_scaling, roi, apply_exif) in
        [(true, true, true), (false, false, false), (true, false, true), (false, true, false)]
    {
        let mut spec = TransformSpec::preset("imagenet-train").unwrap();
        spec.apply_exif = apply_exif;
        let mut c = LoaderConfig::new(4, spec);
        c.sampler.drop_last = false;
        c.dct_scaling = dct_scaling;
        c.roi = roi;
        c.threads = Some(2);
        let loader = folder_loader(&root, c);
        let delivered: usize = loader.iter().unwrap().map(|b| b.unwrap().len()).sum();
        assert_eq!(delivered, 14);
        let r = loader.report();
        let mut got: Vec<(String, String)> = r
            .skipped
            .iter()
            .map(|s| (Path::new(&s.path).file_name().unwrap().to_string_lossy().into_owned(), s.reason.clone()))
            .collect();
        got.sort();
        assert_eq!(got.len(), bombs.len() + 1, "{got:#?}");
        for ((name, reason), (bomb, _, claim)) in got.iter().zip(&bombs) {
            assert_eq!(name, bomb);
            assert_eq!(reason, &format!("image too large: {claim} > max_pixels ({DEFAULT_MAX_PIXELS})"));
        }
        assert_eq!(got[bombs.len()].0, "zz_scans.jpg");
        assert!(got[bombs.len()].1.contains("too many progressive scans"), "{got:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Only real files are samples.

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", p.display());
}

fn samples(f: &ImageFolder) -> Vec<(String, i64)> {
    (0..f.len()).map(|i| (f.relative_path(i).to_string(), f.label(i))).collect()
}

fn left_out(f: &ImageFolder, root: &Path) -> Vec<(String, String)> {
    f.not_samples()
        .iter()
        .map(|(p, why)| (p.strip_prefix(root).unwrap().to_string_lossy().into_owned(), why.clone()))
        .collect()
}

/// A tree with every kind of thing that is not an image file, and the socket listener that
/// keeps its socket alive.
fn hostile_tree(dir: &Path) -> (PathBuf, std::os::unix::net::UnixListener) {
    let root = dir.join("data");
    let (w, h) = (40, 30);
    let img = jpeg(&photo_sized("coffee", w, h), w, h, 85);
    let cat = root.join("cat");
    std::fs::create_dir_all(cat.join("sub")).unwrap();
    std::fs::create_dir_all(root.join("dog")).unwrap();
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for p in
        [cat.join("a.jpg"), cat.join("b.jpg"), cat.join("sub/c.jpg"), root.join("dog/d.jpg"), outside.join("e.jpg")]
    {
        std::fs::write(p, &img).unwrap();
    }
    mkfifo(&cat.join("fifo.jpg"));
    std::os::unix::fs::symlink("/dev/zero", cat.join("zero.jpg")).unwrap();
    std::fs::File::create(cat.join("sparse.jpg")).unwrap().set_len(1 << 40).unwrap();
    let sock = std::os::unix::net::UnixListener::bind(cat.join("sock.jpg")).unwrap();
    std::os::unix::fs::symlink(".", cat.join("loop")).unwrap();
    std::os::unix::fs::symlink("sub", cat.join("again")).unwrap();
    std::os::unix::fs::symlink(&outside, cat.join("linked")).unwrap();
    std::os::unix::fs::symlink("..", cat.join("sub/up")).unwrap();
    std::os::unix::fs::symlink("..", cat.join("root")).unwrap();
    std::os::unix::fs::symlink("../dog", cat.join("dogs")).unwrap();
    std::os::unix::fs::symlink("nowhere.jpg", root.join("dog/dangling.jpg")).unwrap();
    mkfifo(&root.join("dog/notes.txt")); // not named like an image: ignored, not reported
    (root, sock)
}

#[test]
fn only_real_files_are_samples_and_the_rest_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let (root, _sock) = hostile_tree(d.path());
    let t = Instant::now();
    let f = ImageFolder::new(&root).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(f.classes(), &["cat".to_string(), "dog".to_string()]);
    let s = |p: &str, l| (p.to_string(), l);
    assert_eq!(
        samples(&f),
        vec![
            s("cat/a.jpg", 0),
            s("cat/b.jpg", 0),
            s("cat/sparse.jpg", 0),
            s("cat/linked/e.jpg", 0),
            s("cat/sub/c.jpg", 0),
            s("dog/d.jpg", 1),
            s("dog/dangling.jpg", 1),
        ]
    );
    let mut left = left_out(&f, &root);
    left.sort();
    let l = |p: &str, why: &str| (p.to_string(), why.to_string());
    assert_eq!(
        left,
        vec![
            l("cat/again", "repeated folder: the same folder as cat/sub, already indexed there"),
            l("cat/dogs", "the class folder dog: not walked (its images are class dog)"),
            l("cat/fifo.jpg", "not a regular file: a FIFO (named pipe)"),
            l("cat/loop", "folder symlink loop: the same folder as its ancestor cat, not walked again"),
            l("cat/root", "folder symlink loop: the dataset root, not walked"),
            l("cat/sock.jpg", "not a regular file: a socket"),
            l("cat/sub/up", "folder symlink loop: the same folder as its ancestor cat, not walked again"),
            l("cat/zero.jpg", "not a regular file: a symlink to a character device (/dev/zero)"),
        ]
    );
}

#[test]
fn a_loader_over_the_hostile_tree_delivers_the_real_images_and_skips_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let (root, _sock) = hostile_tree(d.path());
    let mut c = LoaderConfig::new(3, TransformSpec::preset("imagenet-val").unwrap());
    c.sampler.drop_last = false;
    let loader = folder_loader(&root, c);
    let t = Instant::now();
    let delivered: usize = loader.iter().unwrap().map(|b| b.unwrap().len()).sum();
    assert!(t.elapsed() < Duration::from_secs(30));
    assert_eq!(delivered, 5);
    let mut got: Vec<(String, String)> = loader
        .report()
        .skipped
        .iter()
        .map(|s| (Path::new(&s.path).strip_prefix(&root).unwrap().to_string_lossy().into_owned(), s.reason.clone()))
        .collect();
    got.sort();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, "cat/sparse.jpg");
    assert_eq!(got[0].1, format!("file too large: {} bytes > max_file_bytes ({})", 1u64 << 40, 256u64 << 20));
    assert_eq!(got[1].0, "dog/dangling.jpg");
    assert!(got[1].1.contains("No such file"), "{got:?}");
}

#[test]
fn a_file_that_changed_after_indexing_is_that_samples_error() {
    let d = tempfile::tempdir().unwrap();
    let (w, h) = (40, 30);
    let img = jpeg(&photo_sized("coffee", w, h), w, h, 85);
    let root = d.path().join("data");
    std::fs::create_dir_all(root.join("cat")).unwrap();
    for n in ["a.jpg", "b.jpg", "c.jpg", "d.jpg"] {
        std::fs::write(root.join("cat").join(n), &img).unwrap();
    }
    let f = ImageFolder::new(&root).unwrap();
    assert_eq!(f.len(), 4);
    let a = root.join("cat/a.jpg");
    std::fs::remove_file(&a).unwrap();
    mkfifo(&a);
    std::fs::remove_file(root.join("cat/b.jpg")).unwrap();
    std::fs::remove_file(root.join("cat/c.jpg")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", root.join("cat/c.jpg")).unwrap();
    let mut buf = vec![];
    let t = Instant::now();
    let e = f.read(0, &mut buf, u64::MAX).unwrap_err();
    assert_eq!(e.to_string(), format!("{}: not a regular file: a FIFO (named pipe)", a.display()));
    let e = f.read(1, &mut buf, u64::MAX).unwrap_err();
    assert!(
        matches!(&e, Error::Io { path, reason } if path.ends_with("cat/b.jpg") && reason.contains("No such file")),
        "{e}"
    );
    let e = f.read(2, &mut buf, u64::MAX).unwrap_err();
    assert!(e.to_string().ends_with("cat/c.jpg: not a regular file: a character device"), "{e}");
    f.read(3, &mut buf, u64::MAX).unwrap();
    assert_eq!(buf, img);
    assert!(t.elapsed() < Duration::from_secs(5));

    // Through a loader: the three are skipped with their reasons, nothing hangs.
    let mut c = LoaderConfig::new(2, TransformSpec::preset("imagenet-val").unwrap());
    c.sampler.drop_last = false;
    let loader = Loader::new(Arc::new(f), c).unwrap();
    let delivered: usize = loader.iter().unwrap().map(|b| b.unwrap().len()).sum();
    assert_eq!(delivered, 1);
    assert_eq!(loader.report().skipped_count, 3);
}

#[test]
fn a_class_of_only_special_files_names_what_was_left_out() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("data");
    std::fs::create_dir_all(root.join("cat")).unwrap();
    std::fs::create_dir_all(root.join("dog")).unwrap();
    std::fs::write(root.join("dog/d.jpg"), b"x").unwrap();
    mkfifo(&root.join("cat/fifo.jpg"));
    let e = ImageFolder::new(&root).unwrap_err().to_string();
    assert!(e.contains("no image files in class folder(s) cat ("), "{e}");
    assert!(e.contains("fifo.jpg: not a regular file: a FIFO"), "{e}");
}
