//! [`EpochIter`]: one pass, delivering batches in order over the shared [`Run`], with the
//! failure budget, stale-iterator checks, the consumer's telemetry and trace spans.

use super::*;

/// One pass over (the rest of) an epoch; yields batches in order. Dropping it stops and joins
/// every thread.
pub struct EpochIter {
    pub(super) shared: Arc<Shared>,
    pub(super) state: Arc<Position>,
    pub(super) core: Arc<IterCore>,
    pub(super) next_batch: usize,
    pub(super) end: usize,
    pub(super) epoch: u64,
    pub(super) clock: ConsumerClock,
    pub(super) finished: bool,
    pub(super) consumer_telemetry: bool,
    /// Samples that failed in this pass, the last few reasons, and how many may.
    pub(super) failures: u64,
    pub(super) last_failures: Vec<String>,
    pub(super) failure_limit: u64,
    /// Samples delivered in this pass.
    pub(super) delivered: u64,
    /// Tracing: when the current wait in `next()` began, and when (and which) batch was last
    /// handed over.
    pub(super) trace_wait: Option<Instant>,
    pub(super) trace_last: Option<(Instant, usize)>,
}

/// What an iteration shares with its loader, so that starting a new iteration (or
/// `set_epoch`, `load_state`) can stop this one and take its buffers back even while the old
/// iterator object is still alive: the generic ordered [`Run`] plus the read buffers.
pub(super) struct IterCore {
    pub(super) run: Arc<Run<Arc<Slot>>>,
    pub(super) bytes_rx: Mutex<Option<Receiver<Vec<u8>>>>,
}

impl IterCore {
    /// Stops the threads, returns every slot to the pool and keeps the read buffers for the
    /// next epoch; idempotent.
    pub(super) fn shutdown(&self, shared: &Shared) {
        // Cancel first, so that no new read starts, then give up the reads in flight (a stalled
        // object store would otherwise hold the join below for its time-out), then join.
        self.run.cancel_flag().store(true, Ordering::Release);
        shared.source.abandon_reads();
        self.run.shutdown();
        if let Some(rx) = self.bytes_rx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let mut stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
            stash.bytes.extend(rx.try_iter());
        }
    }

    /// Makes the iteration stale (`why`: what replaced it) and stops it.
    pub(super) fn make_stale(&self, shared: &Shared, why: &str) {
        self.run.make_stale(why);
        self.shutdown(shared);
    }
}

impl std::fmt::Debug for EpochIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochIter").field("epoch", &self.epoch).field("next_batch", &self.next_batch).finish()
    }
}

impl EpochIter {
    pub(super) fn start(shared: Arc<Shared>, state: Arc<Position>, epoch: u64, start: usize) -> Result<Self> {
        let order = Arc::new(shared.sampler.epoch_order(epoch));
        let end = shared.sampler.num_batches();
        let bs = shared.sampler.spec().batch_size;
        let (task_tx, task_rx) = bounded::<Task>(bs.max(64));
        let work_cap = shared.threads * 2;
        let (work_tx, work_rx) = bounded::<Work>(work_cap);
        let nbytes = work_cap + shared.threads + shared.io_threads;
        let (bytes_tx, bytes_rx) = bounded::<Vec<u8>>(nbytes);
        {
            let mut stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..nbytes {
                bytes_tx.send(stash.bytes.pop().unwrap_or_default()).expect("room");
            }
        }
        let (run, done_tx) = Run::new(shared.pool.slots(), shared.pool.free_tx.clone());
        let core = Arc::new(IterCore { run: run.clone(), bytes_rx: Mutex::new(Some(bytes_rx.clone())) });
        let cancel = run.cancel_flag();
        let it = EpochIter {
            shared: shared.clone(),
            state,
            core: core.clone(),
            next_batch: start,
            end,
            epoch,
            clock: ConsumerClock::default(),
            finished: start >= end,
            consumer_telemetry: true,
            failures: 0,
            delivered: 0,
            last_failures: Vec::new(),
            failure_limit: shared.max_failures.limit(shared.sampler.samples_per_rank()),
            trace_wait: None,
            trace_last: None,
        };
        {
            let (sh, cancel, order) = (shared.clone(), cancel.clone(), order.clone());
            run.spawn("stoker-dispatch".into(), move || dispatch(&sh, &cancel, &order, start, end, task_tx))?;
        }
        for k in 0..shared.io_threads {
            let (sh, cancel, rx, tx, brx) =
                (shared.clone(), cancel.clone(), task_rx.clone(), work_tx.clone(), bytes_rx.clone());
            let done = done_tx.clone();
            run.spawn(format!("stoker-io-{k}"), move || io_loop(&sh, &cancel, rx, tx, brx, done))?;
        }
        drop(task_rx);
        drop(work_tx);
        for k in 0..shared.threads {
            let (sh, cancel, rx, btx, done) =
                (shared.clone(), cancel.clone(), work_rx.clone(), bytes_tx.clone(), done_tx.clone());
            run.spawn(format!("stoker-decode-{k}"), move || decode_loop(&sh, k, &cancel, epoch, rx, btx, done))?;
        }
        shared.tuner.consumed(start);
        shared.telemetry.start();
        Ok(it)
    }

