//! What a fetch of shard bytes gives and takes, shared by the storages
//! ([`super::shard_storage`], [`super::remote`]), the readahead ([`super::readahead`]) and the
//! shard cache ([`super::shard_cache`]): why a read failed, a fetch's result, where a body goes
//! as it arrives, and the two traits (start a fetch; keep parts between passes). A leaf: it
//! imports nothing of the engine.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Why a read of shard bytes failed.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// This read failed (the text says why).
    Failed(String),
    /// The storage is not answering (an object store whose circuit is open): every read
    /// would fail the same way, so the pass ends ([`Error::Unavailable`]).
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    Unavailable(String),
}

impl From<String> for ReadFailure {
    fn from(why: String) -> Self {
        ReadFailure::Failed(why)
    }
}

/// The result of a fetch, given to [`PartFetch::start`]'s callback.
pub(crate) struct Fetched {
    /// The bytes, or why there are none (on success, empty when they went to the fetch's
    /// [`Sink`] as they came).
    pub bytes: std::result::Result<Vec<u8>, ReadFailure>,
    /// From sending the request (its last attempt) to the first byte of the answer.
    pub latency: Duration,
    /// From sending the last attempt to the last byte.
    pub total: Duration,
    /// Attempts answered `503 SlowDown`, `429` or another retryable status before this result.
    pub throttled: u32,
}

/// Where parts come from: starts one fetch of a byte range and calls back when it ends.
pub(crate) trait PartFetch: Send + Sync {
    /// Starts fetching bytes `range` of shard `shard`; `done` is called exactly once, on any
    /// thread, with the result (also when the fetch is abandoned: with a failure). A fetch
    /// retries what is worth retrying (throttling, server errors) itself.
    /// The body is given to `sink` as it arrives (a part is read from while it fills).
    fn start(&self, shard: usize, range: Range<u64>, stop: Arc<std::sync::atomic::AtomicBool>, sink: Sink, done: Done);
}

/// A fetch's callback.
pub(crate) type Done = Box<dyn FnOnce(Fetched) + Send>;

/// What a fetch hands over as its answer arrives.
pub(crate) enum Chunk<'a> {
    /// An attempt starts (again): what came before is void.
    Restart,
    /// The next bytes of the body.
    Bytes(&'a [u8]),
}

/// Where a fetch puts its body as it arrives.
pub(crate) type Sink = Arc<dyn Fn(Chunk<'_>) + Send + Sync>;

/// Parts kept on local storage between passes (the shard cache: [`super::shard_cache`]).
pub(crate) trait PartStore: Send + Sync {
    /// The bytes of part `range` of shard `shard`, when stored and intact.
    fn get(&self, shard: usize, range: &Range<u64>) -> Option<Vec<u8>>;
    /// Stores them (on a thread of its own; nothing when the budget is spent).
    fn put(self: Arc<Self>, shard: usize, range: Range<u64>, bytes: Arc<Vec<u8>>);
}
