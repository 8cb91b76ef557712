//! Reading shards in object storage in a few large parts, fetched ahead in the order a pass
//! will need them, instead of one request per sample.
//!
//! A pass tells its source the order it will read samples in ([`super::Source::plan_reads`]).
//! Every sample lies in one *part* of its shard (a run of consecutive samples of at most
//! [`PART_BYTES`], fixed when the shards are opened: [`super::shards`]). From the order this
//! module makes a plan ([`Readahead::new`]):
//! - for each part the pass touches, the byte range that covers the samples the pass reads
//!   there (a rank reads only its own samples' bytes), how many reads will use it, and the
//!   position of its first and last use;
//! - which parts are streamed: in order of first use, a part is kept when the parts kept and
//!   alive at the same time (from first use to last use, plus a lag for reads that run out of
//!   order) still fit the byte budget. In a shard-window order nearly every part is kept; in a
//!   global permutation a part is used from start to end of the epoch and most are not: their
//!   samples are read one request each, and the report counts them
//!   ([`super::storage_stats::StorageReport::direct_reads`]).
//!
//! A driver thread fetches the kept parts in that order through a [`PartFetch`] (the object
//! store: [`super::remote`]) with as many requests in flight as the measured bandwidth x
//! latency needs ([`Concurrency`]), while the parts fetched and in flight fit the budget. A
//! read of a sample copies its bytes out of its part once the part has arrived (waiting for it
//! if it is on its way, and reading the bytes that have come while it fills) and releases the
//! part after its last use. A read never waits for a part that cannot be fetched: a read whose
//! part is not yet asked for and would not be before a later read released room is a
//! [`Got::Miss`], which the caller reads with its own request; so is a
//! part whose fetch failed with an answer from the store (the sample then fails or succeeds on
//! its own), while a store that does not answer fails the read as [`ReadFailure::Unavailable`].
//!
//! Owns: which parts to fetch, when, how many at once, and the bytes fetched. May not touch:
//! requests themselves (a [`PartFetch`]), tar headers or sample bytes' meaning.

use super::fetch::{Chunk, Fetched, PartFetch, PartStore, ReadFailure, Sink};
use super::storage_stats::StorageStats;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most bytes of one part: a shard is cut into runs of consecutive samples of at most this
/// size (a larger sample is a part of its own). Fixed, so that the parts (and the shard-window
/// order made of them) are the same whatever the storage or the machine. 64 MiB, the top of the
/// usual 8-64 MiB: one request per 64 MiB (S3 bills and throttles per request; a server that
/// reads the whole object for each ranged request, as moto does, pays per request too), while
/// a pass's first batch waits for one part (about 0.1-0.7 s at 0.1-0.6 GB/s).
pub const PART_BYTES: u64 = 64 << 20;

/// The most requests in flight.
const MAX_IN_FLIGHT: usize = 64;
/// Requests in flight before anything is measured.
const START_IN_FLIGHT: usize = 8;
/// How long a waiting read (or the driver) sleeps before it looks at the plan again without
/// being woken.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// What a read of a planned sample gave.
#[derive(Debug)]
pub(crate) enum Got {
    /// The bytes were copied into the caller's buffer.
    Hit,
    /// Not from a part: read the sample with a request of its own.
    Miss,
    /// The pass is stopping: read nothing more.
    Stopped,
}

/// One sample's place for a plan: its part, its shard and the bytes a read of it needs.
#[derive(Debug, Clone)]
pub(crate) struct Need {
    /// The part (numbered by the source, over all its shards).
    pub part: u32,
    /// The shard the part is in.
    pub shard: u32,
    /// The bytes a read of the sample takes from the shard (tar header, data, text member).
    pub bytes: Range<u64>,
}

#[derive(Debug)]
enum State {
    /// Not asked for yet.
    Pending,
    /// A request is on its way; its body so far (reads of the bytes there need not wait).
    Filling(Vec<u8>),
    /// Arrived.
    Ready(Arc<Vec<u8>>),
    /// The fetch failed.
    Failed(ReadFailure),
    /// Every use was read (or the part was given up): its bytes are gone.
    Done,
}

