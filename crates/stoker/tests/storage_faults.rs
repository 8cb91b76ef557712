//! Storage that stalls, locks held by others, files that shrink: faults outside stoker that
//! must end in a clear error or a degraded run within a bound, never in a wait without end or
//! a signal.
//! - An object store that accepts connections and never answers ends a pass over a shard of
//!   many samples within a small multiple of the request timeout, with one error naming the
//!   URL and the cause (the store's circuit breaker), and dropping the loader is prompt.
//! - A CPU registry whose lock another process holds does not stop a loader: it runs unshared
//!   and its report says so.
//! - A `.npy` file truncated while an `ArrayLoader` reads it is an `Error::Io` naming it.

mod common;

use common::http::{shard, Server};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::arrays::{ArrayConfig, ArrayLoader, Column};
use stoker::budget::{Kind, Registry};
use stoker::tune::Tuner;
use stoker::*;

fn val_u8() -> TransformSpec {
    TransformSpec::preset("imagenet-val").unwrap().with_dtype(DType::Uint8)
}

/// The issue: with a 2 s timeout a stalled store took 41 s to give up on a 20-sample shard, a
/// time per sample. Now the first requests that time out open the store's circuit and every
/// other sample fails at once: the pass ends about two request timeouts after the store
/// stopped answering, whatever the shard size.
#[test]
fn a_stalled_object_store_ends_the_pass_within_a_few_timeouts() {
    const SAMPLES: usize = 600;
    // Only this test of this binary reads it.
    std::env::set_var("STOKER_OBJECT_TIMEOUT", "1");
    // Read and applied by `args`, as a loader config built there would (sources read no variable).
    stoker::args::apply_env().unwrap();
    let (data, idx) = shard(SAMPLES);
    let server = Server::start(HashMap::from([("shard.tar".to_string(), data), ("shard.tar.idx".to_string(), idx)]));
    let url = server.url("shard.tar");
    let source: Arc<dyn Source> = Arc::new(stoker::source::open_shards(std::slice::from_ref(&url)).unwrap());
    let mut config = LoaderConfig::new(16, val_u8());
    config.threads = Some(1);
    config.io_threads = Some(2);
    let loader = Loader::new(source, config).unwrap();
    // A healthy store: a whole pass, every sample read, from a few large ranged requests (the
    // shard's parts), not one per sample.
    assert_eq!(loader.iter().unwrap().map(|b| b.unwrap().len()).sum::<usize>(), SAMPLES);
    let ranged = server.ranged.load(Ordering::Relaxed);
    let storage = loader.report().kind.storage.expect("a storage report");
    assert!(ranged >= 1 && ranged as u64 == storage.part_requests + storage.direct_reads, "{ranged} {storage:?}");
    assert_eq!((storage.direct_reads, storage.part_reads), (0, SAMPLES as u64), "{storage:?}");

    server.stall.store(true, Ordering::Release);
    let t0 = Instant::now();
    let mut it = loader.iter().unwrap();
    let mut delivered = 0;
    let err = loop {
        // Bounded, so a regression fails here instead of running for minutes.
        assert!(t0.elapsed() < Duration::from_secs(60), "the pass has not ended after 60 s");
        match it.next_timeout(Duration::from_millis(200)) {
            Next::NotYet => continue,
            Next::End => panic!("the pass ended without an error"),
            Next::Item(Ok(b)) => delivered += b.len(),
            Next::Item(Err(e)) => break e,
        }
    };
    let took = t0.elapsed();
    // Two attempts of 1 s each (a retry) open the circuit; the bound leaves room for a loaded
    // machine. Without the breaker: 101 samples x 2 s / 2 threads, over 100 s.
    assert!(took < Duration::from_secs(12), "the pass took {took:?} to fail");
    assert_eq!(delivered, 0);
    let text = err.to_string();
    eprintln!("the stalled pass ended after {took:?}: {text}");
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
    let base = format!("http://127.0.0.1:{}", server.port);
    assert!(text.contains(&format!("object store {base} is not answering")), "{text}");
    assert!(text.contains("timed out"), "the cause is named: {text}");
    let t1 = Instant::now();
    drop(it);
    drop(loader);
    assert!(t1.elapsed() < Duration::from_secs(5), "dropping took {:?}", t1.elapsed());
}

