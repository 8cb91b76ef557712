//! Shards in object storage: `s3://`, `gs://`, `az://` and `http(s)://` URLs through the
//! `object_store` crate. Every sample is one ranged GET (header + data); indexes are fetched
//! whole. Concurrency is bounded by the loader's I/O threads (one request in flight each).
//! Credentials and endpoints come from the usual environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).
//!
//! Every request is bounded in time, so a stalled or unreachable server is a clear error, never
//! a hang, and dropping a loader never waits on one for longer than a request's bound:
//! - request timeout: 30 s by default (connecting, sending and receiving the whole response),
//!   set with [`set_request_timeout`] (by `stoker::args`, from the environment variable
//!   `STOKER_OBJECT_TIMEOUT`, e.g. `5`, `0.5`; this module reads no environment variable);
//! - connect timeout: the request timeout, at most 10 s;
//! - retries: at most 3 (transient errors: connection errors, timeouts of reads, 5xx), with
//!   exponential backoff from 100 ms up to 5 s, and none started later than 2 × the request
//!   timeout after the first attempt.
//!
//! So a request that never gets an answer fails after about 2 to 3 request timeouts (60 to 90 s
//! by default; about 4 to 6 s with `STOKER_OBJECT_TIMEOUT=2`).
//!
//! A store that stalls is paid once, not once per sample: a [`Breaker`] per store counts the
//! requests that failed in a row with a timeout or a connection failure (each after its own
//! retries). At [`TRIP_AFTER`] of them the circuit opens: the requests still in flight are
//! abandoned at once, and every later request fails at once with the store's URL and the last
//! cause, so a pass ends (its failure budget is spent in no time, or `on_error="raise"` raises)
//! about 2 request timeouts after the store stopped answering, whatever the number of samples.
//! After a cool-down of one request timeout, one request at a time probes the store; any
//! answer (even an error status) closes the circuit. The breaker belongs to the store, not to
//! a reader: every loader and every object of the process read through one per store.
//!
//! What a failure does to a pass is the same for every loader: a store that does not answer is
//! [`Error::Unavailable`], which ends the pass with that one error whatever the failure policy
//! (skipping would drop the rest of the epoch without a word). A sample read of a shard is that
//! once the circuit is open (its neighbours are read in parallel); a sequential read of text or
//! token data at its first unanswered request (the reader cannot go on without that object).
//! A request that is answered with an error (404, 403) is a bad sample or document: skipped
//! and counted, or raised, by the policy. Requests in flight are abandoned at once when their
//! reader stops (a dropped loader waits for none).
//!
//! Files: `remote/breaker.rs` (whether a store answers, the circuit breaker, the stop flag),
//! `remote/object.rs` (one object read in order), `remote/folder.rs` (a prefix objects are
//! written into: the destination of a pack); this file opens shards and lists objects.

use super::fetch::{Chunk, Done, Fetched, PartFetch, ReadFailure, Sink};
use super::glob::glob_match;
use super::shard_storage::{ShardMeta, Storage};
use super::shards::ShardSource;
use super::storage_stats::StorageStats;
use crate::error::{Error, Result};
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, RetryConfig};
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod breaker;
mod folder;
mod object;

use breaker::*;
pub use breaker::{unavailable, with_stop};
pub use folder::ObjectFolder;
pub use object::{exists, ObjectReader};

/// Default request timeout, in seconds.
const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Retries of a failed request.
const MAX_RETRIES: usize = 3;
/// Longest connect timeout.
const MAX_CONNECT: Duration = Duration::from_secs(10);

/// The request timeout set by [`set_request_timeout`], in nanoseconds; 0: the default.
static REQUEST_TIMEOUT_NS: AtomicU64 = AtomicU64::new(0);

/// Sets the time bound of every request of the stores opened from now on; `None`: the default
/// (30 s). Set by `stoker::args` (through [`super::set_object_timeout`]) each time it reads the
/// environment, from `STOKER_OBJECT_TIMEOUT`, which it has checked (a positive number of
/// seconds, at most a day).
pub fn set_request_timeout(t: Option<Duration>) {
    let ns = t.map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1));
    REQUEST_TIMEOUT_NS.store(ns, Ordering::Relaxed);
}