#[derive(Debug)]
struct Part {
    shard: u32,
    range: Range<u64>,
    /// Reads still to come.
    uses: u32,
    state: State,
    /// Its bytes count in [`Plan::held`] (from its request to its last use or failure).
    held: bool,
}

impl Part {
    fn len(&self) -> u64 {
        self.range.end - self.range.start
    }
}

/// How many requests to keep in flight: enough for the bandwidth x latency measured so far
/// (each request carries about one part), halved when the store throttles and grown back by
/// one per answered request (additive increase, multiplicative decrease). Before a request has
/// completed, one more for each answer that has begun (a slow start): the part a pass needs
/// first gets the link (and the server) to itself, so its first bytes come soonest.
#[derive(Debug)]
struct Concurrency {
    /// Moving averages: seconds to the first byte, bytes per second of a body, part bytes.
    latency: Option<f64>,
    rate: Option<f64>,
    part: f64,
    /// The throttling cap.
    cap: usize,
    /// Answers that have begun (their first byte came).
    begun: usize,
}

impl Concurrency {
    fn new(part: f64) -> Self {
        Concurrency { latency: None, rate: None, part: part.max(1.0), cap: MAX_IN_FLIGHT, begun: 0 }
    }

    /// The requests to keep in flight now.
    fn target(&self) -> usize {
        let need = match (self.latency, self.rate) {
            // A request costs `latency + part / rate`; to keep the link busy while one waits
            // for its first byte, `latency * rate / part` more are needed, plus slack.
            (Some(l), Some(r)) => ((l * r / self.part).ceil() as usize).saturating_add(2),
            _ => (1 + self.begun).min(START_IN_FLIGHT),
        };
        need.min(MAX_IN_FLIGHT).min(self.cap).max(1)
    }

    fn record(&mut self, f: &Fetched, bytes: u64, in_flight: usize) {
        const W: f64 = 0.25;
        let ewma = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + W * (new - o)));
        if f.throttled > 0 {
            self.cap = (in_flight / 2).max(1);
        } else if f.bytes.is_ok() {
            self.cap = (self.cap + 1).min(MAX_IN_FLIGHT);
        }
        if f.bytes.is_ok() && bytes > 0 {
            self.latency = ewma(self.latency, f.latency.as_secs_f64());
            let body = (f.total.saturating_sub(f.latency)).as_secs_f64().max(1e-4);
            self.rate = ewma(self.rate, bytes as f64 / body);
            self.part = self.part + W * (bytes as f64 - self.part);
        }
    }
}

struct Plan {
    parts: Vec<Part>,
    /// Plan index of a source's part number.
    by_part: HashMap<u32, usize>,
    /// The next part the driver asks for.
    next: usize,
    /// Bytes of parts arrived or on their way.
    held: u64,
    budget: u64,
    in_flight: usize,
    /// Reads waiting for a part (a body's bytes wake them only when there are some).
    waiting: usize,
    stopped: bool,
    concurrency: Concurrency,
}

impl Plan {
    /// Gives part `k`'s bytes back to the budget (once).
    fn release(&mut self, k: usize) {
        let p = &mut self.parts[k];
        if std::mem::take(&mut p.held) {
            self.held -= p.len();
        }
    }

    /// Whether the driver may ask for a part of `bytes` while `held` bytes are held: within
    /// the budget, or the only part held (a part larger than the budget still comes).
    fn room(&self, held: u64, bytes: u64) -> bool {
        held + bytes <= self.budget || held == 0
    }

    /// Whether the driver will ask for plan part `k` (not yet asked for) without waiting for a
    /// release: the parts still to ask for up to it fit beside what is held. A read of a part
    /// that is not coming does not wait for it (the part it waits on could be held only by
    /// reads after its own).
    fn coming(&self, k: usize) -> bool {
        if self.stopped {
            return false;
        }
        let mut held = self.held;
        for p in &self.parts[self.next.min(k)..=k] {
            if matches!(p.state, State::Pending) && p.uses > 0 {
                if !self.room(held, p.len()) {
                    return false;
                }
                held += p.len();
            }
        }
        true
    }
}

