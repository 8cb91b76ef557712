//! Shards in object storage: `s3://`, `gs://`, `az://` and `http(s)://` URLs through the
//! `object_store` crate. Every sample is one ranged GET (header + data); indexes are fetched
//! whole. Concurrency is bounded by the loader's I/O threads (one request in flight each);
//! `object_store` retries failed requests with backoff. Credentials and endpoints come from the
//! usual environment variables (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`,
//! `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).

use super::shards::{glob_match, ShardMeta, ShardSource, Storage};
use crate::error::{Error, Result};
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;

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
        let bytes = self.rt.block_on(self.store.get_range(&self.keys[shard], range)).map_err(|e| e.to_string())?;
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
    let err = |e: object_store::Error| Error::Dataset(format!("{base}: cannot open object store: {e}"));
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" | "s3a" => Arc::new(object_store::aws::AmazonS3Builder::from_env().with_url(base).build().map_err(err)?),
        "gs" => Arc::new(object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(base).build().map_err(err)?),
        "az" | "azure" | "abfs" | "abfss" => {
            Arc::new(object_store::azure::MicrosoftAzureBuilder::from_env().with_url(base).build().map_err(err)?)
        }
        "http" | "https" => Arc::new(
            object_store::http::HttpBuilder::new()
                .with_url(base)
                .with_client_options(object_store::ClientOptions::new().with_allow_http(scheme == "http"))
                .build()
                .map_err(err)?,
        ),
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
                    let meta = meta.map_err(|e| Error::Dataset(format!("{base}/{dir}: cannot list: {e}")))?;
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
        let size =
            rt.block_on(store.head(&path)).map_err(|e| Error::Dataset(format!("{name}: cannot open shard: {e}")))?.size;
        let idx_name = format!("{name}.idx");
        let idx_path = ObjPath::from(format!("{key}.idx"));
        let idx = rt
            .block_on(async { store.get(&idx_path).await?.bytes().await })
            .map(|b| b.to_vec())
            .map_err(|e| e.to_string());
        metas.push(ShardMeta { name, size, index: (idx_name, idx) });
    }
    let dir = keys[0].rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default();
    let classes_path = ObjPath::from(format!("{dir}classes.json"));
    let classes = rt
        .block_on(async { store.get(&classes_path).await?.bytes().await })
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned());
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
}
