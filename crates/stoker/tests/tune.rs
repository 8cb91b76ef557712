//! Autotuning (`threads`/`prefetch="auto"`) and the host-wide CPU registry. The tuner's
//! decisions are tested by driving it with given waits and busy times (`Driven`), so they do
//! not depend on the machine's speed or load; the loader tests run one at a time (they count threads and time the consumer) with the shared registry
//! turned off, so other stoker processes on the host cannot change their shares; the registry
//! tests use their own temporary files.

mod common;

use common::*;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use stoker::budget::{Kind, Registry};
use stoker::tune::{Tuner, TuningReport};
use stoker::*;

/// Serialises the loader tests (their configs turn sharing off: `cpu_registry: None`).
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A config of `bs` samples a batch that shares no CPU registry with other processes.
fn unshared(bs: usize) -> LoaderConfig {
    let mut c = LoaderConfig::new(bs, TransformSpec::preset("imagenet-train").unwrap());
    c.cpu_registry = None;
    c
}

fn loader(
    root: &std::path::Path,
    bs: usize,
    threads: Option<usize>,
    budget: Option<f64>,
    auto_prefetch: bool,
) -> Loader {
    loader_in(root, unshared(bs), threads, budget, auto_prefetch)
}

fn loader_in(
    root: &std::path::Path,
    mut c: LoaderConfig,
    threads: Option<usize>,
    budget: Option<f64>,
    auto_prefetch: bool,
) -> Loader {
    c.sampler.shuffle = true;
    c.sampler.seed = 3;
    c.threads = threads;
    c.cpu_budget = budget;
    c.prefetch_auto = auto_prefetch;
    folder_loader(root, c)
}

fn tuning(l: &Loader) -> TuningReport {
    l.report().tuning.expect("image loaders report their tuning")
}

/// Iterates one epoch, sleeping `step(batch)` after each batch; returns every batch's bytes
/// and labels.
fn epoch(l: &Loader, step: impl Fn(usize) -> Duration) -> Vec<(Vec<u8>, Vec<i64>)> {
    let mut out = vec![];
    for (i, b) in l.iter().unwrap().enumerate() {
        let b = b.unwrap();
        out.push((b.data().to_vec(), b.labels().to_vec()));
        drop(b);
        std::thread::sleep(step(i));
    }
    out
}

#[test]
fn auto_and_fixed_threads_give_identical_batches() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let fixed = loader(&root, 8, Some(1), None, false);
    let auto = loader(&root, 8, None, Some(3.0), true);
    let t = tuning(&auto);
    assert!(t.threads_auto && t.prefetch_auto && !t.shared);
    assert_eq!(t.threads_max, 3);
    assert_eq!(auto.threads(), 3);
    for e in 0..2 {
        fixed.set_epoch(e);
        auto.set_epoch(e);
        let (a, b) = (epoch(&fixed, |_| Duration::ZERO), epoch(&auto, |_| Duration::ZERO));
        assert_eq!(a.len(), 5);
        assert!(a == b, "epoch {e}: autotuned batches differ from fixed ones");
    }
    // An explicit count is fixed: every worker active, no tuning.
    let f = tuning(&fixed);
    assert!(!f.threads_auto && !f.prefetch_auto);
    assert_eq!((f.threads_active, f.threads_max, f.prefetch_active), (1, 1, 2));
    assert!(f.decisions.is_empty());
}

/// A tuner driven by hand: its load is the waits and busy times a test gives, so its
/// decisions do not depend on how fast this machine decodes or how loaded it is. (These were
/// pipeline runs with a sleeping consumer: beside two busy loops, the fast phase's single
/// worker got too little CPU to look busy, and the raise never came.)
struct Driven {
    tuner: Tuner,
    load: Mutex<tune::Load>,
}

impl Driven {
    fn new(threads_max: usize, epoch_batches: usize) -> Self {
        let spec = common::auto_threads(threads_max, epoch_batches);
        let load = tune::Load::default();
        let d = Driven { tuner: Tuner::new(spec, None), load: Mutex::new(load) };
        d.tuner.on_batch_load(load); // opens the first window
        d
    }

