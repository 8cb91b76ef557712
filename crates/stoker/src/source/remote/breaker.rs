//! Whether a store answers: the text of its errors, whether an error means it did not answer,
//! and the circuit breaker per store (see `remote.rs`'s module doc), with the stop flag that
//! abandons a reader's requests in flight.

use super::*;

/// An object-store error with its causes (`... error sending request: operation timed out`):
/// the top-level message alone often hides what went wrong.
pub(super) fn describe(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text = format!("{text}: {c_text}");
        }
        cause = c.source();
    }
    text
}

/// Whether `e` says the store did not answer: a timeout, or a connection that could not be
/// made or broke (as opposed to an answer, even an error status).
pub(super) fn unreachable(e: &object_store::Error) -> bool {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h) = c.downcast_ref::<HttpError>() {
            return matches!(
                h.kind(),
                HttpErrorKind::Timeout | HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Interrupted
            );
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::TimedOut | K::ConnectionRefused | K::ConnectionReset | K::ConnectionAborted | K::NotConnected
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

/// Requests that fail in a row with a timeout or a connection failure, each after its own
/// retries, before the circuit of their store opens.
pub(super) const TRIP_AFTER: u32 = 2;

/// The circuit breaker of one store (see the module doc).
pub(super) struct Breaker {
    /// The store, for messages (`scheme://authority`).
    base: String,
    /// How long an open circuit fails requests at once before one probes the store.
    cooldown: Duration,
    state: Mutex<Circuit>,
    /// Wakes the requests in flight when the circuit opens, so that they are abandoned.
    opened: tokio::sync::Notify,
}

#[derive(Debug, Default)]
pub(super) struct Circuit {
    /// Requests that failed in a row without an answer.
    failures: u32,
    /// Since when the circuit is open, and why (the last failure); `None`: closed.
    open: Option<(Instant, String)>,
    /// A probe of an open circuit is in flight.
    probing: bool,
}

/// What [`Breaker::admit`] lets a request do.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// Go ahead (the circuit is closed).
    Go,
    /// Go ahead as the one probe of an open circuit.
    Probe,
}

pub(super) fn lock(m: &Mutex<Circuit>) -> std::sync::MutexGuard<'_, Circuit> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Breaker {
    pub(super) fn new(base: &str, cooldown: Duration) -> Self {
        Breaker {
            base: base.to_string(),
            cooldown,
            state: Mutex::new(Circuit::default()),
            opened: tokio::sync::Notify::new(),
        }
    }

    /// Whether the circuit is closed now (the store answers).
    pub(super) fn closed(&self) -> bool {
        lock(&self.state).open.is_none()
    }

    /// The error of a request refused or abandoned because the circuit is open.
    fn refusal(&self, since: Instant, why: &str, now: Instant) -> String {
        let wait = self.cooldown.saturating_sub(now.saturating_duration_since(since));
        format!(
            "object store {} is not answering: {TRIP_AFTER} requests in a row failed (the last: {why}); \
             failing at once, the store is tried again in {:.1} s",
            self.base,
            wait.as_secs_f64()
        )
    }

    /// Whether a request may be sent now; `Err`: the circuit is open, with the error to give.
    pub(super) fn admit(&self, now: Instant) -> std::result::Result<Admit, String> {
        let mut c = lock(&self.state);
        match &c.open {
            None => Ok(Admit::Go),
            Some((since, why)) => {
                if c.probing || now.saturating_duration_since(*since) < self.cooldown {
                    Err(self.refusal(*since, why, now))
                } else {
                    c.probing = true;
                    Ok(Admit::Probe)
                }
            }
        }
    }

    /// Records how a request ended: `Some(why)` when the store did not answer, `None` when it
    /// did (successfully or not). Opens the circuit on the [`TRIP_AFTER`]th failure in a row
    /// (or on a failed probe) and wakes the requests in flight.
    pub(super) fn record(&self, admit: &Admit, failure: Option<String>, now: Instant) {
        let mut c = lock(&self.state);
        if *admit == Admit::Probe {
            c.probing = false;
        }
        match failure {
            None => *c = Circuit::default(),
            Some(why) => {
                c.failures = c.failures.saturating_add(1);
                let reopen = c.open.is_some() && *admit == Admit::Probe;
                if reopen || (c.open.is_none() && c.failures >= TRIP_AFTER) {
                    c.open = Some((now, why));
                    drop(c);
                    self.opened.notify_waiters();
                }
            }
        }
    }

    /// The error for a request abandoned because the circuit opened while it was in flight.
    fn abandoned(&self) -> String {
        let c = lock(&self.state);
        match &c.open {
            Some((since, why)) => self.refusal(*since, why, Instant::now()),
            None => format!("object store {}: request abandoned", self.base),
        }
    }

    /// Runs one request on `rt` under the breaker ([`Breaker::run`], waited for on this thread).
    pub(super) fn call<T>(
        &self,
        rt: &tokio::runtime::Runtime,
        request: impl Future<Output = object_store::Result<T>>,
        stop: impl Future<Output = ()>,
    ) -> std::result::Result<T, RequestFailure> {
        rt.block_on(self.run(request, stop))
    }

    /// Runs one request under the breaker: refused at once while the circuit is open,
    /// abandoned as soon as it opens, or as soon as `stop` completes (the caller's loader is
    /// stopping: [`RequestFailure::Stopped`]). The error is the request's, with its causes.
    pub(super) async fn run<T>(
        &self,
        request: impl Future<Output = object_store::Result<T>>,
        stop: impl Future<Output = ()>,
    ) -> std::result::Result<T, RequestFailure> {
        use futures::future::{select, Either};
        // Registered before the circuit is checked, so that an opening in between is seen.
        let opened = self.opened.notified();
        let admit = self.admit(Instant::now()).map_err(RequestFailure::Refused)?;
        let out = {
            let request = std::pin::pin!(request);
            let opened = std::pin::pin!(opened);
            let stop = std::pin::pin!(stop);
            match select(request, select(opened, stop)).await {
                Either::Left((r, _)) => Ok(r),
                Either::Right((Either::Left(_), _)) => Err(false),
                Either::Right((Either::Right(_), _)) => Err(true),
            }
        };
        match out {
            Ok(Ok(v)) => {
                self.record(&admit, None, Instant::now());
                Ok(v)
            }
            Ok(Err(e)) => {
                let text = describe(&e);
                self.record(&admit, unreachable(&e).then(|| text.clone()), Instant::now());
                Err(RequestFailure::Failed(e, text))
            }
            Err(stopped) => {
                if admit == Admit::Probe {
                    lock(&self.state).probing = false;
                }
                if stopped {
                    return Err(RequestFailure::Stopped(format!("object store {}: request abandoned", self.base)));
                }
                Err(RequestFailure::Refused(self.abandoned()))
            }
        }
    }
}

