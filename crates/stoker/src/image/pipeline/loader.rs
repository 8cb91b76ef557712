//! [`Loader`]: the shared state of a loader (source, sampler, transform plan, buffer pool,
//! telemetry, cache, tuner), its construction from a [`LoaderConfig`], epochs and resume, and
//! the start of an iteration.

use super::iter::EpochIter;
use super::shared::{dataset_key, samples_hash, write_trace, Shared, Stash};
use super::*;

/// A batch loader over a [`Source`].
pub struct Loader {
    pub(super) shared: Arc<Shared>,
    pub(super) epochs: Epochs,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("samples", &self.shared.source.len())
            .field("threads", &self.shared.threads)
            .field("pool", &self.shared.pool)
            .finish()
    }
}

impl Loader {
    /// Validates `config` against `source` and allocates the buffer pool on the heap.
    pub fn new(source: Arc<dyn Source>, config: LoaderConfig) -> Result<Self> {
        Self::new_in(source, config, Arc::new(HeapAllocator))
    }

    /// Like [`Loader::new`], with the batch buffers taken from `alloc` (e.g. page-locked memory
    /// from `stoker-cuda`, so the GPU copies them asynchronously).
    pub fn new_in(source: Arc<dyn Source>, config: LoaderConfig, alloc: Arc<dyn HostAllocator>) -> Result<Self> {
        if source.is_empty() {
            return Err(Error::Dataset("the dataset has no samples".into()));
        }
        let mut sampler = Sampler::new(source.len(), config.sampler.clone())?;
        if config.sampler.shard_window.is_some() {
            let groups = source.groups().ok_or_else(|| {
                Error::config("shuffle", "shard-aware shuffling ('shards') needs a dataset of tar shards")
            })?;
            sampler = sampler.with_groups(groups)?;
        }
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
        let allowance = crate::cpu::allowance().effective;
        let fixed = match config.threads {
            Some(0) => return Err(Error::config("threads", "must be at least 1 (or auto)")),
            Some(n) => Some(n),
            None => None,
        };
        let cpu_budget = config.cpu_budget.unwrap_or_else(crate::cpu::default_budget);
        // An autotuned loader starts a worker per whole core of its budget.
        let threads = fixed.unwrap_or((cpu_budget + 1e-9).floor().max(1.0) as usize);
        let io_threads = match config.io_threads {
            Some(0) => return Err(Error::config("io_threads", "must be at least 1")),
            Some(n) => n,
            None => {
                if threads == 1 {
                    1
                } else {
                    2
                }
            }
        };
        if config.prefetch == 0 {
            return Err(Error::config("prefetch", "must be at least 1"));
        }
        let batch_size = config.sampler.batch_size;
        let batch_bytes = batch_size * plan.sample_bytes();
        // One batch being filled, `prefetch` ready, one held by the consumer.
        let slots = if config.prefetch_auto {
            let limit = config.memory_limit.unwrap_or(crate::tune::AUTO_PREFETCH_BYTES.max(4 * batch_bytes as u64));
            BufferPool::plan(crate::tune::AUTO_PREFETCH_MAX + 2, batch_bytes, Some(limit))?
        } else {
            BufferPool::plan(config.prefetch + 2, batch_bytes, config.memory_limit)?
        };
        let pool = BufferPool::new_in(slots, batch_size, plan.sample_bytes(), alloc, config.memory_limit)?;
        let cache = match &config.cache {
            Some(c) => Some(crate::cache::Cache::open(c, config.transform.apply_exif, &dataset_key(source.as_ref()))?),
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
        let tuner = crate::tune::Tuner::new(
            crate::tune::TuneSpec {
                auto_threads: fixed.is_none(),
                threads_max: threads,
                auto_prefetch: config.prefetch_auto,
                prefetch_max: if config.prefetch_auto { slots.saturating_sub(2).max(1) } else { config.prefetch },
                prefetch: config.prefetch,
                cpu_budget: if fixed.is_some() { config.cpu_budget.unwrap_or(threads as f64) } else { cpu_budget },
                epoch_batches: sampler.num_batches(),
            },
            crate::args::budget_registry(),
        );
        Ok(Loader {
            shared: Arc::new(Shared {
                source,
                sampler,
                plan,
                pool,
                telemetry: Arc::default(),
                tracer,
                threads,
                io_threads,
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
            }),
            epochs: Epochs::default(),
        })
    }

    /// Batches per epoch on this rank (of the current epoch: a continued elastic epoch has
    /// its own count).
    pub fn len(&self) -> usize {
        self.epochs.batches(&self.shared.sampler)
    }

    /// Whether an epoch has no batches (never true for a constructed loader).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decode threads started (autotuned: the most that may take work; see
    /// [`Report::tuning`] for how many do).
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// I/O threads.
    pub fn io_threads(&self) -> usize {
        self.shared.io_threads
    }

    /// The buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.shared.pool
    }

    /// The compiled transform.
    pub fn plan(&self) -> &TransformPlan {
        &self.shared.plan
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.shared.sampler
    }

    /// Selects the epoch for the next iteration (see [`Epochs::set_epoch`]: changing it makes
    /// a running iteration stale; setting the current epoch again changes nothing).
    pub fn set_epoch(&self, epoch: u64) {
        self.epochs.set_epoch(epoch);
    }

    /// The resumable state: where the next iteration would start.
    pub fn state(&self) -> SamplerState {
        self.epochs.state(&self.shared.sampler)
    }