    /// One tuning window in which the consumer waited `waited` and worked `busy`, and the
    /// workers were busy for `workers` (far above or at zero, whatever the window's real
    /// length, which is at least `WINDOW_MIN`).
    fn window(&self, waited: Duration, busy: Duration, workers: Duration) {
        let load = {
            let mut l = self.load.lock().unwrap();
            l.consumer_wait_ns += waited.as_nanos() as u64;
            l.consumer_busy_ns += busy.as_nanos() as u64;
            l.worker_busy_ns += workers.as_nanos() as u64;
            *l
        };
        std::thread::sleep(stoker::tune::WINDOW_MIN);
        for _ in 0..stoker::tune::WINDOW_BATCHES {
            self.tuner.on_batch_load(load);
        }
    }
}

const SECOND: Duration = Duration::from_secs(1);
/// Busy far beyond any window's length: every worker counts as busy.
const ALWAYS: Duration = Duration::from_secs(1000);

#[test]
fn a_slow_consumer_lowers_threads_and_a_starved_one_raises_them_to_the_cap() {
    let d = Driven::new(3, 1000);
    assert_eq!(d.tuner.report().threads_active, 3, "an autotuned loader starts at its limit");
    // The consumer never waits and the workers idle: one thread less per window, down to one.
    for _ in 0..3 {
        d.window(Duration::ZERO, SECOND, Duration::ZERO);
    }
    let t = d.tuner.report();
    assert_eq!(t.threads_active, 1, "{t:?}");
    let down: Vec<_> = t.decisions.iter().filter(|x| x.knob == "threads").map(|x| (x.from, x.to)).collect();
    assert_eq!(down, [(3, 2), (2, 1)], "{t:?}");
    assert!(t.decisions[0].reason.contains("only 0.00 workers busy"), "{t:?}");
    // Now it waits for every batch while the workers are busy: back up to the cap, not past it.
    for _ in 0..3 {
        d.window(SECOND, Duration::ZERO, ALWAYS);
    }
    let t = d.tuner.report();
    assert_eq!(t.threads_active, 3, "{t:?}");
    let up: Vec<_> = t.decisions.iter().filter(|x| x.knob == "threads").skip(2).map(|x| (x.from, x.to)).collect();
    assert_eq!(up, [(1, 2), (2, 3)], "{t:?}");
    assert!(t.decisions[2].reason.contains("consumer waited 100%"), "{t:?}");
    // A starved consumer whose workers idle (the input is slow, not the decode) gets no
    // more threads: they would idle too.
    let d = Driven::new(2, 1000);
    d.window(Duration::ZERO, SECOND, Duration::ZERO);
    d.window(SECOND, Duration::ZERO, Duration::ZERO);
    assert_eq!(d.tuner.report().threads_active, 1);
}

#[test]
fn the_first_epoch_decides_and_the_setting_then_holds() {
    let d = Driven::new(4, 3 * stoker::tune::WINDOW_BATCHES as usize + 1);
    d.window(Duration::ZERO, SECOND, Duration::ZERO);
    d.window(Duration::ZERO, SECOND, Duration::ZERO);
    d.window(Duration::ZERO, SECOND, Duration::ZERO);
    let t = d.tuner.report();
    assert!(t.converged, "{t:?}");
    assert_eq!(t.threads_active, 1, "{t:?}");
    let last = t.decisions.last().unwrap();
    assert_eq!((last.knob.as_str(), last.to), ("hold", 1), "{t:?}");
    // Past the first epoch nothing moves, whatever the consumer does.
    d.window(SECOND, Duration::ZERO, ALWAYS);
    let after = d.tuner.report();
    assert_eq!((after.threads_active, after.decisions.len()), (1, t.decisions.len()), "{after:?}");
}

#[test]
fn auto_prefetch_stays_within_the_memory_cap() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 16);
    let mut c = unshared(4);
    c.prefetch_auto = true;
    let batch = 4 * 3 * 224 * 224 * 4;
    c.memory_limit = Some(5 * batch as u64);
    let l = folder_loader(&root, c);
    assert_eq!(l.pool().slots(), 5);
    assert!(l.pool().total_bytes() <= 5 * batch);
    let t = tuning(&l);
    assert_eq!((t.prefetch_max, t.prefetch_active), (3, 2));
    assert_eq!(l.iter().unwrap().count(), 4);
}

