//! [`Loader`]: the image kind ([`Images`]) on the shell's loader: its construction from a
//! [`LoaderConfig`] and what only an image loader answers (transform plan, pool, cache,
//! telemetry, trace); epochs, resume and the start of a pass are the shell's.

use super::shared::{dataset_key, Captions, Images, Stash};
use super::*;
use crate::values::{batch_bytes as checked_batch_bytes, check_io_threads, check_prefetch};

/// A batch loader over a [`Source`].
pub type Loader = crate::shell::kind::Loader<Images>;

impl Loader {
    /// Validates `config` against `source` and allocates the buffer pool on the heap.
    pub fn new(source: Arc<dyn Source>, config: LoaderConfig) -> Result<Self> {
        Self::new_in(source, config, Arc::new(HeapAllocator))
    }

    /// Like [`Loader::new`], with the batch buffers taken from `alloc` (e.g. page-locked memory
    /// from `stoker-cuda`, so the GPU copies them asynchronously).
    pub fn new_in(source: Arc<dyn Source>, mut config: LoaderConfig, alloc: Arc<dyn HostAllocator>) -> Result<Self> {
        if source.is_empty() {
            return Err(Error::Dataset("the dataset has no samples".into()));
        }
        let remote = source.is_remote();
        // Over object storage, `shuffle=True` is a shard-window order: each rank reads its own
        // parts, each part once, in a few large requests.
        let s = &mut config.sampler;
        if remote && s.shuffle && s.shard_window.is_none() && s.mixture.is_none() && !config.shuffle_global {
            s.shard_window = Some(super::config::remote_window(config.memory_limit));
        }
        // The parts a pass over object storage holds come out of `memory_limit` too.
        if let Some(spec) = &config.shard_cache {
            source.use_shard_cache(spec)?;
        }
        let order_note = (remote && config.sampler.shard_window.is_some()).then(|| sorted_by_class(&*source)).flatten();
        let readahead =
            if remote { super::config::readahead_bytes(config.sampler.shard_window, config.memory_limit) } else { 0 };
        let memory_limit = config.memory_limit.map(|m| m - readahead);
        let mut sampler = Sampler::new(source.len(), config.sampler.clone())?;
        if config.sampler.shard_window.is_some() {
            let groups = source.groups().ok_or_else(|| {
                Error::config("shuffle", "shard-aware shuffling ('shards') needs a dataset of tar shards")
            })?;
            sampler = sampler.with_groups(groups)?;
        }
        let sampler = sampler.with_parts(source.parts())?;
        if sampler.num_batches() == 0 {
            return Err(Error::config(
                "batch_size",
                format!(
                    "{} with drop_last leaves no batch: this rank has only {} samples",
                    config.sampler.batch_size,
                    sampler.samples_per_rank()
                ),
            ));
        }
        let plan = TransformPlan::compile(&config.transform)?;
        let allowance = crate::observe::cpu::allowance().effective;
        let (threads, cpu_budget) = crate::observe::tune::workers(config.threads, config.cpu_budget)?;
        let io_threads = match config.io_threads {
            Some(n) => check_io_threads(n)?,
            None => {
                if threads == 1 {
                    1
                } else {
                    2
                }
            }
        };
        check_prefetch(config.prefetch)?;
        let batch_size = config.sampler.batch_size;
        let captions = match &config.captions {
            Some(spec) => Some(Captions { encoder: spec.encoder()?, field: spec.field.clone() }),
            None => None,
        };
        // A pair's caption: a row of ids and a row of mask values (int32) beside its image; a
        // mixed batch's soft labels: a row of num_classes float32 values.
        let extras = match (&captions, &config.mix) {
            (Some(c), _) => vec![c.encoder.options().context_length * 4; 2],
            (None, Some(m)) => vec![m.num_classes * 4],
            (None, None) => vec![],
        };
        if let Some(m) = &config.mix {
            // Soft labels need a class per sample, inside num_classes: checked once, here.
            let c = m.num_classes as i64;
            if let Some(i) = (0..source.len()).find(|&i| !(0..c).contains(&source.label(i))) {
                return Err(Error::config(
                    "batch_transform",
                    format!(
                        "sample {} has label {}, outside 0..{c} (num_classes): MixUp/CutMix need a class per sample",
                        source.describe(i).display(),
                        source.label(i)
                    ),
                ));
            }
        }
        let sample_bytes = plan.sample_bytes() + extras.iter().sum::<usize>();
        checked_batch_bytes(batch_size, sample_bytes as u64)?;
        let batch_bytes = batch_size * sample_bytes;
        // One batch being filled, `prefetch` ready, one held by the consumer.
        let slots = if config.prefetch_auto {
            let limit = memory_limit.unwrap_or(crate::observe::tune::AUTO_PREFETCH_BYTES.max(4 * batch_bytes as u64));
            BufferPool::plan(crate::observe::tune::AUTO_PREFETCH_MAX + 2, batch_bytes, Some(limit))?
        } else {
            BufferPool::plan(config.prefetch + 2, batch_bytes, memory_limit)?
        };
        let pool = BufferPool::with_extras(slots, batch_size, plan.sample_bytes(), &extras, alloc, memory_limit)?;
        let cache = match &config.cache {
            Some(c) => {
                Some(crate::image::cache::Cache::open(c, config.transform.apply_exif, &dataset_key(source.as_ref()))?)
            }
            None => None,
        };
        let tracer = config.trace.as_ref().map(|t| t.check().map(|()| Arc::new(Tracer::from_spec(t)))).transpose()?;
        // A cache holds whole images: at full resolution every image is decoded that way, cached
        // or not; reduced to a `max_side`, DCT scaling (when allowed) makes the reduction cheap.
        // A miss that the budget cannot store is decoded like an uncached sample: around the
        // crop (`roi`), which at full resolution gives the same pixels within the crop.
        let full = cache.as_ref().is_some_and(|c| c.max_side().is_none());
        let decode_opts = DecodeOptions {
            apply_exif: config.transform.apply_exif,
            dct_scaling: config.dct_scaling && !full,
            roi: config.roi && (cache.is_none() || full),
            restart: true,
            max_pixels: config.max_pixels,
        };
        let tuner = crate::observe::tune::Tuner::new(
            crate::observe::tune::TuneSpec {
                auto_threads: config.threads.is_none(),
                threads_max: threads,
                auto_prefetch: config.prefetch_auto,
                prefetch_max: if config.prefetch_auto { slots.saturating_sub(2).max(1) } else { config.prefetch },
                prefetch: config.prefetch,
                cpu_budget,
                epoch_batches: sampler.num_batches(),
            },
            config.cpu_registry.clone().map(crate::observe::budget::Registry::at),
        );
        Ok(crate::shell::kind::Loader::of(Images {
            source,
            sampler,
            plan,
            pool,
            telemetry: Arc::default(),
            counters: ImageCounters::default(),
            tracer,
            threads,
            io_threads,
            readahead,
            order_note,
            allowance,
            on_error: config.on_error,
            decode_opts,
            max_file_bytes: config.max_file_bytes,
            max_failures: config.max_failures,
            cache,
            tuner,
            fingerprint: std::sync::OnceLock::new(),
            stash: Mutex::new(Stash::default()),
            read_high_water: std::sync::atomic::AtomicUsize::new(0),
            tally: config.sampler.mixture.as_ref().map(|m| crate::shell::mix::Tally::new(m.parts.len())),
            captions,
            gpu: std::sync::OnceLock::new(),
            mix: config.mix.clone(),
        }))
    }