struct Shared {
    plan: Mutex<Plan>,
    changed: Condvar,
    stats: Arc<StorageStats>,
    /// Parts kept between passes: looked up before a part is asked for, stored once it came.
    cache: Option<Arc<dyn PartStore>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

fn lock(m: &Mutex<Plan>) -> MutexGuard<'_, Plan> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The parts of one pass and the thread that fetches them; dropping it stops the thread and
/// gives up the fetches in flight.
pub(crate) struct Readahead {
    shared: Arc<Shared>,
    driver: Option<std::thread::JoinHandle<()>>,
}

/// Which parts of `needs` (one per read, in the order of the pass) are streamed within
/// `budget` bytes, as plan parts in order of first use. `lag`: reads that may run ahead of
/// the oldest unfinished one.
fn choose(needs: &[Need], budget: u64, lag: usize) -> Vec<(u32, Part)> {
    struct Seen {
        shard: u32,
        range: Range<u64>,
        uses: u32,
        first: usize,
        last: usize,
    }
    let mut order: Vec<u32> = vec![];
    let mut seen: HashMap<u32, Seen> = HashMap::new();
    for (pos, n) in needs.iter().enumerate() {
        let e = seen.entry(n.part).or_insert_with(|| {
            order.push(n.part);
            Seen { shard: n.shard, range: n.bytes.clone(), uses: 0, first: pos, last: pos }
        });
        e.range.start = e.range.start.min(n.bytes.start);
        e.range.end = e.range.end.max(n.bytes.end);
        e.uses = e.uses.saturating_add(1);
        e.last = pos;
    }
    // In order of first use: keep a part when, with the kept parts still alive at its first
    // use, it fits the budget. Alive: from first use to last use + lag.
    let mut alive: std::collections::BinaryHeap<std::cmp::Reverse<(usize, u64)>> = Default::default();
    let mut held = 0u64;
    let mut kept = vec![];
    for id in order {
        let s = seen.remove(&id).expect("seen part");
        while let Some(std::cmp::Reverse((end, bytes))) = alive.peek().copied() {
            if end >= s.first {
                break;
            }
            alive.pop();
            held -= bytes;
        }
        let bytes = s.range.end - s.range.start;
        if held + bytes <= budget {
            held += bytes;
            alive.push(std::cmp::Reverse((s.last.saturating_add(lag), bytes)));
            kept.push((id, Part { shard: s.shard, range: s.range, uses: s.uses, state: State::Pending, held: false }));
        }
    }
    kept
}

impl Readahead {
    /// The plan of a pass that reads `needs` in this order, within `budget` bytes of parts;
    /// starts fetching at once. `None` when no part is worth fetching (every read then is a
    /// request of its own).
    pub(crate) fn new(
        needs: &[Need],
        budget: u64,
        lag: usize,
        fetch: Arc<dyn PartFetch>,
        stats: Arc<StorageStats>,
        cache: Option<Arc<dyn PartStore>>,
    ) -> Option<Readahead> {
        let kept = choose(needs, budget, lag);
        let planned_reads: u64 = kept.iter().map(|(_, p)| u64::from(p.uses)).sum();
        stats.planned(needs.len() as u64, planned_reads);
        if kept.is_empty() {
            return None;
        }
        let mean = kept.iter().map(|(_, p)| p.len() as f64).sum::<f64>() / kept.len() as f64;
        let by_part = kept.iter().enumerate().map(|(k, (id, _))| (*id, k)).collect();
        let plan = Plan {
            parts: kept.into_iter().map(|(_, p)| p).collect(),
            by_part,
            next: 0,
            held: 0,
            budget,
            in_flight: 0,
            waiting: 0,
            stopped: false,
            concurrency: Concurrency::new(mean),
        };
        let shared = Arc::new(Shared {
            plan: Mutex::new(plan),
            changed: Condvar::new(),
            stats,
            cache,
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        });
        let s = shared.clone();
        let driver =
            std::thread::Builder::new().name("stoker-readahead".into()).spawn(move || drive(&s, &*fetch)).ok()?;
        Some(Readahead { shared, driver: Some(driver) })
    }