#[test]
fn dropping_an_auto_iterator_mid_epoch_stops_every_thread() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 64);
    let before = thread_count();
    // Four workers, most of them parked once a slow consumer lowers the count.
    let l = loader(&root, 4, None, Some(4.0), true);
    let mut it = l.iter().unwrap();
    for _ in 0..8 {
        it.next().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    assert!(thread_count() > before + 4, "four decode workers, the dispatcher and the I/O threads");
    let t = Instant::now();
    drop(it);
    assert!(t.elapsed() < Duration::from_secs(2), "drop took {:?}", t.elapsed());
    assert_eq!(thread_count_settled(before, Duration::from_millis(500)), before);
}

fn temp_registry(d: &tempfile::TempDir) -> Registry {
    Registry::at(d.path().join("budget"))
}

#[test]
fn two_loaders_split_the_host_and_deregister_on_drop() {
    let d = tempfile::tempdir().unwrap();
    let reg = temp_registry(&d);
    let cores = stoker::budget::host_cores();
    let a = reg.register(Kind::Auto, cores).unwrap();
    let b = reg.register(Kind::Auto, cores).unwrap();
    let (sa, sb) = (a.share(true).unwrap(), b.share(true).unwrap());
    assert_eq!((sa.loaders, sa.processes, sa.cores), (2, 1, cores));
    assert!(sa.cores_for_me + sb.cores_for_me <= cores.max(2), "{sa:?} {sb:?}");
    assert!(sa.cores_for_me >= 1 && sb.cores_for_me >= 1);
    assert!(sa.cores_for_me.abs_diff(sb.cores_for_me) <= 1, "an even split: {sa:?} {sb:?}");
    // A loader that settles lower gives the rest back.
    b.set_demand(1).unwrap();
    assert_eq!(a.share(true).unwrap().cores_for_me, (cores - 1).max(1));
    drop(b);
    assert_eq!(a.share(true).unwrap().cores_for_me, cores);
    drop(a);
    assert!(reg.entries().unwrap().is_empty());
}

#[test]
fn dead_registrants_are_pruned() {
    let d = tempfile::tempdir().unwrap();
    let reg = temp_registry(&d);
    // A process that has exited, and this pid with another start time (a reused pid).
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let me = std::process::id();
    std::fs::write(reg.path(), format!("{dead} 1 1 a 8\n{me} 1 1 f 8\n")).unwrap();
    let a = reg.register(Kind::Auto, 2).unwrap();
    let s = a.share(true).unwrap();
    assert_eq!((s.loaders, s.processes), (1, 1), "{s:?}");
    assert_eq!(s.cores_for_me, 2.min(s.cores));
    let text = std::fs::read_to_string(reg.path()).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with(&format!("{me} ")) && !text.contains(&format!("{dead} ")), "{text}");
}

#[test]
fn a_corrupt_registry_is_reset_and_a_broken_path_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let reg = temp_registry(&d);
    std::fs::write(reg.path(), b"\xff\xfe garbage\n1 2\n\x00\x00\n").unwrap();
    let a = reg.register(Kind::Auto, 1).unwrap();
    assert_eq!(a.share(true).unwrap().loaders, 1);
    let entries = reg.entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].pid, std::process::id());
    // A registry that cannot be opened: the loader runs unshared and says why.
    let dir = Registry::at(d.path());
    let err = dir.register(Kind::Auto, 1).unwrap_err().to_string();
    assert!(err.contains(&d.path().display().to_string()), "{err}");
    let t = Tuner::new(common::auto_threads(2, 10), Some(dir)).report();
    assert!(!t.shared && t.share.is_none());
    assert!(t.note.as_deref().is_some_and(|n| n.contains("cannot use the CPU registry")), "{t:?}");
    assert_eq!(t.threads_active, 2);
}

