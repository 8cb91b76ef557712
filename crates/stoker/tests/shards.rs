//! Tar shards: pack → load round trip, determinism, `--max-side`, and the promised errors for
//! truncated shards, missing/mismatched/corrupt indexes; names of any length and UTF-8 (ours and
//! hand-made pax/GNU headers), refusing/overwriting an earlier run, no partial files left behind,
//! indexing in bounded memory (a counting allocator: this binary's global allocator), and what
//! shards drop (hard links, missing or bad labels, class names) listed with the reason.

mod common;

use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stoker::pack::{pack, PackOptions};
use stoker::source::shards::{decode_index, encode_index, index_path, write_index};
use stoker::*;

/// Counts, per thread, the largest single allocation (other tests run on other threads).
struct LargestPerThread;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: forwards to the system allocator unchanged; only notes sizes in a const thread-local
// (no allocation, no destructor).
unsafe impl GlobalAlloc for LargestPerThread {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note(n);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: LargestPerThread = LargestPerThread;

fn shards_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    v.sort();
    v
}

fn val_u8() -> TransformSpec {
    TransformSpec::preset("imagenet-val").unwrap().with_dtype(DType::Uint8)
}

/// Per sample (by label and dataset index within its class), the decoded val-preset pixels.
fn pixels_by_index(source: Arc<dyn Source>) -> Vec<(i64, Vec<u8>)> {
    let loader = Loader::new(source, LoaderConfig::new(8, val_u8())).unwrap();
    let mut out = vec![];
    for b in loader.iter().unwrap() {
        let b = b.unwrap();
        let per = b.data().len() / b.len();
        for (k, l) in b.labels().iter().enumerate() {
            out.push((*l, b.data()[k * per..(k + 1) * per].to_vec()));
        }
    }
    out
}

#[test]
fn a_class_name_that_is_not_utf8_survives_pack_exactly() {
    use std::os::unix::ffi::OsStrExt;
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("data");
    let names: [&[u8]; 2] = [b"caf\xe9", b"plain"];
    let (px, w, h) = photo("rocket");
    for name in names {
        let dir = root.join(std::ffi::OsStr::from_bytes(name));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.jpg"), jpeg(&px, w, h, 90)).unwrap();
    }
    let folder = ImageFolder::new(&root).unwrap();
    pack(&folder, d.path().join("out"), &PackOptions::default(), &|_| {}).unwrap();
    let shards = ShardSource::open(&shards_in(&d.path().join("out"))).unwrap();
    let got: Vec<&[u8]> = shards.classes().iter().map(|c| c.as_bytes()).collect();
    assert_eq!(got, names, "written lossily, the name would read back as caf\u{fffd}");
    assert_eq!(shards.classes(), folder.class_names());
    assert_eq!((0..2).map(|i| shards.label(i)).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn pack_then_load_gives_the_same_pixels_and_is_deterministic() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let opts = PackOptions { shard_size: 300_000, threads: 2, ..PackOptions::default() };
    let s = pack(&ImageFolder::new(&root).unwrap(), d.path().join("a"), &opts, &|_| {}).unwrap();
    assert_eq!(s.samples, 40);
    assert!(s.shards.len() >= 3, "{} shards", s.shards.len());
    // Same input, same bytes (also with a different thread count).
    let opts1 = PackOptions { threads: 1, ..opts.clone() };
    pack(&ImageFolder::new(&root).unwrap(), d.path().join("b"), &opts1, &|_| {}).unwrap();
    for (a, b) in shards_in(&d.path().join("a")).iter().zip(shards_in(&d.path().join("b"))) {
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(std::fs::read(index_path(a)).unwrap(), std::fs::read(index_path(&b)).unwrap());
    }
    // Round trip: same order (dataset order), same labels, same pixels per sample.
    let folder = pixels_by_index(Arc::new(ImageFolder::new(&root).unwrap()));
    let shards = ShardSource::open(&shards_in(&d.path().join("a"))).unwrap();
    assert_eq!(shards.classes(), ImageFolder::new(&root).unwrap().class_names());
    let keys: Vec<String> = (0..shards.len()).map(|i| shards.member(i).to_string()).collect();
    let expect: Vec<String> = (0..40).map(|i| ImageFolder::new(&root).unwrap().relative_path(i).to_string()).collect();
    assert_eq!(keys, expect);
    assert_eq!(pixels_by_index(Arc::new(shards)), folder);
}

#[test]
fn a_shuffled_pack_holds_every_sample_once_in_a_seeded_order_that_mixes_classes() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let folder = ImageFolder::new(&root).unwrap();
    let opts = PackOptions { shard_size: 300_000, threads: 2, shuffle: Some(7), ..PackOptions::default() };
    pack(&folder, d.path().join("a"), &opts, &|_| {}).unwrap();
    pack(&folder, d.path().join("b"), &PackOptions { threads: 1, ..opts.clone() }, &|_| {}).unwrap();
    for (a, b) in shards_in(&d.path().join("a")).iter().zip(shards_in(&d.path().join("b"))) {
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(&b).unwrap(), "the same seed, the same bytes");
    }
    let shards = ShardSource::open(&shards_in(&d.path().join("a"))).unwrap();
    let keys: Vec<String> = (0..shards.len()).map(|i| shards.member(i).to_string()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    let mut expect: Vec<String> = (0..40).map(|i| folder.relative_path(i).to_string()).collect();
    assert_ne!(keys, expect, "not the dataset's order");
    expect.sort();
    assert_eq!(sorted, expect, "every sample once");
    // The labels follow their images, and the order is no longer sorted by class.
    let labels: Vec<i64> = (0..shards.len()).map(|i| shards.label(i)).collect();
    for (i, k) in keys.iter().enumerate() {
        let j = (0..40).find(|&j| folder.relative_path(j) == k.as_str()).unwrap();
        assert_eq!(labels[i], folder.label(j));
    }
    assert!(labels.windows(2).any(|w| w[0] > w[1]));
}

