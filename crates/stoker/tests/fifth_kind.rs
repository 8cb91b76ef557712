//! A fifth loader kind, written outside the engine against the shell's public API alone: the
//! proof that a new kind touches no file of `shell/`. `Squares` brings only what differs (its
//! position, its slot and pool, its producer threads, its slot view, its report section, its
//! saved state); the shell gives it in-order delivery over out-of-order producers, the lease
//! that returns each buffer to its pool, stale passes, the report's common part, the trace
//! file's lifecycle, and the state surface (state dicts, each saved rank given once).

use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use stoker::observe::report::{Report, Section};
use stoker::observe::telemetry::Telemetry;
use stoker::observe::trace::{Args, Tracer};
use stoker::shell::epochs::Positioned;
use stoker::shell::grow::{Lease, MakeSlot, SlotPool};
use stoker::shell::kind::{Delivery, HostBatch, Kind, Loader, PassPlan};
use stoker::shell::ordered::{send_or_cancel, take_free, Run};
use stoker::shell::pass::{FailureBudget, PassSlot};
use stoker::shell::resume::{Ranked, Resumable};

const BATCH: usize = 4;

/// Where a pass of squares starts: the epoch (each epoch's numbers are offset by it).
#[derive(Default)]
struct Epoch(AtomicU64);

impl Positioned for Epoch {
    fn set_epoch(&self, epoch: u64) -> bool {
        self.0.swap(epoch, Ordering::AcqRel) != epoch
    }
    fn resume_pending(&self) -> bool {
        false
    }
}

/// A pooled buffer of `BATCH` squares.
#[derive(Debug)]
struct Slot {
    batch: AtomicUsize,
    values: Mutex<Vec<u64>>,
}

impl PassSlot for Slot {
    fn batch(&self) -> usize {
        self.batch.load(Ordering::Acquire)
    }
    fn samples(&self) -> Option<usize> {
        Some(BATCH)
    }
}

/// The kind: `batches` batches of the squares of `epoch * 1000 + i`, made by two producer
/// threads that each take every other batch, the odd ones first to finish.
struct Squares {
    batches: usize,
    pool: SlotPool<Arc<Slot>>,
    telemetry: Arc<Telemetry>,
    tracer: Option<Arc<Tracer>>,
}

/// A delivered batch: the squares, and the lease that returns the buffer when dropped.
#[derive(Debug)]
struct SquareBatch {
    slot: Lease<Arc<Slot>>,
}

impl SquareBatch {
    fn values(&self) -> Vec<u64> {
        self.slot.values.lock().unwrap().clone()
    }
}

impl HostBatch for SquareBatch {
    type Meta = usize;
    fn regions(&self, out: &mut Vec<(*const u8, usize)>) {
        let v = self.slot.values.lock().unwrap();
        out.push((v.as_ptr().cast(), v.len() * 8));
    }
    fn meta(&self) -> usize {
        self.slot.batch.load(Ordering::Acquire)
    }
}

#[derive(serde::Serialize)]
struct SquareSection {
    made: usize,
}

impl Section for SquareSection {
    fn items(&self) -> &'static str {
        "squares"
    }
}

impl Kind for Squares {
    type Position = Epoch;
    type Slot = Arc<Slot>;
    type Hooks = ();
    type Batch = SquareBatch;
    type Section = SquareSection;

    fn pool(&self) -> &SlotPool<Arc<Slot>> {
        &self.pool
    }

    fn start(
        self: &Arc<Self>,
        position: &Arc<Epoch>,
        run: &Arc<Run<Arc<Slot>>>,
        done: Sender<Arc<Slot>>,
    ) -> stoker::Result<PassPlan<Self>> {
        let epoch = position.0.load(Ordering::Acquire);
        // One thread takes the free slots in batch order (the shell's contract: the run holds
        // batches that finish early, so slots handed out of order could all wait there)...
        let (work_tx, work_rx) = crossbeam_channel::bounded::<(usize, Arc<Slot>)>(2);
        let (me, cancel) = (self.clone(), run.cancel_flag());
        run.spawn("squares-order".into(), move || {
            for b in 0..me.batches {
                let Some(slot) = take_free(&me.pool.free_rx, &cancel) else { return };
                if !send_or_cancel(&work_tx, (b, slot), &cancel) {
                    return;
                }
            }
        })?;
        // ... and two fill them, the even batches finishing after the odd ones.
        for worker in 0..2 {
            let (me, done, cancel, work) = (self.clone(), done.clone(), run.cancel_flag(), work_rx.clone());
            run.spawn(format!("squares-{worker}"), move || {
                while let Some((b, slot)) = take_free(&work, &cancel) {
                    if b % 2 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    let t0 = Instant::now();
                    let base = epoch * 1000 + (b * BATCH) as u64;
                    *slot.values.lock().unwrap() = (base..base + BATCH as u64).map(|i| i * i).collect();
                    slot.batch.store(b, Ordering::Release);
                    if let Some(t) = &me.tracer {
                        let args = Args::Sample { index: base as u32, batch: b as u32 };
                        t.span("square", "squares", t0, Instant::now(), args);
                    }
                    if !send_or_cancel(&done, slot, &cancel) {
                        return;
                    }
                }
            })?;
        }
        Ok(PassPlan {
            epoch,
            batches: (0, Some(self.batches)),
            budget: FailureBudget::new(0, true),
            hooks: (),
            retire: None,
        })
    }

    fn batch(self: &Arc<Self>, slot: Lease<Arc<Slot>>, _: &Epoch, _: Delivery) -> SquareBatch {
        SquareBatch { slot }
    }

