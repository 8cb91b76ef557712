//! A prefix in a store that stoker writes into (the destination of `stoker pack` and
//! `stoker.ray.pack`): whole objects put, read, listed and deleted, each request under the
//! time bounds and the circuit breaker of every request (see the module doc). An object is
//! written in one request ([`ObjectFolder::put`]) or, past [`PART`] bytes, as a multipart
//! upload completed only once every part is in: either way it appears whole or not at all.

use super::*;

/// Bytes of one part of a multipart upload (S3 takes parts of 5 MiB and more, but the last):
/// each part is one request under the request bound, so a large object is never one request
/// that outlives it. Objects up to this size are one `PUT`.
pub const PART: usize = 8 << 20;

/// Parts of one multipart upload in flight at once (so at most this many times [`PART`] bytes
/// of it in memory): a large shard is not uploaded at the speed of one request after another.
pub const PARTS_IN_FLIGHT: usize = 4;

/// A prefix in an object store (`s3://bucket/prefix`, `gs://...`, `az://...`) that objects are
/// written into, by name under the prefix. Runs its requests on a runtime of the calling
/// thread: no thread of its own.
pub struct ObjectFolder {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    breaker: Arc<Breaker>,
    /// `scheme://bucket`.
    base: String,
    /// The key prefix, without a trailing `/` (empty: the bucket's root).
    prefix: String,
}

impl std::fmt::Debug for ObjectFolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectFolder({})", self.url())
    }
}

/// The schemes an [`ObjectFolder`] writes to (an `http(s)://` server is read only here).
pub const WRITABLE_SCHEMES: [&str; 7] = ["s3", "s3a", "gs", "az", "azure", "abfs", "abfss"];

impl ObjectFolder {
    /// The store and prefix of `url` (no request is made: a missing bucket shows at the
    /// first request). `arg` is the argument it came from, named in a refusal.
    pub fn open(arg: &str, url: &str) -> Result<Self> {
        let (base, key) = split_url(url)
            .map_err(|_| Error::config(arg, format!("{url}: not an object-store URL (s3://BUCKET/PREFIX)")))?;
        let scheme = base.split("://").next().unwrap_or("");
        if !WRITABLE_SCHEMES.contains(&scheme) {
            return Err(Error::config(
                arg,
                format!("{url}: cannot write to {scheme}:// (writable: {})", WRITABLE_SCHEMES.join(", ")),
            ));
        }
        if key.contains(['*', '?']) || key.split('/').any(|c| c == "." || c == "..") {
            return Err(Error::config(arg, format!("{url}: a destination is a plain prefix, without *, ?, . or ..")));
        }
        let limits = Limits::current();
        Ok(ObjectFolder {
            rt: calling_thread_runtime()?,
            store: store_for(&base, &limits)?,
            breaker: breaker_for(&base, limits.request),
            base,
            prefix: key.trim_matches('/').to_string(),
        })
    }

    /// `scheme://bucket/prefix`.
    pub fn url(&self) -> String {
        self.url_of("").trim_end_matches('/').to_string()
    }

    /// The URL of object `name` (a name under the prefix, `/` allowed).
    pub fn url_of(&self, name: &str) -> String {
        format!("{}/{}", self.base, self.key(name))
    }

    fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    fn path(&self, name: &str) -> ObjPath {
        ObjPath::from(self.key(name).as_str())
    }

    /// Runs one request under the breaker, waited for on this thread.
    fn call<T>(
        &self,
        request: impl Future<Output = object_store::Result<T>>,
    ) -> std::result::Result<T, RequestFailure> {
        self.breaker.call(&self.rt, request, futures::future::pending())
    }

    /// The error of a request about `name` that failed: [`Error::Unavailable`] when the store
    /// did not answer, else [`Error::Io`] naming the object's URL and what was being done.
    fn fail(&self, name: &str, doing: &str, e: RequestFailure) -> Error {
        let url = if name.is_empty() { self.url() } else { self.url_of(name) };
        if e.store_down() {
            return Error::Unavailable(format!("{url}: cannot {doing}: {}", e.text()));
        }
        Error::Io { path: url.into(), reason: format!("cannot {doing}: {}", e.text()) }
    }

