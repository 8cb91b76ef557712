//! The decoded-pixel cache through the whole pipeline: fill and hit counts, bit-identity with
//! the uncached full-resolution path, bad entries, the budget, changed files, bad arguments.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stoker::cache::{Cache, CacheLocation, CacheReport, CacheSpec};
use stoker::decode::{DecodeOptions, Decoder};
use stoker::*;

const N: usize = 24;

fn dataset(dir: &Path) -> PathBuf {
    let root = demo_folder(dir, N - 1);
    // One EXIF-rotated image: the cache holds pixels after orientation.
    let (w, h) = (200, 120);
    let data = with_exif(&jpeg(&photo_sized("rocket", w, h), w, h, 90), 6);
    let class = std::fs::read_dir(&root).unwrap().flatten().next().unwrap().path();
    std::fs::write(class.join("zz_rotated.jpg"), data).unwrap();
    root
}

fn config(cache: Option<&Path>, bytes: Option<u64>) -> LoaderConfig {
    let mut c = LoaderConfig::new(5, TransformSpec::preset("imagenet-train").unwrap());
    c.sampler.shuffle = true;
    c.sampler.seed = 3;
    c.threads = Some(2);
    c.cache =
        cache.map(|d| CacheSpec { location: CacheLocation::Dir(d.to_path_buf()), bytes, max_side: None, ttl: None });
    c
}

/// The documented uncached twin of a cached loader: full-resolution decoding.
fn uncached_full(c: &LoaderConfig) -> LoaderConfig {
    let mut c = c.clone();
    c.cache = None;
    c.dct_scaling = false;
    c.roi = false;
    c
}

fn loader(root: &Path, c: LoaderConfig) -> Loader {
    folder_loader(root, c)
}

/// Digest and sample count of one epoch, and the cache counters of that epoch alone.
fn epoch(l: &Loader, e: u64) -> (String, usize, Option<CacheReport>) {
    l.set_epoch(e);
    l.reset_report();
    let mut d = Digest::new();
    let mut n = 0;
    for b in l.iter().unwrap() {
        let b = b.unwrap();
        n += b.len();
        d.update(&b);
    }
    (d.hex(), n, l.report().kind.cache)
}

fn entry_paths(cache_dir: &Path, root: &Path) -> Vec<PathBuf> {
    let cache = open_cache(cache_dir, None, root);
    let mut files: Vec<PathBuf> = walk(root);
    files.sort();
    files.iter().map(|f| cache.entry_path(Cache::key(&std::fs::read(f).unwrap()))).collect()
}

/// The cache group the loaders of these tests use for the dataset at `root`.
fn open_cache(cache_dir: &Path, max_side: Option<usize>, root: &Path) -> Cache {
    let spec = CacheSpec { location: CacheLocation::Dir(cache_dir.into()), bytes: None, max_side, ttl: None };
    Cache::open(&spec, true, &stoker::pipeline::dataset_key(&ImageFolder::new(root).unwrap())).unwrap()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn first_epoch_fills_later_epochs_hit_and_batches_equal_the_full_resolution_path() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    let cached = loader(&root, config(Some(&cdir), None));
    let plain = loader(&root, uncached_full(&config(Some(&cdir), None)));
    for e in 0..3 {
        let (digest, n, rep) = epoch(&cached, e);
        let (want, m, _) = epoch(&plain, e);
        assert_eq!((n, m), (N, N));
        assert_eq!(digest, want, "epoch {e}: cached batches differ from the uncached full-resolution ones");
        let rep = rep.unwrap();
        if e == 0 {
            assert_eq!((rep.group.hits, rep.group.misses, rep.group.stored), (0, N as u64, N as u64), "{rep:?}");
            assert!(rep.group.stored_bytes > 0 && rep.group.used_bytes == rep.group.stored_bytes, "{rep:?}");
        } else {
            assert_eq!((rep.group.hits, rep.group.misses, rep.group.stored), (N as u64, 0, 0), "{rep:?}");
            assert!(rep.group.read_bytes > 0 && rep.decode_seconds_saved > 0.0, "{rep:?}");
        }
    }
    // A second loader (another process would see the same files) starts with every hit.
    let again = loader(&root, config(Some(&cdir), None));
    let (digest, _, rep) = epoch(&again, 7);
    assert_eq!(digest, epoch(&plain, 7).0);
    let rep = rep.unwrap();
    assert_eq!((rep.group.hits, rep.group.misses), (N as u64, 0));
    // The report and its text name the cache.
    assert!(again.report().to_text().contains("hits"));
}