#[test]
fn random_access_packing_keeps_every_pixel_and_adds_restart_markers() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 24);
    let opts = PackOptions { random_access: true, threads: 2, ..PackOptions::default() };
    let s = pack(&ImageFolder::new(&root).unwrap(), d.path().join("r"), &opts, &|_| {}).unwrap();
    let ra = s.random_access.clone().unwrap();
    assert_eq!((ra.recoded, ra.kept), (24, 0), "{ra:?}");
    assert!(ra.bytes_after < ra.bytes_before * 102 / 100, "{ra:?}");
    let shards = ShardSource::open(&shards_in(&d.path().join("r"))).unwrap();
    let mut buf = vec![];
    for i in 0..shards.len() {
        shards.read(i, &mut buf, u64::MAX).unwrap();
        let interval = stoker::decode::restart::restart_interval(&buf);
        assert!(interval.is_some_and(|n| ra.intervals.contains_key(&n)), "sample {i}: {interval:?}");
    }
    let full = pixels_by_index(Arc::new(ImageFolder::new(&root).unwrap()));
    assert_eq!(pixels_by_index(Arc::new(shards)), full, "the same pixels, bit for bit");
    // Without the flag: no summary, no markers.
    let plain = pack(&ImageFolder::new(&root).unwrap(), d.path().join("p"), &PackOptions::default(), &|_| {}).unwrap();
    assert!(plain.random_access.is_none());

    // Train, val and uint8 batches, several seeds: the same bytes from the source folder, the
    // plain shards and the random-access shards, whose crops are decoded from the restart
    // intervals they touch.
    let batches = |source: Arc<dyn Source>, preset: &str, dtype: DType, seed: u64| {
        let mut c = LoaderConfig::new(6, TransformSpec::preset(preset).unwrap().with_dtype(dtype));
        c.sampler.shuffle = true;
        c.sampler.seed = seed;
        c.threads = Some(2);
        let l = Loader::new(source, c).unwrap();
        let got: Vec<(Vec<i64>, Vec<u8>)> =
            l.iter().unwrap().map(|b| b.unwrap()).map(|b| (b.labels().to_vec(), b.data().to_vec())).collect();
        (got, l.report().kind.restart_decodes)
    };
    let restarts = |dir: &str| Arc::new(ShardSource::open(&shards_in(&d.path().join(dir))).unwrap());
    for (preset, dtype, seed) in [
        ("imagenet-train", DType::Uint8, 1),
        ("imagenet-train", DType::Float32, 2),
        ("imagenet-train", DType::Uint8, 3),
        ("imagenet-val", DType::Uint8, 4),
    ] {
        let (want, none) = batches(Arc::new(ImageFolder::new(&root).unwrap()), preset, dtype, seed);
        assert_eq!(none, 0, "no restart markers in the source folder");
        let (from_plain, _) = batches(restarts("p"), preset, dtype, seed);
        let (from_ra, used) = batches(restarts("r"), preset, dtype, seed);
        assert!(from_plain == want, "{preset} seed {seed}: plain shards");
        assert!(from_ra == want, "{preset} seed {seed}: random-access shards");
        eprintln!("{preset} seed {seed}: {used} of 24 crops decoded from their restart intervals");
        if preset == "imagenet-train" {
            assert!(used > 12, "{preset} seed {seed}: crops decoded from their intervals: {used} of 24");
        }
    }
}

