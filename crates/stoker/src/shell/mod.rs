//! The loader shell: what every kind of loader (images, arrays, tokens, the CUDA transfer stage)
//! shares instead of keeping its own copy.
//!
//! - [`kind`]: the one [`kind::Loader`] and [`kind::Iter`] of every kind; a [`kind::Kind`]
//!   brings its position, its threads of a pass (the shell starts every pass) and what a
//!   delivered slot becomes, and its batch meets [`kind::HostBatch`], the contract the CUDA
//!   stage copies.
//! - [`sampler`]: the seeded per-epoch order, rank sharding with equal batch counts, the
//!   resumable position, the elastic base that continues an epoch on another number of ranks,
//!   and the fingerprint a saved state must match.
//! - [`buffer`]: the pool of batch buffers (the memory cap and the backpressure).
//! - [`grow`]: how every pool grows past its base slots while the consumer keeps batches,
//!   within the memory limit, and shrinks back when they are given back.
//! - [`ordered`]: one iteration's threads, the finished-slot queue and reorder buffer, the one
//!   free-slot wait and the one "all buffers held" error, prompt shutdown, stale runs.
//! - [`pass`]: the consumer's side of a run: in-order delivery, the failure budget, stale and
//!   dead-thread errors, the held-buffer check, the consumer's telemetry and trace; [`pass::Next`]
//!   is what one poll gives.
//! - [`stream`]: the one iterator over a pass (a kind's, a transfer stage's): a delivered slot
//!   made the consumer's batch, polls with a time-out, closing.
//! - [`resume`]: a kind's saved state ([`resume::Resumable`]) and the loader's state surface
//!   over it, written once: state dicts, restoring, continuing every saved rank's state.
//! - [`sampled`]: the kinds over the sampler (images, arrays) and their one saved state.
//! - [`epochs`]: epoch, position (any kind's [`epochs::Positioned`]), `state_dict`/
//!   `load_state_dict` and the running iteration a newer one makes stale.
//! - [`mix`]: weighted mixtures of sources: the schedule that gives every position its source
//!   with exact shares at every prefix, and the per-rank order over the sources' passes.
//! - [`rng`]: the per-sample random generator seeded by `(seed, epoch, index)`, so batches do
//!   not depend on the thread count.
//! - [`store`]: cache groups on the host (the decoded-pixel and token caches): roots, one byte
//!   budget shared by every group, eviction of idle groups, time to live, locks with deadlines.
//!
//! Owns: order, position, buffers, delivery. May not touch: what a sample is (pixels, rows):
//! a loader kind brings that.

pub mod buffer;
pub mod epochs;
pub mod grow;
pub mod kind;
pub mod mix;
pub mod ordered;
pub mod pass;
pub mod resume;
pub mod rng;
pub mod sampled;
pub mod sampler;
pub mod store;
pub mod stream;