    /// The epoch being iterated.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Stops counting this iterator's caller as the consumer: for a stage that forwards the
    /// batches (the GPU transfer) and measures the real consumer itself.
    pub fn forwarding(mut self) -> Self {
        self.consumer_telemetry = false;
        self
    }

    /// Batches left in this pass.
    pub fn remaining(&self) -> usize {
        self.end.saturating_sub(self.next_batch)
    }

    pub(super) fn shutdown(&mut self) {
        if !self.finished {
            self.core.shutdown(&self.shared);
            self.shared.telemetry.stop();
            self.finished = true;
        }
    }

    /// Traces a delivery: the consumer's wait for it, its step since the previous batch, and
    /// the hand-over itself.
    pub(super) fn trace_delivered(&mut self, batch: usize, samples: usize) {
        let Some(t) = &self.shared.tracer else { return };
        let now = Instant::now();
        let waited = self.trace_wait.take().unwrap_or(now);
        if let (Some((last, prev)), true) = (self.trace_last.take(), self.consumer_telemetry) {
            t.span("step", "consumer", last, waited, TraceArgs::fields(serde_json::json!({"after_batch": prev})));
        }
        t.span("wait", "consumer", waited, now, TraceArgs::fields(serde_json::json!({"batch": batch})));
        let args = serde_json::json!({"batch": batch, "epoch": self.epoch, "samples": samples});
        t.instant("deliver", "batch", now, TraceArgs::fields(args));
        self.trace_last = Some((now, batch));
    }

    /// At the end of a completed pass: writes the trace file (a failure goes to stderr, the
    /// iteration has ended well).
    pub(super) fn trace_pass_end(&self) {
        if let Some(t) = &self.shared.tracer {
            if let Some(path) = t.auto_path() {
                if let Err(e) = write_trace(&self.shared, t, path) {
                    eprintln!("stoker: {e}");
                }
            }
        }
    }

    pub(super) fn wait_for(&mut self, batch: usize, deadline: Option<Instant>) -> Result<Wait<Arc<Slot>>> {
        let pool = &self.shared.pool;
        self.core.run.wait_for(
            batch,
            deadline,
            |slot| slot.batch.load(Ordering::Relaxed),
            || (pool.held() >= pool.slots()).then(|| all_held(pool.slots(), "batch", Some(pool.batch_bytes()))),
        )
    }

