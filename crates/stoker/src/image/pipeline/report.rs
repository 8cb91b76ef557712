//! The image kind's part of its report: the counters its threads record ([`ImageCounters`]:
//! read, decode, ops, decode warnings, restart decodes; plain atomics, as cheap as before),
//! its typed [`ImageSection`] (decode warnings, restart decodes, the pixel cache) and its
//! bottleneck verdict. It imports no file of the pipeline; `shared` keeps the counters.

use crate::image::cache::CacheReport;
use crate::image::ops::augment::KINDS;
use crate::observe::report::{keeps_up, percent, Bottleneck, Report, Section, StageReport};
use crate::observe::telemetry::{StageCounters, Telemetry};
use crate::observe::tune::Load;
use crate::shell::mix::MixReport;
use crate::source::StorageReport;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The report of an image loader.
pub type ImageReport = Report<ImageSection>;

/// The counters of the image stages, recorded by the loader's threads.
#[derive(Debug, Default)]
pub struct ImageCounters {
    /// Reading bytes from storage.
    pub read: StageCounters,
    /// Decoding (header, entropy decode, IDCT, colour conversion).
    pub decode: StageCounters,
    /// Resampling and writing the slot (flip, normalise, dtype, layout).
    pub ops: StageCounters,
    /// Tokenizing image-text pairs' captions into their rows (pair loaders only).
    pub caption: StageCounters,
    /// MixUp/CutMix of finished batches and their soft labels (`batch_transform` only), one
    /// item per batch, on the thread that finished it.
    pub mix: StageCounters,
    /// The augmentations of the crop and the erase (a part of `ops`; loaders with
    /// augmentations only).
    pub augment: StageCounters,
    /// Each kind of augmentation work (`ops::augment::KINDS`): how often, how long.
    augment_ops: [StageCounters; KINDS.len()],
    decode_warnings: AtomicU64,
    restart_decodes: AtomicU64,
}

