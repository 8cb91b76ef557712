//! The threads of one pass, in the order data flows: the dispatcher hands out slots of free
//! buffers as tasks, the I/O threads read each sample's bytes, the decode threads run the
//! per-sample work ([`super::work`]) and mark slots done.

use super::shared::{sample_args, Images, Task};
use super::work::{caption, process};
use super::*;
use crate::shell::ordered::take_free;

pub(super) struct Work {
    pub(super) task: Task,
    pub(super) bytes: Vec<u8>,
    /// An image-text pair's caption member (empty for images alone).
    pub(super) text: Vec<u8>,
    pub(super) read: Result<()>,
}

pub(super) fn dispatch(
    sh: &Images,
    cancel: &AtomicBool,
    order: &[u32],
    (start, end): (usize, usize),
    epoch: u64,
    tasks: Sender<Task>,
) {
    for b in start..end {
        let t0 = Instant::now();
        if sh.tuner.gate(b, cancel).is_none() {
            return;
        }
        let Some(slot) = take_free(&sh.pool.slots.free_rx, cancel) else { return };
        let t1 = Instant::now();
        sh.telemetry.buffers.add_wait(t1 - t0);
        if let Some(t) = &sh.tracer {
            t.span("wait_buffer", "backpressure", t0, t1, TraceArgs::fields(serde_json::json!({"batch": b})));
        }
        if cancel.load(Ordering::Acquire) {
            sh.pool.slots.give_back(slot);
            return;
        }
        let idx = sh.sampler.batch(order, b);
        slot.reset(b, idx);
        sh.telemetry.buffers.record(Duration::ZERO);
        for pos in 0..idx.len() {
            if tasks.send(Task { slot: slot.clone(), pos, epoch }).is_err() {
                return;
            }
        }
    }
}

/// Marks a task finished; the thread finishing the batch compacts it, mixes it (MixUp/CutMix,
/// when asked) and hands it on.
pub(super) fn complete(sh: &Images, task: Task, label: Option<i64>, done: &Sender<Arc<Slot>>) {
    let Task { slot, pos, epoch } = task;
    if slot.finish(pos, label) {
        slot.compact();
        if let Some(mix) = &sh.mix {
            mix_batch(sh, mix, &slot, epoch);
        }
        if let Err(e) = done.send(slot) {
            // The consumer is gone: give the buffer straight back to the pool.
            sh.pool.slots.give_back(e.into_inner());
        }
    }
}

