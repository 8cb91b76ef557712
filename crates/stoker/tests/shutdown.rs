//! Shutdown: dropping an iterator or loader mid-epoch stops every thread promptly. Its own test
//! binary, because it counts the threads of the whole process.

mod common;

use common::*;
use std::time::{Duration, Instant};
use stoker::*;

fn loader_for(root: &std::path::Path, bs: usize, threads: usize) -> Loader {
    folder_loader(root, shuffled(bs, "imagenet-train", threads))
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
    assert_eq!(thread_count_settled(before, Duration::from_millis(500)), before);
    assert_eq!(before, 0);
    // The state says where the abandoned iteration stopped; a new iteration starts the epoch
    // over (DataLoader's rule), unless that state is loaded.
    assert_eq!(loader.state().state.next_batch, 1);
    assert_eq!(loader.iter().unwrap().count(), 16);
    loader.load_state(SamplerState { seed: 0, epoch: 0, next_batch: 1 }.into()).unwrap();
    assert_eq!(loader.iter().unwrap().count(), 15);
    // Starting a new iteration makes the previous one stale: its next batch is an error.
    let mut first = loader.iter().unwrap();
    first.next().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(100)); // let it finish batches ahead
    let second = loader.iter().unwrap();
    let stale = first.next().unwrap().unwrap_err();
    assert!(matches!(stale, Error::Stale(_)) && stale.to_string().contains("newer iteration"), "{stale}");
    assert!(first.next().is_none());
    // The old iteration's buffers came back: the new one runs a whole epoch while the old
    // iterator object is still alive.
    loader.set_epoch(1);
    assert_eq!(loader.iter().unwrap().count(), 16);
    drop(second);
    drop(first);
    drop(loader);
    assert_eq!(thread_count_settled(before, Duration::from_millis(500)), before);
}
