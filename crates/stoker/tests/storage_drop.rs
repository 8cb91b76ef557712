//! Dropping an iteration while an object store stalls is prompt: the reads in flight are given
//! up at once (`Source::abandon_reads`), not waited for until their time-out. Its own test
//! binary, because it sets `STOKER_OBJECT_TIMEOUT` for the whole process.

mod common;

use common::http::{shard, Server};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::shell::kind::{Iter, Kind};
use stoker::*;

/// Stalls `server`, starts a pass (`start`) and polls it (it delivers nothing: the store
/// stalls) until the server holds one more request.
fn stalled_pass<K: Kind>(server: &Server, start: impl FnOnce() -> Iter<K>) -> Iter<K> {
    server.stall.store(true, Ordering::Release);
    let before = server.held.load(Ordering::Relaxed);
    let mut it = start();
    let t0 = Instant::now();
    while server.held.load(Ordering::Relaxed) < before + 1 {
        assert!(t0.elapsed() < Duration::from_secs(30), "no request reached the stalled server");
        assert!(matches!(it.next_timeout(Duration::from_millis(20)), Next::NotYet), "nothing can be delivered");
    }
    it
}

#[test]
fn dropping_an_iteration_during_a_stall_does_not_wait_for_the_timeout() {
    // Far longer than the bound below: a drop that waited for a read would fail the test.
    std::env::set_var("STOKER_OBJECT_TIMEOUT", "60");
    // Read and applied by `args`, as a loader config built there would (sources read no variable).
    stoker::args::apply_env().unwrap();
    let (data, idx) = shard(64);
    let server = Server::start(HashMap::from([("shard.tar".to_string(), data), ("shard.tar.idx".to_string(), idx)]));
    let source: Arc<dyn Source> =
        Arc::new(stoker::source::open_shards(std::slice::from_ref(&server.url("shard.tar"))).unwrap());
    let mut transform = TransformSpec::preset("imagenet-val").unwrap().with_dtype(DType::Uint8);
    transform.apply_exif = true;
    let mut config = LoaderConfig::new(8, transform);
    config.threads = Some(1);
    config.io_threads = Some(2);
    let loader = Loader::new(source, config).unwrap();
    // Wait until the request of the shard's part is in flight (the server has read it), with
    // both I/O threads waiting for that part.
    let it = stalled_pass(&server, || loader.iter().unwrap());
    let t1 = Instant::now();
    drop(it);
    let took = t1.elapsed();
    assert!(took < Duration::from_secs(10), "dropping the iteration took {took:?} (the time-out is 60 s)");
    // The loader goes on: another pass starts (and is dropped) just as promptly.
    let it = loader.iter().unwrap();
    let t2 = Instant::now();
    drop(it);
    drop(loader);
    assert!(t2.elapsed() < Duration::from_secs(10), "{:?}", t2.elapsed());
}

/// The text path too: a `TokenLoader` whose reader thread waits on a stalled store is dropped
/// at once (its object reads watch the run's stop flag), not after the request's bound.
#[test]
fn dropping_a_token_iteration_during_a_stall_does_not_wait_for_the_timeout() {
    std::env::set_var("STOKER_OBJECT_TIMEOUT", "60");
    // Read and applied by `args`, as a loader config built there would (sources read no variable).
    stoker::args::apply_env().unwrap();
    let text = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text");
    let raw = zstd::decode_all(std::fs::File::open(text.join("wiki-sample.jsonl.zst")).unwrap()).unwrap();
    let server = Server::start(HashMap::from([("a.jsonl".to_string(), raw.clone()), ("b.jsonl".to_string(), raw)]));
    let tok = stoker::tokens::TextTokenizer::from_file(&text.join("tokenizer-gpt2.json")).unwrap();
    let urls = [server.url("a.jsonl"), server.url("b.jsonl")].map(std::path::PathBuf::from);
    let mut c = stoker::tokens::TokenConfig::new(2, 128);
    c.threads = Some(1);
    c.index_dir = None;
    let loader = stoker::tokens::TokenLoader::new(&urls, Some(tok), c).unwrap();
    let it = stalled_pass(&server, || loader.iter().unwrap());
    let t1 = Instant::now();
    drop(it);
    drop(loader);
    let took = t1.elapsed();
    assert!(took < Duration::from_secs(5), "dropping the token iteration took {took:?} (the time-out is 60 s)");
}
