//! Reads at positions of an object in a store, served from aligned blocks of [`BLOCK`] bytes
//! (one ranged request each, through the reader's bounded, breaker-protected requests: see
//! `super::remote`) kept in a small least-recently-used cache, with the next blocks read ahead
//! on a thread of the reader's own while reads go forward block after block. Token files in
//! object storage are read through it ([`super::open_positioned`]): a pass over a file costs
//! about one request per 8 MiB of it, not one per document, and opening a file whose index is
//! its own scan (a nanoGPT `.bin` split at EOS ids) one request per block too.
//!
//! Memory: at most [`CACHED`] blocks are cached (32 MiB), plus the blocks being fetched: one
//! per thread reading and one read ahead (48 MiB for one reading thread).
//!
//! The read-ahead serves passes that go forward through a file. The token loader's orders of
//! object storage do: files, then windows of a file (each shuffled within, its documents read
//! in file order; see `tokens::pipeline::order`), never a permutation of a whole file, so
//! a block is read once per pass and rank. A read in the block after the one read before
//! starts the fetch of the next [`AHEAD`] blocks not yet cached or fetched; reads that jump
//! about fetch the block they need and nothing more. The read-ahead thread is started at the
//! first forward step and requests one block at a time under the same time bounds, circuit
//! breaker and stop flag as every request; once the reader is dropped its request in flight
//! is abandoned (within the stop poll, 20 ms) and the drop waits for the thread to end. No lock
//! is held during a request, and a read that needs a block being fetched waits for that fetch
//! (itself bounded in time) instead of asking for the block a second time; the error of a
//! failed read-ahead is the error of the next read of its block (the one after asks again).
// Objects are read through it only with the `remote` feature; its tests run without.
#![cfg_attr(not(feature = "remote"), allow(dead_code))]