    /// Copies bytes `at` of the sample whose part is `part` into `buf` (sized by the caller)
    /// once its part has arrived; see [`Got`] for when it does not.
    pub(crate) fn read(&self, part: u32, at: u64, buf: &mut [u8]) -> std::result::Result<Got, ReadFailure> {
        let sh = &self.shared;
        let mut plan = lock(&sh.plan);
        let Some(&k) = plan.by_part.get(&part) else { return Ok(Got::Miss) };
        let end = at + buf.len() as u64;
        if at < plan.parts[k].range.start || end > plan.parts[k].range.end {
            return Ok(Got::Miss);
        }
        let waited = Instant::now();
        loop {
            if plan.stopped {
                return Ok(Got::Stopped);
            }
            let coming = plan.coming(k);
            let p = &mut plan.parts[k];
            let from = (at - p.range.start) as usize;
            let bytes = match &p.state {
                State::Ready(bytes) => Some(bytes.clone()),
                State::Filling(body) if body.len() >= from + buf.len() => {
                    buf.copy_from_slice(&body[from..from + buf.len()]);
                    None
                }
                State::Failed(ReadFailure::Unavailable(why)) => return Err(ReadFailure::Unavailable(why.clone())),
                State::Failed(_) | State::Done => return Ok(Got::Miss),
                State::Pending if !coming => {
                    // No room for the part before the reads of the parts ahead of it are
                    // done: this read goes on its own, and the part is not fetched for it.
                    p.uses = p.uses.saturating_sub(1);
                    if p.uses == 0 {
                        p.state = State::Done;
                    }
                    return Ok(Got::Miss);
                }
                State::Pending | State::Filling(_) => {
                    plan.waiting += 1;
                    plan = sh.changed.wait_timeout(plan, WAIT_POLL).unwrap_or_else(|p| p.into_inner()).0;
                    plan.waiting -= 1;
                    continue;
                }
            };
            p.uses = p.uses.saturating_sub(1);
            if p.uses == 0 {
                // Its last use: its bytes go (a fill still under way ends in `arrived`).
                p.state = State::Done;
                plan.release(k);
                sh.changed.notify_all();
            }
            drop(plan);
            if let Some(bytes) = bytes {
                buf.copy_from_slice(&bytes[from..from + buf.len()]);
            }
            sh.stats.part_read(waited.elapsed());
            return Ok(Got::Hit);
        }
    }

    /// Stops the driver and gives up the fetches in flight; reads waiting on a part return
    /// [`Got::Stopped`].
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        lock(&self.shared.plan).stopped = true;
        self.shared.changed.notify_all();
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.stop();
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
    }
}

/// The driver: asks for the parts in order while they fit the budget and the concurrency.
fn drive(sh: &Arc<Shared>, fetch: &dyn PartFetch) {
    let mut plan = lock(&sh.plan);
    loop {
        if plan.stopped {
            break;
        }
        let next = plan.next;
        if next >= plan.parts.len() {
            break;
        }
        if plan.parts[next].uses == 0 {
            // Every use went on its own (the driver waited for room meanwhile).
            plan.parts[next].state = State::Done;
            plan.next += 1;
            continue;
        }
        let bytes = plan.parts[next].len();
        if !plan.room(plan.held, bytes) || plan.in_flight >= plan.concurrency.target() {
            plan = sh.changed.wait_timeout(plan, WAIT_POLL).unwrap_or_else(|p| p.into_inner()).0;
            continue;
        }
        plan.next += 1;
        plan.held += bytes;
        plan.in_flight += 1;
        sh.stats.in_flight(plan.in_flight);
        let p = &mut plan.parts[next];
        p.state = State::Filling(Vec::new());
        p.held = true;
        let (shard, range) = (p.shard as usize, p.range.clone());
        drop(plan);
        if let Some(bytes) = sh.cache.as_ref().and_then(|c| c.get(shard, &range)) {
            sh.stats.cache_hit(bytes.len() as u64);
            plan = lock(&sh.plan);
            plan.in_flight -= 1;
            if plan.parts[next].uses > 0 {
                plan.parts[next].state = State::Ready(Arc::new(bytes));
            } else {
                plan.parts[next].state = State::Done;
                plan.release(next);
            }
            sh.changed.notify_all();
            continue;
        }
        let (s, f) = (sh.clone(), sh.clone());
        let sink: Sink = Arc::new(move |c| filled(&f, next, bytes, c));
        fetch.start(shard, range, sh.stop.clone(), sink, Box::new(move |f| arrived(&s, next, bytes, f)));
        plan = lock(&sh.plan);
    }
    drop(plan);
    sh.changed.notify_all();
}