/// The request timeout: the one set by [`set_request_timeout`], else the default.
fn request_timeout() -> Duration {
    match REQUEST_TIMEOUT_NS.load(Ordering::Relaxed) {
        0 => Duration::from_secs_f64(DEFAULT_TIMEOUT_S),
        ns => Duration::from_nanos(ns),
    }
}

/// The time bounds of every request (see the module doc).
struct Limits {
    request: Duration,
    connect: Duration,
    retry: RetryConfig,
}

impl Limits {
    /// The bounds of the request timeout set now.
    fn current() -> Self {
        let request = request_timeout();
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: MAX_RETRIES,
            retry_timeout: request * 2,
        };
        Limits { request, connect: request.min(MAX_CONNECT), retry }
    }

    /// `(key, value)` client settings, in the builders' text form.
    fn client_config(&self) -> [(ClientConfigKey, String); 2] {
        [
            (ClientConfigKey::Timeout, format!("{}ms", self.request.as_millis().max(1))),
            (ClientConfigKey::ConnectTimeout, format!("{}ms", self.connect.as_millis().max(1))),
        ]
    }
}

/// Shards in a store: reads of samples ([`Storage::read_at`]) and of parts
/// ([`PartFetch`]), both through [`Fetcher`].
struct Remote {
    rt: tokio::runtime::Runtime,
    fetch: Arc<Fetcher>,
    /// Wakes this loader's sample reads in flight when its iteration stops.
    abandon: tokio::sync::Notify,
    names: Vec<String>,
}

/// Ranged requests of shards, with their retries (see [`Fetcher::fetch`]) and counters.
struct Fetcher {
    rt: tokio::runtime::Handle,
    /// The store without the client's own retries: [`Fetcher::fetch`] sees every answer.
    store: Arc<dyn ObjectStore>,
    breaker: Arc<Breaker>,
    keys: Vec<ObjPath>,
    stats: Arc<StorageStats>,
    /// How long retries of a throttled request may go on.
    retry_for: Duration,
}

/// Metadata requests in flight when shards are opened (sizes, indexes).
const META_IN_FLIGHT: usize = 16;

/// Attempts of a request answered with a retryable status (`503 SlowDown`, `429`, 5xx).
const THROTTLE_ATTEMPTS: u32 = 10;

/// The HTTP status of an answer that asks to be retried later (`503 SlowDown`, `429 Too Many
/// Requests`, `500`, `502`, `504`, `408`), read from the error's text: `object_store` keeps the
/// status in a private type and says it as `... status code: 503 ...`.
fn retryable_status(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    let code: u16 = text.get(at..at + 3)?.parse().ok()?;
    matches!(code, 408 | 429 | 500 | 502 | 503 | 504).then_some(code)
}

/// A random wait before attempt `k + 1` (full jitter over an exponential backoff from 100 ms
/// up to 5 s): many readers throttled together do not come back together.
fn backoff(k: u32) -> Duration {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let cap = (100u64 << k.min(6)).min(5_000);
    let nanos = Instant::now().elapsed().as_nanos() as u64;
    let r = crate::shell::rng::mix64(SEQ.fetch_add(1, Ordering::Relaxed) ^ nanos ^ (std::process::id() as u64) << 32);
    Duration::from_millis(cap / 2 + r % (cap / 2 + 1))
}