use std::collections::{BTreeSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes of a block: one ranged request (the request size of `remote::ObjectReader`).
pub(crate) const BLOCK: u64 = 8 << 20;

/// Blocks kept in a reader's cache, at most.
pub(crate) const CACHED: usize = 4;

/// Blocks read ahead of a read that went forward into the next block.
pub(crate) const AHEAD: u64 = 2;

/// Read-ahead errors kept for the reads of their blocks, at most (the oldest go first).
const FAILED_KEPT: usize = 16;

/// How often a read waiting for another thread's fetch looks at its loader's stop flag.
const POLL: Duration = Duration::from_millis(20);

/// An object read in ranged requests: what a [`BlockReader`] reads its blocks from.
pub(crate) trait Ranged: Send + Sync + Sized + 'static {
    /// Bytes in all.
    fn size(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset` (one request for a block).
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// The same object for the read-ahead thread, whose requests are abandoned once `halt`
    /// is set (and when this one's would be).
    fn fork(&self, halt: Arc<AtomicBool>) -> io::Result<Self>;
    /// Whether the loader reading it is stopping: a read waiting for a block gives up.
    fn stopping(&self) -> bool;
    /// Its name, for messages.
    fn name(&self) -> &str;
}

#[cfg(feature = "remote")]
impl Ranged for super::remote::ObjectReader {
    fn size(&self) -> u64 {
        super::remote::ObjectReader::size(self)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        super::remote::ObjectReader::read_exact_at(self, buf, offset)
    }
    fn fork(&self, halt: Arc<AtomicBool>) -> io::Result<Self> {
        super::remote::ObjectReader::fork(self, halt).map_err(|e| io::Error::other(e.to_string()))
    }
    fn stopping(&self) -> bool {
        super::remote::ObjectReader::stopping(self)
    }
    fn name(&self) -> &str {
        self.url()
    }
}

/// Reads at positions of `R` through cached blocks and a read-ahead (see the module doc).
/// Thread-safe: any number of threads may read at once.
pub(crate) struct BlockReader<R: Ranged> {
    at: R,
    block: u64,
    cached: usize,
    ahead: u64,
    shared: Arc<Shared>,
    /// Set when the reader is dropped: the read-ahead's request in flight is abandoned.
    halt: Arc<AtomicBool>,
    thread: Mutex<Ahead>,
}

/// The read-ahead thread of a reader.
enum Ahead {
    /// Not started (no read has gone forward yet).
    Idle,
    /// Running: blocks to fetch go down `tx`.
    Running(crossbeam_channel::Sender<u64>, JoinHandle<()>),
    /// Could not be started (its handle on the object could not be made): reads fetch alone.
    Off,
}

/// What the readers and the read-ahead thread of a reader share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever a fetch ends (its block cached, or its error kept).
    landed: Condvar,
}

#[derive(Default)]
struct State {
    /// Cached blocks by index, least recently used first.
    lru: VecDeque<(u64, Arc<Vec<u8>>)>,
    /// Blocks a reading thread is fetching.
    fetching: BTreeSet<u64>,
    /// Blocks queued for, or in flight on, the read-ahead thread.
    queued: BTreeSet<u64>,
    /// Errors of read-ahead fetches, for the next read of their block (the latest
    /// [`FAILED_KEPT`]).
    failed: VecDeque<(u64, io::Error)>,
    /// The block of the last read.
    last: Option<u64>,
    /// The last step between blocks went to the next block.
    forward: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// Block `b` if cached, now the most recently used.
    fn hit(&mut self, b: u64) -> Option<Arc<Vec<u8>>> {
        let i = self.lru.iter().position(|(k, _)| *k == b)?;
        let e = self.lru.remove(i).expect("found above");
        let data = e.1.clone();
        self.lru.push_back(e);
        Some(data)
    }

    /// Caches block `b`, dropping the least recently used beyond `cap`.
    fn insert(&mut self, b: u64, data: Arc<Vec<u8>>, cap: usize) {
        self.lru.retain(|(k, _)| *k != b);
        self.lru.push_back((b, data));
        while self.lru.len() > cap {
            self.lru.pop_front();
        }
    }

    /// Whether block `b` is cached or being fetched.
    fn known(&self, b: u64) -> bool {
        self.fetching.contains(&b) || self.queued.contains(&b) || self.lru.iter().any(|(k, _)| *k == b)
    }

    /// Notes a read in block `b`: whether reads go forward block after block.
    fn step(&mut self, b: u64) -> bool {
        match self.last {
            Some(l) if l == b => {}
            Some(l) if l + 1 == b => self.forward = true,
            _ => self.forward = false,
        }
        self.last = Some(b);
        self.forward
    }
}

/// Bytes of block `b` of `at`, in one request.
fn fetch<R: Ranged>(at: &R, b: u64, block: u64) -> io::Result<Arc<Vec<u8>>> {
    let from = b * block;
    let mut data = vec![0u8; (at.size() - from).min(block) as usize];
    at.read_exact_at(&mut data, from)?;
    Ok(Arc::new(data))
}

impl<R: Ranged> BlockReader<R> {
    /// Reads `at` in blocks of [`BLOCK`] bytes, [`CACHED`] of them cached, [`AHEAD`] read ahead.
    pub(crate) fn new(at: R) -> Self {
        Self::with(at, BLOCK, CACHED, AHEAD)
    }

    /// Reads `at` in blocks of `block` bytes, `cached` of them cached (at least `ahead + 2`:
    /// the block being read, the one before and those read ahead), `ahead` read ahead.
    pub(crate) fn with(at: R, block: u64, cached: usize, ahead: u64) -> Self {
        BlockReader {
            at,
            block: block.max(1),
            cached: cached.max(ahead as usize + 2),
            ahead,
            shared: Arc::default(),
            halt: Arc::default(),
            thread: Mutex::new(Ahead::Idle),
        }
    }

    /// Bytes in all.
    pub(crate) fn size(&self) -> u64 {
        self.at.size()
    }

    /// Reads exactly `buf.len()` bytes at `offset`, from cached blocks where it can and a
    /// request per missing block; a range past the end is an `UnexpectedEof` error.
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let size = self.at.size();
        let end = offset.checked_add(buf.len() as u64).filter(|&e| e <= size).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: bytes {offset}..+{} past its end ({size} bytes)", self.at.name(), buf.len()),
            )
        })?;
        let mut at = offset;
        while at < end {
            let b = at / self.block;
            let data = self.get(b)?;
            let from = (at - b * self.block) as usize;
            let n = (data.len().saturating_sub(from) as u64).min(end - at) as usize;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: short block {b}", self.at.name()),
                ));
            }
            let to = (at - offset) as usize;
            buf[to..to + n].copy_from_slice(&data[from..from + n]);
            at += n as u64;
        }
        Ok(())
    }

    /// Block `b`: cached, fetched by another thread (waited for), or fetched here.
    fn get(&self, b: u64) -> io::Result<Arc<Vec<u8>>> {
        let mut st = lock(&self.shared.state);
        if st.step(b) {
            st = self.read_ahead(st, b);
        }
        loop {
            if let Some(data) = st.hit(b) {
                return Ok(data);
            }
            if let Some(i) = st.failed.iter().position(|(k, _)| *k == b) {
                return Err(st.failed.remove(i).expect("found above").1);
            }
            if !st.known(b) {
                break;
            }
            st = self.shared.landed.wait_timeout(st, POLL).unwrap_or_else(|p| p.into_inner()).0;
            if self.at.stopping() {
                return Err(io::Error::other(format!(
                    "{}: block {b}: abandoned (the loader is stopping)",
                    self.at.name()
                )));
            }
        }
        st.fetching.insert(b);
        drop(st);
        let got = fetch(&self.at, b, self.block);
        let mut st = lock(&self.shared.state);
        st.fetching.remove(&b);
        if let Ok(data) = &got {
            st.insert(b, data.clone(), self.cached);
        }
        drop(st);
        self.shared.landed.notify_all();
        got
    }

    /// Queues the blocks after `b` that are neither cached nor being fetched (up to
    /// `ahead`, within the object) for the read-ahead thread, started if need be; without
    /// one they are left to the reads. Returns the lock it was given, taken again.
    fn read_ahead<'a>(&'a self, mut st: MutexGuard<'a, State>, b: u64) -> MutexGuard<'a, State> {
        let size = self.at.size();
        let want: Vec<u64> =
            (b + 1..=b + self.ahead).take_while(|&k| k * self.block < size).filter(|&k| !st.known(k)).collect();
        if want.is_empty() {
            return st;
        }
        for &k in &want {
            st.queued.insert(k);
            st.failed.retain(|(f, _)| *f != k);
        }
        drop(st);
        let sent = self.send(&want);
        let mut st = lock(&self.shared.state);
        if !sent {
            for k in &want {
                st.queued.remove(k);
            }
            self.shared.landed.notify_all();
        }
        st
    }

    /// Hands `blocks` to the read-ahead thread, starting it at the first call; `false` when
    /// there is none.
    fn send(&self, blocks: &[u64]) -> bool {
        let mut t = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*t, Ahead::Idle) {
            *t = match self.at.fork(self.halt.clone()) {
                Ok(at) => {
                    let (tx, rx) = crossbeam_channel::unbounded();
                    let (shared, halt, block, cached) =
                        (self.shared.clone(), self.halt.clone(), self.block, self.cached);
                    let spawned = std::thread::Builder::new()
                        .name("stoker-blocks".into())
                        .spawn(move || read_ahead_thread(&at, &shared, &rx, &halt, (block, cached)));
                    match spawned {
                        Ok(h) => Ahead::Running(tx, h),
                        Err(_) => Ahead::Off,
                    }
                }
                Err(_) => Ahead::Off,
            };
        }
        match &*t {
            Ahead::Running(tx, _) => blocks.iter().all(|&k| tx.send(k).is_ok()),
            _ => false,
        }
    }
}

/// The read-ahead thread: fetches the blocks it is sent, one at a time, until its reader is
/// dropped; on its way out (even by a panic) no block is left marked as queued.
fn read_ahead_thread<R: Ranged>(
    at: &R,
    shared: &Shared,
    rx: &crossbeam_channel::Receiver<u64>,
    halt: &AtomicBool,
    (block, cached): (u64, usize),
) {
    struct Unmark<'a>(&'a Shared);
    impl Drop for Unmark<'_> {
        fn drop(&mut self) {
            lock(&self.0.state).queued.clear();
            self.0.landed.notify_all();
        }
    }
    let _unmark = Unmark(shared);
    for b in rx.iter() {
        if halt.load(Ordering::Acquire) {
            return;
        }
        let got = fetch(at, b, block);
        let mut st = lock(&shared.state);
        st.queued.remove(&b);
        match got {
            Ok(data) => st.insert(b, data, cached),
            Err(e) => {
                st.failed.push_back((b, e));
                while st.failed.len() > FAILED_KEPT {
                    st.failed.pop_front();
                }
            }
        }
        drop(st);
        shared.landed.notify_all();
    }
}

impl<R: Ranged> Drop for BlockReader<R> {
    fn drop(&mut self) {
        self.halt.store(true, Ordering::Release);
        let t = std::mem::replace(self.thread.get_mut().unwrap_or_else(|p| p.into_inner()), Ahead::Off);
        if let Ahead::Running(tx, h) = t {
            drop(tx);
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    /// An object in memory that counts its requests; the read-ahead's handle (a fork) can be
    /// made to hang until halted, or to fail.
    struct Fake {
        data: Arc<Vec<u8>>,
        gets: Arc<AtomicUsize>,
        /// `Some` on a fork: its halt flag.
        halt: Option<Arc<AtomicBool>>,
        /// A fork's requests hang until halted.
        stuck: bool,
        /// A fork's requests fail.
        broken: bool,
    }

    impl Fake {
        fn new(len: usize) -> Self {
            let data = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            Fake { data: Arc::new(data), gets: Arc::default(), halt: None, stuck: false, broken: false }
        }
    }

    impl Ranged for Fake {
        fn size(&self) -> u64 {
            self.data.len() as u64
        }
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            if let Some(h) = &self.halt {
                while self.stuck && !h.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if self.stuck || self.broken {
                    return Err(io::Error::other("read-ahead failed"));
                }
            }
            self.gets.fetch_add(1, Ordering::SeqCst);
            let o = offset as usize;
            buf.copy_from_slice(&self.data[o..o + buf.len()]);
            Ok(())
        }
        fn fork(&self, halt: Arc<AtomicBool>) -> io::Result<Self> {
            Ok(Fake { data: self.data.clone(), gets: self.gets.clone(), halt: Some(halt), ..*self })
        }
        fn stopping(&self) -> bool {
            false
        }
        fn name(&self) -> &str {
            "fake"
        }
    }

    fn read(r: &BlockReader<Fake>, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        r.read_exact_at(&mut buf, offset).map(|()| buf)
    }

    #[test]
    fn a_forward_pass_fetches_each_block_once() {
        let f = Fake::new(10_500);
        let (data, gets) = (f.data.clone(), f.gets.clone());
        let r = BlockReader::with(f, 1000, 4, 2);
        let mut at = 0usize;
        for n in (0..).map(|k| 1 + k * 37 % 400) {
            if at >= data.len() {
                break;
            }
            let n = n.min(data.len() - at);
            assert_eq!(read(&r, at as u64, n).unwrap(), data[at..at + n], "at {at}");
            at += n;
        }
        drop(r); // waits for the read-ahead thread
        assert_eq!(gets.load(Ordering::SeqCst), 11, "one request per block");
    }

    #[test]
    fn jumps_fetch_only_the_blocks_read_and_reuse_cached_ones() {
        let f = Fake::new(20_000);
        let (data, gets) = (f.data.clone(), f.gets.clone());
        let r = BlockReader::with(f, 1000, 4, 2);
        // Blocks 7, 2, 7, 2, 12: jumps, no read-ahead.
        for (at, n) in [(7100, 50), (2999, 1), (7000, 1000), (2000, 10), (12_100, 300)] {
            assert_eq!(read(&r, at, n).unwrap(), data[at as usize..at as usize + n], "at {at}");
        }
        assert_eq!(gets.load(Ordering::SeqCst), 3);
        assert!(matches!(*r.thread.lock().unwrap(), Ahead::Idle), "no read-ahead thread");
        // A range across blocks 12 and 13 is a forward step: one request for 13 here.
        assert_eq!(read(&r, 12_900, 300).unwrap(), data[12_900..13_200]);
        assert!(matches!(*r.thread.lock().unwrap(), Ahead::Running(..)));
        let e = read(&r, 19_990, 11).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn readers_on_many_threads_get_the_right_bytes() {
        let f = Fake::new(50_000);
        let data = f.data.clone();
        let r = BlockReader::with(f, 1024, 4, 2);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (r, data) = (&r, &data);
                s.spawn(move || {
                    let mut x = t + 1;
                    for _ in 0..500 {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        let at = (x >> 33) % 49_000;
                        let n = 1 + (x >> 20) as usize % 1000;
                        assert_eq!(read(r, at, n).unwrap(), data[at as usize..at as usize + n]);
                    }
                });
            }
        });
    }

    #[test]
    fn a_failed_read_ahead_is_the_next_reads_error_and_then_asked_again() {
        let mut f = Fake::new(5000);
        f.broken = true;
        let data = f.data.clone();
        let r = BlockReader::with(f, 1000, 4, 2);
        read(&r, 900, 200).unwrap(); // blocks 0 and 1: 2 and 3 are read ahead, and fail
        let e = read(&r, 2000, 10).unwrap_err();
        assert!(e.to_string().contains("read-ahead failed"), "{e}");
        assert_eq!(read(&r, 2000, 10).unwrap(), data[2000..2010]);
    }

    #[test]
    fn dropping_a_reader_abandons_its_read_ahead() {
        let mut f = Fake::new(10_000);
        f.stuck = true;
        let r = BlockReader::with(f, 1000, 4, 2);
        read(&r, 990, 20).unwrap(); // blocks 0 and 1: the read-ahead of 2 hangs
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        drop(r);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }
}