    /// Leaves the share `on` says of each batch to GPU decode, from the next pass on, and
    /// returns that share (which the caller, the transfer stage that decodes the records, tunes
    /// for `auto`); `None` for `cpu`. Only that stage calls this: a loader never writes records
    /// nothing would decode. Set once; a second call returns the first share.
    pub fn leave_to_gpu(&self, on: crate::image::gpu_job::DecodeOn) -> Option<crate::image::gpu_job::GpuShare> {
        if !on.uses_gpu() {
            return None;
        }
        Some(self.kind().gpu.get_or_init(|| crate::image::gpu_job::GpuShare::new(on.start_permille())).clone())
    }

    /// Decode threads started (autotuned: the most that may take work; see
    /// [`crate::observe::report::Report::tuning`] for how many do).
    pub fn threads(&self) -> usize {
        self.kind().threads
    }

    /// I/O threads.
    pub fn io_threads(&self) -> usize {
        self.kind().io_threads
    }

    /// The buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.kind().pool
    }

    /// The compiled transform.
    pub fn plan(&self) -> &TransformPlan {
        &self.kind().plan
    }

    /// Lists entries of the dataset that are not samples (from [`crate::source::Dataset`]) in
    /// the report's skipped files, so a FIFO or a link loop is seen, not silently dropped.
    pub fn report_not_samples(&self, items: &[(std::path::PathBuf, String)]) {
        for (path, reason) in items {
            let path = path.display().to_string();
            self.kind().telemetry.skip(Skipped { index: u32::MAX, path, reason: reason.clone() });
        }
    }

    /// The MixUp/CutMix draw of batch `batch` of `epoch` (what its images and soft labels were
    /// mixed with), when the loader mixes batches.
    pub fn mix_params(&self, epoch: u64, batch: usize) -> Option<crate::image::ops::mix::MixParams> {
        let sh = self.kind();
        sh.mix.as_ref().map(|m| sh.mix_params(m, epoch, batch))
    }

    /// The batch mixing (MixUp/CutMix), when the loader mixes batches: its soft labels are
    /// `num_classes` float32 values per sample, and [`crate::image::ops::mix::MixSpec::images`]
    /// says where the images are mixed.
    pub fn mix(&self) -> Option<&crate::image::ops::mix::MixSpec> {
        self.kind().mix.as_ref()
    }

    /// The decoded-pixel cache, if the loader has one.
    pub fn cache(&self) -> Option<&crate::image::cache::Cache> {
        self.kind().cache.as_ref()
    }

    /// The caption rows' length (`context_length`), when the samples are image-text pairs.
    pub fn context_length(&self) -> Option<usize> {
        self.kind().captions.as_ref().map(|c| c.encoder.options().context_length)
    }

    /// The key of each of the dataset's samples `indices` (WebDataset's, for shards); an index
    /// past the dataset is an error naming it, never a shorter list.
    pub fn keys(&self, indices: &[u32]) -> Result<Vec<String>> {
        let source = &self.kind().source;
        indices
            .iter()
            .map(|&i| match (i as usize) < source.len() {
                true => Ok(source.key(i as usize)),
                false => Err(Error::config("indices", format!("{i} is past the dataset's {} samples", source.len()))),
            })
            .collect()
    }

    /// Zeroes the counters of the report.
    pub fn reset_report(&self) {
        self.kind().telemetry.reset();
        self.kind().counters.reset();
        if let Some(c) = &self.kind().cache {
            c.reset();
        }
    }
}

/// A note when the samples of a dataset are grouped by class (more than 90% of neighbours share
/// a label, as an ImageFolder packed in its own order): a shard-window order then fills a batch
/// from the few classes of a window's parts.
fn sorted_by_class(source: &dyn Source) -> Option<String> {
    let n = source.len();
    let same = (1..n).filter(|&i| source.label(i) == source.label(i - 1) && source.label(i) >= 0).count();
    (n > 1 && same * 10 > (n - 1) * 9).then(|| {
        format!(
            "{:.0}% of neighbouring samples in the shards share a class: a shard-window order (shuffle=True over \
             object storage) draws each batch from the few classes of a window; re-pack with `stoker pack --shuffle` \
             (each shard a random sample of the dataset), or use shuffle='global' (a request per sample)",
            100.0 * same as f64 / (n - 1) as f64
        )
    })
}