#[test]
fn max_side_shrinks_files_and_stays_close_after_the_preset() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 21);
    let opts = PackOptions { max_side: Some(320), threads: 2, ..PackOptions::default() };
    let s = pack(&ImageFolder::new(&root).unwrap(), d.path().join("m"), &opts, &|_| {}).unwrap();
    assert_eq!(s.reencoded, 21, "every demo image is larger than 320");
    let small = pixels_by_index(Arc::new(ShardSource::open(&shards_in(&d.path().join("m"))).unwrap()));
    let full = pixels_by_index(Arc::new(ImageFolder::new(&root).unwrap()));
    // Resize(256)+CenterCrop(224) of a 320-px re-encode vs of the original: stated tolerance,
    // mean absolute difference <= 6 levels per image (JPEG re-encoding + an extra resample).
    let mut worst: f64 = 0.0;
    for ((la, a), (lb, b)) in small.iter().zip(&full) {
        assert_eq!(la, lb);
        worst = worst.max(mean_abs(a, b));
    }
    eprintln!("max-side 320: worst mean abs difference {worst:.2}");
    assert!(worst <= 6.0, "{worst}");
}

#[test]
fn indexing_existing_webdataset_shards() {
    // A shard written by another tool: keys with dots in directories, a .cls per sample.
    let d = tempfile::tempdir().unwrap();
    let (w, h) = (64, 48);
    let img = jpeg(&photo_sized("rocket", w, h), w, h, 90);
    let mut t = vec![];
    for k in 0..3 {
        stoker::source::tar::append_member(&mut t, &format!("v1.0/s{k}.jpg"), &img);
        stoker::source::tar::append_member(&mut t, &format!("v1.0/s{k}.cls"), format!("{k}").as_bytes());
    }
    stoker::source::tar::finish(&mut t);
    let shard = d.path().join("x.tar");
    std::fs::write(&shard, &t).unwrap();
    assert!(ShardSource::open(std::slice::from_ref(&shard)).unwrap_err().to_string().contains("stoker index"));
    assert_eq!(write_index(&shard).unwrap(), 3);
    let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
    assert_eq!((0..3).map(|i| s.label(i)).collect::<Vec<_>>(), vec![0, 1, 2]);
    let mut buf = vec![];
    s.read(1, &mut buf, u64::MAX).unwrap();
    assert_eq!(buf, img);
}

#[test]
fn truncated_shards_and_bad_indexes_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 14);
    let out = d.path().join("s");
    pack(&ImageFolder::new(&root).unwrap(), &out, &PackOptions::default(), &|_| {}).unwrap();
    let shard = shards_in(&out).remove(0);
    let idx = index_path(&shard);
    let bytes = std::fs::read(&shard).unwrap();
    let index = std::fs::read(&idx).unwrap();
    let open = || ShardSource::open(std::slice::from_ref(&shard));

    // Truncated shard: the index no longer matches (size recorded in the index).
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let e = open().unwrap_err().to_string();
    assert!(e.contains("index does not match its shard") && e.contains(".tar.idx"), "{e}");
    // ... and re-indexing a truncated shard names the file and says truncated.
    let e = write_index(&shard).unwrap_err().to_string();
    assert!(e.contains("truncated") && e.contains(".tar"), "{e}");
    std::fs::write(&shard, &bytes).unwrap();

    // Corrupt index.
    let mut bad = index.clone();
    bad[40] ^= 0x55;
    std::fs::write(&idx, &bad).unwrap();
    let e = open().unwrap_err().to_string();
    assert!(e.contains("checksum") && e.contains(".tar.idx"), "{e}");
    // Missing index.
    std::fs::remove_file(&idx).unwrap();
    assert!(open().unwrap_err().to_string().contains("cannot read the shard index"));
    // An index of another shard of the same size: caught per sample by the header check.
    std::fs::write(&idx, &index).unwrap();
    let mut shifted = bytes.clone();
    shifted.rotate_right(1024);
    std::fs::write(&shard, &shifted).unwrap();
    let s = open().unwrap();
    let mut buf = vec![];
    let e = s.read(0, &mut buf, u64::MAX).unwrap_err().to_string();
    assert!(e.contains("index does not match its shard") && e.contains(".tar:"), "{e}");
    // Under the default policy those samples are skipped, counted and reported.
    let loader = Loader::new(Arc::new(s), LoaderConfig::new(4, val_u8())).unwrap();
    let n: usize = loader.iter().unwrap().map(|b| b.map(|b| b.len()).unwrap_or(0)).sum();
    let r = loader.report();
    assert_eq!(n as u64 + r.skipped_count, 14);
    assert!(r.skipped_count > 0);
}

