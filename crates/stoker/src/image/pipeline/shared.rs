//! [`Images`]: what a loader and the threads of its passes share (source, sampler, plan,
//! pool, telemetry, cache, tuner, scratch kept between epochs), the unit of per-sample work
//! ([`Task`]), and the helpers every file of the pipeline needs (the trace file, the dataset's
//! hash). It imports no other file of the pipeline but `config` and `report`; the files import
//! it.

use super::*;

/// The image kind: what a loader and the threads of its passes share.
pub struct Images {
    pub(super) source: Arc<dyn Source>,
    pub(super) sampler: Sampler,
    pub(super) plan: TransformPlan,
    pub(super) pool: BufferPool,
    /// The shell's counters (buffer wait, consumer, samples, skipped, device, transfer).
    pub(super) telemetry: Arc<Telemetry>,
    /// The image stages' counters.
    pub(super) counters: ImageCounters,
    /// The trace recorder, when tracing is on (checked once per event site).
    pub(super) tracer: Option<Arc<Tracer>>,
    pub(super) threads: usize,
    pub(super) io_threads: usize,
    /// Bytes of parts a pass over object storage may hold ([`super::config::readahead_bytes`]).
    pub(super) readahead: u64,
    /// What the report's storage section notes about the order (shards sorted by class).
    pub(super) order_note: Option<String>,
    pub(super) allowance: usize,
    pub(super) on_error: ErrorPolicy,
    pub(super) decode_opts: DecodeOptions,
    pub(super) max_file_bytes: u64,
    pub(super) max_failures: MaxFailures,
    /// The decoded-pixel cache, if any.
    pub(super) cache: Option<crate::image::cache::Cache>,
    /// Active threads, prefetch gate and CPU share (fixed settings included).
    pub(super) tuner: crate::observe::tune::Tuner,
    /// Computed on first use (it reads every sample's name).
    pub(super) fingerprint: std::sync::OnceLock<Fingerprint>,
    /// Worker scratch (decoder, resampler) and read buffers kept between epochs, so a new
    /// epoch's threads start warm instead of re-growing their buffers.
    pub(super) stash: Mutex<Stash>,
    /// The largest read buffer any I/O thread has needed: every buffer is grown to it at once,
    /// so the rotating buffers stop reallocating as soon as one of them has met the largest file.
    pub(super) read_high_water: std::sync::atomic::AtomicUsize,
    /// A mixture's counters per source, when the samples are a mixture's.
    pub(super) tally: Option<crate::shell::mix::Tally>,
    /// Image-text pairs: how each sample's caption is read and encoded.
    pub(super) captions: Option<Captions>,
    /// GPU decode: the share of each batch the decode threads leave to the transfer stage (set
    /// only by the stage that decodes them, [`super::Loader::leave_to_gpu`]).
    pub(super) gpu: std::sync::OnceLock<crate::image::gpu_job::GpuShare>,
    /// MixUp/CutMix of each finished batch; its soft labels are the slot's extra region 0.
    pub(super) mix: Option<crate::image::ops::mix::MixSpec>,
}

/// An image-text pair loader's captions: where each is read from and its encoder (rows of ids
/// and a mask in the slot's extra regions 0 and 1, int32).
pub(super) struct Captions {
    pub(super) encoder: crate::tokens::CaptionEncoder,
    pub(super) field: crate::tokens::CaptionField,
}

impl Images {
    /// The MixUp/CutMix draw of batch `batch` of `epoch`: a pure function of the seed, the
    /// epoch, the rank and the batch number (so of no thread count), drawn once per batch.
    pub(super) fn mix_params(
        &self,
        mix: &crate::image::ops::mix::MixSpec,
        epoch: u64,
        batch: usize,
    ) -> crate::image::ops::mix::MixParams {
        let s = self.sampler.spec();
        let key = ((s.rank as u64) << 40) | batch as u64;
        let mut rng = Rng::new(s.seed, rng::stream::BATCH_MIX ^ (epoch << 8), key);
        let (h, w) = self.plan.output_size();
        mix.draw(&mut rng, h, w)
    }

    /// The mixture source of sample `index` and the tally, when the samples are a mixture's.
    pub(super) fn mixed(&self, index: u32) -> Option<(usize, &crate::shell::mix::Tally)> {
        Some((self.sampler.mixture()?.source_of(index), self.tally.as_ref()?))
    }
}

#[derive(Default)]
pub(super) struct Stash {
    pub(super) workers: Vec<(Decoder, Resampler)>,
    pub(super) bytes: Vec<Vec<u8>>,
}

/// One sample of a batch: its slot and position in it, and the pass's epoch.
pub(super) struct Task {
    pub(super) slot: Arc<Slot>,
    pub(super) pos: usize,
    pub(super) epoch: u64,
}

/// A sample's trace arguments: dataset index and batch.
pub(super) fn sample_args(task: &Task) -> TraceArgs {
    TraceArgs::Sample { index: task.slot.index(task.pos), batch: task.slot.batch.load(Ordering::Relaxed) as u32 }
}

/// Hash of every sample's path and label, in order: what a saved state and a cache group are
/// valid for.
pub(super) fn samples_hash(source: &dyn Source) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for i in 0..source.len() {
        h.update(source.describe(i).as_os_str().as_encoded_bytes());
        h.update(&[0]);
        h.update(&source.label(i).to_le_bytes());
    }
    h.digest()
}

/// The cache group key of a dataset: its samples' hash, and the folder or shards its samples
/// come from (the longest common path of the first and last), for `stoker cache`.
pub fn dataset_key(source: &dyn Source) -> crate::shell::store::DatasetKey {
    let n = source.len();
    let description = if n == 0 {
        String::new()
    } else {
        let (a, b) = (source.describe(0), source.describe(n - 1));
        let common: PathBuf = a.components().zip(b.components()).take_while(|(x, y)| x == y).map(|(x, _)| x).collect();
        common.display().to_string()
    };
    crate::shell::store::DatasetKey { hash: samples_hash(source), samples: n, description }
}
