//! One object read from start to end as ranged requests (text and token data in a store).

use super::*;

/// Bytes of one ranged request of an [`ObjectReader`]: each request is bounded in time, so a
/// large object is read as many requests, never as one response that outlives the bound.
pub(super) const READ_CHUNK: u64 = 8 << 20;

/// An object read from start to end (text and token data in object storage: JSON Lines, text,
/// tar shards, compressed or not), as ranged requests of [`READ_CHUNK`] bytes under the time
/// bounds and the circuit breaker of every request (see the module doc). Runs its requests on
/// a runtime of the calling thread: no thread of its own to stop.
pub struct ObjectReader {
    at: Object,
    url: String,
    size: u64,
    pos: u64,
    chunk: Vec<u8>,
    used: usize,
}

/// One object, for requests on the calling thread: its store, the store's breaker, the stop
/// flag of the thread that opened it ([`with_stop`]) and a runtime of that thread.
pub(super) struct Object {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    breaker: Arc<Breaker>,
    stop: Option<Arc<AtomicBool>>,
    /// A second flag that abandons its requests (a reader's read-ahead: see [`ObjectReader::fork`]).
    halt: Option<Arc<AtomicBool>>,
    key: ObjPath,
}

impl Object {
    fn new(url: &str) -> Result<Self> {
        let (base, key) = split_url(url)?;
        let limits = Limits::current();
        Ok(Object {
            rt: calling_thread_runtime()?,
            store: store_for(&base, &limits)?,
            breaker: breaker_for(&base, limits.request),
            stop: STOP.with(|s| s.borrow().clone()),
            halt: None,
            key: ObjPath::from(key.as_str()),
        })
    }

    /// Runs one request on it (bounded, under the breaker, abandoned when the thread stops or
    /// its `halt` flag is set).
    pub(super) fn call<T>(
        &self,
        request: impl Future<Output = object_store::Result<T>>,
    ) -> std::result::Result<T, RequestFailure> {
        let (stop, halt) = (stopped(self.stop.clone()), stopped(self.halt.clone()));
        let either = async move {
            futures::future::select(std::pin::pin!(stop), std::pin::pin!(halt)).await;
        };
        self.breaker.call(&self.rt, request, either)
    }

    /// The object's size.
    fn head(&self) -> std::result::Result<u64, RequestFailure> {
        self.call(self.store.head(&self.key)).map(|m| m.size)
    }

    /// Bytes `range` of the object.
    fn range(
        &self,
        range: std::ops::Range<u64>,
    ) -> std::result::Result<impl std::ops::Deref<Target = [u8]>, RequestFailure> {
        self.call(self.store.get_range(&self.key, range))
    }
}

impl ObjectReader {
    /// Opens the object at `url` (one request for its size). A store that does not answer is
    /// [`Error::Unavailable`] (see [`RequestFailure::into_io`]); another failure an
    /// [`Error::Io`] naming the URL.
    pub fn open(url: &str) -> Result<Self> {
        let at = Object::new(url)?;
        let size = match at.head() {
            Ok(size) => size,
            Err(e) if e.store_down() => return Err(Error::Unavailable(format!("{url}: cannot open: {}", e.text()))),
            Err(e) => return Err(Error::Io { path: url.into(), reason: format!("cannot open: {}", e.text()) }),
        };
        Ok(ObjectReader { at, url: url.to_string(), size, pos: 0, chunk: vec![], used: 0 })
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The same object for requests on another thread (a read-ahead, `super::blocks`), with
    /// its own runtime and HTTP client (a pooled connection is driven by the runtime that made
    /// it) and no request for its size: under the same breaker and stop flag, and abandoned
    /// too once `halt` is set.
    pub(crate) fn fork(&self, halt: Arc<AtomicBool>) -> Result<Self> {
        let mut at = Object::new(&self.url)?;
        at.stop = self.at.stop.clone();
        at.halt = Some(halt);
        Ok(ObjectReader { at, url: self.url.clone(), size: self.size, pos: 0, chunk: vec![], used: 0 })
    }

    /// Whether the loader that opened it is stopping (its [`with_stop`] flag is set).
    pub(crate) fn stopping(&self) -> bool {
        self.at.stop.as_ref().is_some_and(|s| s.load(Ordering::Acquire))
    }

    /// The object's URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Reads exactly `buf.len()` bytes at `offset` (one ranged request per [`READ_CHUNK`]),
    /// under the same bounds, breaker and stop flag as the sequential reads; a store that does
    /// not answer is an error [`unavailable`] recognises.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let from = offset + done as u64;
            let end = (from + READ_CHUNK).min(offset + buf.len() as u64);
            let got = self.at.range(from..end).map_err(|e| e.into_io(&format!("{}: bytes {from}..{end}", self.url)))?;
            if got.len() as u64 != end - from {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{}: short read at byte {from}: {} of {} bytes", self.url, got.len(), end - from),
                ));
            }
            buf[done..done + got.len()].copy_from_slice(&got);
            done += got.len();
        }
        Ok(())
    }
}

/// Whether the object at `url` exists: `false` when the store says it does not (404, or 403 as
/// S3 answers for a missing object to a caller that may not list the bucket); a store that does
/// not answer is [`Error::Unavailable`].
pub fn exists(url: &str) -> Result<bool> {
    match Object::new(url)?.head() {
        Ok(_) => Ok(true),
        Err(RequestFailure::Failed(
            object_store::Error::NotFound { .. } | object_store::Error::PermissionDenied { .. },
            _,
        )) => Ok(false),
        Err(e) if e.store_down() => Err(Error::Unavailable(format!("{url}: {}", e.text()))),
        Err(e) => Err(Error::Io { path: url.into(), reason: e.text() }),
    }
}

impl std::io::Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.used == self.chunk.len() {
            if self.pos >= self.size {
                return Ok(0);
            }
            let end = (self.pos + READ_CHUNK).min(self.size);
            let got = self
                .at
                .range(self.pos..end)
                .map_err(|e| e.into_io(&format!("{}: bytes {}..{end}", self.url, self.pos)))?;
            if got.len() as u64 != end - self.pos {
                return Err(std::io::Error::other(format!(
                    "{}: short read at byte {}: {} of {} bytes (the object changed?)",
                    self.url,
                    self.pos,
                    got.len(),
                    end - self.pos
                )));
            }
            self.pos = end;
            self.chunk = got.to_vec();
            self.used = 0;
        }
        let n = buf.len().min(self.chunk.len() - self.used);
        buf[..n].copy_from_slice(&self.chunk[self.used..self.used + n]);
        self.used += n;
        Ok(n)
    }
}