    /// The elastic base of the current epoch: the saved runs it continues on this loader's
    /// ranks (`None`: a normal epoch). Part of the state.
    pub fn elastic(&self) -> Option<ElasticBase> {
        self.epochs.elastic()
    }

    /// Restores `st` (and its elastic base) exactly as another loader had it, including
    /// whether it was still to be resumed: how a fork child's rebuilt loader continues its
    /// parent's.
    pub fn adopt_state(&self, st: SamplerState, elastic: Option<ElasticBase>, resume: bool) -> Result<()> {
        self.epochs.adopt_state(st, elastic, resume, &self.shared.sampler)
    }

    /// Lists entries of the dataset that are not samples (from [`crate::source::Dataset`]) in
    /// the report's skipped files, so a FIFO or a link loop is seen, not silently dropped.
    pub fn report_not_samples(&self, items: &[(std::path::PathBuf, String)]) {
        for (path, reason) in items {
            let path = path.display().to_string();
            self.shared.telemetry.skip(Skipped { index: u32::MAX, path, reason: reason.clone() });
        }
    }

    /// Whether a state was loaded and no iteration has started from it yet.
    pub fn resume_pending(&self) -> bool {
        self.epochs.resume_pending()
    }

    /// What a saved state is valid for (see [`Fingerprint`]); computed once, on first use.
    pub fn fingerprint(&self) -> &Fingerprint {
        self.shared.fingerprint.get_or_init(|| {
            let sh = &self.shared;
            let transform = serde_json::to_vec(&(sh.plan.spec(), sh.decode_opts.dct_scaling, sh.decode_opts.roi))
                .map(|b| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&b)))
                .unwrap_or_default();
            Fingerprint::new(sh.sampler.spec(), sh.source.len(), samples_hash(sh.source.as_ref()), transform)
        })
    }

    /// The decoded-pixel cache, if the loader has one.
    pub fn cache(&self) -> Option<&crate::cache::Cache> {
        self.shared.cache.as_ref()
    }

    /// Restores a state from [`Loader::state`]: the next iteration resumes there. A running
    /// iteration becomes stale.
    pub fn load_state(&self, st: SamplerState) -> Result<()> {
        self.epochs.load_state(st, None, &self.shared.sampler)
    }

    /// Restores a state of an elastic epoch ([`Loader::elastic`]), or continues an epoch saved
    /// on another number of ranks (`elastic`: their base, from
    /// [`crate::args::saved_states`]): every sample no saved rank delivered is dealt to this
    /// loader's ranks (see [`Sampler::elastic_order`]). A running iteration becomes stale.
    pub fn load_elastic(&self, st: SamplerState, elastic: ElasticBase) -> Result<()> {
        self.epochs.load_state(st, Some(elastic), &self.shared.sampler)
    }

    /// Telemetry since the loader was made (or last reset), with the bottleneck verdict.
    pub fn report(&self) -> Report {
        let tuning = self.shared.tuner.report();
        let mut r = self.shared.telemetry.report(tuning.threads_active, self.shared.io_threads, self.shared.allowance);
        r.cache = self.shared.cache.as_ref().map(|c| c.report());
        r.tuning = Some(tuning);
        r
    }

    /// The live counters (a transfer stage outside this crate records into them).
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.shared.telemetry
    }

    /// The trace recorder, when tracing is on (a transfer stage outside this crate records
    /// into it).
    pub fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.shared.tracer.as_ref()
    }

    /// The file the trace is written to: at the end of each completed pass and when the loader
    /// is dropped (and by [`Loader::write_trace`]).
    pub fn trace_path(&self) -> Option<&Path> {
        self.shared.tracer.as_ref().and_then(|t| t.path())
    }

    /// Writes the trace recorded so far (the last `trace_events` events) to `path` now,
    /// atomically (a temporary file, then a rename). An error when tracing is off.
    pub fn write_trace(&self, path: &Path) -> Result<()> {
        let tracer = self.shared.tracer.as_ref().ok_or_else(|| {
            Error::config("trace", "tracing is off: make the loader with trace=PATH to record a trace")
        })?;
        write_trace(&self.shared, tracer, path)
    }

    /// Zeroes the telemetry.
    pub fn reset_report(&self) {
        self.shared.telemetry.reset();
        if let Some(c) = &self.shared.cache {
            c.reset();
        }
    }

    /// Starts an iteration of the current epoch: at its first batch, or where a state loaded
    /// since the last iteration says. A previous iteration of this loader becomes stale (it
    /// stops, its buffers return to the pool, and its next batch is an error).
    pub fn iter(&self) -> Result<EpochIter> {
        // Stop the previous iteration and take its buffers back before starting.
        let start = self.epochs.begin(&self.shared.sampler);
        let it = EpochIter::start(self.shared.clone(), self.epochs.position().clone(), start)?;
        self.epochs.started(it.core());
        Ok(it)
    }
}

impl Drop for Loader {
    /// Writes the trace, when there is one with events not yet in its file. A failure is
    /// reported on stderr: a drop has no caller to return it to.
    fn drop(&mut self) {
        if let Some(t) = &self.shared.tracer {
            if let Some(path) = t.auto_path() {
                if let Err(e) = write_trace(&self.shared, t, path) {
                    eprintln!("stoker: {e}");
                }
            }
        }
    }
}
