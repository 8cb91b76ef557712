//! The one ordered run: what every producer of batches (the image pipeline, `ArrayLoader`)
//! shares instead of keeping its own copy. A [`Run`] is one iteration: it owns the worker
//! threads, the queue of finished slots and the reorder buffer, and it knows how to stop.
//!
//! Its guarantees, unit-tested here on their own:
//! - **In order**: [`Run::wait_for`] hands out batch `b` only, whatever order slots finish in.
//! - **Nothing waits on a dead thread**: threads are started by [`Run::spawn`], which catches a
//!   panic, records it and cancels the run; the next wait returns an internal error instead
//!   of waiting for a slot that will never come.
//! - **No hang when the consumer holds every slot**: the wait asks the caller's `held_all`
//!   check on every poll (which grows the pool, or gives the error: `shell::grow`) and
//!   returns its error.
//! - **Prompt, idempotent shutdown**: [`Run::shutdown`] cancels, joins every thread and
//!   returns every slot it still holds (finished or reordered) to the pool, even while the
//!   iterator object that owns the run is alive elsewhere (a newer iteration, `set_epoch`).
//! - **Stale runs say so**: [`Run::make_stale`] shuts a run down and makes every later wait
//!   an error naming why (a newer `iter()`, `set_epoch`, `load_state_dict`).
//! - **Producers that find the end themselves**: a producer that does not know the batch count
//!   up front (the CUDA transfer stage forwards whatever its host iterator yields) calls
//!   [`Run::finish`] before it returns; the waits then deliver every queued slot and end with
//!   [`Wait::Cancelled`] instead of reporting threads that stopped early.

use crate::error::{Error, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError, SendTimeoutError, Sender};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one wait step lasts before the flags (cancel, death, held-all) are checked again.
pub const POLL: Duration = Duration::from_millis(20);

/// What a wait gave.
#[derive(Debug)]
pub enum Wait<S> {
    /// The slot of the batch asked for.
    Slot(S),
    /// The run was cancelled (shut down): no more batches.
    Cancelled,
    /// The deadline passed first.
    TimedOut,
}

