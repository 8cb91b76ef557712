//! [`Pass`]: the consumer's side of one ordered [`Run`], written once for every loader kind
//! (images, arrays, the CUDA transfer stage, and the kinds to come).
//!
//! A pass asks the run for batch `n`, `n + 1`, ... in order and, for each finished slot:
//! counts its failed samples against the failure budget (or raises the first one), skips a
//! slot with nothing to deliver, advances the position, records the consumer's wait and
//! step (telemetry and trace) and hands the slot over, counted as held. A stale run, a dead
//! thread, the end of the epoch and a pass whose every sample failed all end here, the same
//! way for every kind. A kind brings its slot type ([`PassSlot`]: batch number, samples,
//! failures) and its [`PassHooks`] (what else a shutdown stops, where the position advances,
//! what a delivery updates); it wraps the slot [`Pass::poll`] returns into its own batch.

use super::grow::{Lease, PoolView};
use super::ordered::{Run, Wait};
use crate::error::{Error, Result};
use crate::observe::telemetry::{ConsumerClock, StageCounters, Telemetry};
use crate::observe::trace::{Args as TraceArgs, Tracer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one poll of an iteration gave.
#[derive(Debug)]
pub enum Next<T> {
    /// A batch, or the error that ends the pass.
    Item(Result<T>),
    /// The pass is over: no more batches.
    End,
    /// The deadline passed first: ask again.
    NotYet,
}

impl<T> Next<T> {
    /// Maps a delivered batch, keeping an error, the end and "not yet" as they are.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Next<U> {
        match self {
            Next::Item(r) => Next::Item(r.map(f)),
            Next::End => Next::End,
            Next::NotYet => Next::NotYet,
        }
    }

    /// What [`Iterator::next`] returns for a poll without a deadline (which never gives
    /// [`Next::NotYet`]; if it did, the pass would be reported as ended).
    pub fn into_item(self) -> Option<Result<T>> {
        match self {
            Next::Item(r) => Some(r),
            Next::End | Next::NotYet => None,
        }
    }
}

/// What a pass reads from a finished slot.
pub trait PassSlot: Send + 'static {
    /// The slot's batch number in this pass (the order of delivery).
    fn batch(&self) -> usize;
    /// Samples to deliver: `Some(0)` for a batch whose every sample failed (it is not
    /// delivered), `None` when the kind does not count samples (the transfer stage).
    fn samples(&self) -> Option<usize>;
    /// Takes the failures its workers recorded, in sample order.
    fn take_failures(&self) -> Vec<Error> {
        Vec::new()
    }
}

/// A slot shared with the threads that fill it (the usual pooled slot) is read as the slot.
impl<T: PassSlot + Sync> PassSlot for Arc<T> {
    fn batch(&self) -> usize {
        (**self).batch()
    }

    fn samples(&self) -> Option<usize> {
        (**self).samples()
    }

    fn take_failures(&self) -> Vec<Error> {
        (**self).take_failures()
    }
}

/// What a loader kind adds to a pass.
pub trait PassHooks: Send {
    /// Stops what the kind runs besides the run's threads (reads in flight, its telemetry's
    /// clock); called once, before the run is shut down.
    fn shutdown(&self) {}
    /// The pass moved on to batch `next` (the position a saved state resumes at).
    fn advanced(&self, _next: usize) {}
    /// A batch of `samples` samples is being handed over.
    fn delivered(&self, _samples: usize) {}
    /// The run ended without an error of its own: an error the producer left for after the
    /// batches before it (the transfer stage's), if any.
    fn ended(&self) -> Option<Error> {
        None
    }
}

/// No hooks.
impl PassHooks for () {}

/// The error that ended a producer thread (the token mixer, the CUDA transfer thread), kept
/// for the pass: as hooks, it is delivered after the batches before it. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct ProducerError(Arc<Mutex<Option<Error>>>);

impl ProducerError {
    /// Keeps `e` for the pass (a later one replaces it).
    pub fn set(&self, e: Error) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
    }
}

impl PassHooks for ProducerError {
    fn ended(&self) -> Option<Error> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// How many failed samples a pass accepts before it ends with an error, and the last reasons.
#[derive(Debug, Clone)]
pub struct FailureBudget {
    /// Failed samples allowed in a pass (past it, the pass ends with an error).
    pub limit: u64,
    /// Raise the first failure instead of skipping it.
    pub raise: bool,
    failures: u64,
    /// The last distinct reasons, each with how many failures in a row gave it.
    last: Vec<(String, u64)>,
}

impl FailureBudget {
    /// A budget of `limit` skipped samples; with `raise`, the first failure ends the pass.
    pub fn new(limit: u64, raise: bool) -> Self {
        FailureBudget { limit, raise, failures: 0, last: Vec::new() }
    }