thread_local! {
    /// A sample's bytes, for mixing a rolled batch in place (one per thread, reused).
    static MIX_SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// MixUp/CutMix of a batch this thread completed, and its soft labels (the slot's extra
/// region 0), timed as the `mix` stage and traced. A batch bound for a GPU gets its soft labels
/// alone (its images are mixed there: [`crate::image::ops::mix::MixImages`]).
fn mix_batch(sh: &Images, mix: &crate::image::ops::mix::MixSpec, slot: &Slot, epoch: u64) {
    let t0 = Instant::now();
    let batch = slot.batch.load(Ordering::Relaxed);
    let p = sh.mix_params(mix, epoch, batch);
    let n = slot.len.load(Ordering::Acquire);
    let (h, w) = sh.plan.output_size();
    let spec = sh.plan.spec();
    // SAFETY: this thread's `finish` completed the slot and it has compacted it; it hands the
    // slot on only after this function returns.
    let (data, soft) = unsafe { slot.completed_mut(0) };
    assert!(soft.len() == n * mix.num_classes * 4 && (soft.as_ptr() as usize).is_multiple_of(4));
    // SAFETY: `soft` holds n * num_classes float32 values at a 4-aligned address (asserted);
    // every bit pattern is a valid f32, and the view borrows `soft` for its life.
    let soft = unsafe { std::slice::from_raw_parts_mut(soft.as_mut_ptr().cast::<f32>(), n * mix.num_classes) };
    // Every label was checked against num_classes when the loader was made.
    if mix.soft_labels(&p, slot.labels(), soft).is_err() {
        soft.fill(0.0);
    }
    // Bound for a GPU, the images are uint8 before their normalisation: mixed there, after it.
    if mix.images == crate::image::ops::mix::MixImages::Host {
        MIX_SCRATCH.with_borrow_mut(|s| mix.mix_images(&p, data, n, spec.dtype, spec.layout, h, w, s));
    }
    let t1 = Instant::now();
    sh.counters.mix.record(t1 - t0);
    if let Some(t) = &sh.tracer {
        t.span("mix", "batch", t0, t1, TraceArgs::fields(serde_json::json!({"batch": batch})));
    }
}

pub(super) fn fail(sh: &Images, task: Task, err: Error, done: &Sender<Arc<Slot>>) {
    let index = task.slot.index(task.pos);
    let path = sh.source.describe(index as usize);
    let err = match err {
        Error::Decode { reason, .. } => Error::Decode { path: path.clone(), reason },
        other => other,
    };
    if let Some(t) = &sh.tracer {
        let batch = task.slot.batch.load(Ordering::Relaxed) as u32;
        t.instant("failed", "sample", Instant::now(), TraceArgs::Failure { index, batch, reason: err.reason().into() });
    }
    sh.telemetry.skip(Skipped { index, path: path.display().to_string(), reason: err.reason() });
    task.slot.errors.lock().expect("slot errors lock").push((index, err));
    complete(sh, task, None, done);
}

pub(super) fn io_loop(
    sh: &Images,
    cancel: &AtomicBool,
    tasks: Receiver<Task>,
    work: Sender<Work>,
    bytes: Receiver<Vec<u8>>,
    done: Sender<Arc<Slot>>,
) {
    while let Ok(task) = tasks.recv() {
        if cancel.load(Ordering::Acquire) {
            complete(sh, task, None, &done);
            continue;
        }
        let t_wait = Instant::now();
        let Ok(mut buf) = bytes.recv() else {
            complete(sh, task, None, &done);
            continue;
        };
        let t0 = Instant::now();
        sh.counters.read.add_wait(t0 - t_wait);
        let hw = sh.read_high_water.load(Ordering::Relaxed);
        if buf.capacity() < hw {
            buf.reserve_exact(hw - buf.len());
        }
        let index = task.slot.index(task.pos) as usize;
        let mut text = vec![];
        let read = match &sh.captions {
            Some(c) => sh.source.read_pair(index, c.field.member(), &mut buf, &mut text, sh.max_file_bytes),
            None => sh.source.read(index, &mut buf, sh.max_file_bytes),
        };
        sh.read_high_water.fetch_max(buf.capacity(), Ordering::Relaxed);
        let t1 = Instant::now();
        sh.counters.read.record(t1 - t0);
        if let Some((d, tally)) = sh.mixed(task.slot.index(task.pos)) {
            tally.add_busy(d, (t1 - t0).as_nanos() as u64);
        }
        if let Some(t) = &sh.tracer {
            t.span("read", "sample", t0, t1, sample_args(&task));
        }
        if let Err(e) = work.send(Work { task, bytes: buf, text, read }) {
            let w = e.into_inner();
            complete(sh, w.task, None, &done);
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn decode_loop(
    sh: &Images,
    k: usize,
    cancel: &AtomicBool,
    epoch: u64,
    work: Receiver<Work>,
    bytes: Sender<Vec<u8>>,
    done: Sender<Arc<Slot>>,
) {
    let stashed = sh.stash.lock().expect("stash lock").workers.pop();
    let made = match stashed {
        Some(w) => Ok(w),
        None => Decoder::new(sh.decode_opts).map(|d| (d, Resampler::new())),
    };
    let (mut decoder, mut resampler) = match made {
        Ok(w) => w,
        Err(e) => {
            // Cannot decode anything: fail every sample that reaches this worker.
            while let Ok(w) = work.recv() {
                let _ = bytes.send(w.bytes);
                fail(sh, w.task, Error::Internal(e.to_string()), &done);
            }
            return;
        }
    };
    // The thread's CPU time, lapped after each sample: the verdict weighs it against the cores.
    let mut cpu = crate::observe::cpu::ThreadCpu::start();
    loop {
        sh.telemetry.add_workers_cpu(cpu.lap());
        let t_wait = Instant::now();
        // Autotuned: only the first `threads_active` workers take work. A cancelled pass ends
        // the wait but not the loop: every queued task must still complete (below), or its
        // batch buffer never returns to the pool and the next pass waits for it forever.
        let _ = sh.tuner.wait_turn(k, cancel);
        let Ok(w) = work.recv() else {
            sh.stash.lock().expect("stash lock").workers.push((decoder, resampler));
            return;
        };
        sh.counters.decode.add_wait(t_wait.elapsed());
        let Work { task, bytes: buf, text, read } = w;
        if cancel.load(Ordering::Acquire) {
            let _ = bytes.send(buf);
            complete(sh, task, None, &done);
            continue;
        }
        let result = read.and_then(|()| caption(sh, &task, &text)).and_then(|_| {
            // A panic while processing one sample is that sample's error; the worker goes on
            // with a fresh decoder and resampler (the old ones may be mid-update).
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                process(sh, &mut decoder, &mut resampler, epoch, &task, &buf)
            }))
            .unwrap_or_else(|p| {
                if let Ok(d) = Decoder::new(sh.decode_opts) {
                    decoder = d;
                }
                resampler = Resampler::new();
                Err(Error::Internal(format!(
                    "panic while processing this sample: {} (please report this)",
                    crate::shell::ordered::panic_message(p.as_ref())
                )))
            })
        });
        sh.counters.add_decode_warnings(decoder.take_warnings());
        sh.counters.add_restart_decodes(decoder.take_restart_decodes());
        let _ = bytes.send(buf);
        match result {
            Ok(label) => complete(sh, task, Some(label), &done),
            Err(e) => fail(sh, task, e, &done),
        }
    }
}
