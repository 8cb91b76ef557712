//! Shutdown: dropping an iterator or loader mid-epoch stops every thread promptly. Its own test
//! binary, because it counts the threads of the whole process.

mod common;

use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::*;

fn loader_for(root: &std::path::Path, bs: usize, threads: usize) -> Loader {
    let mut c = LoaderConfig::new(bs, TransformSpec::preset("imagenet-train").unwrap());
    c.sampler.shuffle = true;
    c.threads = Some(threads);
    Loader::new(Arc::new(ImageFolder::new(root).unwrap()), c).unwrap()
}

#[test]
fn dropping_mid_epoch_stops_every_thread_promptly() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 64);
    let before = thread_count();
    let loader = loader_for(&root, 4, 4);
    {
        let mut it = loader.iter().unwrap();
        it.next().unwrap().unwrap();
        assert!(thread_count() > before);
        let t = Instant::now();
        drop(it);
        assert!(t.elapsed() < Duration::from_secs(2), "drop took {:?}", t.elapsed());
    }
    assert_eq!(thread_count(), before);
    // The loader still works after an abandoned iteration, from where it stopped.
    assert_eq!(loader.state().next_batch, 1);
    assert_eq!(loader.iter().unwrap().count(), 15);
    // Starting a new iteration ends the previous one.
    let mut first = loader.iter().unwrap();
    first.next().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(100)); // let it finish batches ahead
    let second = loader.iter().unwrap();
    assert!(first.next().is_none());
    // The old iteration's buffers came back: the new one runs a whole epoch while the old
    // iterator object is still alive.
    loader.set_epoch(1);
    assert_eq!(loader.iter().unwrap().count(), 16);
    drop(second);
    drop(first);
    drop(loader);
    assert_eq!(thread_count(), before);
}