    /// Counts `errs` (in sample order); under `raise`, returns the first. Storage that is not
    /// answering ([`Error::Unavailable`]) is returned whatever the policy: every later sample
    /// would fail the same way, so the pass ends now with that one error.
    fn count(&mut self, mut errs: Vec<Error>) -> Option<Error> {
        if let Some(k) = errs.iter().position(|e| matches!(e, Error::Unavailable(_))) {
            self.failures += 1;
            return Some(errs.swap_remove(k));
        }
        self.failures += errs.len() as u64;
        let keep = errs.len().saturating_sub(3);
        for e in &errs[keep..] {
            let text = e.to_string();
            match self.last.last_mut() {
                // The same reason again (an open circuit, a missing mount): counted, not repeated.
                Some((t, n)) if *t == text => *n += 1,
                _ => {
                    if self.last.len() == 3 {
                        self.last.remove(0);
                    }
                    self.last.push((text, 1));
                }
            }
        }
        (self.raise && !errs.is_empty()).then(|| errs.swap_remove(0))
    }

    /// The last reasons, for an error message.
    fn last_text(&self) -> String {
        let one = |(t, n): &(String, u64)| if *n > 1 { format!("{t} ({n} times)") } else { t.clone() };
        self.last.iter().map(one).collect::<Vec<_>>().join("; ")
    }

    fn exceeded(&self) -> Option<Error> {
        (self.failures > self.limit).then(|| {
            Error::Dataset(format!(
                "{} samples of this epoch failed, more than max_failures ({}): is the storage reachable? last errors: {}",
                self.failures,
                self.limit,
                self.last_text()
            ))
        })
    }

    fn all_failed(&self) -> Error {
        Error::Dataset(format!(
            "every sample of this pass failed ({}); last errors: {}",
            self.failures,
            self.last_text()
        ))
    }
}

/// What a pass records: the shell's counters of its loader (the wall clock of the pass, the
/// samples delivered) and its consumer's waits and steps.
#[derive(Default)]
pub struct Observe {
    /// The loader's counters (`None`: the pass records nothing).
    pub telemetry: Option<Arc<Telemetry>>,
    /// Whether this pass's caller is the consumer whose waits and steps are counted (false:
    /// the caller forwards the batches, and whoever consumes them is measured elsewhere).
    pub consumer: bool,
    /// The trace recorder, when tracing is on.
    pub tracer: Option<Arc<Tracer>>,
    /// The epoch, for the trace's delivery events.
    pub epoch: Option<u64>,
    clock: ConsumerClock,
    /// Batches handed over in this pass.
    handed: u64,
    trace_wait: Option<Instant>,
    trace_last: Option<(Instant, usize)>,
}

impl Observe {
    /// Records into `telemetry` (its caller measured as the consumer), and traces into
    /// `tracer`.
    pub fn new(telemetry: Option<Arc<Telemetry>>, tracer: Option<Arc<Tracer>>, epoch: Option<u64>) -> Self {
        Observe { consumer: telemetry.is_some(), telemetry, tracer, epoch, ..Observe::default() }
    }

    fn waiting(&mut self) {
        self.clock.waiting(consumer_counters(&self.telemetry, self.consumer));
        if self.tracer.is_some() {
            self.trace_wait.get_or_insert_with(Instant::now);
        }
    }

    /// Counts the consumer's wait for a batch being handed over (before the kind's hooks see
    /// the batch: the tuner reads this wait), and the batch's samples.
    fn handing_over(&mut self, samples: Option<usize>) {
        let waited = self.clock.delivered(consumer_counters(&self.telemetry, self.consumer));
        if let (Some(t), true) = (&self.telemetry, self.handed == 0 && self.consumer) {
            t.add_fill(waited);
        }
        self.handed += 1;
        if let (Some(t), Some(n)) = (&self.telemetry, samples) {
            t.add_samples(n);
        }
    }

