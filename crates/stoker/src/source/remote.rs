//! Shards in object storage: `s3://`, `gs://`, `az://` and `http(s)://` URLs through the
//! `object_store` crate. Every sample is one ranged GET (header + data); indexes are fetched
//! whole. Concurrency is bounded by the loader's I/O threads (one request in flight each).
//! Credentials and endpoints come from the usual environment variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).
//!
//! Every request is bounded in time, so a stalled or unreachable server is a clear error, never
//! a hang, and dropping a loader never waits on one for longer than a request's bound:
//! - request timeout: 30 s by default (connecting, sending and receiving the whole response),
//!   set in seconds by the environment variable `STOKER_OBJECT_TIMEOUT` (e.g. `5`, `0.5`);
//! - connect timeout: the request timeout, at most 10 s;
//! - retries: at most 3 (transient errors: connection errors, timeouts of reads, 5xx), with
//!   exponential backoff from 100 ms up to 5 s, and none started later than 2 × the request
//!   timeout after the first attempt.
//!
//! So a request that never gets an answer fails after about 2 to 3 request timeouts (60 to 90 s
//! by default; about 4 to 6 s with `STOKER_OBJECT_TIMEOUT=2`).

use super::shards::{glob_match, ShardMeta, ShardSource, Storage};
use crate::error::{Error, Result};
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, ObjectStoreExt, RetryConfig};
use std::sync::Arc;
use std::time::Duration;

/// Default request timeout, in seconds.
const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Environment variable that overrides it.
const TIMEOUT_VAR: &str = "STOKER_OBJECT_TIMEOUT";
/// Retries of a failed request.
const MAX_RETRIES: usize = 3;
/// Longest connect timeout.
const MAX_CONNECT: Duration = Duration::from_secs(10);

/// The request timeout: [`TIMEOUT_VAR`] when set, else the default.
fn request_timeout() -> Result<Duration> {
    let bad = |v: &str| {
        Error::config(
            TIMEOUT_VAR,
            format!("environment variable {TIMEOUT_VAR}={v:?}: must be a positive number of seconds"),
        )
    };
    match std::env::var(TIMEOUT_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(Duration::from_secs_f64(DEFAULT_TIMEOUT_S)),
        Err(std::env::VarError::NotUnicode(v)) => Err(bad(&v.to_string_lossy())),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(bad(&v)),
        },
    }
}

/// The time bounds of every request (see the module doc).
struct Limits {
    request: Duration,
    connect: Duration,
    retry: RetryConfig,
}

impl Limits {
    fn from_env() -> Result<Self> {
        let request = request_timeout()?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: MAX_RETRIES,
            retry_timeout: request * 2,
        };
        Ok(Limits { request, connect: request.min(MAX_CONNECT), retry })
    }

    /// `(key, value)` client settings, in the builders' text form.
    fn client_config(&self) -> [(ClientConfigKey, String); 2] {
        [
            (ClientConfigKey::Timeout, format!("{}ms", self.request.as_millis().max(1))),
            (ClientConfigKey::ConnectTimeout, format!("{}ms", self.connect.as_millis().max(1))),
        ]
    }
}

/// An object-store error with its causes (`... error sending request: operation timed out`):
/// the top-level message alone often hides what went wrong.
fn describe(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text = format!("{text}: {c_text}");
        }
        cause = c.source();
    }
    text
}

/// A store and the object keys of the shards in it.
struct Remote {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    keys: Vec<ObjPath>,
    names: Vec<String>,
}

impl Storage for Remote {
    fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> std::result::Result<(), String> {
        let range = offset..offset + buf.len() as u64;
        let bytes = self.rt.block_on(self.store.get_range(&self.keys[shard], range)).map_err(|e| describe(&e))?;
        if bytes.len() != buf.len() {
            return Err(format!("short read: {} of {} bytes", bytes.len(), buf.len()));
        }
        buf.copy_from_slice(&bytes);
        Ok(())
    }