#[test]
fn member_names_are_never_paths() {
    // A hostile member name is just a key: reading never touches the filesystem by it.
    let d = tempfile::tempdir().unwrap();
    let (w, h) = (32, 32);
    let img = jpeg(&photo_sized("chelsea", w, h), w, h, 90);
    let mut t = vec![];
    stoker::source::tar::append_member(&mut t, "../../etc/passwd.jpg", &img);
    stoker::source::tar::finish(&mut t);
    let shard = d.path().join("evil.tar");
    std::fs::write(&shard, &t).unwrap();
    write_index(&shard).unwrap();
    let s = ShardSource::open(&[shard]).unwrap();
    let mut buf = vec![];
    s.read(0, &mut buf, u64::MAX).unwrap();
    assert_eq!(buf, img);
}

/// Every file name under `dir` (not recursive).
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Loads every sample of `source` once (val preset) and returns (indices, skipped count).
fn load_all(source: Arc<dyn Source>) -> (Vec<u32>, u64) {
    let loader = Loader::new(source, LoaderConfig::new(4, val_u8())).unwrap();
    let mut seen = vec![];
    for b in loader.iter().unwrap() {
        seen.extend(b.unwrap().indices());
    }
    seen.sort();
    (seen, loader.report().skipped_count)
}

#[test]
fn long_and_utf8_file_names_round_trip_through_pack() {
    // Regression: a file name longer than 100 bytes aborted the whole run ("member name too
    // long"); UTF-8 names went into the ustar field.
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 14);
    let folder = ImageFolder::new(&root).unwrap();
    let renames = [
        format!("{}.jpg", "l".repeat(200)),
        format!("{}.jpg", "é".repeat(100)),
        "Ünïcødé 猫 🐈.jpg".to_string(),
        format!("{}.jpg", "🐈".repeat(60)),
    ];
    for (k, new) in renames.iter().enumerate() {
        let old = root.join(folder.relative_path(k * 3));
        std::fs::rename(&old, old.with_file_name(new)).unwrap();
    }
    let out = d.path().join("packed");
    let opts = PackOptions { shard_size: 200_000, threads: 2, ..PackOptions::default() };
    let s = pack(&ImageFolder::new(&root).unwrap(), &out, &opts, &|_| {}).unwrap();
    assert_eq!((s.samples, s.skipped.len()), (14, 0));
    let folder = ImageFolder::new(&root).unwrap();
    let shards = ShardSource::open(&shards_in(&out)).unwrap();
    let members: Vec<&str> = (0..14).map(|i| shards.member(i)).collect();
    let expect: Vec<&str> = (0..14).map(|i| folder.relative_path(i)).collect();
    assert_eq!(members, expect);
    for new in &renames {
        assert!(members.iter().any(|m| m.ends_with(new.as_str())), "{new}");
    }
    let (mut a, mut b) = (vec![], vec![]);
    for (i, member) in members.iter().enumerate() {
        shards.read(i, &mut a, u64::MAX).unwrap();
        folder.read(i, &mut b, u64::MAX).unwrap();
        assert_eq!(a, b, "{member}");
        assert_eq!(shards.label(i), folder.label(i));
    }
    // What pack wrote, `stoker index` reads back the same (fingerprints included).
    for shard in shards_in(&out) {
        let packed = std::fs::read(index_path(&shard)).unwrap();
        write_index(&shard).unwrap();
        assert_eq!(std::fs::read(index_path(&shard)).unwrap(), packed);
    }
    assert_eq!(load_all(Arc::new(shards)), ((0..14).collect(), 0));
}