    /// Traces a delivery: the consumer's wait for it, its step since the previous batch, and
    /// the hand-over itself.
    fn delivered(&mut self, batch: usize, samples: Option<usize>) {
        let Some(t) = &self.tracer else { return };
        let now = Instant::now();
        let waited = self.trace_wait.take().unwrap_or(now);
        if let (Some((last, prev)), true) =
            (self.trace_last.take(), consumer_counters(&self.telemetry, self.consumer).is_some())
        {
            t.span("step", "consumer", last, waited, TraceArgs::fields(serde_json::json!({"after_batch": prev})));
        }
        t.span("wait", "consumer", waited, now, TraceArgs::fields(serde_json::json!({"batch": batch})));
        let mut args = serde_json::json!({"batch": batch});
        if let Some(e) = self.epoch {
            args["epoch"] = e.into();
        }
        if let Some(s) = samples {
            args["samples"] = s.into();
        }
        t.instant("deliver", "batch", now, TraceArgs::fields(args));
        self.trace_last = Some((now, batch));
    }
}

/// The consumer's counters of `telemetry`, when the pass's caller is the consumer.
fn consumer_counters(telemetry: &Option<Arc<Telemetry>>, consumer: bool) -> Option<&StageCounters> {
    telemetry.as_deref().filter(|_| consumer).map(|t| &t.consumer)
}

/// One pass over (the rest of) an epoch, on the consumer's side: in-order delivery over a
/// [`Run`] with the failure budget, stale and dead-thread errors, the held-buffer check and
/// the consumer's telemetry. Dropping it shuts the run down (and the kind's hooks).
pub struct Pass<S: PassSlot, H: PassHooks> {
    run: Arc<Run<S>>,
    pool: Arc<PoolView<S>>,
    hooks: H,
    next: usize,
    /// The batch count of the pass (`None`: the producer says when it ends, [`Run::finish`]).
    end: Option<usize>,
    finished: bool,
    budget: FailureBudget,
    delivered: u64,
    /// The pass ended well, and no caller has been told yet ([`Pass::take_completed`]).
    completed: bool,
    /// What the pass records about its consumer.
    pub observe: Observe,
}

impl<S: PassSlot, H: PassHooks> std::fmt::Debug for Pass<S, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass").field("next", &self.next).field("end", &self.end).finish()
    }
}

impl<S: PassSlot, H: PassHooks> Pass<S, H> {
    /// A pass delivering batches `start..end` (`end` `None`: until the producer finishes) of
    /// `run`, whose slots come from and go back to `pool`.
    pub fn new(
        run: Arc<Run<S>>,
        pool: PoolView<S>,
        hooks: H,
        (start, end): (usize, Option<usize>),
        budget: FailureBudget,
        observe: Observe,
    ) -> Self {
        let finished = end.is_some_and(|e| start >= e);
        if let Some(t) = &observe.telemetry {
            t.start();
        }
        let pool = Arc::new(pool);
        Pass { run, pool, hooks, next: start, end, finished, budget, delivered: 0, completed: false, observe }
    }

    /// The run this pass consumes.
    pub fn run(&self) -> &Arc<Run<S>> {
        &self.run
    }

    /// The kind's hooks.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    /// The next batch number to deliver.
    pub fn next_batch(&self) -> usize {
        self.next
    }

    /// Batches left in this pass (0 when the producer decides the end).
    pub fn remaining(&self) -> usize {
        self.end.map_or(0, |e| e.saturating_sub(self.next))
    }

    /// Whether the pass ended well (its last batch delivered, or the producer found the end
    /// without an error) since the last call: true once.
    pub fn take_completed(&mut self) -> bool {
        std::mem::take(&mut self.completed)
    }

    /// Stops the run and the kind's work, returning every slot to the pool; idempotent.
    pub fn shutdown(&mut self) {
        if !self.finished {
            self.finished = true;
            self.hooks.shutdown();
            self.run.shutdown();
            if let Some(t) = &self.observe.telemetry {
                t.stop();
            }
        }
    }