    fn regions(&self) -> Vec<usize> {
        vec![BATCH * 8]
    }

    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    fn report(&self) -> Report<SquareSection> {
        self.telemetry.report(|_| vec![], 2, SquareSection { made: self.batches })
    }

    fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.tracer.as_ref()
    }

    fn describe(&self, index: u32) -> String {
        format!("square of {index}")
    }
}

/// What a saved state of squares is valid for.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Shape {
    batches: usize,
    rank: usize,
    world_size: usize,
}

/// The saved state of squares is the epoch; a run saved by several ranks continues at the
/// latest epoch any of them had reached.
impl Resumable for Squares {
    type State = u64;
    type Fingerprint = Shape;

    fn fingerprint(&self) -> Shape {
        Shape { batches: self.batches, rank: 0, world_size: 1 }
    }
    fn save(&self, position: &Epoch) -> u64 {
        position.0.load(Ordering::Acquire)
    }
    fn fields(&self, _: &Epoch, epoch: &u64) -> stoker::Result<serde_json::Value> {
        Ok(serde_json::json!({ "epoch": epoch }))
    }
    fn restore(&self, position: &Epoch, epoch: u64) -> stoker::Result<()> {
        position.0.store(epoch, Ordering::Release);
        Ok(())
    }
    fn continue_ranks(&self, saved: &[Ranked<u64>]) -> stoker::Result<u64> {
        Ok(saved.iter().map(|r| r.state).max().unwrap_or(0))
    }
}

fn squares(batches: usize, trace: Option<std::path::PathBuf>) -> Loader<Squares> {
    let make: MakeSlot<Arc<Slot>> =
        Arc::new(|| Ok(Arc::new(Slot { batch: AtomicUsize::new(0), values: Mutex::new(vec![]) })));
    let pool = SlotPool::new(3, BATCH * 8, Some(64 * BATCH as u64 * 8), "squares", make).unwrap();
    let tracer = trace.map(|p| Arc::new(Tracer::new(1000, Some(p))));
    Loader::of(Squares { batches, pool, telemetry: Arc::default(), tracer })
}

#[test]
fn a_kind_outside_the_engine_gets_the_shell_s_delivery_leases_epochs_report_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("squares.json");
    let loader = squares(9, Some(trace.clone()));
    loader.set_epoch(2);

    // In order, whatever order the two producers finish in; every batch held is counted, and
    // the pool grows while the consumer keeps them all (3 slots, 9 batches kept).
    let got: Vec<SquareBatch> = loader.iter().unwrap().map(|b| b.unwrap()).collect();
    assert_eq!(got.iter().map(|b| b.meta()).collect::<Vec<_>>(), (0..9).collect::<Vec<_>>());
    for (b, batch) in got.iter().enumerate() {
        let want: Vec<u64> = (0..BATCH as u64).map(|i| 2000 + (b * BATCH) as u64 + i).map(|i| i * i).collect();
        assert_eq!(batch.values(), want, "batch {b}");
    }
    assert_eq!(loader.held(), 9);
    drop(got);
    assert_eq!(loader.held(), 0, "each lease gave its buffer back");

    // The pass ended well: the shell wrote the trace file, with the kind's own names.
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("square of 2000") && text.contains("square of 2032"), "{}", &text[..text.len().min(400)]);
    assert_eq!(loader.report().samples, 9 * BATCH as u64);
    assert_eq!(loader.report().kind.made, 9);

    // A newer pass makes the running one stale; the new one starts at its first batch.
    let mut old = loader.iter().unwrap();
    let first = old.next().unwrap().unwrap();
    let mut new = loader.iter().unwrap();
    let e = old.next().unwrap().unwrap_err().to_string();
    assert!(e.contains("newer"), "{e}");
    assert_eq!(new.next().unwrap().unwrap().meta(), 0);
    drop(first);
    drop((old, new));
    assert_eq!(loader.held(), 0);

    // Asked for: the file is written now, where the caller says.
    let asked = dir.path().join("asked.json");
    assert_eq!(loader.write_trace(Some(&asked)).unwrap(), asked);
    assert!(std::fs::read_to_string(&asked).unwrap().contains("square of 2000"));
}

#[test]
fn a_kind_outside_the_engine_gets_the_shell_s_state_surface() {
    let loader = squares(2, None);
    loader.set_epoch(4);
    let want = serde_json::json!({"epoch": 4, "fingerprint": {"batches": 2, "rank": 0, "world_size": 1}});
    assert_eq!(loader.state_dict().unwrap(), want);
    // Every rank of a saved run, in any order, each once.
    loader.load_states(vec![(7, 1, 2), (6, 0, 2)]).unwrap();
    assert_eq!(loader.state(), 7);
    let first = loader.iter().unwrap().next().unwrap().unwrap().values();
    assert_eq!(first[0], 7000 * 7000, "the pass starts where the restored state says");
    let e = loader.load_states(vec![(5, 1, 2)]).unwrap_err().to_string();
    assert!(e.contains("no state of rank 0 of the saved run's 2 ranks"), "{e}");
    let e = loader.load_states(vec![(5, 1, 2), (5, 1, 2)]).unwrap_err().to_string();
    assert!(e.contains("rank 1 appears twice"), "{e}");
    assert_eq!(loader.state(), 7, "a refused list changes nothing");
    loader.load_state(3).unwrap();
    assert_eq!(loader.state_dict().unwrap()["epoch"], 3);
}