impl Fetcher {
    /// Bytes `range` of shard `shard` in one ranged request (a `GET` with `Range`), under the
    /// store's breaker: an answer asking to retry later (throttling, a server error) is retried
    /// after a random backoff up to [`THROTTLE_ATTEMPTS`] times within `retry_for`; a request
    /// without an answer (time-out, connection) up to [`MAX_RETRIES`] times; `stop` (made
    /// anew for each wait) abandons it. With a `sink`, the body goes there as it arrives (and
    /// the result's bytes are empty).
    async fn fetch<F: Future<Output = ()>>(
        &self,
        shard: usize,
        range: Range<u64>,
        stop: impl Fn() -> F,
        sink: Option<&Sink>,
    ) -> Fetched {
        use futures::future::{select, Either};
        let key = &self.keys[shard];
        let (mut throttled, mut unanswered) = (0u32, 0usize);
        let first = Instant::now();
        loop {
            let t0 = Instant::now();
            let request = async {
                let opts = object_store::GetOptions { range: Some(range.clone().into()), ..Default::default() };
                let answer = self.store.get_opts(key, opts).await?;
                let latency = t0.elapsed();
                let Some(sink) = sink else { return Ok((answer.bytes().await?.to_vec(), latency)) };
                sink(Chunk::Restart);
                let mut body = answer.into_stream();
                while let Some(bytes) = body.next().await {
                    sink(Chunk::Bytes(&bytes?));
                }
                Ok((vec![], latency))
            };
            let failure = match self.breaker.run(request, stop()).await {
                Ok((bytes, latency)) => {
                    return Fetched { bytes: Ok(bytes), latency, total: t0.elapsed(), throttled };
                }
                Err(e) => e,
            };
            let again = match &failure {
                RequestFailure::Failed(e, text) => {
                    if retryable_status(text).is_some() {
                        throttled += 1;
                        throttled < THROTTLE_ATTEMPTS && first.elapsed() < self.retry_for
                    } else if unreachable(e) {
                        unanswered += 1;
                        unanswered <= MAX_RETRIES && first.elapsed() < self.retry_for
                    } else {
                        false
                    }
                }
                RequestFailure::Refused(_) | RequestFailure::Stopped(_) => false,
            };
            if again {
                let wait = std::pin::pin!(tokio::time::sleep(backoff(throttled + unanswered as u32)));
                let stop = std::pin::pin!(stop());
                if let Either::Left(_) = select(wait, stop).await {
                    continue;
                }
            }
            let bytes = Err(match failure {
                RequestFailure::Refused(why) => ReadFailure::Unavailable(why),
                other => ReadFailure::Failed(other.text()),
            });
            return Fetched { bytes, latency: t0.elapsed(), total: t0.elapsed(), throttled };
        }
    }
}

/// The [`PartFetch`] of a store's shards: each fetch a task on the store's runtime.
struct Parts(Arc<Fetcher>);

impl PartFetch for Parts {
    fn start(&self, shard: usize, range: Range<u64>, stop: Arc<AtomicBool>, sink: Sink, done: Done) {
        let f = self.0.clone();
        self.0.rt.spawn(async move {
            let got = f.fetch(shard, range, || stopped(Some(stop.clone())), Some(&sink)).await;
            done(got);
        });
    }
}

impl Storage for Remote {
    fn abandon_reads(&self) {
        // The requests in flight wait on this notification too: they return at once (their
        // samples fail; the iteration is stopping anyway).
        self.abandon.notify_waiters();
    }

    /// One request of its own (a sample whose part is not streamed).
    fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure> {
        let range = offset..offset + buf.len() as u64;
        let f = self.rt.block_on(self.fetch.fetch(shard, range, || self.abandon.notified(), None));
        let stats = &self.fetch.stats;
        let bytes = match f.bytes {
            Ok(b) => b,
            Err(e) => {
                stats.direct(None, f.latency, f.throttled);
                return Err(e);
            }
        };
        stats.direct(Some(bytes.len() as u64), f.latency, f.throttled);
        if bytes.len() != buf.len() {
            return Err(format!("short read: {} of {} bytes", bytes.len(), buf.len()).into());
        }
        buf.copy_from_slice(&bytes);
        Ok(())
    }

    /// Every read is a request: an image and its caption are read in one.
    fn coalesce(&self) -> bool {
        true
    }

    fn name(&self, shard: usize) -> &str {
        &self.names[shard]
    }

    fn parts(&self) -> Option<(Arc<dyn PartFetch>, Arc<StorageStats>)> {
        Some((Arc::new(Parts(self.fetch.clone())), self.fetch.stats.clone()))
    }
}

/// `(scheme://authority, key)` of a URL.
fn split_url(url: &str) -> Result<(String, String)> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| Error::config("root", format!("not a URL: {url}")))?;
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(Error::config("root", format!("{url}: no bucket or host")));
    }
    Ok((format!("{scheme}://{authority}"), key.to_string()))
}

