//! The `Iterator` class, and the waiting that every iteration class shares: the GIL released
//! in short steps, Ctrl-C checked between them and raised from the call that waited, and
//! iterations inherited through `fork()` let go untouched.

use crate::batch::PyBatch;
use crate::device;
use crate::errors;
use pyo3::prelude::*;
use std::sync::Mutex;
use std::time::Duration;
use stoker::{EpochIter, Next};

/// How long one wait lasts before Python gets a chance to handle signals (Ctrl-C).
pub(crate) const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// An image iteration: from the host pool, or through the transfer stage.
pub(crate) type Iter = device::Iter<EpochIter>;

/// An iteration over (the rest of) an epoch. Waits release the GIL; Ctrl-C is honoured
/// between 50 ms waits and stops every worker thread.
#[pyclass(frozen, weakref, name = "Iterator", module = "stoker._stoker")]
pub struct PyIter {
    inner: Mutex<Option<Iter>>,
    pid: u32,
}

impl PyIter {
    /// The Python iterator of a started iteration, bound to this process.
    pub(crate) fn new(it: Iter) -> Self {
        PyIter { inner: Mutex::new(Some(it)), pid: std::process::id() }
    }
}

/// The next item of a native iteration, waiting with the GIL released in short steps so that
/// Ctrl-C (checked between steps) stops the iteration and joins its threads. The iteration is
/// dropped when it ends or fails; an iteration inherited through `fork()` is refused.
///
/// Signals are checked after every step, whatever it gave: a Ctrl-C that arrived while stoker
/// waited (for a batch, or for the threads of a finished epoch to be joined) is raised from this
/// call. Left pending, it would be raised at the interpreter's next check, which may be inside a
/// finalizer or a weakref callback that runs when the finished iterator is freed; Python reports
/// an exception there as "unraisable" and goes on, so the Ctrl-C would be lost. A batch in hand
/// when the signal is found is dropped (its buffer returns to the pool): it counts as delivered,
/// as it would if the interrupt had come one bytecode later.
pub(crate) fn next_polling<I: Send, B: Send>(
    py: Python<'_>,
    inner: &Mutex<Option<I>>,
    pid: u32,
    poll: impl Fn(&mut I) -> Next<B> + Sync,
) -> PyResult<Option<B>> {
    if std::process::id() != pid {
        return Err(errors::to_py(stoker::Error::Internal(
            "this iteration was started in another process (before a fork); start a new one".into(),
        )));
    }
    loop {
        let step = py.detach(|| {
            let mut guard = inner.lock().unwrap_or_else(|p| p.into_inner());
            let Some(it) = guard.as_mut() else { return Next::End };
            let r = poll(it);
            if matches!(r, Next::End | Next::Item(Err(_))) {
                guard.take();
            }
            r
        });
        if let Err(interrupt) = py.check_signals() {
            let it = inner.lock().unwrap_or_else(|p| p.into_inner()).take();
            py.detach(move || {
                drop(step);
                drop(it);
            });
            return Err(interrupt);
        }
        match step {
            Next::Item(Ok(b)) => return Ok(Some(b)),
            Next::Item(Err(e)) => return Err(errors::to_py(e)),
            Next::End => return Ok(None),
            Next::NotYet => {}
        }
    }
}

#[pymethods]
impl PyIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        errors::contain(|| {
            Ok(next_polling(py, &self.inner, self.pid, |it| it.next_timeout(SIGNAL_POLL))?.map(PyBatch::new))
        })
    }

    /// Stops the iteration now (joins every worker thread, GIL released). In a fork child the
    /// inherited iteration is let go without touching its threads, which live in the parent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        release(py, &self.inner, self.pid);
        py.check_signals()
    }
}

impl Drop for PyIter {
    fn drop(&mut self) {
        forget_if_inherited(&mut self.inner, self.pid);
    }
}

/// Raises a Ctrl-C that arrived while stoker waited with the GIL released from the call that
/// waited (see [`next_polling`] for why it must not be left pending); `held` is let go first,
/// with the GIL released.
pub(crate) fn raise_pending_signal<T: Send>(py: Python<'_>, held: T) -> PyResult<T> {
    match py.check_signals() {
        Ok(()) => Ok(held),
        Err(interrupt) => {
            py.detach(move || drop(held));
            Err(interrupt)
        }
    }
}

/// Ends an iteration now: its threads are joined with the GIL released. An iteration
/// inherited through `fork()` is forgotten instead: its threads exist only in the parent, so
/// joining them (or freeing what they use) in the child would panic or hang.
pub(crate) fn release<I: Send>(py: Python<'_>, inner: &Mutex<Option<I>>, pid: u32) {
    let it = inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    if std::process::id() != pid {
        std::mem::forget(it);
        return;
    }
    py.detach(move || drop(it));
}

/// For `Drop`: forgets an iteration inherited through `fork()` (see [`release`]).
pub(crate) fn forget_if_inherited<I>(inner: &mut Mutex<Option<I>>, pid: u32) {
    if std::process::id() != pid {
        let it = inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        std::mem::forget(it);
    }
}