/// A hand-made tar header (no tar crate): POSIX ustar, or old GNU (`ustar  \0`, times where
/// POSIX keeps the prefix).
fn raw_header(name: &[u8], size: u64, typeflag: u8, gnu: bool) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0001750\0");
    h[116..124].copy_from_slice(b"0001750\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(format!("{:011o}\0", 1_700_000_000u64).as_bytes());
    h[156] = typeflag;
    if gnu {
        h[257..265].copy_from_slice(b"ustar  \0");
        h[345..357].copy_from_slice(format!("{:011o}\0", 1_700_000_001u64).as_bytes());
    // atime
    } else {
        h[257..265].copy_from_slice(b"ustar\x0000");
    }
    h[265..269].copy_from_slice(b"user");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn pad(t: &mut Vec<u8>) {
    t.resize(t.len().div_ceil(512) * 512, 0);
}

fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let digits = |n: usize| n.to_string().len();
    let len = if digits(body + digits(body)) == digits(body) { body + digits(body) } else { body + digits(body) + 1 };
    [format!("{len} {key}=").as_bytes(), value, b"\n"].concat()
}

/// A member as Python's tarfile (PAX_FORMAT) or GNU tar (posix) writes it: a pax header with a
/// `path` record, then a header whose name is the first 100 bytes (UTF-8 possibly cut).
fn push_pax(t: &mut Vec<u8>, name: &str, data: &[u8]) {
    let rec = [pax_record("mtime", b"1700000000.25"), pax_record("path", name.as_bytes())].concat();
    t.extend_from_slice(&raw_header(b"./PaxHeaders/x", rec.len() as u64, b'x', false));
    t.extend_from_slice(&rec);
    pad(t);
    let short = &name.as_bytes()[..name.len().min(100)];
    t.extend_from_slice(&raw_header(short, data.len() as u64, b'0', false));
    t.extend_from_slice(data);
    pad(t);
}

/// A member as GNU_FORMAT writes it: a `././@LongLink` record for a name over 100 bytes, raw
/// UTF-8 in the header otherwise.
fn push_gnu(t: &mut Vec<u8>, name: &str, data: &[u8]) {
    if name.len() > 100 {
        let long = [name.as_bytes(), b"\0"].concat();
        t.extend_from_slice(&raw_header(b"././@LongLink", long.len() as u64, b'L', true));
        t.extend_from_slice(&long);
        pad(t);
    }
    let short = &name.as_bytes()[..name.len().min(100)];
    t.extend_from_slice(&raw_header(short, data.len() as u64, b'0', true));
    t.extend_from_slice(data);
    pad(t);
}

#[test]
fn hand_made_pax_and_gnu_long_names_are_indexed_and_read() {
    // Regression: such shards were indexed, then every long-named sample was skipped at read
    // time ("index does not match its shard": the ustar name field was compared).
    let d = tempfile::tempdir().unwrap();
    let mut t = vec![];
    // A pax global header and a directory: skipped.
    let g = pax_record("comment", b"made by hand");
    t.extend_from_slice(&raw_header(b"pax_global_header", g.len() as u64, b'g', false));
    t.extend_from_slice(&g);
    pad(&mut t);
    t.extend_from_slice(&raw_header(b"pax/", 0, b'5', false));
    let names = [
        (true, format!("pax/{}-0", "p".repeat(150))),
        (true, format!("pax/{}-1", "é".repeat(70))),
        (true, "pax/猫-2".to_string()),
        (false, format!("gnu/{}-3", "g".repeat(150))),
        (false, format!("gnu/{}-4", "ü".repeat(60))),
        (false, "gnu/ünï-5".to_string()),
    ];
    let mut expect = vec![];
    for (k, (pax, key)) in names.iter().enumerate() {
        let (w, h) = (40 + 8 * k, 32);
        let img = jpeg(&photo_sized("rocket", w, h), w, h, 90);
        let push = if *pax { push_pax } else { push_gnu };
        push(&mut t, &format!("{key}.jpg"), &img);
        push(&mut t, &format!("{key}.cls"), format!("{k}\n").as_bytes());
        expect.push((format!("{key}.jpg"), img, k as i64));
    }
    t.extend_from_slice(&[0u8; 1024]);
    let shard = d.path().join("other-tool.tar");
    std::fs::write(&shard, &t).unwrap();
    assert_eq!(write_index(&shard).unwrap(), 6);
    let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
    let mut buf = vec![];
    for (i, (member, img, label)) in expect.iter().enumerate() {
        assert_eq!(s.member(i), member);
        assert_eq!(s.label(i), *label);
        s.read(i, &mut buf, u64::MAX).unwrap();
        assert_eq!(&buf, img, "{member}");
    }
    assert_eq!(load_all(Arc::new(s)), ((0..6).collect(), 0));

    // The check still catches an index that points at the wrong place: offsets rotated among
    // entries, or moved by one block.
    let idx = index_path(&shard);
    let (entries, size) = decode_index(&std::fs::read(&idx).unwrap(), &idx).unwrap();
    let mut rotated = entries.clone();
    for (k, e) in rotated.iter_mut().enumerate() {
        let other = &entries[(k + 1) % entries.len()];
        (e.offset, e.length) = (other.offset, other.length);
    }
    let mut shifted = entries.clone();
    for e in &mut shifted {
        e.offset += 512;
        e.length = e.length.min(size - e.offset);
    }
    for bad in [rotated, shifted] {
        std::fs::write(&idx, encode_index(&bad, size)).unwrap();
        let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
        for i in 0..6 {
            let e = s.read(i, &mut buf, u64::MAX).unwrap_err().to_string();
            assert!(e.contains("index does not match its shard") && e.contains("stoker index"), "{e}");
        }
    }
}