#[test]
fn a_loader_in_the_registry_reports_its_share() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 16);
    let file = d.path().join("budget");
    let cores = stoker::budget::host_cores();
    let other = Registry::at(&file).register(Kind::Fixed, cores).unwrap();
    let mut c = unshared(4);
    c.cpu_registry = Some(file.clone());
    let l = loader_in(&root, c, None, Some(cores as f64), false);
    let t = tuning(&l);
    assert!(t.shared, "{t:?}");
    assert_eq!(t.share, Some(1), "a fixed loader holding every core leaves one: {t:?}");
    assert_eq!(t.processes_sharing, Some(1));
    assert_eq!(t.threads_active, 1);
    drop(other);
    std::thread::sleep(stoker::budget::REFRESH + Duration::from_millis(100));
    assert_eq!(l.iter().unwrap().count(), 4);
    // The share is re-read while iterating: the fixed loader left.
    let t = tuning(&l);
    assert_eq!(t.share, Some(cores), "{t:?}");
    assert_eq!(t.threads_active, cores, "{t:?}");
    assert!(l.report().to_text().contains("cpu share:"));
    drop(l);
    assert!(Registry::at(&file).entries().unwrap().is_empty(), "deregistered on drop");
}

/// Regression: a worker told to stop (the pass was dropped) used to leave the tuner's wait and
/// return at once, leaving queued tasks uncompleted; their batch buffers never came back to the
/// pool, and a later pass (here the resumed epoch of the soak test) waited for them forever.
#[test]
fn passes_dropped_with_work_queued_give_every_buffer_back() {
    let _g = serial();
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 96);
    for threads in [Some(2), None] {
        let l = Arc::new(loader(&root, 16, threads, Some(2.0), false));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = l.clone();
        std::thread::spawn(move || {
            // Dropped while the queues still hold tasks: at once, a moment later, after a batch.
            for k in 0..12 {
                let mut it = l2.iter().unwrap();
                match k % 3 {
                    0 => {}
                    1 => std::thread::sleep(Duration::from_millis(3)),
                    _ => drop(it.next().unwrap().unwrap()),
                }
                drop(it);
            }
            let _ = tx.send(l2.iter().unwrap().count());
        });
        let n = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            panic!("threads {threads:?}: a whole pass after dropped ones did not finish in 30 s: buffers were lost")
        });
        assert_eq!(n, 6, "threads {threads:?}");
        assert_eq!(l.pool().held(), 0);
    }
}

/// A token loader's `threads="auto"` gives tokenizer threads back when the consumer is the slow
/// side (within a budget of 4 cores, sharing off), and the batches do not change.
#[test]
fn token_loader_threads_settle_lower_under_a_slow_consumer() {
    use stoker::tokens::{TextTokenizer, TokenConfig, TokenLoader};
    let _g = serial();
    let text = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text");
    let tok = TextTokenizer::from_file(&text.join("tokenizer-gpt2.json")).unwrap();
    let data = [text.join("wiki-sample.jsonl.zst")];
    let mut fixed = TokenConfig::new(1, 128);
    fixed.threads = Some(3);
    let batches = |l: &TokenLoader, slow: bool| -> Vec<Vec<i32>> {
        let mut out = vec![];
        for (k, b) in l.iter().unwrap().enumerate() {
            out.push(b.unwrap().input_ids().to_vec());
            if slow && k < 80 {
                std::thread::sleep(Duration::from_millis(25)); // a slow training step
            }
        }
        out
    };
    let want = batches(&TokenLoader::new(&data, Some(tok.clone()), fixed).unwrap(), false);
    let mut auto = TokenConfig::new(1, 128);
    auto.cpu_budget = Some(4.0);
    // Unshared, as the doc says: a stoker process elsewhere on the host (a CI run beside a
    // benchmark) would otherwise cut its share to one thread before the first decision.
    auto.cpu_registry = None;
    let l = TokenLoader::new(&data, Some(tok), auto).unwrap();
    assert_eq!(l.threads(), 4);
    assert_eq!(batches(&l, true), want, "tuning never changes the batches");
    let tuning = l.report().tuning.expect("token loaders report their tuning");
    let lowered = tuning.decisions.iter().any(|d| d.knob == "threads" && d.to < d.from);
    assert!(lowered, "{tuning:?}");
}
