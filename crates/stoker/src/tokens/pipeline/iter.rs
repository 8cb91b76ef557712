//! [`TokenIter`]: one pass of the token loader over the shell's [`Pass`].

use super::batch::TokenBatch;
use super::shared::Shared;
use super::slot::TokenSlot;
use super::state::TokenPosition;
use crate::error::Result;
use crate::shell::pass::{Next, Pass, PassHooks};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The token kind adds nothing to a pass: its position advances with each delivered slot (the
/// producer decides the end, which [`TokenIter`] sees, and writes the trace then).
pub(super) struct TokenHooks;

impl PassHooks for TokenHooks {}

/// One pass over (the rest of) an epoch, or for ever with `infinite`.
pub struct TokenIter {
    pub(super) shared: Arc<Shared>,
    pub(super) position: Arc<TokenPosition>,
    pub(super) pass: Pass<Arc<TokenSlot>, TokenHooks>,
}

impl std::fmt::Debug for TokenIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIter").field("next", &self.pass.next_batch()).finish()
    }
}

impl TokenIter {
    /// Like `next`, but gives up after `timeout` ([`Next::NotYet`]).
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<TokenBatch> {
        self.poll(Some(Instant::now() + timeout))
    }

    pub(super) fn poll(&mut self, deadline: Option<Instant>) -> Next<TokenBatch> {
        let t0 = Instant::now();
        let got = self.pass.poll(deadline);
        self.shared.stats.wait_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let shared = &self.shared;
        if matches!(got, Next::End) {
            // The pass ended (the trace's writer skips a ring with nothing new).
            if let Err(e) = shared.write_trace() {
                eprintln!("stoker: {e}"); // the iteration has ended well: no caller to return it to
            }
        }
        got.map(|slot| {
            shared.span("consumer wait", t0, &[("batch", slot.batch.load(Ordering::Relaxed) as f64)]);
            let s = &shared.stats;
            let wait = s.wait_ns.load(Ordering::Relaxed);
            let since = s.started.get().map_or(0, |t| t.elapsed().as_nanos() as u64);
            shared.tuner.on_batch_load(crate::tune::Load {
                consumer_wait_ns: wait,
                consumer_busy_ns: since.saturating_sub(wait),
                worker_busy_ns: s.tokenize_ns.load(Ordering::Relaxed),
            });
            let at = slot.after.lock().unwrap_or_else(|p| p.into_inner()).0;
            self.position.advance(at);
            TokenBatch { slot: Some(slot), shared: shared.clone() }
        })
    }

    /// Stops the iteration now (every thread joined).
    pub fn close(&mut self) {
        self.pass.shutdown();
    }
}

impl Iterator for TokenIter {
    type Item = Result<TokenBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.poll(None).into_item()
    }
}