fn store_for(base: &str, limits: &Limits) -> Result<Arc<dyn ObjectStore>> {
    // TLS (rustls) runs on the `ring` provider; reqwest needs a process default before a
    // client is built. `Err` means one was installed already (by us, or by another library in
    // the process): that one serves.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scheme = base.split("://").next().unwrap_or("");
    let err = |e: object_store::Error| Error::Dataset(format!("{base}: cannot open object store: {}", describe(&e)));
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" | "s3a" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut b = AmazonS3Builder::from_env().with_url(base).with_retry(limits.retry.clone());
            for (k, v) in limits.client_config() {
                b = b.with_config(AmazonS3ConfigKey::Client(k), v);
            }
            Arc::new(b.build().map_err(err)?)
        }
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(base).with_retry(limits.retry.clone());
            for (k, v) in limits.client_config() {
                b = b.with_config(GoogleConfigKey::Client(k), v);
            }
            Arc::new(b.build().map_err(err)?)
        }
        "az" | "azure" | "abfs" | "abfss" => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let mut b = MicrosoftAzureBuilder::from_env().with_url(base).with_retry(limits.retry.clone());
            for (k, v) in limits.client_config() {
                b = b.with_config(AzureConfigKey::Client(k), v);
            }
            Arc::new(b.build().map_err(err)?)
        }
        "http" | "https" => {
            let options = object_store::ClientOptions::new()
                .with_allow_http(scheme == "http")
                .with_timeout(limits.request)
                .with_connect_timeout(limits.connect);
            Arc::new(
                object_store::http::HttpBuilder::new()
                    .with_url(base)
                    .with_client_options(options)
                    .with_retry(limits.retry.clone())
                    .build()
                    .map_err(err)?,
            )
        }
        other => {
            return Err(Error::config(
                "root",
                format!("unsupported URL scheme {other:?}; allowed: s3, gs, az, http, https"),
            ))
        }
    };
    Ok(store)
}

/// Opens shards at object-store URLs (one store; `*`/`?` in the last component are matched
/// against a listing of the prefix). Every request goes through the store's [`Breaker`], so a
/// store that stops answering while many shards are opened costs about two request bounds, not
/// two per shard.
pub(crate) fn open(urls: &[String], text: Option<super::TextKind>) -> Result<ShardSource> {
    let (base, _) = split_url(&urls[0])?;
    let limits = Limits::current();
    let store = store_for(&base, &limits)?;
    let breaker = breaker_for(&base, limits.request);
    let stats = Arc::new(StorageStats::default());
    let never = futures::future::pending::<()>;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("stoker-object-store")
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
    // Shards with their sizes when a listing gave them (else a HEAD request tells).
    let mut keys: Vec<(String, Option<u64>)> = vec![];
    for url in urls {
        let (b, key) = split_url(url)?;
        if b != base {
            return Err(Error::config("root", format!("all shards must be in one bucket/host: {b} vs {base}")));
        }
        let (dir, name) = key.rsplit_once('/').unwrap_or(("", key.as_str()));
        if name.contains(['*', '?']) {
            stats.meta_request();
            let found = list_matching(&*store, &breaker, &rt, (&base, dir, name), url)?;
            keys.extend(found.into_iter().map(|(k, size)| (k, Some(size))));
        } else {
            keys.push((key, None));
        }
    }
    // Each shard's size and index, and classes.json, [`META_IN_FLIGHT`] requests at a time: a
    // store far away is paid about once, not once per shard.
    let dir = keys[0].0.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
    let classes_path = ObjPath::from(format!("{dir}classes.json"));
    let (metas, classes) = rt.block_on(async {
        let one = |(key, size): (String, Option<u64>)| {
            let (store, breaker, stats, base) = (&store, &breaker, &stats, &base);
            async move {
                let path = ObjPath::from(key.as_str());
                let name = format!("{base}/{key}");
                let size = match size {
                    Some(s) => s,
                    None => {
                        stats.meta_request();
                        breaker
                            .run(store.head(&path), never())
                            .await
                            .map_err(|e| Error::Dataset(format!("{name}: cannot open shard: {}", e.text())))?
                            .size
                    }
                };
                let idx_name = format!("{name}.idx");
                let idx_path = ObjPath::from(format!("{key}.idx"));
                stats.meta_request();
                let idx = match breaker.run(async { store.get(&idx_path).await?.bytes().await }, never()).await {
                    Ok(b) => Ok(b.to_vec()),
                    // The store stopped answering: say so now rather than after trying every shard.
                    Err(RequestFailure::Refused(why)) => {
                        return Err(Error::Dataset(format!("{idx_name}: cannot read the shard index: {why}")));
                    }
                    Err(e) => Err(e.text()),
                };
                Ok(ShardMeta { name, size, index: (idx_name, idx) })
            }
        };
        // When the store's circuit is open (past its cool-down), the first shard's requests go
        // alone: they are its one probe, which the others would be refused beside.
        let (first, skip) = if breaker.closed() { (None, 0) } else { (Some(one(keys[0].clone()).await), 1) };
        stats.meta_request();
        let classes = breaker.run(async { store.get(&classes_path).await?.bytes().await }, never());
        let rest = futures::stream::iter(keys[skip..].iter().cloned().map(one))
            .buffered(META_IN_FLIGHT)
            .collect::<Vec<Result<ShardMeta>>>();
        let (rest, classes) = futures::join!(rest, classes);
        (first.into_iter().chain(rest).collect::<Vec<_>>(), classes)
    });
    let metas = metas.into_iter().collect::<Result<Vec<ShardMeta>>>()?;
    // classes.json is optional; any error other than its absence (a timeout, a server error) is
    // reported rather than silently giving a dataset without class names. S3 answers 403, not
    // 404, for a missing object when the caller may not list the bucket: absent too.
    let classes = match classes {
        Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Err(RequestFailure::Failed(
            object_store::Error::NotFound { .. } | object_store::Error::PermissionDenied { .. },
            _,
        )) => None,
        Err(e) => {
            return Err(Error::Dataset(format!("{base}/{dir}classes.json: cannot read: {}", e.text())));
        }
    };
    let names = metas.iter().map(|m| m.name.clone()).collect();
    let keys = keys.into_iter().map(|(k, _)| ObjPath::from(k.as_str())).collect();
    // Parts and samples are fetched by a store without the client's retries: `Fetcher::fetch`
    // retries itself, and so sees (and counts) the throttling answers.
    let mut once = Limits::current();
    once.retry.max_retries = 0;
    let fetch = Arc::new(Fetcher {
        rt: rt.handle().clone(),
        store: store_for(&base, &once)?,
        breaker,
        keys,
        stats,
        retry_for: limits.retry.retry_timeout * 2,
    });
    let abandon = tokio::sync::Notify::new();
    ShardSource::assemble(metas, classes, Box::new(Remote { rt, fetch, abandon, names }), text)
}