#[test]
fn truncated_corrupt_and_foreign_entries_are_misses_and_are_replaced() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    let plain = loader(&root, uncached_full(&config(None, None)));
    let (want, _, _) = epoch(&plain, 1);
    epoch(&loader(&root, config(Some(&cdir), None)), 0);
    let entries = entry_paths(&cdir, &root);
    assert!(entries.iter().all(|p| p.is_file()));
    // Truncated.
    let f = std::fs::OpenOptions::new().write(true).open(&entries[0]).unwrap();
    f.set_len(std::fs::metadata(&entries[0]).unwrap().len() - 1).unwrap();
    // A corrupt header (the source width changed: the checksum no longer matches).
    let mut b = std::fs::read(&entries[1]).unwrap();
    b[24] ^= 0x10;
    std::fs::write(&entries[1], b).unwrap();
    // Foreign: another image's entry under this key.
    std::fs::copy(&entries[3], &entries[2]).unwrap();
    // Garbage.
    std::fs::write(&entries[4], b"not an entry").unwrap();
    // Pixels changed (header intact): one byte flipped in every checksum chunk, so whatever
    // rows a crop reads fail their checksum.
    let mut b = std::fs::read(&entries[5]).unwrap();
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let (w, h, per) = (u32_at(16), u32_at(20), u32_at(64));
    let pixels = b.len() - w * h * 3;
    for c in 0..h.div_ceil(per) {
        b[pixels + c * per * w * 3 + 7] ^= 0x40;
    }
    std::fs::write(&entries[5], b).unwrap();
    let l = loader(&root, config(Some(&cdir), None));
    let (digest, n, rep) = epoch(&l, 1);
    assert_eq!((digest, n), (want.clone(), N), "a changed entry must never be served");
    let rep = rep.unwrap();
    assert_eq!(
        (rep.group.hits, rep.group.misses, rep.replaced, rep.group.verify_failures),
        (N as u64 - 5, 5, 4, 1),
        "{rep:?}"
    );
    let (digest, _, rep) = epoch(&l, 1);
    assert_eq!(digest, want);
    assert_eq!(rep.unwrap().group.hits, N as u64, "the bad entries were rewritten");
}

#[test]
fn a_budget_smaller_than_the_dataset_stores_only_up_to_it() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    // Fill once without a limit to learn the entry sizes.
    let full_dir = d.path().join("full");
    let (_, _, rep) = epoch(&loader(&root, config(Some(&full_dir), None)), 0);
    let total = rep.unwrap().group.stored_bytes;
    let budget = total / 2;
    let l = loader(&root, config(Some(&cdir), Some(budget)));
    let (_, _, rep) = epoch(&l, 0);
    let rep = rep.unwrap();
    assert!(rep.group.stored > 0 && rep.group.stored < N as u64, "{rep:?}");
    assert!(rep.group.stored_bytes <= budget && rep.group.used_bytes <= budget, "{rep:?}");
    assert_eq!(rep.group.stored + rep.group.not_stored_budget, N as u64, "{rep:?}");
    let stored = rep.group.stored;
    // Never evict: the next epoch hits exactly what was stored and stores nothing more.
    let (digest, _, rep) = epoch(&l, 1);
    let rep = rep.unwrap();
    assert_eq!((rep.group.hits, rep.group.misses, rep.group.stored), (stored, N as u64 - stored, 0), "{rep:?}");
    assert_eq!(digest, epoch(&loader(&root, uncached_full(&config(None, None))), 1).0);
    let on_disk: u64 = walk(&cdir)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "px"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(on_disk <= budget, "{on_disk} > {budget}");
    // Another loader sharing the directory shares the budget.
    let other = loader(&root, config(Some(&cdir), Some(budget)));
    let rep = epoch(&other, 2).2.unwrap();
    assert_eq!(rep.group.stored, 0, "{rep:?}");
}

