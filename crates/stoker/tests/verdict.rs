//! The image verdict against the CPU clock, on real loaders: a loader whose consumer takes
//! batches as fast as they come is called CPU-bound (decode or ops), with 2 threads and with 16
//! (oversubscribed on a small machine), and the busy share it reports is the process's own CPU
//! clock (measured here around the run); a loader whose consumer sleeps is called
//! consumer-bound. The tests run one at a time: the process's CPU clock counts every thread.

mod common;

use common::*;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use stoker::*;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn loader(root: &std::path::Path, bs: usize, threads: usize) -> Loader {
    let mut c = shuffled(bs, "imagenet-train", threads);
    c.cpu_registry = None;
    c.sampler.seed = 5;
    folder_loader(root, c)
}

#[test]
fn a_fully_busy_loader_is_cpu_bound_by_the_cpu_clock_with_2_and_16_threads() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    // Batches of 32: two batches ahead (prefetch 2) hold work for all 16 threads.
    let root = demo_folder(d.path(), 256);
    for threads in [2, 16] {
        let l = loader(&root, 32, threads);
        let cpu0 = stoker::cpu::process_cpu();
        for _ in 0..3 {
            for b in l.iter().unwrap() {
                drop(b.unwrap());
            }
        }
        let measured = (stoker::cpu::process_cpu() - cpu0).as_secs_f64();
        let r = l.report();
        let c = &r.cpu;
        let b = r.bottleneck.as_ref().unwrap();
        let ctx = format!("{threads} threads: {c:?}, measured {measured:.3} CPU-s; {b:?}");
        // CPU-bound: the threads' stage, or (on a host whose other processes hold cores, as
        // CI's may) the host's CPUs named as the limit.
        let contended = b.stage == "cpu" && c.host_busy.is_some_and(|h| h >= 0.9);
        assert!(["decode", "ops"].contains(&b.stage.as_str()) || contended, "{ctx}\n{}", r.to_text());
        assert!(!b.suggestion.contains("prefetch"), "{ctx}");
        assert_eq!(c.threads, threads, "{ctx}");
        // The report's process clock is the one measured around the pass (the pass is all
        // of it but the iterator's start and end).
        assert!(c.process_seconds <= measured + 1e-3 && c.process_seconds >= 0.9 * measured, "{ctx}");
        // Nearly all of the process's CPU is the decode threads': their busy share of the
        // cores they may use is the process's own within a few points.
        let usable = threads.min(c.allowance) as f64;
        let process_busy = c.process_cores / usable;
        assert!(c.workers_seconds <= c.process_seconds, "{ctx}");
        assert!(process_busy - c.workers_busy < 0.08, "workers {} vs process {process_busy}: {ctx}", c.workers_busy);
        assert!(r.to_text().contains("cpu: process "), "{}", r.to_text());
    }
}

#[test]
fn a_sleeping_consumer_is_the_limit_and_a_report_reset_mid_pass_measures_what_follows() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 48);
    let l = loader(&root, 4, 2);
    let mut it = l.iter().unwrap();
    // The first batch (the pipeline's fill) is left out of the measure: reset after it.
    drop(it.next().unwrap().unwrap());
    l.reset_report();
    let mut n = 0;
    for b in it {
        drop(b.unwrap());
        n += 1;
        // Slow enough that the loader keeps up on a host whose cores other processes hold too
        // (two busy loops on two cores left it 5% behind a 40 ms step).
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = l.report();
    let b = r.bottleneck.as_ref().unwrap();
    assert_eq!(n, 11);
    assert_eq!(r.samples, 44, "only the batches after the reset: {r:?}");
    assert!(r.wall_seconds >= 1.0, "the running pass is measured from the reset on: {}", r.wall_seconds);
    assert_eq!(b.stage, "consumer", "{b:?}\n{}", r.to_text());
    assert!(r.cpu.workers_busy < 0.7, "{:?}", r.cpu);
}
