//! [`Tokens`]: what a token loader and the threads of its passes share (source, tokenizer,
//! config, pool, counters, trace, token cache, tuner).

use super::config::TokenConfig;
use super::order::RowsMemo;
use super::slot::TokenSlot;
use super::stats::TokenStats;
use crate::shell::grow::SlotPool;
use crate::tokens::corpus::DocSource;
use crate::tokens::tokenizer::TextTokenizer;
use std::sync::Arc;
use std::time::Instant;

/// The token kind: what a token loader and the threads of its passes share.
pub struct Tokens {
    pub(super) source: DocSource,
    pub(super) tokenizer: Option<TextTokenizer>,
    pub(super) config: TokenConfig,
    pub(super) threads: usize,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) pad: u32,
    pub(super) pool: SlotPool<Arc<TokenSlot>>,
    pub(super) stats: Arc<TokenStats>,
    /// The consumer's counters (waits and steps), which the shell's pass records.
    pub(super) telemetry: Arc<crate::observe::telemetry::Telemetry>,
    /// Rows per rank of token files, for the last epoch asked.
    pub(super) rows: RowsMemo,
    /// The trace, when asked for.
    pub(super) tracer: Option<Arc<crate::observe::trace::Tracer>>,
    /// The automatic token cache, when asked for.
    pub(super) autocache: Option<crate::tokens::autocache::TokenCache>,
    /// `threads="auto"`: how many tokenizer threads take work (see [`crate::observe::tune`]); a fixed
    /// count keeps them all working.
    pub(super) tuner: crate::observe::tune::Tuner,
}

impl Tokens {
    /// Records a span on the trace, when there is one.
    pub(super) fn span(&self, name: &'static str, start: Instant, args: &[(&str, f64)]) {
        if let Some(t) = &self.tracer {
            t.span(name, "tokens", start, Instant::now(), crate::observe::trace::Args::numbers(args));
        }
    }
}