    /// The next slot in order, until `deadline` (`None`: wait as long as it takes), lent to the
    /// consumer: the caller wraps the lease into a batch, and the slot goes back to the pool
    /// when the batch is dropped.
    pub fn poll(&mut self, deadline: Option<Instant>) -> Next<Lease<S>> {
        self.observe.waiting();
        loop {
            if self.finished {
                return Next::End;
            }
            if let Some(e) = self.run.stale_error() {
                self.shutdown();
                return Next::Item(Err(e));
            }
            let at_end = self.end.is_some_and(|e| self.next >= e);
            if at_end && self.delivered == 0 && self.budget.failures > 0 {
                // Not an empty epoch: a pass in which every sample failed is an error.
                self.shutdown();
                return Next::Item(Err(self.budget.all_failed()));
            }
            if at_end || self.run.cancelled() {
                let dead = self.run.death_error();
                self.shutdown();
                if let Some(e) = dead {
                    return Next::Item(Err(e));
                }
                self.completed = at_end;
                return Next::End;
            }
            let pool = &self.pool;
            let slot = match self.run.wait_for(self.next, deadline, S::batch, || pool.all_held()) {
                Ok(Wait::Slot(s)) => s,
                Ok(Wait::TimedOut) => return Next::NotYet,
                Ok(Wait::Cancelled) => {
                    let left = self.hooks.ended();
                    self.shutdown();
                    if left.is_none() && self.delivered == 0 && self.budget.failures > 0 {
                        // The producer found the end, and every sample of the pass failed.
                        return Next::Item(Err(self.budget.all_failed()));
                    }
                    self.completed = left.is_none();
                    return left.map_or(Next::End, |e| Next::Item(Err(e)));
                }
                Err(e) => {
                    self.shutdown();
                    return Next::Item(Err(e));
                }
            };
            let failure = self.budget.count(slot.take_failures()).or_else(|| self.budget.exceeded());
            if let Some(e) = failure {
                // The position stays at the failing batch: a saved state resumes there.
                self.pool.give_back(slot);
                self.shutdown();
                return Next::Item(Err(e));
            }
            self.next += 1;
            self.hooks.advanced(self.next);
            let samples = slot.samples();
            if samples == Some(0) {
                self.pool.give_back(slot);
                continue;
            }
            self.observe.handing_over(samples);
            if let Some(n) = samples {
                self.hooks.delivered(n);
                self.delivered += n as u64;
            }
            self.observe.delivered(self.next - 1, samples);
            return Next::Item(Ok(Lease::new(slot, self.pool.clone())));
        }
    }

    /// [`Pass::poll`] with a time-out instead of a deadline.
    pub fn poll_timeout(&mut self, timeout: Duration) -> Next<Lease<S>> {
        self.poll(Some(Instant::now() + timeout))
    }
}