impl ImageCounters {
    /// Counts `n` images decoded despite a libjpeg warning (see
    /// [`ImageSection::decode_warnings`]).
    pub fn add_decode_warnings(&self, n: u64) {
        if n > 0 {
            self.decode_warnings.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts `n` JPEGs decoded from their restart intervals alone (see
    /// [`ImageSection::restart_decodes`]).
    pub fn add_restart_decodes(&self, n: u64) {
        if n > 0 {
            self.restart_decodes.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts one augmentation op of kind `kind` (an index of `ops::augment::KINDS`) that took
    /// `busy`.
    pub fn augment_op(&self, kind: usize, busy: Duration) {
        if let Some(c) = self.augment_ops.get(kind) {
            c.record(busy);
        }
    }

    /// Zeroes every counter.
    pub fn reset(&self) {
        for s in [&self.read, &self.decode, &self.ops, &self.caption, &self.mix, &self.augment] {
            s.reset();
        }
        for s in &self.augment_ops {
            s.reset();
        }
        self.decode_warnings.store(0, Ordering::Relaxed);
        self.restart_decodes.store(0, Ordering::Relaxed);
    }

    /// The image stages over `wall` seconds: `read` on `io_threads`, `decode` and `ops` on
    /// `threads`, `caption` on `threads` when the samples are image-text pairs, `augment` (the
    /// part of `ops` spent augmenting) when samples were augmented, and `mix` on `threads` once
    /// a batch has been mixed.
    pub fn stages(&self, wall: f64, threads: usize, io_threads: usize, captions: bool) -> Vec<StageReport> {
        let mut stages = vec![
            self.read.snapshot("read", io_threads, wall),
            self.decode.snapshot("decode", threads, wall),
            self.ops.snapshot("ops", threads, wall),
        ];
        if captions {
            stages.push(self.caption.snapshot("caption", threads, wall));
        }
        if self.augment.items() > 0 {
            stages.push(self.augment.snapshot("augment", threads, wall));
        }
        if self.mix.busy_ns() > 0 {
            stages.push(self.mix.snapshot("mix", threads, wall));
        }
        stages
    }

    /// The section, with the pixel cache's report when the loader has a cache, and the
    /// mixture's when the samples are a mixture's.
    pub fn section(
        &self,
        cache: Option<CacheReport>,
        mixture: Option<MixReport>,
        storage: Option<StorageReport>,
    ) -> ImageSection {
        ImageSection {
            decode_warnings: self.decode_warnings.load(Ordering::Relaxed),
            restart_decodes: self.restart_decodes.load(Ordering::Relaxed),
            augment_ops: KINDS
                .iter()
                .zip(&self.augment_ops)
                .filter(|(_, c)| c.items() > 0)
                .map(|(name, c)| AugmentOpReport {
                    name: (*name).into(),
                    count: c.items(),
                    seconds: c.busy_ns() as f64 * 1e-9,
                })
                .collect(),
            cache,
            mixture,
            storage,
        }
    }

    /// The load the tuner weighs after each batch: the consumer's, and the decode and ops
    /// stages' busy time (the tuned workers).
    pub fn load(&self, tel: &Telemetry) -> Load {
        Load {
            consumer_wait_ns: tel.consumer.wait_ns(),
            consumer_busy_ns: tel.consumer.busy_ns(),
            worker_busy_ns: self.decode.busy_ns() + self.ops.busy_ns() + self.caption.busy_ns() + self.mix.busy_ns(),
        }
    }
}

/// One kind of augmentation work in the report: how many times it ran and for how long.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AugmentOpReport {
    /// The op (torchvision's name; `ColorJitter.hue`, `RandomErasing`, ...).
    pub name: String,
    /// Times it ran.
    pub count: u64,
    /// Seconds it took, all threads together.
    pub seconds: f64,
}

/// The image kind's section of its report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageSection {
    /// Images decoded and delivered despite a libjpeg warning (corrupt data that libjpeg
    /// recovered from, in the header or the scan data: Pillow and torchvision load them too).
    pub decode_warnings: u64,
    /// JPEGs whose crop was decoded from the restart intervals it touches alone (files packed
    /// with `stoker pack --random-access`, or with tiling restart markers from their source).
    pub restart_decodes: u64,
    /// The augmentation ops that ran, each with its count and time (empty without
    /// augmentations): the `augment` stage, op by op.
    pub augment_ops: Vec<AugmentOpReport>,
    /// The decoded-pixel cache's counters, when the loader has one.
    pub cache: Option<CacheReport>,
    /// Each source's samples against its share, and its read, decode and ops time per sample,
    /// when the samples are a mixture's.
    pub mixture: Option<MixReport>,
    /// Requests, bytes, latency and throttling of object storage, when the samples are there.
    pub storage: Option<StorageReport>,
}

impl Section for ImageSection {
    /// The cache's lines, and the images decoded despite warnings.
    fn text(&self) -> String {
        let mut s = String::new();
        if let Some(st) = &self.storage {
            s.push_str(&st.text());
        }
        if let Some(c) = &self.cache {
            let g = &c.group;
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            s.push_str(&format!(
                "cache {}: {} hits, {} misses; stored {} ({:.1} MiB, {} over budget), read {:.1} MiB; \
                 used {:.1} of {:.1} MiB; decode time saved {:.2} s (lookups {:.2} s, fills {:.2} s)\n",
                g.dir,
                g.hits,
                g.misses,
                g.stored,
                mib(g.stored_bytes),
                g.not_stored_budget,
                mib(g.read_bytes),
                mib(g.used_bytes),
                mib(g.budget_bytes),
                c.decode_seconds_saved,
                c.lookup_seconds,
                c.fill_seconds
            ));
            if c.held_by_others_bytes > 0 && g.not_stored_budget > 0 {
                s.push_str(&format!(
                    "  cache budget: {:.1} MiB of it held by other datasets in use under {} (not evictable while \
                     they run); {} misses not stored. `stoker cache --dir {}` lists them\n",
                    mib(c.held_by_others_bytes),
                    g.root,
                    g.not_stored_budget,
                    g.root
                ));
            }
            if g.evicted_groups > 0 {
                s.push_str(&format!(
                    "  cache: {} idle group(s) of other datasets removed ({:.1} MiB) to make room or past their \
                     time to live\n",
                    g.evicted_groups,
                    mib(g.evicted_bytes)
                ));
            }
            if g.verify_failures > 0 || g.lock_timeouts > 0 {
                s.push_str(&format!(
                    "  cache: {} entries failed their pixel checksums (decoded and rewritten); {} lock waits timed \
                     out (entries not stored)\n",
                    g.verify_failures, g.lock_timeouts
                ));
            }
        }
        if !self.augment_ops.is_empty() {
            let ops: Vec<String> = self
                .augment_ops
                .iter()
                .map(|o| format!("{} {} x {:.3} ms", o.name, o.count, 1e3 * o.seconds / o.count.max(1) as f64))
                .collect();
            s.push_str(&format!("augment: {}\n", ops.join(", ")));
        }
        if self.decode_warnings > 0 {
            s.push_str(&format!(
                "decoded {} image(s) despite libjpeg warnings (corrupt data libjpeg recovered from)\n",
                self.decode_warnings
            ));
        }
        if let Some(m) = &self.mixture {
            s.push_str(&m.text("samples"));
        }
        s
    }
}

/// How busy the decode threads are, two ways: wall time inside their work over their threads
/// (`running`: a thread that has work but waits for a core counts as busy), and their CPU time
/// over the cores they can use (`cpu`, the CPU clock). The threads are the limit when either is
/// at least [`BUSY`]: `running` alone high means they have work and the cores are taken
/// (oversubscribed, or other processes), `cpu` high that they use every core they may.
const BUSY: f64 = 0.7;

/// The image verdict over a report: the consumer (the loader keeps up), the bus, storage, the
/// busy threads' stage (decode, ops, caption: busy by their wall time or by the CPU clock), the
/// process's other threads when they take the cores ([`crowded`]), or what holds the work of
/// idle threads ([`idle`]); `threads` work now of the `allowance`, `prefetch` batches may be
/// ahead of the consumer.
pub(super) fn verdict(r: &ImageReport, threads: usize, allowance: usize, prefetch: usize) -> Bottleneck {
    if let Some(b) = keeps_up(r.starvation_steady) {
        return b;
    }
    let stage = |name: &str| r.stage(name).cloned().unwrap_or_default();
    let (read, decode, ops) = (stage("read"), stage("decode"), stage("ops"));
    // An image-text pair loader's captions are tokenized on the same threads.
    let caption = stage("caption");
    let pct = percent;
    let worker_util = decode.utilization + ops.utilization + caption.utilization;
    let cpu_busy = r.cpu.workers_busy;
    if let Some(t) = r.stage("transfer").filter(|t| t.utilization > 0.7) {
        return Bottleneck {
            stage: "transfer".into(),
            reason: format!(
                "bus-bound: host-to-device copies keep the bus {} busy while decode threads are {} busy",
                pct(t.utilization),
                pct(worker_util)
            ),
            suggestion: "send uint8 over the bus (dtype uint8 or a GPU-normalised preset), smaller crops, \
                         or check the PCIe link with `stoker doctor`"
                .into(),
        };
    }
    if read.utilization > 0.7 && worker_util < BUSY && cpu_busy < BUSY {
        if let Some(st) = &r.kind.storage {
            return storage(st, &read, worker_util);
        }
        return Bottleneck {
            stage: "storage".into(),
            reason: format!(
                "reads keep {} I/O threads {} busy while decode threads are only {} busy",
                read.threads,
                pct(read.utilization),
                pct(worker_util)
            ),
            suggestion: "raise io_threads, use faster storage, or pack small files into shards".into(),
        };
    }
    if worker_util < BUSY && cpu_busy < BUSY {
        if let Some(b) = crowded(r) {
            return b;
        }
        return idle(r, worker_util, prefetch);
    }
    let more = if cpu_busy < 0.5 && worker_util >= BUSY {
        // The threads have work but run half the time or less: the cores are taken.
        format!(
            "the threads have work but ran only {} of the time they could: the cores are taken by other \
             processes or by more threads than cores (threads {threads}, allowance {allowance}); give the job \
             cores of its own",
            pct(cpu_busy)
        )
    } else if threads < allowance {
        format!("raise threads (now {threads}, allowance {allowance})")
    } else {
        format!("all {allowance} allowed CPUs are used (threads {threads}): give the job more CPUs")
    };
    let busy = busy_text(r, worker_util);
    let worker_busy = (decode.busy_seconds + ops.busy_seconds + caption.busy_seconds).max(1e-9);
    if caption.busy_seconds > decode.busy_seconds.max(ops.busy_seconds) {
        Bottleneck {
            stage: "caption".into(),
            reason: format!(
                "caption-bound: tokenizing captions takes {} of worker time; {busy}",
                pct(caption.busy_seconds / worker_busy),
            ),
            suggestion: format!("{more}, or a shorter context_length (long captions are cut there anyway)"),
        }
    } else if decode.busy_seconds >= ops.busy_seconds {
        Bottleneck {
            stage: "decode".into(),
            reason: format!(
                "decode-bound: decode takes {} of worker time; {busy}",
                pct(decode.busy_seconds / worker_busy),
            ),
            suggestion: format!(
                "{more}, or pre-resized shards (`stoker pack --max-side 512`: smaller JPEGs decode faster)"
            ),
        }
    } else {
        Bottleneck {
            stage: "ops".into(),
            reason: format!(
                "ops-bound: resize/normalise take {} of worker time; {busy}",
                pct(ops.busy_seconds / worker_busy),
            ),
            suggestion: format!("{more}, output uint8 and normalise on the GPU, or pre-resize images"),
        }
    }
}

/// How busy the decode threads were, in a verdict's words: by the CPU clock (the cores they
/// used of those they could) and by their wall time (`running`, their stages' utilization),
/// with the process's cores.
fn busy_text(r: &ImageReport, running: f64) -> String {
    let c = &r.cpu;
    format!(
        "threads {} busy by the CPU clock ({:.1} of {} usable cores) and {} of their wall time; the \
         process used {:.1} of {} cores",
        percent(c.workers_busy),
        c.workers_cores(),
        c.usable_cores(),
        percent(running),
        c.process_cores,
        c.allowance
    )
}

/// The verdict when the decode threads are not busy but the cores are: the process keeps nearly
/// all of its allowance busy with other threads (the training loop, PyTorch's CPU thread pool
/// spinning between ops, a tokenizer), or the host's CPUs are nearly all busy while this process
/// uses fewer than it may (other processes hold them; the pipeline's threads then wait for a
/// core and for each other). The cores are the limit: neither more prefetch nor more threads
/// would help. `None` when cores are free.
fn crowded(r: &ImageReport) -> Option<Bottleneck> {
    let c = &r.cpu;
    let workers = c.workers_cores();
    let allowance = c.allowance as f64;
    if c.process_cores < 0.85 * allowance {
        let host = c.host_busy.filter(|&h| h >= 0.9)?;
        return Some(Bottleneck {
            stage: "cpu".into(),
            reason: format!(
                "the host's CPUs are {} busy but this process uses only {:.1} of the {} cores it may (its decode \
                 threads {workers:.1}): other processes hold the cores, and the loader's threads wait for a core and \
                 for each other",
                percent(host),
                c.process_cores,
                c.allowance
            ),
            suggestion: "give the job cores of its own (fewer processes on the host, or a CPU set per job), or \
                         share the host's cores among stoker processes (STOKER_SHARED_BUDGET, on by default)"
                .into(),
        });
    }
    if c.process_cores - workers < 0.25 * allowance {
        return None;
    }
    Some(Bottleneck {
        stage: "cpu".into(),
        reason: format!(
            "the process keeps {:.1} of its {} cores busy but its decode threads use only {workers:.1} of them: the \
             other {:.1} go to other threads of the process (the training loop, PyTorch's CPU threads)",
            c.process_cores,
            c.allowance,
            c.process_cores - workers
        ),
        suggestion: "leave the cores to the decode threads: torch.set_num_threads(1) in a GPU trainer (PyTorch's \
                     CPU pool spins between ops), move CPU work out of the step, or give the job more CPUs"
            .into(),
    })
}

/// The verdict when reads from object storage hold the decode threads back: samples read one
/// request each (a global permutation whose parts do not fit the readahead), or parts that
/// arrive slower than they are used.
fn storage(st: &StorageReport, read: &StageReport, worker_util: f64) -> Bottleneck {
    let pct = percent;
    if st.direct_reads > st.part_reads {
        return Bottleneck {
            stage: "storage".into(),
            reason: format!(
                "{} of {} reads from object storage were a request each ({:.2} requests per sample, first byte p50                  {:.0} ms): the order reads samples from all over the shards, so their parts do not fit the readahead",
                st.direct_reads,
                st.direct_reads + st.part_reads,
                st.requests_per_sample,
                st.latency_p50_ms
            ),
            suggestion: "shuffle=True or 'shards' (a shard-window order: each part fetched once, in a few large                          requests) instead of shuffle='global', or copy the shards to a local disk"
                .into(),
        };
    }
    let mib_s = if st.wait_seconds > 0.0 { st.part_bytes as f64 / (1 << 20) as f64 } else { 0.0 };
    Bottleneck {
        stage: "storage".into(),
        reason: format!(
            "reads waited {:.1} s for parts from object storage ({} I/O threads {} busy, decode threads {} busy):              {} parts, {:.1} MiB, first byte p50 {:.0} ms / p99 {:.0} ms, up to {} requests in flight, {} throttled",
            st.wait_seconds,
            read.threads,
            pct(read.utilization),
            pct(worker_util),
            st.part_requests,
            mib_s,
            st.latency_p50_ms,
            st.latency_p99_ms,
            st.max_in_flight,
            st.throttled
        ),
        suggestion: if st.throttled > 0 {
            "the store throttles (503 SlowDown / 429): spread the shards over more prefixes, or read from fewer              nodes at once"
                .into()
        } else {
            "the store's bandwidth is the limit: read from the same region (or a closer cache), or copy the              shards to a local disk"
                .into()
        },
    }
}

/// The verdict when the consumer waits although the workers are under 70% busy (`worker_util`):
/// more threads or a cheaper decode would not help, so it names what holds the work instead of
/// a stage the threads are not limited by. The dispatcher hands out a batch only when the
/// prefetch gate lets it and a buffer is free (its `buffer wait`): when it waits a quarter of
/// the time or more, that is the limit. Otherwise the work is held after the workers: a batch
/// delivered in order waits for its slowest sample, the copy to the GPU, or the consumer's own
/// CPU between batches.
fn idle(r: &ImageReport, worker_util: f64, prefetch: usize) -> Bottleneck {
    let pct = percent;
    let wall = r.wall_seconds.max(1e-9);
    let stage = |name: &str| r.stage(name).cloned().unwrap_or_default();
    let dispatcher = stage("buffer wait").wait_seconds / wall;
    let consumer = stage("consumer");
    let read = stage("read");
    if read.utilization >= 0.5 && read.utilization > worker_util {
        // Every stage partly busy, the reads the most: they feed the decode threads too slowly.
        if let Some(st) = &r.kind.storage {
            return storage(st, &read, worker_util);
        }
        return Bottleneck {
            stage: "storage".into(),
            reason: format!(
                "no stage is fully busy, the reads the most: {} I/O threads {} busy, decode threads {} busy",
                read.threads,
                pct(read.utilization),
                pct(worker_util)
            ),
            suggestion: format!("raise io_threads (now {}), or use faster storage", read.threads),
        };
    }
    if dispatcher >= 0.25 {
        return Bottleneck {
            stage: "buffers".into(),
            reason: format!(
                "decode threads are only {} busy: the dispatcher waits {} of the time for the prefetch gate or a \
                 free batch buffer ({prefetch} batch(es) may be ahead of the consumer), so the threads run out of work",
                pct(worker_util),
                pct(dispatcher)
            ),
            suggestion: format!(
                "raise prefetch (now {prefetch}) or use prefetch='auto'; a consumer that keeps batches: release \
                 them sooner or raise memory_limit"
            ),
        };
    }
    let transfer = r.stage("transfer").map(|t| t.utilization).unwrap_or(0.0);
    let step = consumer.busy_seconds / (consumer.busy_seconds + consumer.wait_seconds).max(1e-9);
    Bottleneck {
        stage: "delivery".into(),
        reason: format!(
            "decode threads are only {} busy and the dispatcher waits {} of the time, yet the consumer waits {} of \
             its time: finished samples are held on their way out: a batch is delivered in order, after its \
             slowest sample (prefetch {prefetch}), then copied to the device (the copies keep the bus {} busy), \
             and the consumer spends {} of its time in its own step",
            pct(worker_util),
            pct(dispatcher),
            pct(r.starvation),
            pct(transfer),
            pct(step)
        ),
        suggestion: format!(
            "raise prefetch (now {prefetch}) or use prefetch='auto' so that more batches are in flight behind a slow \
             sample; a trace (trace=PATH) shows which batch the consumer waits for and why"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::report::CpuReport;
    use std::time::Duration;

    /// An image report over `wall`-second counters with the consumer waiting `waited` of 10 s.
    fn report(c: &ImageCounters, waited: u64) -> ImageReport {
        report_with(c, waited, 0)
    }

    /// [`report`], the dispatcher having waited `dispatcher` of the 10 s for buffers.
    fn report_with(c: &ImageCounters, waited: u64, dispatcher: u64) -> ImageReport {
        let tel = Telemetry::default();
        tel.consumer.add_busy(Duration::from_secs(10 - waited));
        tel.consumer.add_wait(Duration::from_secs(waited));
        tel.buffers.add_wait(Duration::from_secs(dispatcher));
        tel.start();
        tel.stop();
        let captions = c.caption.busy_ns() > 0;
        let mut r = tel.report(|_| c.stages(10.0, 2, 1, captions), 2, c.section(None, None, None));
        // The counters' stages over 10 s, whatever the real clock said.
        for s in &mut r.stages {
            s.utilization = s.busy_seconds / (10.0 * s.threads as f64);
        }
        r.wall_seconds = 10.0;
        // The CPU clock agreeing with the wall times: the workers ran whenever they had work,
        // on 2 threads of 4 cores, and the process's other threads hardly used any CPU.
        let workers: f64 = r.stages.iter().filter(|s| s.threads == 2).map(|s| s.busy_seconds).sum::<f64>() / 10.0;
        r.cpu = CpuReport {
            process_seconds: 10.0 * workers + 1.0,
            process_cores: workers + 0.1,
            workers_seconds: 10.0 * workers,
            workers_busy: workers / 2.0,
            threads: 2,
            allowance: 4,
            host_busy: None,
        };
        r
    }

    #[test]
    fn idle_threads_name_what_holds_the_work_not_decode() {
        // 2 threads 40% busy (decode most of it) while the consumer waits 6 of 10 s.
        let c = ImageCounters::default();
        c.decode.record(Duration::from_secs(6));
        c.ops.record(Duration::from_secs(2));
        // The dispatcher waited 4 s at the prefetch gate or for a buffer: that is the limit.
        let b = verdict(&report_with(&c, 6, 4), 2, 4, 2);
        assert_eq!(b.stage, "buffers", "{b:?}");
        assert!(b.reason.contains("only 40% busy") && b.reason.contains("waits 40% of the time"), "{}", b.reason);
        assert!(b.suggestion.starts_with("raise prefetch (now 2)"), "{}", b.suggestion);
        // It hardly waited: the work is held after the workers, and the verdict says so
        // instead of calling a 40%-busy loader decode-bound.
        let b = verdict(&report_with(&c, 6, 1), 2, 4, 3);
        assert_eq!(b.stage, "delivery", "{b:?}");
        assert!(b.reason.contains("only 40% busy") && b.reason.contains("consumer waits 60%"), "{}", b.reason);
        assert!(b.suggestion.contains("prefetch (now 3)") && b.suggestion.contains("trace"), "{}", b.suggestion);
        // Every stage partly busy, the reads (60% of their one thread) the most: the reads.
        let io = ImageCounters::default();
        io.read.record(Duration::from_secs(6));
        io.decode.record(Duration::from_secs(6));
        io.ops.record(Duration::from_secs(2));
        let b = verdict(&report_with(&io, 6, 4), 2, 4, 2);
        assert_eq!(b.stage, "storage", "{b:?}");
        assert!(b.suggestion.starts_with("raise io_threads (now 1)"), "{}", b.suggestion);
        // Busy threads are the limit as before.
        c.decode.record(Duration::from_secs(8));
        assert_eq!(verdict(&report_with(&c, 6, 4), 2, 4, 2).stage, "decode");
    }

    /// [`report_with`] with the CPU clocks: the process used `process` cores and the `threads`
    /// workers `workers` cores of an `allowance`, over the 10 s.
    fn clocked(
        c: &ImageCounters,
        waited: u64,
        dispatcher: u64,
        threads: usize,
        allowance: usize,
        clocks: (f64, f64),
    ) -> ImageReport {
        let mut r = report_with(c, waited, dispatcher);
        let (process, workers) = clocks;
        let usable = threads.min(allowance) as f64;
        r.cpu = CpuReport {
            process_seconds: process * 10.0,
            process_cores: process,
            workers_seconds: workers * 10.0,
            workers_busy: workers / usable,
            threads,
            allowance,
            host_busy: None,
        };
        for s in r.stages.iter_mut().filter(|s| ["decode", "ops"].contains(&s.name.as_str())) {
            s.threads = threads;
            s.utilization = s.busy_seconds / (10.0 * threads as f64);
        }
        r
    }

    #[test]
    fn a_verdict_follows_the_cpu_clock_not_the_dispatcher_s_wait() {
        // 16 threads whose wall time says half busy while the dispatcher waits 55% of the time
        // at the prefetch gate (as a decode-bound run of a 16-core host reported), but whose CPU
        // clock says 14.4 of 16 cores: decode-bound, and no advice to raise prefetch.
        let c = ImageCounters::default();
        c.decode.record(Duration::from_secs(64));
        c.ops.record(Duration::from_secs(16));
        let b = verdict(&clocked(&c, 2, 5, 16, 16, (15.0, 14.4)), 16, 16, 2);
        assert_eq!(b.stage, "decode", "{b:?}");
        assert!(b.reason.contains("threads 90% busy by the CPU clock (14.4 of 16 usable cores)"), "{}", b.reason);
        assert!(!b.suggestion.contains("prefetch"), "{}", b.suggestion);
        // The same wall times with the CPU clock agreeing (8 of 16 cores) and the process's
        // other cores free: the threads run out of work at the gate, and prefetch is the fix.
        let b = verdict(&clocked(&c, 2, 5, 16, 16, (8.5, 8.0)), 16, 16, 2);
        assert_eq!(b.stage, "buffers", "{b:?}");
        assert!(b.suggestion.starts_with("raise prefetch"), "{}", b.suggestion);
        // Half busy decode threads in a process that keeps 15 of its 16 cores busy: other
        // threads take the cores; neither prefetch nor threads would help.
        let b = verdict(&clocked(&c, 2, 5, 16, 16, (15.0, 8.0)), 16, 16, 2);
        assert_eq!(b.stage, "cpu", "{b:?}");
        assert!(b.reason.contains("other 7.0 go to other threads"), "{}", b.reason);
        assert!(!b.suggestion.contains("prefetch"), "{}", b.suggestion);
    }

    #[test]
    fn a_host_whose_cores_other_processes_hold_is_named_not_prefetch() {
        // Two threads idle half the time, the process on 1 of its 2 cores, the host 97% busy.
        let c = ImageCounters::default();
        c.decode.record(Duration::from_secs(8));
        c.ops.record(Duration::from_secs(2));
        let mut r = clocked(&c, 6, 0, 2, 2, (1.0, 0.95));
        r.cpu.host_busy = Some(0.97);
        let b = verdict(&r, 2, 2, 2);
        assert_eq!(b.stage, "cpu", "{b:?}");
        assert!(b.reason.contains("host's CPUs are 97% busy") && b.reason.contains("only 1.0 of the 2"), "{b:?}");
        assert!(!b.suggestion.contains("prefetch"), "{b:?}");
        // The same with the host's other CPUs idle: what holds the work is named as before.
        r.cpu.host_busy = Some(0.55);
        assert_eq!(verdict(&r, 2, 2, 2).stage, "delivery");
    }

    #[test]
    fn oversubscribed_or_crowded_threads_are_still_the_limit() {
        // 16 threads on 2 cores: each inside its work all the time (wall), 1.9 of the 2 cores
        // by the CPU clock: decode-bound, busy as a share of the 2 usable cores.
        let c = ImageCounters::default();
        c.decode.record(Duration::from_secs(150));
        c.ops.record(Duration::from_secs(10));
        let b = verdict(&clocked(&c, 6, 8, 16, 2, (2.0, 1.9)), 16, 2, 2);
        assert_eq!(b.stage, "decode", "{b:?}");
        assert!(b.reason.contains("95% busy by the CPU clock (1.9 of 2 usable cores)"), "{}", b.reason);
        assert!(b.suggestion.starts_with("all 2 allowed CPUs are used (threads 16)"), "{}", b.suggestion);
        // Two threads with work all the time that ran 40% of it (other processes hold the
        // cores): still the threads' stage, and the advice names the taken cores.
        let c = ImageCounters::default();
        c.decode.record(Duration::from_secs(18));
        c.ops.record(Duration::from_secs(2));
        let b = verdict(&clocked(&c, 6, 8, 2, 2, (0.9, 0.8)), 2, 2, 2);
        assert_eq!(b.stage, "decode", "{b:?}");
        assert!(b.suggestion.contains("the cores are taken"), "{}", b.suggestion);
    }

    #[test]
    fn the_image_section_keeps_its_keys_and_the_verdict_its_meaning() {
        let c = ImageCounters::default();
        c.add_decode_warnings(2);
        c.add_restart_decodes(5);
        c.decode.record(Duration::from_secs(15));
        c.ops.record(Duration::from_secs(3));
        let r = report(&c, 6);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!((v["decode_warnings"].as_u64(), v["restart_decodes"].as_u64()), (Some(2), Some(5)));
        assert!(v["cache"].is_null() && v.get("kind").is_none(), "flattened: {v}");
        let names: Vec<&str> = r.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["read", "decode", "ops", "buffer wait", "consumer"]);
        // Decode holds 15 of 18 s of worker time, with 2 of 4 allowed threads.
        let b = verdict(&r, 2, 4, 2);
        assert_eq!(b.stage, "decode");
        assert!(b.suggestion.starts_with("raise threads (now 2, allowance 4)"), "{}", b.suggestion);
        // A consumer that hardly waits is the limit.
        assert_eq!(verdict(&report(&c, 0), 2, 4, 2).stage, "consumer");
        // Reads busy on their one thread while the workers idle: storage.
        let io = ImageCounters::default();
        io.read.record(Duration::from_secs(9));
        assert_eq!(verdict(&report(&io, 6), 2, 4, 2).stage, "storage");
        assert!(r.to_text().contains("decoded 2 image(s) despite libjpeg warnings"));
        // Image-text pairs whose captions take the most of the workers' time.
        let pairs = ImageCounters::default();
        pairs.decode.record(Duration::from_secs(4));
        pairs.ops.record(Duration::from_secs(2));
        pairs.caption.record(Duration::from_secs(9));
        let r = report(&pairs, 6);
        assert_eq!(r.stages.iter().filter(|s| s.name == "caption").count(), 1);
        let b = verdict(&r, 2, 2, 2);
        assert_eq!(b.stage, "caption");
        assert!(b.reason.contains("60%") && b.suggestion.contains("give the job more CPUs"), "{b:?}");
    }
}