/// More of plan part `k`'s body (`bytes` long) arrived: reads waiting for those bytes go on.
fn filled(sh: &Shared, k: usize, bytes: u64, c: Chunk<'_>) {
    let mut plan = lock(&sh.plan);
    let waiting = plan.waiting > 0;
    if let Chunk::Restart = c {
        plan.concurrency.begun += 1;
        sh.changed.notify_all();
    }
    if let State::Filling(body) = &mut plan.parts[k].state {
        match c {
            Chunk::Restart => body.clear(),
            Chunk::Bytes(b) => {
                if body.capacity() == 0 {
                    body.reserve_exact(bytes as usize);
                }
                // More than asked for is the fetch's error, found when it ends.
                let room = (bytes as usize).saturating_sub(body.len());
                body.extend_from_slice(&b[..b.len().min(room)]);
            }
        }
        if waiting {
            sh.changed.notify_all();
        }
    }
}

/// A fetch of plan part `k` (`bytes` long) ended.
fn arrived(sh: &Shared, k: usize, bytes: u64, f: Fetched) {
    sh.stats.part_fetched(&f, bytes);
    let mut plan = lock(&sh.plan);
    let in_flight = plan.in_flight;
    plan.concurrency.record(&f, bytes, in_flight);
    plan.in_flight -= 1;
    let p = &mut plan.parts[k];
    let body = match std::mem::replace(&mut p.state, State::Done) {
        State::Filling(streamed) if matches!(f.bytes, Ok(ref b) if b.is_empty()) => Ok(streamed),
        _ => f.bytes,
    };
    let (shard, range) = (p.shard as usize, p.range.clone());
    let keep = |b: Vec<u8>| {
        let b = Arc::new(b);
        if let Some(c) = &sh.cache {
            c.clone().put(shard, range, b.clone());
        }
        b
    };
    match body {
        // Every use was read while it filled: nothing to keep here.
        Ok(b) if p.uses == 0 && b.len() as u64 == bytes => drop(keep(b)),
        Ok(_) if p.uses == 0 => {}
        Ok(b) if b.len() as u64 == bytes => p.state = State::Ready(keep(b)),
        Ok(b) => p.state = State::Failed(ReadFailure::Failed(format!("short read: {} of {bytes} bytes", b.len()))),
        Err(e) => p.state = State::Failed(e),
    }
    if !matches!(plan.parts[k].state, State::Ready(_)) {
        plan.release(k);
    }
    drop(plan);
    sh.changed.notify_all();
}

#[cfg(test)]
mod tests {
    use super::super::fetch::Done;
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    /// Parts from memory, on threads of their own, after `delay`; counts requests.
    struct Mem {
        shards: Vec<Vec<u8>>,
        delay: Duration,
        requests: AtomicUsize,
        fail: Option<ReadFailure>,
        /// Hand the body over in halves (to the sink) instead of at the end.
        stream: bool,
    }