#[test]
fn a_changed_source_file_is_not_served_stale() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    epoch(&loader(&root, config(Some(&cdir), None)), 0);
    let mut files = walk(&root);
    files.sort();
    // Same name, new pixels (and size).
    let (w, h) = (300, 200);
    std::fs::write(&files[5], jpeg(&photo_sized("coffee", w, h), w, h, 80)).unwrap();
    let l = loader(&root, config(Some(&cdir), None));
    let (digest, _, rep) = epoch(&l, 1);
    let rep = rep.unwrap();
    assert_eq!((rep.group.hits, rep.group.misses), (N as u64 - 1, 1), "{rep:?}");
    assert_eq!(digest, epoch(&loader(&root, uncached_full(&config(None, None))), 1).0);
}

#[test]
fn an_unusable_cache_directory_is_a_config_error_naming_cache() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let file = d.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let c = config(Some(&file.join("sub")), None);
    let e = Loader::new(Arc::new(ImageFolder::new(&root).unwrap()), c).unwrap_err();
    assert!(matches!(e, Error::Config { .. }), "{e}");
    assert!(e.to_string().contains("`cache`") && e.to_string().contains("a-file"), "{e}");
}

/// A loader whose cache reduces images to `max_side` (and an optional budget).
fn reduced(root: &Path, cdir: &Path, max_side: usize, bytes: Option<u64>, preset: &str) -> Loader {
    let mut c = config(Some(cdir), bytes);
    c.transform = TransformSpec::preset(preset).unwrap().with_dtype(DType::Uint8);
    c.cache.as_mut().unwrap().max_side = Some(max_side);
    loader(root, c)
}

/// All the bytes of one epoch's batches, in order.
fn epoch_bytes(l: &Loader, e: u64) -> Vec<u8> {
    l.set_epoch(e);
    l.iter().unwrap().flat_map(|b| b.unwrap().data().to_vec()).collect()
}

#[test]
fn a_max_side_cache_stores_reduced_images_and_gives_the_same_batches_whatever_it_holds() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    let side = 96;
    // Filling (every sample a miss) and reading (every sample a hit) give the same batches.
    let filling = reduced(&root, &cdir, side, None, "imagenet-train");
    let first = epoch_bytes(&filling, 4);
    let rep = filling.report().kind.cache.unwrap();
    assert_eq!((rep.group.misses, rep.group.stored, rep.max_side), (N as u64, N as u64, Some(side)), "{rep:?}");
    let reading = reduced(&root, &cdir, side, None, "imagenet-train");
    assert_eq!(epoch_bytes(&reading, 4), first, "hits and misses must give the same pixels");
    assert_eq!(reading.report().kind.cache.unwrap().group.hits, N as u64);
    // So does a cache whose budget holds only some of the images (misses not stored are
    // reduced the same way).
    let half = reduced(&root, &d.path().join("half"), side, Some(rep.group.stored_bytes / 2), "imagenet-train");
    assert_eq!(epoch_bytes(&half, 4), first);
    let rep_half = half.report().kind.cache.unwrap();
    assert!(rep_half.group.not_stored_budget > 0 && rep_half.group.stored > 0, "{rep_half:?}");

    // The entries: longer side `side`, the source's oriented size recorded, and smaller files
    // than full resolution.
    let cache = open_cache(&cdir, Some(side), &root);
    let mut files = walk(&root);
    files.sort();
    let mut dec = Decoder::new(DecodeOptions::default()).unwrap();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let info = dec.info(&data, f).unwrap();
        let entry = std::fs::read(cache.entry_path(Cache::key(&data))).unwrap();
        let u32_at = |o: usize| u32::from_le_bytes(entry[o..o + 4].try_into().unwrap()) as usize;
        let (w, h, sw, sh) = (u32_at(16), u32_at(20), u32_at(24), u32_at(28));
        assert_eq!((sw, sh), (info.width, info.height), "{}", f.display());
        assert_eq!(w.max(h), side.min(sw.max(sh)), "{}: stored {w}x{h} of {sw}x{sh}", f.display());
        assert_eq!(cache.stored_size(sw, sh), (w, h));
        assert_eq!(entry.len() as u64, Cache::entry_bytes(w, h));
    }
    // Another max_side is another directory; full resolution another again.
    let other = |m| open_cache(&cdir, m, &root).dir().to_path_buf();
    assert_ne!(other(Some(side)), other(Some(side + 1)));
    assert_ne!(other(Some(side)), other(None));

    // The crops are the uncached ones (drawn on the source size, then scaled): a reduced cache
    // gives batches close to full resolution (a wrongly scaled box would not be).
    let mut plain = config(None, None);
    plain.transform = TransformSpec::preset("imagenet-val").unwrap().with_dtype(DType::Uint8);
    let want = epoch_bytes(&loader(&root, plain), 2);
    let got = epoch_bytes(&reduced(&root, &d.path().join("val"), 200, None, "imagenet-val"), 2);
    let diff = mean_abs(&got, &want);
    assert!(diff < 6.0, "reduced to 200 px vs full resolution: mean difference {diff}");
    let bad = mean_abs(&epoch_bytes(&reduced(&root, &d.path().join("tiny"), 8, None, "imagenet-val"), 2), &want);
    assert!(bad > diff, "an 8-px cache ({bad}) must differ more than a 200-px one ({diff})");
}