#[test]
fn packing_over_an_earlier_run_is_refused_unless_overwrite() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 21);
    let out = d.path().join("out");
    let opts = PackOptions { shard_size: 150_000, ..PackOptions::default() };
    let first = pack(&ImageFolder::new(&root).unwrap(), &out, &opts, &|_| {}).unwrap();
    assert!(first.shards.len() >= 3 && first.removed.is_empty());
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    std::fs::create_dir(out.join("keep.tar")).unwrap(); // a folder: never touched
    let before = names_in(&out);
    let e = pack(&ImageFolder::new(&root).unwrap(), &out, &opts, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("overwrite") && e.contains("already holds") && e.contains("shard-000000.tar"), "{e}");
    assert_eq!(names_in(&out), before, "a refused run changes nothing");
    // A smaller dataset with --overwrite: fewer shards, none of the earlier run left.
    let small = d.path().join("small");
    stoker::demo::make_demo(&small, 7, 3, 1).unwrap();
    std::fs::remove_file(small.join("LICENSE.md")).unwrap();
    let again = PackOptions { overwrite: true, ..opts };
    let second = pack(&ImageFolder::new(&small).unwrap(), &out, &again, &|_| {}).unwrap();
    assert!(second.shards.len() < first.shards.len());
    assert_eq!(second.removed.len(), 2 * first.shards.len() + 1);
    let mut want: Vec<String> = second
        .shards
        .iter()
        .flat_map(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            [n.clone(), format!("{n}.idx")]
        })
        .chain(["classes.json".into(), "keep.tar".into(), "notes.txt".into()])
        .collect();
    want.sort();
    assert_eq!(names_in(&out), want);
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"mine");
    let ds = stoker::source::open_path(&out).unwrap();
    assert_eq!(ds.source.len(), 7);
}

#[test]
fn a_failed_pack_leaves_no_partial_file_and_no_shard_without_index() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 14);
    let out = d.path().join("out");
    let opts = PackOptions { shard_size: 150_000, ..PackOptions::default() };
    let ok = pack(&ImageFolder::new(&root).unwrap(), &out, &opts, &|_| {}).unwrap();
    assert!(ok.shards.len() >= 2);
    assert!(names_in(&out).iter().all(|n| !n.contains("partial")), "{:?}", names_in(&out));
    // The second shard cannot take its name (a non-empty folder holds it): a clear error naming
    // the shard; the first shard is complete with its index, nothing temporary is left.
    let out2 = d.path().join("out2");
    std::fs::create_dir_all(out2.join("shard-000001.tar").join("x")).unwrap();
    let e = pack(&ImageFolder::new(&root).unwrap(), &out2, &opts, &|_| {}).unwrap_err().to_string();
    assert!(e.contains("shard-000001.tar") && e.contains("cannot write the shard"), "{e}");
    let names = names_in(&out2);
    assert!(names.iter().all(|n| !n.contains("partial")), "{names:?}");
    assert_eq!(names, ["classes.json", "shard-000000.tar", "shard-000000.tar.idx", "shard-000001.tar"]);
    ShardSource::open(&[out2.join("shard-000000.tar")]).unwrap();
}