    /// Like [`Iterator::next`], but gives up after `timeout`: `None` means "not yet" (call
    /// again), `Some(None)` the end of the pass. For callers that must stay responsive, such as
    /// the Python binding checking for Ctrl-C between waits.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Option<Result<Batch>>> {
        self.poll(Some(Instant::now() + timeout))
    }

    pub(super) fn poll(&mut self, deadline: Option<Instant>) -> Option<Option<Result<Batch>>> {
        let consumer = self.consumer_telemetry.then_some(&self.shared.telemetry.consumer);
        self.clock.waiting(consumer);
        if self.shared.tracer.is_some() {
            self.trace_wait.get_or_insert_with(Instant::now);
        }
        loop {
            if self.finished {
                return Some(None);
            }
            if let Some(e) = self.core.run.stale_error() {
                self.shutdown();
                return Some(Some(Err(e)));
            }
            if self.next_batch >= self.end && self.delivered == 0 && self.failures > 0 {
                // Not an empty epoch: a pass in which every sample failed is an error.
                self.shutdown();
                return Some(Some(Err(Error::Dataset(format!(
                    "every sample of this pass failed ({}); last errors: {}",
                    self.failures,
                    self.last_failures.join("; ")
                )))));
            }
            if self.next_batch >= self.end || self.core.run.cancelled() {
                let completed = self.next_batch >= self.end;
                self.shutdown();
                if completed {
                    self.trace_pass_end();
                }
                return Some(None);
            }
            let slot = match self.wait_for(self.next_batch, deadline) {
                Ok(Wait::Slot(s)) => s,
                Ok(Wait::TimedOut) => return None,
                Ok(Wait::Cancelled) => {
                    self.shutdown();
                    return Some(None);
                }
                Err(e) => {
                    self.shutdown();
                    return Some(Some(Err(e)));
                }
            };
            let first_err = {
                let mut errs = slot.errors.lock().unwrap_or_else(|p| p.into_inner());
                errs.sort_by_key(|(i, _)| *i);
                self.failures += errs.len() as u64;
                for (_, e) in errs.iter().rev().take(3).rev() {
                    if self.last_failures.len() == 3 {
                        self.last_failures.remove(0);
                    }
                    self.last_failures.push(e.to_string());
                }
                if self.shared.on_error == ErrorPolicy::Raise && !errs.is_empty() {
                    Some(errs.swap_remove(0).1)
                } else {
                    None
                }
            };
            if let Some(e) = first_err {
                // The position stays at the failing batch: a saved state resumes there.
                let _ = self.shared.pool.free_tx.send(slot);
                self.shutdown();
                return Some(Some(Err(e)));
            }
            if self.failures > self.failure_limit {
                let _ = self.shared.pool.free_tx.send(slot);
                self.shutdown();
                return Some(Some(Err(Error::Dataset(format!(
                    "{} samples of this epoch failed, more than max_failures ({}): is the storage reachable? \
                     last errors: {}",
                    self.failures,
                    self.failure_limit,
                    self.last_failures.join("; ")
                )))));
            }
            self.next_batch += 1;
            self.state.advance(self.next_batch);
            self.shared.tuner.consumed(self.next_batch);
            let len = slot.len.load(Ordering::Acquire);
            if len == 0 {
                let _ = self.shared.pool.free_tx.send(slot);
                continue;
            }
            let tel = &self.shared.telemetry;
            self.clock.delivered(self.consumer_telemetry.then_some(&tel.consumer));
            tel.add_samples(len);
            self.shared.tuner.on_batch(tel);
            self.delivered += len as u64;
            self.trace_delivered(self.next_batch - 1, len);
            self.shared.pool.held.fetch_add(1, Ordering::AcqRel);
            let plan = &self.shared.plan;
            return Some(Some(Ok(Batch {
                slot: Some(slot),
                free: self.shared.pool.free_tx.clone(),
                held: self.shared.pool.held.clone(),
                sample_shape: plan.sample_shape(),
                dtype: plan.spec().dtype,
                layout: plan.spec().layout,
                epoch: self.epoch,
            })));
        }
    }
}

impl Iterator for EpochIter {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.poll(None).expect("no deadline, so no time-out")
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        self.shutdown();
    }
}