    /// The objects directly under the prefix (not deeper), by name, with their sizes, sorted.
    pub fn list(&self) -> Result<Vec<(String, u64)>> {
        let prefix = (!self.prefix.is_empty()).then(|| ObjPath::from(self.prefix.as_str()));
        let listing =
            self.call(self.store.list_with_delimiter(prefix.as_ref())).map_err(|e| self.fail("", "list", e))?;
        let mut out: Vec<(String, u64)> = listing
            .objects
            .into_iter()
            .filter_map(|m| m.location.filename().map(|f| (f.to_string(), m.size)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// The size of object `name`, `None` when it is not there (404, or the 403 S3 answers to
    /// a caller that may not list the bucket).
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        match self.call(self.store.head(&self.path(name))) {
            Ok(m) => Ok(Some(m.size)),
            Err(e) if absent(&e) => Ok(None),
            Err(e) => Err(self.fail(name, "read its size", e)),
        }
    }

    /// Object `name` whole, `None` when it is not there.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(name);
        match self.call(async { self.store.get(&path).await?.bytes().await }) {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(e) if absent(&e) => Ok(None),
            Err(e) => Err(self.fail(name, "read", e)),
        }
    }

    /// Bytes `range` of object `name`, as ranged requests of 8 MiB; a
    /// short answer is an error.
    pub fn read_range(&self, name: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let path = self.path(name);
        let mut out = Vec::with_capacity(range.end.saturating_sub(range.start) as usize);
        let mut from = range.start;
        while from < range.end {
            let end = (from + object::READ_CHUNK).min(range.end);
            let got = self
                .call(self.store.get_range(&path, from..end))
                .map_err(|e| self.fail(name, &format!("read bytes {from}..{end}"), e))?;
            if got.len() as u64 != end - from {
                return Err(Error::Io {
                    path: self.url_of(name).into(),
                    reason: format!("short read at byte {from}: {} of {} bytes", got.len(), end - from),
                });
            }
            out.extend_from_slice(&got);
            from = end;
        }
        Ok(out)
    }

    /// Writes object `name` from `bytes`: one `PUT` up to `PART` bytes (8 MiB), else a multipart
    /// upload. The object appears whole, or not at all.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        if bytes.len() <= PART {
            let payload = object_store::PutPayload::from(bytes.to_vec());
            return self
                .call(self.store.put(&self.path(name), payload))
                .map(|_| ())
                .map_err(|e| self.fail(name, "write", e));
        }
        let mut parts = bytes.chunks(PART).map(|c| Ok(c.to_vec()));
        self.put_parts(name, &mut parts)
    }

    /// Writes object `name` from the local file `file`, read `PART` bytes at a time (so a
    /// large shard is never held in memory whole).
    pub fn put_file(&self, name: &str, file: &std::path::Path) -> Result<()> {
        use std::io::Read;
        let size = std::fs::metadata(file).map_err(|e| Error::io(file, &e))?.len();
        let mut f = std::fs::File::open(file).map_err(|e| Error::io(file, &e))?;
        if size <= PART as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            f.read_to_end(&mut bytes).map_err(|e| Error::io(file, &e))?;
            return self.put(name, &bytes);
        }
        let mut parts = std::iter::from_fn(|| {
            let mut part = Vec::with_capacity(PART);
            match (&mut f).take(PART as u64).read_to_end(&mut part) {
                Ok(0) => None,
                Ok(_) => Some(Ok(part)),
                Err(e) => Some(Err(Error::io(file, &e))),
            }
        });
        self.put_parts(name, &mut parts)
    }

    /// A multipart upload of `parts` into `name`, [`PARTS_IN_FLIGHT`] parts at a time (each
    /// its own bounded request under the breaker), completed only when every part is in;
    /// aborted on an error (nothing appears).
    fn put_parts(&self, name: &str, parts: &mut dyn Iterator<Item = Result<Vec<u8>>>) -> Result<()> {
        use futures::stream::FuturesUnordered;
        let mut upload =
            self.call(self.store.put_multipart(&self.path(name))).map_err(|e| self.fail(name, "start an upload", e))?;
        let mut send = || -> Result<()> {
            let mut in_flight = FuturesUnordered::new();
            let wait_one = |in_flight: &mut FuturesUnordered<_>| -> Result<()> {
                match self.rt.block_on(in_flight.next()) {
                    Some((n, Err(e))) => Err(self.fail(name, &format!("upload part {n}"), e)),
                    _ => Ok(()),
                }
            };
            for (n, part) in parts.enumerate() {
                let part = part?;
                if in_flight.len() >= PARTS_IN_FLIGHT {
                    wait_one(&mut in_flight)?;
                }
                let request = upload.put_part(object_store::PutPayload::from(part));
                let breaker = &self.breaker;
                in_flight.push(async move { (n, breaker.run(request, futures::future::pending()).await) });
            }
            while !in_flight.is_empty() {
                wait_one(&mut in_flight)?;
            }
            drop(in_flight);
            self.call(upload.complete()).map(|_| ()).map_err(|e| self.fail(name, "complete the upload", e))
        };
        let sent = send();
        if sent.is_err() {
            let _ = self.call(upload.abort());
        }
        sent
    }

    /// Deletes object `name` (one that is not there is no error).
    pub fn delete(&self, name: &str) -> Result<()> {
        match self.call(self.store.delete(&self.path(name))) {
            Ok(()) => Ok(()),
            Err(e) if absent(&e) => Ok(()),
            Err(e) => Err(self.fail(name, "delete", e)),
        }
    }
}

/// Whether a request failed because the object is not there (404; 403, as S3 answers for a
/// missing object to a caller that may not list the bucket).
fn absent(e: &RequestFailure) -> bool {
    matches!(
        e,
        RequestFailure::Failed(object_store::Error::NotFound { .. } | object_store::Error::PermissionDenied { .. }, _)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_checked() {
        let f = ObjectFolder::open("dst", "s3://bucket/a/b/").unwrap();
        assert_eq!(f.url(), "s3://bucket/a/b");
        assert_eq!(f.url_of("x.tar"), "s3://bucket/a/b/x.tar");
        let root = ObjectFolder::open("dst", "s3://bucket").unwrap();
        assert_eq!((root.url(), root.url_of("x")), ("s3://bucket".to_string(), "s3://bucket/x".to_string()));
        for (bad, words) in [
            ("s3:///x", "not an object-store URL"),
            ("http://host/x", "cannot write to http://"),
            ("ftp://host/x", "cannot write to ftp://"),
            ("s3://b/x/*.tar", "plain prefix"),
            ("s3://b/../x", "plain prefix"),
        ] {
            let e = ObjectFolder::open("dst", bad).unwrap_err().to_string();
            assert!(e.contains("`dst`") && e.contains(words), "{bad}: {e}");
        }
    }
}