#[test]
fn indexing_streams_the_shard() {
    // Regression: `stoker index` read the whole shard into memory. A sparse 256 MiB member,
    // then a labelled image: indexing allocates kilobytes, not the shard.
    let d = tempfile::tempdir().unwrap();
    let shard = d.path().join("big.tar");
    let big: u64 = 256 << 20;
    let (w, h) = (48, 40);
    let img = jpeg(&photo_sized("chelsea", w, h), w, h, 90);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::File::create(&shard).unwrap();
        f.write_all(&raw_header(b"big/huge.jpg", big, b'0', false)).unwrap();
        f.seek(SeekFrom::Current(big as i64)).unwrap(); // a hole: costs no disk
        let mut t = vec![];
        stoker::source::tar::append_member(&mut t, "small/a.jpg", &img);
        stoker::source::tar::append_member(&mut t, "small/a.cls", b"5");
        stoker::source::tar::finish(&mut t);
        f.write_all(&t).unwrap();
    }
    LARGEST.with(|l| l.set(0));
    assert_eq!(write_index(&shard).unwrap(), 2);
    let largest = LARGEST.with(|l| l.get());
    assert!(largest < 1 << 20, "indexing allocated {largest} bytes at once");
    let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
    // The huge image has no label while the other has one: not a sample, and said so.
    assert_eq!((s.len(), s.member(0), s.label(0)), (1, "small/a.jpg", 5));
    assert_eq!(s.not_samples().len(), 1);
    assert!(s.not_samples()[0].0.to_string_lossy().ends_with("big.tar:big/huge.jpg"));
    assert!(s.not_samples()[0].1.contains("no label"), "{}", s.not_samples()[0].1);
    let mut buf = vec![];
    s.read(0, &mut buf, u64::MAX).unwrap();
    assert_eq!(buf, img);
}