#[test]
fn a_held_registry_lock_does_not_stop_a_loader() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("budget");
    // Another process (here: another open file description) holds the lock and never lets go.
    let holder = std::fs::File::create(&file).unwrap();
    // SAFETY: flock on a descriptor this test owns; released when `holder` closes.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&holder), libc::LOCK_EX) }, 0);
    let spec = common::auto_threads(2, 10);
    let t0 = Instant::now();
    let tuner = Tuner::new(spec, Some(Registry::at(&file)));
    let took = t0.elapsed();
    assert!(took < stoker::budget::LOCK_WAIT + Duration::from_secs(5), "{took:?}");
    let t = tuner.report();
    assert!(!t.shared && t.registry_busy && t.share.is_none(), "{t:?}");
    let note = t.note.unwrap();
    assert!(note.contains("sharing skipped") && note.contains(&file.display().to_string()), "{note}");
    assert_eq!(t.threads_active, 2, "unshared, on its own budget");
    // Registering and listing give up too, with the reason.
    let err = Registry::at(&file).register(Kind::Auto, 1).unwrap_err();
    assert!(err.is_busy(), "{err}");
    drop(tuner);
    drop(holder);
    assert!(Registry::at(&file).entries().unwrap().is_empty());
}

/// A `.npy` file of `rows` x `width` little-endian u32 counting from 0.
fn write_npy(path: &Path, rows: usize, width: usize) -> usize {
    let mut b = stoker::source::npy::npy_header("<u4", &[rows, width]);
    let offset = b.len();
    for v in 0..(rows * width) as u32 {
        b.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
    offset
}

/// The issue: truncating an `.npy` that an ArrayLoader was reading killed the process with
/// SIGBUS (the rows were memory-mapped). Here the truncation happens in this very process: with
/// a mapping, this test binary would die.
#[test]
fn an_array_file_truncated_while_read_is_an_error_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let path: PathBuf = d.path().join("x.npy");
    // Larger than READ_WHOLE_MAX, so its rows are read from the file as batches need them.
    let (rows, width) = (2_500, 4096);
    assert!(rows * width * 4 > stoker::arrays::READ_WHOLE_MAX);
    let offset = write_npy(&path, rows, width);
    let (col, _) = Column::from_npy(&path).unwrap();
    let spec = SamplerSpec { batch_size: 16, shuffle: true, seed: 1, ..SamplerSpec::default() };
    let cfg = ArrayConfig { sampler: spec, threads: Some(2), prefetch: 2, memory_limit: None };
    let loader = ArrayLoader::new(vec![col], cfg).unwrap();
    // A whole pass first: every row, bit for bit.
    let mut seen = 0;
    for b in loader.iter().unwrap() {
        let b = b.unwrap();
        for (k, i) in b.indices().into_iter().enumerate() {
            let row = &b.column(0)[k * width * 4..(k + 1) * width * 4];
            assert_eq!(u32::from_le_bytes(row[..4].try_into().unwrap()), i * width as u32);
        }
        seen += b.len();
    }
    assert_eq!(seen, rows);
    // Then the file loses most of its rows mid-pass.
    let mut it = loader.iter().unwrap();
    let first = it.next().unwrap().unwrap();
    drop(first);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len((offset + 10 * width * 4) as u64).unwrap();
    let err = it.find_map(|b| b.err()).expect("a batch after the truncation fails");
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()) && text.contains("became shorter"), "{text}");
    assert!(it.next().is_none(), "the pass ends with the error");
}
