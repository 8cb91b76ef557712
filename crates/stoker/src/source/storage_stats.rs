//! What reading shards from object storage cost: requests, bytes, latency, requests in flight,
//! throttling, and the reads that waited for their part ([`StorageReport`], the `storage`
//! section of a loader's report). Counted by the remote storage ([`super::remote`]) and its
//! readahead ([`super::readahead`]), kept for the life of the source (every pass of a loader).

use super::fetch::Fetched;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Latencies kept for the percentiles (later ones replace the oldest).
const MAX_LATENCIES: usize = 1 << 16;

/// The counters (atomics, a short lock for latencies).
#[derive(Debug, Default)]
pub struct StorageStats {
    /// Requests for the shards' metadata (listing, sizes, indexes, `classes.json`).
    meta_requests: AtomicU64,
    part_requests: AtomicU64,
    part_bytes: AtomicU64,
    direct_requests: AtomicU64,
    direct_bytes: AtomicU64,
    failed: AtomicU64,
    throttled: AtomicU64,
    max_in_flight: AtomicU64,
    /// Reads served from parts, and the time they waited for their part.
    part_reads: AtomicU64,
    part_wait_ns: AtomicU64,
    /// Reads of the passes planned so far, and how many of them their plan streams.
    reads_planned: AtomicU64,
    reads_streamed: AtomicU64,
    /// Parts read from the shard cache instead of the store, and their bytes.
    cache_hits: AtomicU64,
    cache_bytes: AtomicU64,
    /// Seconds to the first byte of each request (the latest [`MAX_LATENCIES`]).
    latencies: Mutex<(Vec<f32>, usize)>,
}

/// Reading from object storage, as a report shows it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StorageReport {
    /// Every request: metadata, parts and samples read alone.
    pub requests: u64,
    /// Bytes received in answers to parts and samples.
    pub bytes: u64,
    /// `bytes / (part + sample requests)`.
    pub bytes_per_request: f64,
    /// Requests for the shards' metadata when they were opened (listing, sizes, indexes).
    pub meta_requests: u64,
    /// Parts fetched (each one ranged request) and their bytes.
    pub part_requests: u64,
    /// Bytes of the parts.
    pub part_bytes: u64,
    /// Samples read with a request of their own (a global permutation's samples whose part did
    /// not fit the readahead, a failed part's samples), and their bytes.
    pub direct_reads: u64,
    /// Bytes of those.
    pub direct_bytes: u64,
    /// Requests answered `503 SlowDown`, `429` or another retryable status, and retried.
    pub throttled: u64,
    /// Requests that failed (after their retries).
    pub failed_requests: u64,
    /// Seconds to the first byte of a request: median and 99th percentile.
    pub latency_p50_ms: f64,
    /// See `latency_p50_ms`.
    pub latency_p99_ms: f64,
    /// The most requests in flight at once.
    pub max_in_flight: u64,
    /// Reads served from fetched parts.
    pub part_reads: u64,
    /// Seconds those reads waited for their part to arrive (summed over I/O threads).
    pub wait_seconds: f64,
    /// Requests for each sample read (`(part + sample requests) / reads`): about
    /// `1 / samples per part` when streamed, 1 when every sample is a request.
    pub requests_per_sample: f64,
    /// Of the reads the passes planned, the share their readahead streams from parts.
    pub streamed_share: f64,
    /// Parts read from the local shard cache instead of the store (`shard_cache`), and their
    /// bytes (not in `requests` nor `bytes`).
    pub cache_parts: u64,
    /// See `cache_parts`.
    pub cache_bytes: u64,
    /// The shard cache's group (its directory, budget, use, entries stored), when there is one.
    pub cache: Option<crate::shell::store::GroupReport>,
    /// What the loader noticed about the order (shards sorted by class under a shard-window
    /// order), if anything.
    pub note: Option<String>,
}

impl StorageStats {
    /// A request for the shards' metadata.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fn meta_request(&self) {
        self.meta_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A pass planned `reads`, of which `streamed` come from parts.
    pub(crate) fn planned(&self, reads: u64, streamed: u64) {
        self.reads_planned.fetch_add(reads, Ordering::Relaxed);
        self.reads_streamed.fetch_add(streamed, Ordering::Relaxed);
    }

    /// Requests in flight now.
    pub(crate) fn in_flight(&self, n: usize) {
        self.max_in_flight.fetch_max(n as u64, Ordering::Relaxed);
    }