#[test]
fn a_zero_max_side_is_a_config_error() {
    let d = tempfile::tempdir().unwrap();
    let spec = CacheSpec { location: CacheLocation::Dir(d.path().into()), bytes: None, max_side: Some(0), ttl: None };
    let key = stoker::cache::DatasetKey { hash: 1, samples: 1, description: String::new() };
    let e = Cache::open(&spec, true, &key).unwrap_err();
    assert!(e.to_string().contains("`cache_max_side`"), "{e}");
}

#[test]
fn a_full_resolution_cache_equals_the_full_resolution_path_for_resize_and_center_crop_too() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    let mut c = config(Some(&cdir), None);
    c.transform = TransformSpec::preset("imagenet-val").unwrap();
    let cached = loader(&root, c.clone());
    let plain = loader(&root, uncached_full(&c));
    for e in 0..2 {
        let (got, n, rep) = epoch(&cached, e);
        assert_eq!(n, N);
        assert_eq!(got, epoch(&plain, e).0, "epoch {e} ({:?})", rep.map(|r| (r.group.hits, r.group.misses)));
    }
}

/// Every entry file under `dir`, with its size.
fn px_bytes(dir: &Path) -> u64 {
    walk(dir)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "px"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// A second dataset: the same photos under other names (other sample list, same bytes).
fn second_dataset(dir: &Path, root: &Path) -> PathBuf {
    let other = dir.join("other");
    for f in walk(root) {
        let class = f.parent().unwrap().file_name().unwrap();
        std::fs::create_dir_all(other.join(class)).unwrap();
        std::fs::copy(&f, other.join(class).join(format!("b_{}", f.file_name().unwrap().to_string_lossy()))).unwrap();
    }
    other
}

#[test]
fn a_new_dataset_evicts_idle_groups_but_never_one_in_use() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let other = second_dataset(d.path(), &root);
    let cdir = d.path().join("cache");
    // Learn one dataset's size, then give the root a budget that holds one dataset only.
    let (_, _, rep) = epoch(&loader(&root, config(Some(&d.path().join("sizing")), None)), 0);
    let one = rep.unwrap().group.stored_bytes;
    let budget = one + one / 2;

    // Dataset A fills the cache; while its loader lives, B cannot take A's room.
    let a = loader(&root, config(Some(&cdir), Some(budget)));
    let rep = epoch(&a, 0).2.unwrap();
    assert_eq!(rep.group.stored, N as u64, "{rep:?}");
    let a_dir = a.cache().unwrap().dir().to_path_buf();
    let b = loader(&other, config(Some(&cdir), Some(budget)));
    let rep = epoch(&b, 0).2.unwrap();
    assert!(rep.group.stored < N as u64 && rep.group.not_stored_budget > 0, "{rep:?}");
    assert_eq!(rep.group.evicted_groups, 0, "a group in use was evicted: {rep:?}");
    assert_eq!(rep.held_by_others_bytes, one, "{rep:?}");
    assert!(b.report().to_text().contains("held by other datasets in use"), "{}", b.report().to_text());
    assert_eq!(px_bytes(&a_dir), one, "A's entries are intact");
    assert_eq!(epoch(&a, 1).2.unwrap().group.hits, N as u64, "A still hits everything");
    drop(b);

    // A's loader ends: its group is idle, and the next dataset to need room evicts it (least
    // recently used first) and stores all of its own.
    drop(a);
    let b = loader(&other, config(Some(&cdir), Some(budget)));
    let rep = epoch(&b, 2).2.unwrap();
    assert_eq!(rep.group.evicted_groups, 1, "{rep:?}");
    assert_eq!(rep.group.evicted_bytes, one, "{rep:?}");
    assert!(!a_dir.exists(), "the evicted group is removed from disk");
    assert!(rep.group.used_bytes <= budget && px_bytes(&cdir) <= budget, "{rep:?}");
    assert_eq!(epoch(&b, 3).2.unwrap().group.hits, N as u64, "B now holds all of its images");
    let listed = stoker::cache::list_groups(&cdir);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].in_use && listed[0].samples == N as u64 && listed[0].dataset.ends_with("other"), "{listed:?}");
    drop(b);
    let listed = stoker::cache::list_groups(&cdir);
    assert!(!listed[0].in_use, "{listed:?}");
    // Clearing removes idle groups (and nothing is left under the root but its lock file).
    let cleared = stoker::cache::clear(&cdir, None).unwrap();
    assert_eq!((cleared.removed.len(), cleared.in_use.len()), (1, 0));
    assert_eq!(px_bytes(&cdir), 0);
}