    impl PartFetch for Mem {
        fn start(&self, shard: usize, range: Range<u64>, _stop: Arc<AtomicBool>, sink: Sink, done: Done) {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let bytes = match &self.fail {
                Some(ReadFailure::Unavailable(w)) => Err(ReadFailure::Unavailable(w.clone())),
                Some(ReadFailure::Failed(w)) => Err(ReadFailure::Failed(w.clone())),
                None => Ok(self.shards[shard][range.start as usize..range.end as usize].to_vec()),
            };
            let (delay, stream) = (self.delay, self.stream);
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let bytes = match bytes {
                    // A body in two halves, the second after another delay.
                    Ok(b) if stream => {
                        sink(Chunk::Restart);
                        sink(Chunk::Bytes(&b[..b.len() / 2]));
                        std::thread::sleep(delay);
                        sink(Chunk::Bytes(&b[b.len() / 2..]));
                        Ok(vec![])
                    }
                    other => other,
                };
                done(Fetched { bytes, latency: delay, total: delay, throttled: 0 });
            });
        }
    }

    /// One shard of `n` samples of 100 bytes, `per` samples a part.
    fn setup(n: usize, per: usize, fail: Option<ReadFailure>) -> (Arc<Mem>, Vec<Need>) {
        let data: Vec<u8> = (0..n * 100).map(|i| (i % 251) as u8).collect();
        let mem = Arc::new(Mem {
            shards: vec![data],
            delay: Duration::from_millis(5),
            requests: 0.into(),
            fail,
            stream: false,
        });
        let needs = (0..n)
            .map(|i| Need { part: (i / per) as u32, shard: 0, bytes: (i as u64 * 100)..(i as u64 * 100 + 100) })
            .collect();
        (mem, needs)
    }

    fn read_all(ra: &Readahead, needs: &[Need], mem: &Mem) -> (usize, usize) {
        let (mut hits, mut misses) = (0, 0);
        for n in needs {
            let mut buf = vec![0u8; 100];
            match ra.read(n.part, n.bytes.start, &mut buf).unwrap() {
                Got::Hit => {
                    hits += 1;
                    let s = n.bytes.start as usize;
                    assert_eq!(buf, mem.shards[0][s..s + 100]);
                }
                Got::Miss => misses += 1,
                Got::Stopped => panic!("stopped"),
            }
        }
        (hits, misses)
    }

    #[test]
    fn in_order_reads_come_from_one_request_per_part() {
        let (mem, needs) = setup(1000, 100, None);
        let stats = Arc::new(StorageStats::default());
        let ra = Readahead::new(&needs, 4 * 10_000, 8, mem.clone(), stats.clone(), None).unwrap();
        assert_eq!(read_all(&ra, &needs, &mem), (1000, 0));
        assert_eq!(mem.requests.load(Ordering::Relaxed), 10);
        drop(ra);
        let r = stats.report();
        assert_eq!((r.part_requests, r.part_bytes), (10, 100_000));
    }

    #[test]
    fn a_global_permutation_streams_only_what_fits_and_reads_the_rest_alone() {
        let (mem, mut needs) = setup(1000, 100, None);
        // Every part used from start to end: at most 3 parts fit.
        let mut r = crate::shell::rng::Rng::new(1, 0, 0);
        crate::shell::rng::shuffle(&mut needs, &mut r);
        let kept = choose(&needs, 3 * 10_000, 8);
        assert_eq!(kept.len(), 3);
        let ra = Readahead::new(&needs, 3 * 10_000, 8, mem.clone(), Arc::new(StorageStats::default()), None).unwrap();
        let (hits, misses) = read_all(&ra, &needs, &mem);
        assert_eq!(hits + misses, 1000);
        assert!(hits <= 300 && misses >= 700, "{hits} {misses}");
        assert!(mem.requests.load(Ordering::Relaxed) <= 3);
    }

    #[test]
    fn a_part_is_only_the_bytes_of_the_samples_read() {
        // A rank that reads samples 150..250 fetches bytes 15000..25000, in two parts.
        let (mem, needs) = setup(1000, 100, None);
        let mine = &needs[150..250];
        let kept = choose(mine, 1 << 20, 8);
        let ranges: Vec<_> = kept.iter().map(|(_, p)| p.range.clone()).collect();
        assert_eq!(ranges, vec![15_000..20_000, 20_000..25_000]);
        let ra = Readahead::new(mine, 1 << 20, 8, mem.clone(), Arc::new(StorageStats::default()), None).unwrap();
        assert_eq!(read_all(&ra, mine, &mem), (100, 0));
        // A sample outside the plan is a miss, never a wait.
        assert!(matches!(ra.read(0, 0, &mut [0u8; 100]).unwrap(), Got::Miss));
    }

    #[test]
    fn a_store_that_does_not_answer_fails_reads_and_an_answered_failure_is_a_miss() {
        let (mem, needs) = setup(200, 100, Some(ReadFailure::Unavailable("down".into())));
        let ra = Readahead::new(&needs, 1 << 20, 8, mem, Arc::new(StorageStats::default()), None).unwrap();
        let e = ra.read(0, 0, &mut [0u8; 100]).unwrap_err();
        assert!(matches!(e, ReadFailure::Unavailable(ref w) if w == "down"));
        let (mem, needs) = setup(200, 100, Some(ReadFailure::Failed("404".into())));
        let ra = Readahead::new(&needs, 1 << 20, 8, mem, Arc::new(StorageStats::default()), None).unwrap();
        assert!(matches!(ra.read(0, 0, &mut [0u8; 100]).unwrap(), Got::Miss));
    }

    #[test]
    fn a_stopped_plan_ends_waiting_reads() {
        let (mem, needs) = setup(200, 100, None);
        let slow = Arc::new(Mem { delay: Duration::from_secs(30), ..Arc::try_unwrap(mem).ok().unwrap() });
        let ra = Arc::new(Readahead::new(&needs, 1 << 20, 8, slow, Arc::new(StorageStats::default()), None).unwrap());
        let r = ra.clone();
        let waiter = std::thread::spawn(move || r.read(0, 0, &mut [0u8; 100]).map(|g| matches!(g, Got::Stopped)));
        std::thread::sleep(Duration::from_millis(100));
        ra.stop();
        assert!(waiter.join().unwrap().unwrap());
    }

    /// Hands its one part over in two halves, the second only once `gate` lets it.
    struct Halves {
        data: Vec<u8>,
        gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    }

    impl PartFetch for Halves {
        fn start(&self, _: usize, range: Range<u64>, _stop: Arc<AtomicBool>, sink: Sink, done: Done) {
            let body = self.data[range.start as usize..range.end as usize].to_vec();
            let gate = self.gate.lock().unwrap().take().unwrap();
            std::thread::spawn(move || {
                sink(Chunk::Restart);
                sink(Chunk::Bytes(&body[..body.len() / 2]));
                let _ = gate.recv();
                sink(Chunk::Bytes(&body[body.len() / 2..]));
                done(Fetched { bytes: Ok(vec![]), latency: Duration::ZERO, total: Duration::ZERO, throttled: 0 });
            });
        }
    }

    #[test]
    fn a_part_is_read_while_it_fills() {
        let (mem, needs) = setup(100, 100, None);
        let (open, gate) = std::sync::mpsc::channel();
        let halves = Arc::new(Halves { data: mem.shards[0].clone(), gate: Mutex::new(Some(gate)) });
        let ra = Arc::new(Readahead::new(&needs, 1 << 20, 8, halves, Arc::new(StorageStats::default()), None).unwrap());
        // The first half has come: its samples are read although the part is not complete.
        let mut buf = vec![0u8; 100];
        assert!(matches!(ra.read(0, 0, &mut buf).unwrap(), Got::Hit));
        assert_eq!(buf, mem.shards[0][..100]);
        // A sample of the second half waits for it.
        let r = ra.clone();
        let late = std::thread::spawn(move || {
            let mut buf = vec![0u8; 100];
            (matches!(r.read(0, 9_900, &mut buf).unwrap(), Got::Hit), buf)
        });
        open.send(()).unwrap();
        let (hit, got) = late.join().unwrap();
        assert!(hit);
        assert_eq!(got, mem.shards[0][9_900..10_000]);
        // The rest, from the complete part.
        for n in &needs[1..99] {
            let mut buf = vec![0u8; 100];
            assert!(matches!(ra.read(n.part, n.bytes.start, &mut buf).unwrap(), Got::Hit));
        }
    }

    #[test]
    fn concurrency_follows_bandwidth_times_latency_and_halves_when_throttled() {
        let mut c = Concurrency::new(16e6);
        // A slow start: one request, then one more for each answer begun.
        assert_eq!(c.target(), 1);
        c.begun = 3;
        assert_eq!(c.target(), 4);
        c.begun = 100;
        assert_eq!(c.target(), START_IN_FLIGHT);
        // 100 ms to the first byte, 16 MB in 0.1 s after it: 160 MB/s x 0.1 s = one part.
        let f = |throttled| Fetched {
            bytes: Ok(vec![]),
            latency: Duration::from_millis(100),
            total: Duration::from_millis(200),
            throttled,
        };
        for _ in 0..20 {
            c.record(&f(0), 16_000_000, 4);
        }
        assert_eq!(c.target(), 3);
        c.record(&f(2), 16_000_000, 3);
        assert_eq!(c.target(), 1);
    }
}