    /// A part's fetch ended.
    pub(crate) fn part_fetched(&self, f: &Fetched, bytes: u64) {
        self.part_requests.fetch_add(1, Ordering::Relaxed);
        self.throttled.fetch_add(u64::from(f.throttled), Ordering::Relaxed);
        match &f.bytes {
            // Empty: the body went to the part as it came (its length is the part's).
            Ok(b) => {
                let n = if b.is_empty() { bytes } else { b.len() as u64 };
                self.part_bytes.fetch_add(n, Ordering::Relaxed);
                self.latency(f.latency);
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A part read from the shard cache.
    pub(crate) fn cache_hit(&self, bytes: u64) {
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
        self.cache_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A sample read from its part after waiting `waited` for it.
    pub(crate) fn part_read(&self, waited: Duration) {
        self.part_reads.fetch_add(1, Ordering::Relaxed);
        self.part_wait_ns.fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    }

    /// A sample read with a request of its own: `Some(bytes)`, or `None` when it failed.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fn direct(&self, got: Option<u64>, latency: Duration, throttled: u32) {
        self.direct_requests.fetch_add(1, Ordering::Relaxed);
        self.throttled.fetch_add(u64::from(throttled), Ordering::Relaxed);
        match got {
            Some(b) => {
                self.direct_bytes.fetch_add(b, Ordering::Relaxed);
                self.latency(latency);
            }
            None => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn latency(&self, d: Duration) {
        let mut l = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        let (all, next) = &mut *l;
        if all.len() < MAX_LATENCIES {
            all.push(d.as_secs_f32());
        } else {
            all[*next % MAX_LATENCIES] = d.as_secs_f32();
        }
        *next += 1;
    }

    /// The report of everything counted so far.
    pub fn report(&self) -> StorageReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut lat = self.latencies.lock().unwrap_or_else(|p| p.into_inner()).0.clone();
        lat.sort_by(f32::total_cmp);
        let pct = |q: f64| match lat.len() {
            0 => 0.0,
            n => f64::from(lat[((n - 1) as f64 * q).round() as usize]) * 1e3,
        };
        let (parts, direct) = (get(&self.part_requests), get(&self.direct_requests));
        let bytes = get(&self.part_bytes) + get(&self.direct_bytes);
        let reads = get(&self.part_reads) + direct;
        let planned = get(&self.reads_planned);
        StorageReport {
            requests: get(&self.meta_requests) + parts + direct,
            bytes,
            bytes_per_request: if parts + direct > 0 { bytes as f64 / (parts + direct) as f64 } else { 0.0 },
            meta_requests: get(&self.meta_requests),
            part_requests: parts,
            part_bytes: get(&self.part_bytes),
            direct_reads: direct,
            direct_bytes: get(&self.direct_bytes),
            throttled: get(&self.throttled),
            failed_requests: get(&self.failed),
            latency_p50_ms: pct(0.5),
            latency_p99_ms: pct(0.99),
            max_in_flight: get(&self.max_in_flight),
            part_reads: get(&self.part_reads),
            wait_seconds: get(&self.part_wait_ns) as f64 * 1e-9,
            requests_per_sample: if reads > 0 { (parts + direct) as f64 / reads as f64 } else { 0.0 },
            streamed_share: if planned > 0 { get(&self.reads_streamed) as f64 / planned as f64 } else { 0.0 },
            cache_parts: get(&self.cache_hits),
            cache_bytes: get(&self.cache_bytes),
            cache: None,
            note: None,
        }
    }
}

impl StorageReport {
    /// The sum of several sources' reports (a mixture's), the latencies taken as the worst.
    pub fn merge(reports: impl IntoIterator<Item = StorageReport>) -> Option<StorageReport> {
        let mut out: Option<StorageReport> = None;
        for r in reports {
            let o = out.get_or_insert_with(StorageReport::default);
            let reads = |x: &StorageReport| x.part_reads + x.direct_reads;
            let (ra, rb) = (reads(o), reads(&r));
            o.note = o.note.take().or(r.note);
            o.cache = o.cache.take().or(r.cache);
            o.cache_parts += r.cache_parts;
            o.cache_bytes += r.cache_bytes;
            o.requests += r.requests;
            o.bytes += r.bytes;
            o.meta_requests += r.meta_requests;
            o.part_requests += r.part_requests;
            o.part_bytes += r.part_bytes;
            o.direct_reads += r.direct_reads;
            o.direct_bytes += r.direct_bytes;
            o.throttled += r.throttled;
            o.failed_requests += r.failed_requests;
            o.latency_p50_ms = o.latency_p50_ms.max(r.latency_p50_ms);
            o.latency_p99_ms = o.latency_p99_ms.max(r.latency_p99_ms);
            o.max_in_flight += r.max_in_flight;
            o.part_reads += r.part_reads;
            o.wait_seconds += r.wait_seconds;
            let fetches = o.part_requests + o.direct_reads;
            o.bytes_per_request = if fetches > 0 { o.bytes as f64 / fetches as f64 } else { 0.0 };
            o.requests_per_sample = if ra + rb > 0 { fetches as f64 / (ra + rb) as f64 } else { 0.0 };
            o.streamed_share = if ra + rb > 0 {
                (o.streamed_share * ra as f64 + r.streamed_share * rb as f64) / (ra + rb) as f64
            } else {
                0.0
            };
        }
        out
    }

    /// The report's lines of the human summary.
    pub fn text(&self) -> String {
        let note = self.note.as_ref().map(|n| format!("  note: {n}\n")).unwrap_or_default();
        let cache = self
            .cache
            .as_ref()
            .map(|c| {
                format!(
                    "  shard cache {}: {} parts read from it ({:.1} MiB), {} stored, {} not stored (budget); uses \
                     {:.1} of {:.1} MiB\n",
                    c.dir,
                    self.cache_parts,
                    self.cache_bytes as f64 / (1 << 20) as f64,
                    c.stored,
                    c.not_stored_budget,
                    c.used_bytes as f64 / (1 << 20) as f64,
                    c.budget_bytes as f64 / (1 << 20) as f64
                )
            })
            .unwrap_or_default();
        note + &cache
            + &format!(
                "storage: {} requests ({} parts, {} samples alone, {} metadata), {:.1} MiB, {:.2} MiB per request, \
             first byte p50 {:.0} ms / p99 {:.0} ms, up to {} in flight, {} throttled and retried, \
             reads waited {:.2} s for their part\n",
                self.requests,
                self.part_requests,
                self.direct_reads,
                self.meta_requests,
                self.bytes as f64 / (1 << 20) as f64,
                self.bytes_per_request / (1 << 20) as f64,
                self.latency_p50_ms,
                self.latency_p99_ms,
                self.max_in_flight,
                self.throttled,
                self.wait_seconds,
            )
    }
}