/// Why a request under a [`Breaker`] gave no result.
pub(super) enum RequestFailure {
    /// The request failed: the error and its text with causes.
    Failed(object_store::Error, String),
    /// Not sent, or abandoned: the circuit of the store is open.
    Refused(String),
    /// Abandoned because the caller is stopping.
    Stopped(String),
}

impl RequestFailure {
    pub(super) fn text(self) -> String {
        match self {
            RequestFailure::Failed(_, t) | RequestFailure::Refused(t) | RequestFailure::Stopped(t) => t,
        }
    }

    /// Whether the store did not answer: the circuit is open, or the request got no answer
    /// (a time-out or a failed connection, after its retries).
    pub(super) fn store_down(&self) -> bool {
        match self {
            RequestFailure::Refused(_) => true,
            RequestFailure::Failed(e, _) => unreachable(e),
            RequestFailure::Stopped(_) => false,
        }
    }

    /// The failure as an I/O error of a sequential read of `what` (text and token data): a
    /// store that did not answer carries an [`Unavailable`] that [`unavailable`] finds again
    /// above. A reader that goes through its objects in order cannot go on without this one,
    /// and skipping its documents would lose them silently: unlike a sample read (whose
    /// neighbours are read in parallel, and which the circuit stops), the first unanswered
    /// request ends the pass.
    pub(super) fn into_io(self, what: &str) -> std::io::Error {
        if self.store_down() {
            return std::io::Error::other(Unavailable(format!("{what}: {}", self.text())));
        }
        std::io::Error::other(format!("{what}: {}", self.text()))
    }
}

/// The store of an object is not answering (its circuit is open): not a fault of one
/// document or sample, so it ends a pass instead of being skipped ([`Error::Unavailable`]).
#[derive(Debug)]
pub(super) struct Unavailable(String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The message of an I/O error that says a store is not answering ([`RequestFailure::into_io`]),
/// if it is one.
pub fn unavailable(e: &std::io::Error) -> Option<String> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Unavailable>()).map(|u| u.0.clone())
}

/// The circuit breaker of each store this process reads (by `scheme://authority` and request
/// timeout): every reader of a store shares one, so a store that stops answering is paid
/// about two request bounds in all, not two per object or per document.
pub(super) fn breaker_for(base: &str, cooldown: Duration) -> Arc<Breaker> {
    type Breakers = Mutex<std::collections::HashMap<(String, Duration), Arc<Breaker>>>;
    static BREAKERS: std::sync::OnceLock<Breakers> = std::sync::OnceLock::new();
    let mut all = BREAKERS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    all.entry((base.to_string(), cooldown)).or_insert_with(|| Arc::new(Breaker::new(base, cooldown))).clone()
}

thread_local! {
    /// The stop flag of the loader thread running on this thread ([`with_stop`]).
    pub(super) static STOP: std::cell::RefCell<Option<Arc<AtomicBool>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `stop` as the stop flag of every [`ObjectReader`] opened in it on this
/// thread: once the flag is set, their requests in flight are abandoned within [`STOP_POLL`],
/// so a loader that is dropped while its reader thread waits on a store does not wait for
/// the request's time bound.
pub fn with_stop<T>(stop: Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    let old = STOP.with(|s| s.replace(Some(stop)));
    let out = f();
    STOP.with(|s| *s.borrow_mut() = old);
    out
}

/// How often a request in flight looks at its reader's stop flag.
pub(super) const STOP_POLL: Duration = Duration::from_millis(20);

/// Completes once `flag` is set (never without one).
pub(super) async fn stopped(flag: Option<Arc<AtomicBool>>) {
    match flag {
        Some(f) => {
            while !f.load(Ordering::Acquire) {
                tokio::time::sleep(STOP_POLL).await;
            }
        }
        None => futures::future::pending().await,
    }
}