/// The text of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Takes a free slot from a pool's `free` queue (or the next item of any queue between a run's
/// threads), waiting in [`POLL`] steps so that `cancel` is seen; `None` when the run was
/// cancelled or the queue is closed. The one free-slot wait of every producer (image
/// dispatcher, array gatherer, token packer, CUDA transfer stage).
pub fn take_free<S>(free: &Receiver<S>, cancel: &AtomicBool) -> Option<S> {
    loop {
        if cancel.load(Ordering::Acquire) {
            return None;
        }
        match free.recv_timeout(POLL) {
            Ok(s) => return Some(s),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Sends `v` on a queue between a run's threads, waiting in [`POLL`] steps so that `cancel` is
/// seen; false when the run was cancelled or the queue is closed (the counterpart of
/// [`take_free`]).
pub fn send_or_cancel<T>(tx: &Sender<T>, mut v: T, cancel: &AtomicBool) -> bool {
    loop {
        if cancel.load(Ordering::Acquire) {
            return false;
        }
        match tx.send_timeout(v, POLL) {
            Ok(()) => return true,
            Err(SendTimeoutError::Timeout(back)) => v = back,
            Err(SendTimeoutError::Disconnected(_)) => return false,
        }
    }
}

/// Locks `m` even if a thread panicked while holding it (the data are slots and handles,
/// valid whatever the panicking thread was doing).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One iteration's threads, finished-slot queue and reorder buffer.
pub struct Run<S> {
    cancel: Arc<AtomicBool>,
    done_rx: Mutex<Option<Receiver<S>>>,
    /// Finished slots that arrived ahead of their turn, by `batch % len`.
    pending: Mutex<Vec<Option<S>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    free_tx: Sender<S>,
    /// Why the first thread that died, died.
    dead: Mutex<Option<String>>,
    /// Why this run may no longer be iterated.
    stale: Mutex<Option<String>>,
    /// The producer reached the end of its input (see [`Run::finish`]).
    finished: AtomicBool,
}

impl<S: Send + 'static> Run<S> {
    /// A run whose finished slots arrive on the returned sender (at most `slots` of them at a
    /// time) and go back to the pool through `free_tx`.
    pub fn new(slots: usize, free_tx: Sender<S>) -> (Arc<Self>, Sender<S>) {
        let (done_tx, done_rx) = crossbeam_channel::bounded(slots.max(1));
        let run = Run {
            cancel: Arc::new(AtomicBool::new(false)),
            done_rx: Mutex::new(Some(done_rx)),
            pending: Mutex::new((0..slots.max(1)).map(|_| None).collect()),
            threads: Mutex::new(vec![]),
            free_tx,
            dead: Mutex::new(None),
            stale: Mutex::new(None),
            finished: AtomicBool::new(false),
        };
        (Arc::new(run), done_tx)
    }

    /// The cancel flag workers poll.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Whether the run was cancelled.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// Starts a worker thread. A panic in `f` is caught: the run records it and is cancelled,
    /// so the consumer gets an error instead of waiting forever.
    pub fn spawn(self: &Arc<Self>, name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let me = Arc::downgrade(self);
        let cancel = self.cancel.clone();
        let thread_name = name.clone();
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
                    let why = format!("thread {thread_name} panicked: {}", panic_message(p.as_ref()));
                    if let Some(run) = me.upgrade() {
                        lock(&run.dead).get_or_insert(why);
                    }
                    cancel.store(true, Ordering::Release);
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start a thread: {e}")))?;
        lock(&self.threads).push(h);
        Ok(())
    }

    /// Says that the producer has queued its last slot: once the queue is drained and closed,
    /// a wait ends with [`Wait::Cancelled`] (the end of the pass) rather than an error.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
    }

    /// Marks the run stale (`why` says what replaced it) and shuts it down.
    pub fn make_stale(&self, why: &str) {
        lock(&self.stale).get_or_insert_with(|| why.to_string());
        self.shutdown();
    }

    /// The error for a stale run, if it is one.
    pub fn stale_error(&self) -> Option<Error> {
        lock(&self.stale).as_ref().map(|why| Error::Stale(why.clone()))
    }

    /// The error for a run whose thread died, if one did.
    pub fn death_error(&self) -> Option<Error> {
        lock(&self.dead).as_ref().map(|why| Error::Internal(format!("{why} (please report this)")))
    }

    /// Stops the threads and returns every slot the run holds to the pool; idempotent.
    pub fn shutdown(&self) {
        self.cancel.store(true, Ordering::Release);
        let threads: Vec<_> = lock(&self.threads).drain(..).collect();
        let me = std::thread::current().id();
        for t in threads {
            // A worker never shuts its own run down, but be safe: never join oneself.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        if let Some(rx) = lock(&self.done_rx).take() {
            for slot in rx.try_iter() {
                let _ = self.free_tx.send(slot);
            }
        }
        for p in lock(&self.pending).iter_mut() {
            if let Some(slot) = p.take() {
                let _ = self.free_tx.send(slot);
            }
        }
    }

    /// Waits for the slot of batch `batch` (`batch_of` reads a slot's batch number), until
    /// `deadline`. Before the wait and on every poll step, `held_all` may grow the pool or
    /// return an error (the consumer holds every slot, so none can come); a dead thread or a
    /// stale run is an error too.
    pub fn wait_for(
        &self,
        batch: usize,
        deadline: Option<Instant>,
        batch_of: impl Fn(&S) -> usize,
        held_all: impl Fn() -> Option<Error>,
    ) -> Result<Wait<S>> {
        if let Some(e) = self.stale_error() {
            return Err(e);
        }
        let mut pending = lock(&self.pending);
        let n = pending.len();
        if let Some(s) = pending[batch % n].take() {
            return Ok(Wait::Slot(s));
        }
        let guard = lock(&self.done_rx);
        let Some(rx) = guard.as_ref() else {
            drop(guard);
            drop(pending);
            return self.ended();
        };
        // A consumer that holds every slot gets one more (or the error) now, not after a poll
        // step: no slot can be on its way, and `list(loader)` would pay a step per batch.
        if let Some(e) = held_all() {
            return Err(e);
        }
        loop {
            if self.cancelled() {
                drop(guard);
                drop(pending);
                return self.ended();
            }
            let step = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(POLL),
                None => POLL,
            };
            match rx.recv_timeout(step) {
                Ok(slot) => {
                    let b = batch_of(&slot);
                    if b == batch {
                        return Ok(Wait::Slot(slot));
                    }
                    // The producers hold at most the pool's base slots, taken in batch order
                    // (`Kind::start`), so a batch that finished early is one of the next `n`.
                    match pending.get_mut(b % n).filter(|_| b > batch && b < batch + n) {
                        Some(p @ None) => *p = Some(slot),
                        _ => {
                            let _ = self.free_tx.send(slot);
                            return Err(Error::Internal(format!(
                                "batch {b} arrived twice or out of range while waiting for {batch} (a run holds the \
                                 next {n} batches: the producer took its free slots out of batch order; please \
                                 report this)"
                            )));
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(e) = held_all() {
                        return Err(e);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(Wait::TimedOut);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    drop(guard);
                    drop(pending);
                    // A panicking worker drops its senders while unwinding, before `spawn`
                    // records why and cancels the run: give it a moment to say why.
                    let t0 = Instant::now();
                    while !self.cancelled()
                        && !self.finished.load(Ordering::Acquire)
                        && t0.elapsed() < Duration::from_secs(1)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    return match self.ended()? {
                        Wait::Cancelled if !self.cancelled() && !self.finished.load(Ordering::Acquire) => {
                            Err(Error::Internal(
                                "worker threads stopped before the epoch ended (please report this)".into(),
                            ))
                        }
                        w => Ok(w),
                    };
                }
            }
        }
    }

    /// What a run that cannot deliver any more says: why it is stale, why a thread died, or
    /// that it was cancelled.
    fn ended(&self) -> Result<Wait<S>> {
        if let Some(e) = self.stale_error() {
            return Err(e);
        }
        if let Some(e) = self.death_error() {
            return Err(e);
        }
        Ok(Wait::Cancelled)
    }
}

impl<S> Drop for Run<S> {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::bounded;

    /// A pool of `n` slots that are just batch numbers (a slot taken from the pool becomes the
    /// batch it holds).
    fn pool(n: usize) -> (Sender<usize>, Receiver<usize>) {
        let (tx, rx) = bounded(n);
        for _ in 0..n {
            tx.send(usize::MAX).unwrap();
        }
        (tx, rx)
    }

    fn no_check() -> Option<Error> {
        None
    }

    /// A producer that fills batches `0..end` from the pool, finishing them out of order.
    fn produce(run: &Arc<Run<usize>>, done: Sender<usize>, free: Receiver<usize>, end: usize) {
        let cancel = run.cancel_flag();
        run.spawn("test-producer".into(), move || {
            let mut held = vec![];
            for b in 0..end {
                let _ = loop {
                    if cancel.load(Ordering::Acquire) {
                        return;
                    }
                    if let Ok(s) = free.recv_timeout(POLL) {
                        break s;
                    }
                };
                held.push(b);
                // Finish in pairs, the second first.
                if held.len() == 2 || b + 1 == end {
                    while let Some(s) = held.pop() {
                        if done.send(s).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .unwrap();
    }

    #[test]
    fn delivers_in_order_and_returns_every_slot() {
        let (free_tx, free_rx) = pool(4);
        let (run, done) = Run::new(4, free_tx.clone());
        produce(&run, done, free_rx.clone(), 10);
        for b in 0..10 {
            match run.wait_for(b, None, |s| *s, no_check).unwrap() {
                Wait::Slot(s) => {
                    assert_eq!(s, b);
                    free_tx.send(s).unwrap();
                }
                other => panic!("batch {b}: {other:?}"),
            }
        }
        run.shutdown();
        assert_eq!(free_rx.len(), 4, "every slot is back in the pool");
    }

    #[test]
    fn a_batch_past_the_window_is_an_error_not_a_wrong_delivery() {
        // Slots taken out of order: batch 3 of a 3-slot run arrives while batch 0 is awaited.
        // Parked at 3 % 3 it would be delivered as batch 0.
        let (free_tx, free_rx) = pool(3);
        let (run, done) = Run::new(3, free_tx);
        free_rx.recv().unwrap();
        done.send(3).unwrap();
        let e = run.wait_for(0, None, |s| *s, no_check).unwrap_err().to_string();
        assert!(e.contains("batch 3 arrived") && e.contains("out of batch order"), "{e}");
        run.shutdown();
    }

    #[test]
    fn consumer_holding_every_slot_is_an_error_not_a_hang() {
        let (free_tx, free_rx) = pool(2);
        let (run, done) = Run::new(2, free_tx);
        produce(&run, done, free_rx.clone(), 10);
        let mut held = vec![];
        let err = loop {
            let free = free_rx.len();
            let check = || (free == 0 && held.len() == 2).then(|| Error::Memory("all held".into()));
            match run.wait_for(held.len(), None, |s| *s, check) {
                Ok(Wait::Slot(s)) => held.push(s),
                Ok(other) => panic!("{other:?}"),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::Memory(_)), "{err}");
        assert_eq!(held.len(), 2);
    }

    #[test]
    fn a_dead_worker_is_an_error_not_a_hang() {
        let (free_tx, _free_rx) = pool(2);
        let (run, done) = Run::new(2, free_tx);
        run.spawn("test-worker".into(), move || {
            let _keep = done;
            panic!("boom at sample 7");
        })
        .unwrap();
        let t0 = Instant::now();
        let err = run.wait_for(0, None, |s: &usize| *s, no_check).unwrap_err().to_string();
        assert!(err.contains("boom at sample 7") && err.contains("please report"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn cancel_mid_flight_and_shutdown_from_another_thread_return_the_slots() {
        let (free_tx, free_rx) = pool(3);
        let (run, done) = Run::new(3, free_tx.clone());
        produce(&run, done, free_rx.clone(), 1000);
        match run.wait_for(0, None, |s| *s, no_check).unwrap() {
            Wait::Slot(s) => free_tx.send(s).unwrap(),
            other => panic!("{other:?}"),
        }
        let r2 = run.clone();
        let stopper = std::thread::spawn(move || r2.make_stale("a newer iteration started"));
        stopper.join().unwrap();
        let err = run.wait_for(1, None, |s| *s, no_check).unwrap_err();
        assert!(matches!(err, Error::Stale(_)) && err.to_string().contains("newer iteration"), "{err}");
        run.shutdown(); // idempotent
        assert_eq!(free_rx.len(), 3, "every slot is back in the pool");
    }

    #[test]
    fn drop_during_a_wait_ends_the_wait() {
        let (free_tx, _free_rx) = pool(1);
        let (run, _done) = Run::new(1, free_tx);
        let r2 = run.clone();
        let waiter = std::thread::spawn(move || r2.wait_for(0, None, |s: &usize| *s, no_check).map(|_| ()));
        std::thread::sleep(Duration::from_millis(50));
        run.shutdown();
        assert!(waiter.join().unwrap().is_ok(), "a cancelled wait ends without an error");
    }

    #[test]
    fn a_finished_producer_delivers_its_queue_then_ends() {
        let (free_tx, free_rx) = pool(3);
        let (run, done) = Run::new(3, free_tx.clone());
        let me = Arc::downgrade(&run);
        run.spawn("test-finisher".into(), move || {
            for b in 0..2 {
                let _ = free_rx.recv().unwrap();
                done.send(b).unwrap();
            }
            me.upgrade().unwrap().finish();
        })
        .unwrap();
        for b in 0..2 {
            assert!(matches!(run.wait_for(b, None, |s| *s, no_check), Ok(Wait::Slot(s)) if s == b));
        }
        assert!(matches!(run.wait_for(2, None, |s| *s, no_check), Ok(Wait::Cancelled)));
        // Without `finish`, the same early end is an error (see `a_dead_worker...`).
        let (run, done) = Run::new(1, free_tx);
        drop(done);
        let err = run.wait_for(0, None, |s: &usize| *s, no_check).unwrap_err();
        assert!(err.to_string().contains("stopped before the epoch ended"), "{err}");
    }

    #[test]
    fn a_deadline_times_out() {
        let (free_tx, _free_rx) = pool(1);
        let (run, _done) = Run::new(1, free_tx);
        let w = run.wait_for(0, Some(Instant::now() + Duration::from_millis(30)), |s: &usize| *s, no_check);
        assert!(matches!(w, Ok(Wait::TimedOut)));
    }
}