/// The object URLs a spec names: itself, or with `*`/`?` in its last component the matching
/// objects of a listing of that prefix, in name order.
pub fn expand_url(spec: &str) -> Result<Vec<String>> {
    let (base, key) = split_url(spec)?;
    let (dir, name) = key.rsplit_once('/').unwrap_or(("", key.as_str()));
    if !name.contains(['*', '?']) {
        return Ok(vec![spec.to_string()]);
    }
    let limits = Limits::current();
    let store = store_for(&base, &limits)?;
    let breaker = breaker_for(&base, limits.request);
    let keys = list_matching(&*store, &breaker, &calling_thread_runtime()?, (&base, dir, name), spec)?;
    Ok(keys.into_iter().map(|(k, _)| format!("{base}/{k}")).collect())
}

/// A runtime that runs requests on the thread that waits for them (no thread of its own).
fn calling_thread_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))
}

/// The keys under `dir` whose last component matches the glob `name`, with their sizes, sorted;
/// none is an error
/// naming `spec`.
fn list_matching(
    store: &dyn ObjectStore,
    breaker: &Breaker,
    rt: &tokio::runtime::Runtime,
    (base, dir, name): (&str, &str, &str),
    spec: &str,
) -> Result<Vec<(String, u64)>> {
    let prefix = ObjPath::from(dir);
    let listing = breaker.call(
        rt,
        async {
            let mut out = vec![];
            let mut list = store.list(Some(&prefix));
            while let Some(meta) = list.next().await {
                let meta = meta?;
                let loc = meta.location.to_string();
                let file = loc.rsplit('/').next().unwrap_or(&loc);
                if glob_match(name, file) {
                    out.push((loc, meta.size));
                }
            }
            Ok::<_, object_store::Error>(out)
        },
        futures::future::pending(),
    );
    let mut found = listing.map_err(|e| Error::Dataset(format!("{base}/{dir}: cannot list: {}", e.text())))?;
    found.sort();
    if found.is_empty() {
        return Err(Error::Dataset(format!("no object matches {spec}")));
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(split_url("s3://b/x/y.tar").unwrap(), ("s3://b".into(), "x/y.tar".into()));
        assert!(split_url("s3:///x").is_err());
        let limits = Limits::current();
        assert!(store_for("ftp://h", &limits).unwrap_err().to_string().contains("unsupported URL scheme"));
    }

    #[test]
    fn limits_are_bounded() {
        let l = Limits::current();
        assert!(l.request > Duration::ZERO && l.connect <= MAX_CONNECT);
        assert_eq!(l.retry.max_retries, MAX_RETRIES);
        assert_eq!(l.retry.retry_timeout, l.request * 2);
        let [(_, t), (_, c)] = l.client_config();
        assert!(t.ends_with("ms") && c.ends_with("ms"));
    }

    fn timeout() -> object_store::Error {
        let e = object_store::client::HttpError::new(
            object_store::client::HttpErrorKind::Timeout,
            std::io::Error::new(std::io::ErrorKind::TimedOut, "operation timed out"),
        );
        object_store::Error::Generic { store: "test", source: Box::new(e) }
    }

    #[test]
    fn timeouts_and_refused_connections_count_answers_do_not() {
        assert!(unreachable(&timeout()));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(unreachable(&object_store::Error::Generic { store: "t", source: Box::new(refused) }));
        let missing = object_store::Error::NotFound { path: "x".into(), source: "404".into() };
        assert!(!unreachable(&missing));
    }

    #[test]
    fn the_circuit_opens_after_failures_in_a_row_and_a_probe_closes_it() {
        let b = Breaker::new("http://h:1", Duration::from_secs(10));
        let t0 = Instant::now();
        // An answer between two failures resets the count.
        assert_eq!(b.admit(t0), Ok(Admit::Go));
        b.record(&Admit::Go, Some("timed out".into()), t0);
        b.record(&Admit::Go, None, t0);
        b.record(&Admit::Go, Some("timed out".into()), t0);
        assert_eq!(b.admit(t0), Ok(Admit::Go));
        b.record(&Admit::Go, Some("timed out again".into()), t0);
        // Open: refused at once, naming the store and the cause.
        let why = b.admit(t0 + Duration::from_secs(1)).unwrap_err();
        assert!(why.contains("http://h:1") && why.contains("timed out again") && why.contains("in 9.0 s"), "{why}");
        // After the cool-down, one probe at a time.
        let later = t0 + Duration::from_secs(11);
        assert_eq!(b.admit(later), Ok(Admit::Probe));
        assert!(b.admit(later).is_err());
        // A failed probe opens it again for a whole cool-down ...
        b.record(&Admit::Probe, Some("still down".into()), later);
        assert!(b.admit(later + Duration::from_secs(9)).unwrap_err().contains("still down"));
        // ... an answered one closes it.
        let again = later + Duration::from_secs(10);
        assert_eq!(b.admit(again), Ok(Admit::Probe));
        b.record(&Admit::Probe, None, again);
        assert_eq!(b.admit(again), Ok(Admit::Go));
    }

    #[test]
    fn requests_in_flight_are_abandoned_when_the_circuit_opens() {
        let b = Arc::new(Breaker::new("http://h:1", Duration::from_secs(60)));
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let stuck = {
            let b = b.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let t0 = Instant::now();
                let r = b.call(&rt, futures::future::pending::<object_store::Result<()>>(), futures::future::pending());
                (t0.elapsed(), r.map_err(RequestFailure::text).unwrap_err())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..TRIP_AFTER {
            let r = b.call(&rt, async { Err::<(), _>(timeout()) }, futures::future::pending());
            assert!(matches!(r, Err(RequestFailure::Failed(..))));
        }
        let (waited, why) = stuck.join().unwrap();
        assert!(waited < Duration::from_secs(30), "{waited:?}");
        assert!(why.contains("is not answering") && why.contains("timed out"), "{why}");
        // Later requests are not sent at all.
        let r = b.call::<()>(
            &rt,
            async { panic!("a request was sent through an open circuit") },
            futures::future::pending(),
        );
        assert!(matches!(r, Err(RequestFailure::Refused(_))));
    }
}