    fn name(&self, shard: usize) -> &str {
        &self.names[shard]
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

fn store_for(base: &str) -> Result<Arc<dyn ObjectStore>> {
    let scheme = base.split("://").next().unwrap_or("");
    let err = |e: object_store::Error| Error::Dataset(format!("{base}: cannot open object store: {}", describe(&e)));
    let limits = Limits::from_env()?;
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
/// against a listing of the prefix).
pub(crate) fn open(urls: &[String]) -> Result<ShardSource> {
    let (base, _) = split_url(&urls[0])?;
    let store = store_for(&base)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("stoker-object-store")
        .enable_all()
        .build()
        .map_err(|e| Error::Internal(format!("cannot start the I/O runtime: {e}")))?;
    let mut keys = vec![];
    for url in urls {
        let (b, key) = split_url(url)?;
        if b != base {
            return Err(Error::config("root", format!("all shards must be in one bucket/host: {b} vs {base}")));
        }
        let (dir, name) = key.rsplit_once('/').unwrap_or(("", key.as_str()));
        if name.contains(['*', '?']) {
            let prefix = ObjPath::from(dir);
            let mut found: Vec<String> = rt.block_on(async {
                let mut out = vec![];
                let mut list = store.list(Some(&prefix));
                while let Some(meta) = list.next().await {
                    let meta =
                        meta.map_err(|e| Error::Dataset(format!("{base}/{dir}: cannot list: {}", describe(&e))))?;
                    let loc = meta.location.to_string();
                    let file = loc.rsplit('/').next().unwrap_or(&loc);
                    if glob_match(name, file) {
                        out.push(loc);
                    }
                }
                Ok::<_, Error>(out)
            })?;
            found.sort();
            if found.is_empty() {
                return Err(Error::Dataset(format!("no object matches {url}")));
            }
            keys.extend(found);
        } else {
            keys.push(key);
        }
    }
    let mut metas = vec![];
    for key in &keys {
        let path = ObjPath::from(key.as_str());
        let name = format!("{base}/{key}");
        let size = rt
            .block_on(store.head(&path))
            .map_err(|e| Error::Dataset(format!("{name}: cannot open shard: {}", describe(&e))))?
            .size;
        let idx_name = format!("{name}.idx");
        let idx_path = ObjPath::from(format!("{key}.idx"));
        let idx = rt
            .block_on(async { store.get(&idx_path).await?.bytes().await })
            .map(|b| b.to_vec())
            .map_err(|e| describe(&e));
        metas.push(ShardMeta { name, size, index: (idx_name, idx) });
    }
    let dir = keys[0].rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
    let classes_path = ObjPath::from(format!("{dir}classes.json"));
    // classes.json is optional; any error other than its absence (a timeout, a server error) is
    // reported rather than silently giving a dataset without class names. S3 answers 403, not
    // 404, for a missing object when the caller may not list the bucket: absent too.
    let classes = match rt.block_on(async { store.get(&classes_path).await?.bytes().await }) {
        Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Err(object_store::Error::NotFound { .. } | object_store::Error::PermissionDenied { .. }) => None,
        Err(e) => {
            return Err(Error::Dataset(format!("{base}/{dir}classes.json: cannot read: {}", describe(&e))));
        }
    };
    let names = metas.iter().map(|m| m.name.clone()).collect();
    let keys = keys.into_iter().map(|k| ObjPath::from(k.as_str())).collect();
    ShardSource::assemble(metas, classes, Box::new(Remote { rt, store, keys, names }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(split_url("s3://b/x/y.tar").unwrap(), ("s3://b".into(), "x/y.tar".into()));
        assert!(split_url("s3:///x").is_err());
        assert!(store_for("ftp://h").unwrap_err().to_string().contains("unsupported URL scheme"));
    }

    #[test]
    fn limits_are_bounded() {
        let l = Limits::from_env().unwrap();
        assert!(l.request > Duration::ZERO && l.connect <= MAX_CONNECT);
        assert_eq!(l.retry.max_retries, MAX_RETRIES);
        assert_eq!(l.retry.retry_timeout, l.request * 2);
        let [(_, t), (_, c)] = l.client_config();
        assert!(t.ends_with("ms") && c.ends_with("ms"));
    }
}
