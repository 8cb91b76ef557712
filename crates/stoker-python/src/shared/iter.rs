//! What every iterator class shares, written once: the waiting (the GIL released in short
//! steps, Ctrl-C checked between them and raised from the call that waited), iterations
//! inherited through `fork()` let go untouched, and the `__iter__`/`__next__`/`close` methods
//! ([`iterator_class!`]).

use crate::errors;
use crate::shared::device::{Held, HostIter, Iter};
use pyo3::prelude::*;
use std::sync::Mutex;
use std::time::Duration;
use stoker::Next;

/// How long one wait lasts before Python gets a chance to handle signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// A started iteration as an iterator class holds it: bound to the process that started it,
/// taken (and its threads joined) when it ends, fails, is closed or is interrupted.
pub(crate) struct Polled<H: HostIter> {
    inner: Mutex<Option<Iter<H>>>,
    pid: u32,
}

impl<H: HostIter> Polled<H> {
    /// Holds a started iteration, bound to this process.
    pub(crate) fn new(it: Iter<H>) -> Self {
        Polled { inner: Mutex::new(Some(it)), pid: std::process::id() }
    }

    /// The next batch, waiting with the GIL released in short steps so that Ctrl-C (checked
    /// between steps) stops the iteration and joins its threads. The iteration is dropped
    /// when it ends or fails; an iteration inherited through `fork()` is refused.
    ///
    /// Signals are checked after every step, whatever it gave: a Ctrl-C that arrived while
    /// stoker waited (for a batch, or for the threads of a finished epoch to be joined) is
    /// raised from this call. Left pending, it would be raised at the interpreter's next check,
    /// which may be inside a finalizer or a weakref callback that runs when the finished
    /// iterator is freed; Python reports an exception there as "unraisable" and goes on, so the
    /// Ctrl-C would be lost. A batch in hand when the signal is found is dropped (its buffer
    /// returns to the pool): it counts as delivered, as it would if the interrupt had come one
    /// bytecode later.
    pub(crate) fn next(&self, py: Python<'_>) -> PyResult<Option<Held<H::Batch>>> {
        if std::process::id() != self.pid {
            return Err(errors::to_py(stoker::Error::Internal(
                "this iteration was started in another process (before a fork); start a new one".into(),
            )));
        }
        loop {
            let step = py.detach(|| {
                let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                let Some(it) = guard.as_mut() else { return Next::End };
                let r = it.next_timeout(SIGNAL_POLL);
                if matches!(r, Next::End | Next::Item(Err(_))) {
                    guard.take();
                }
                r
            });
            if let Err(interrupt) = py.check_signals() {
                let it = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
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

    /// Ends the iteration now: its threads are joined with the GIL released, then a Ctrl-C
    /// that came meanwhile is raised. An iteration inherited through `fork()` is forgotten
    /// instead: its threads exist only in the parent, so joining them (or freeing what they
    /// use) in the child would panic or hang.
    pub(crate) fn close(&self, py: Python<'_>) -> PyResult<()> {
        let it = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if std::process::id() != self.pid {
            std::mem::forget(it);
        } else {
            py.detach(move || drop(it));
        }
        py.check_signals()
    }
}

impl<H: HostIter> Drop for Polled<H> {
    /// Forgets an iteration inherited through `fork()` (see [`Polled::close`]); this process's
    /// own iteration is dropped as usual.
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            let it = self.inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
            std::mem::forget(it);
        }
    }
}

/// Raises a Ctrl-C that arrived while stoker waited with the GIL released from the call that
/// waited (see [`Polled::next`] for why it must not be left pending); `held` is let go first,
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

/// What an iterator class adds to the shared methods: how a delivered batch becomes its batch
/// class. The class keeps its iteration in a field `polled` ([`Polled`]).
pub(crate) trait IteratorClass {
    /// The engine's host iteration of this kind.
    type Host: HostIter;
    /// The batch class `__next__` returns.
    type Batch;
    /// The Python batch of a delivered batch.
    fn batch(&self, held: Held<<Self::Host as HostIter>::Batch>) -> Self::Batch;
}

/// An iterator class written once: `iterator_class!(PyIter: EpochIter => PyBatch, |it, held|
/// PyBatch::new(held))` for a class with a `polled` field over the host iteration `EpochIter`
/// makes its [`IteratorClass`] (a delivered batch `held` becomes the expression, `it` being the
/// iterator) and its `#[pymethods]` (`__iter__`, `__next__` and `close`).
macro_rules! iterator_class {
    ($class:ident : $host:ty => $batch:ty, |$it:pat_param, $held:ident| $make:expr) => {
        impl $crate::shared::iter::IteratorClass for $class {
            type Host = $host;
            type Batch = $batch;
            fn batch(
                &self,
                $held: $crate::shared::device::Held<<$host as $crate::shared::device::HostIter>::Batch>,
            ) -> $batch {
                let $it = self;
                $make
            }
        }

        #[::pyo3::pymethods]
        impl $class {
            fn __iter__(slf: ::pyo3::PyRef<'_, Self>) -> ::pyo3::PyRef<'_, Self> {
                slf
            }

            fn __next__(&self, py: ::pyo3::Python<'_>) -> ::pyo3::PyResult<Option<$batch>> {
                $crate::errors::contain(|| {
                    Ok(self.polled.next(py)?.map(|held| $crate::shared::iter::IteratorClass::batch(self, held)))
                })
            }

            /// Stops the iteration now (joins every worker thread, GIL released). In a fork
            /// child the inherited iteration is let go without touching its threads, which live
            /// in the parent.
            fn close(&self, py: ::pyo3::Python<'_>) -> ::pyo3::PyResult<()> {
                self.polled.close(py)
            }
        }
    };
}
pub(crate) use iterator_class;