impl<S: PassSlot, H: PassHooks> Drop for Pass<S, H> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::grow::{Growth, MakeSlot};
    use crossbeam_channel::bounded;
    use std::sync::atomic::AtomicUsize;
    use std::sync::atomic::Ordering;

    #[derive(Debug)]
    struct S {
        batch: usize,
        samples: usize,
        errors: Mutex<Vec<Error>>,
    }

    impl PassSlot for S {
        fn batch(&self) -> usize {
            self.batch
        }
        fn samples(&self) -> Option<usize> {
            Some(self.samples)
        }
        fn take_failures(&self) -> Vec<Error> {
            std::mem::take(&mut *self.errors.lock().unwrap())
        }
    }

    /// A pass over `batches` (samples, failures each), produced in reverse order.
    fn pass(batches: &[(usize, usize)], budget: FailureBudget) -> Pass<Arc<S>, ()> {
        let n = batches.len();
        let (free_tx, _free_rx) = bounded(n + 1);
        let (run, done) = Run::new(n, free_tx.clone());
        for (b, &(samples, failed)) in batches.iter().enumerate().rev() {
            let errors = (0..failed).map(|k| Error::Dataset(format!("bad {b}.{k}"))).collect();
            done.send(Arc::new(S { batch: b, samples, errors: Mutex::new(errors) })).unwrap();
        }
        let growth = Arc::new(Growth::new(n + 1, 1, Some(n as u64 + 1), "batch"));
        let make: MakeSlot<Arc<S>> = Arc::new(|| Err(Error::Internal("no growth in this test".into())));
        let pool = PoolView { free: free_tx, held: Arc::default(), growth, make };
        Pass::new(run, pool, (), (0, Some(n)), budget, Observe::default())
    }

    /// A pass's batch numbers and errors.
    type Got = Vec<std::result::Result<usize, String>>;

    /// The pass's batch numbers and errors, and the leases of its batches (still held).
    fn drain(p: &mut Pass<Arc<S>, ()>) -> (Got, Vec<Lease<Arc<S>>>) {
        let (mut out, mut kept) = (vec![], vec![]);
        while let Some(r) = p.poll(None).into_item() {
            out.push(r.map(|s| {
                let b = s.batch;
                kept.push(s);
                b
            }));
        }
        (out.into_iter().map(|r| r.map_err(|e| e.to_string())).collect(), kept)
    }

    #[test]
    fn delivers_in_order_and_skips_empty_batches() {
        let mut p = pass(&[(2, 0), (0, 2), (1, 1)], FailureBudget::new(10, false));
        let (got, kept) = drain(&mut p);
        assert_eq!(got, vec![Ok(0), Ok(2)]);
        assert_eq!(p.pool.held.load(Ordering::Relaxed), 2);
        drop(kept);
        assert_eq!(p.pool.held.load(Ordering::Relaxed), 0, "a dropped lease gives its slot back");
    }

    #[test]
    fn raise_ends_the_pass_at_the_first_failure() {
        let mut p = pass(&[(2, 0), (1, 1), (2, 0)], FailureBudget::new(10, true));
        let got = drain(&mut p).0;
        assert_eq!(got.len(), 2);
        assert!(got[1].as_ref().unwrap_err().contains("bad 1.0"), "{got:?}");
        assert_eq!(p.next_batch(), 1, "the position stays at the failing batch");
    }

    #[test]
    fn a_repeated_reason_is_counted_not_repeated() {
        let mut b = FailureBudget::new(0, false);
        let same = || (0..3).map(|_| Error::Dataset("circuit open".into())).collect();
        b.count(same());
        b.count(vec![Error::Dataset("other".into())]);
        let text = b.exceeded().unwrap().to_string();
        assert!(text.ends_with("last errors: dataset error: circuit open (3 times); dataset error: other"), "{text}");
    }

    #[test]
    fn the_budget_and_an_all_failed_pass_are_errors() {
        let mut p = pass(&[(1, 1), (1, 1), (1, 1)], FailureBudget::new(1, false));
        let got = drain(&mut p).0;
        assert!(got[1].as_ref().unwrap_err().contains("more than max_failures (1)"), "{got:?}");
        let mut p = pass(&[(0, 2), (0, 2)], FailureBudget::new(10, false));
        let got = drain(&mut p).0;
        assert_eq!(got.len(), 1);
        assert!(got[0].as_ref().unwrap_err().contains("every sample of this pass failed (4)"), "{got:?}");
    }

    #[test]
    fn a_stale_run_is_an_error_and_holding_every_slot_grows_the_pool_up_to_its_limit() {
        let mut p = pass(&[(1, 0), (1, 0)], FailureBudget::new(0, false));
        p.run.make_stale("a test replaced it");
        assert!(drain(&mut p).0[0].as_ref().unwrap_err().contains("a test replaced it"));
        // Two batches, one slot of 8 bytes: the consumer holds it, so batch 1 needs another.
        let holding = |limit: u64| {
            let (free_tx, free_rx) = bounded(2);
            let (run, done) = Run::new(1, free_tx.clone());
            done.send(Arc::new(S { batch: 0, samples: 1, errors: Mutex::default() })).unwrap();
            let made = Arc::new(AtomicUsize::new(0));
            let m = made.clone();
            let make: MakeSlot<Arc<S>> = Arc::new(move || {
                m.fetch_add(1, Ordering::Relaxed);
                Ok(Arc::new(S { batch: 9, samples: 1, errors: Mutex::default() }))
            });
            let growth = Arc::new(Growth::new(1, 8, Some(limit), "batch"));
            let pool = PoolView { free: free_tx, held: Arc::default(), growth, make };
            let mut p = Pass::new(run, pool, (), (0, Some(2)), FailureBudget::new(0, false), Observe::default());
            let first = p.poll(None).into_item().unwrap().unwrap();
            (p, first, made, free_rx, done)
        };
        // Room for a second slot: it is made and handed to the producers; the wait goes on.
        let (mut p, _first, made, free_rx, _done) = holding(16);
        assert!(matches!(p.poll_timeout(Duration::from_millis(100)), Next::NotYet));
        assert_eq!(made.load(Ordering::Relaxed), 1);
        assert_eq!(free_rx.try_iter().count(), 1);
        // No room: the wait ends with the error that says what the consumer holds.
        let (mut p, _first, made, _, _done) = holding(8);
        let err = p.poll(None).into_item().unwrap().unwrap_err().to_string();
        assert!(err.contains("the consumer holds all 1 batch buffers") && err.contains("8 bytes each"), "{err}");
        assert_eq!(made.load(Ordering::Relaxed), 0);
    }
}