/// A hard (`b'1'`) or symbolic (`b'2'`) link header named `name`, linking to `target`.
fn link_header(name: &str, target: &str, typeflag: u8) -> [u8; 512] {
    let mut h = raw_header(name.as_bytes(), 0, typeflag, false);
    h[157..157 + target.len()].copy_from_slice(target.as_bytes());
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn push_file(t: &mut Vec<u8>, name: &str, data: &[u8]) {
    t.extend_from_slice(&raw_header(name.as_bytes(), data.len() as u64, b'0', false));
    t.extend_from_slice(data);
    pad(t);
}

#[test]
fn shards_say_what_they_drop() {
    // Regression (issue 19): hard-linked members were dropped, an image without .cls got label
    // -1, a .cls holding a class name refused the whole shard. Now: links read the earlier
    // member, class names go through classes.json, and every image that is not a sample is
    // listed with its reason; one bad member never refuses the shard.
    let d = tempfile::tempdir().unwrap();
    let img = |k: usize| jpeg(&photo_sized("rocket", 40 + 8 * k, 32), 40 + 8 * k, 32, 90);
    let mut t = vec![];
    let sample = |t: &mut Vec<u8>, key: &str, k: usize, cls: Option<&[u8]>| {
        push_file(t, &format!("{key}.jpg"), &img(k));
        if let Some(c) = cls {
            push_file(t, &format!("{key}.cls"), c);
        }
    };
    sample(&mut t, "s/a", 0, Some(b"3"));
    sample(&mut t, "s/b", 1, Some(b"n01440764\n")); // a class name
    sample(&mut t, "s/c", 2, None); // no label
    sample(&mut t, "s/d", 3, Some(b"")); // empty
    sample(&mut t, "s/e", 4, Some(b"-2")); // negative
    t.extend_from_slice(&link_header("s/f.jpg", "s/a.jpg", b'1')); // GNU tar's second link
    push_file(&mut t, "s/f.cls", b"1");
    t.extend_from_slice(&link_header("s/g.jpg", "s/missing.jpg", b'1'));
    push_file(&mut t, "s/g.cls", b"1");
    t.extend_from_slice(&link_header("s/h.jpg", "a.jpg", b'2'));
    push_file(&mut t, "s/h.cls", b"1");
    sample(&mut t, "s/i", 5, Some(b"7")); // out of range of classes.json
    push_file(&mut t, "s/j.jpg", &img(6));
    t.extend_from_slice(&link_header("s/j.cls", "s/a.cls", b'1')); // a linked label
    sample(&mut t, "s/k", 7, Some(&[b'1'; 5000])); // not a label
    t.extend_from_slice(&[0u8; 1024]);
    let shard = d.path().join("mixed.tar");
    std::fs::write(&shard, &t).unwrap();
    assert_eq!(write_index(&shard).unwrap(), 6, "a, b, c, f, i, j (the others are dropped already)");
    let classes = ["n00000000", "n01440764", "x", "y", "z"];
    std::fs::write(d.path().join("classes.json"), serde_json::to_string(&classes).unwrap()).unwrap();

    let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
    let got: Vec<(&str, i64)> = (0..s.len()).map(|i| (s.member(i), s.label(i))).collect();
    assert_eq!(got, [("s/a.jpg", 3), ("s/b.jpg", 1), ("s/f.jpg", 1), ("s/j.jpg", 3)]);
    let (mut a, mut f) = (vec![], vec![]);
    s.read(0, &mut a, u64::MAX).unwrap();
    s.read(2, &mut f, u64::MAX).unwrap();
    assert_eq!((&a, &f), (&img(0), &img(0)), "the hard link reads its target's bytes");
    let why = |key: &str| -> String {
        let path = format!("mixed.tar:s/{key}.jpg");
        let found = s.not_samples().iter().find(|(p, _)| p.to_string_lossy().ends_with(&path));
        found.unwrap_or_else(|| panic!("{key} not listed: {:?}", s.not_samples())).1.clone()
    };
    assert_eq!(s.not_samples().len(), 7, "{:?}", s.not_samples());
    for (key, reason) in [
        ("c", "no label"),
        ("d", "s/d.cls is empty"),
        ("e", "negative number (-2)"),
        ("g", "hard link to \"s/missing.jpg\""),
        ("h", "symbolic link"),
        ("i", "label 7 is out of range"),
        ("k", "has 5000 bytes"),
    ] {
        assert!(why(key).contains(reason), "{key}: {}", why(key));
    }
    // Through a loader: the samples delivered, the others in the report with their reasons.
    let source = Arc::new(s);
    let loader = Loader::new(source.clone(), LoaderConfig::new(2, val_u8())).unwrap();
    loader.report_not_samples(source.not_samples());
    let mut labels = vec![];
    for b in loader.iter().unwrap() {
        labels.extend_from_slice(b.unwrap().labels());
    }
    assert_eq!(labels, [3, 1, 1, 3]);
    let r = loader.report();
    assert_eq!(r.skipped_count, 7);
    assert!(!r.skipped.iter().any(|k| k.path.ends_with("s/b.jpg")));
    assert!(r.skipped.iter().any(|k| k.path.ends_with("s/g.jpg") && k.reason.contains("hard link")));

    // Without classes.json: a class name cannot be mapped, and nothing is out of range.
    std::fs::remove_file(d.path().join("classes.json")).unwrap();
    let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
    let got: Vec<(&str, i64)> = (0..s.len()).map(|i| (s.member(i), s.label(i))).collect();
    assert_eq!(got, [("s/a.jpg", 3), ("s/f.jpg", 1), ("s/i.jpg", 7), ("s/j.jpg", 3)]);
    let b = s.not_samples().iter().find(|(p, _)| p.to_string_lossy().ends_with("s/b.jpg")).unwrap();
    assert!(b.1.contains("\"n01440764\" is a class name") && b.1.contains("no classes.json"), "{}", b.1);
}

#[test]
fn shards_without_any_label_are_an_unlabelled_dataset() {
    let d = tempfile::tempdir().unwrap();
    let mut t = vec![];
    for k in 0..3 {
        push_file(&mut t, &format!("u/{k}.jpg"), &jpeg(&photo_sized("chelsea", 32, 24), 32, 24, 90));
    }
    stoker::source::tar::finish(&mut t);
    let shard = d.path().join("u.tar");
    std::fs::write(&shard, &t).unwrap();
    write_index(&shard).unwrap();
    let s = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
    assert_eq!(((0..3).map(|i| s.label(i)).collect::<Vec<_>>(), s.not_samples().len()), (vec![-1, -1, -1], 0));
}

#[test]
fn shards_where_no_image_is_a_sample_say_why() {
    let d = tempfile::tempdir().unwrap();
    let mut t = vec![];
    push_file(&mut t, "x/a.jpg", &jpeg(&photo_sized("chelsea", 32, 24), 32, 24, 90));
    push_file(&mut t, "x/a.cls", b"cat");
    stoker::source::tar::finish(&mut t);
    let shard = d.path().join("x.tar");
    std::fs::write(&shard, &t).unwrap();
    write_index(&shard).unwrap();
    let e = ShardSource::open(std::slice::from_ref(&shard)).unwrap_err().to_string();
    assert!(
        e.contains("none of the 1 image members") && e.contains("x.tar:x/a.jpg") && e.contains("classes.json"),
        "{e}"
    );
}