#[test]
fn clear_leaves_groups_in_use_and_older_formats_are_removed() {
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    // A group left by an older stoker (entry format 2): unreadable by this one, so removed when
    // a cache under the same root is opened, whatever its age.
    let old = cdir.join("v2-0123456789abcdef").join("ab");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("x.px"), vec![0u8; 4096]).unwrap();
    let l = loader(&root, config(Some(&cdir), None));
    assert!(!cdir.join("v2-0123456789abcdef").exists(), "the old-format group is removed");
    epoch(&l, 0);
    let cleared = stoker::cache::clear(&cdir, None).unwrap();
    assert_eq!((cleared.removed.len(), cleared.in_use.len()), (0, 1), "a group in use is never removed");
    assert_eq!(epoch(&l, 1).2.unwrap().group.hits, N as u64);
    let cleared = stoker::cache::clear(&cdir, Some(std::time::Duration::from_secs(3600))).unwrap();
    assert_eq!((cleared.removed.len(), cleared.in_use.len()), (0, 1));
    drop(l);
    let cleared = stoker::cache::clear(&cdir, Some(std::time::Duration::from_secs(3600))).unwrap();
    assert_eq!((cleared.removed.len(), cleared.kept.len()), (0, 1), "used a moment ago: kept");
    assert_eq!(stoker::cache::clear(&cdir, None).unwrap().removed.len(), 1);
}

#[test]
fn a_held_root_lock_costs_one_deadline_then_the_run_goes_on_without_storing() {
    use std::os::fd::AsRawFd;
    let d = tempfile::tempdir().unwrap();
    let root = dataset(d.path());
    let cdir = d.path().join("cache");
    let want = epoch(&loader(&root, uncached_full(&config(None, None))), 0).0;
    let l = loader(&root, config(Some(&cdir), None));
    // Another process (a stopped one, say) holds the root lock from now on.
    let held = std::fs::File::open(cdir.join(".lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let t = std::time::Instant::now();
    let (digest, n, rep) = epoch(&l, 0);
    let took = t.elapsed();
    let rep = rep.unwrap();
    assert_eq!((digest, n), (want, N));
    assert_eq!(rep.group.stored, 0, "{rep:?}");
    assert!(rep.group.lock_timeouts >= 1, "{rep:?}");
    // One wait of LOCK_DEADLINE, then no more waiting (not one per sample: 24 x 2 s).
    assert!(took < stoker::cache::LOCK_DEADLINE * 6, "{took:?}");
    assert!(l.report().to_text().contains("lock waits timed out"));
    drop(held);
}
