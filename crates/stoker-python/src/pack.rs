//! `PackJob` and the token cache's description: what `stoker.ray` needs to make a pack or a
//! token cache in pieces on a Ray cluster, with the engine's own rules
//! ([`stoker::pack::Planner`], [`stoker::pack::write_shard`],
//! [`stoker::tools::tokenize::write_meta`]) so that the result is byte for byte the
//! one-machine command's.

use crate::errors::{self, IntoPy};
use crate::shared::args::json_of;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use stoker::pack::{Destination, PackInput, PackOptions};

/// A pack to be made in pieces: the source opened (an ImageFolder or shards, as `stoker pack`
/// opens it), the destination (a folder, made absolute, or a prefix in object storage) and the
/// checked options.
#[pyclass(frozen, name = "PackJob", module = "stoker._stoker")]
pub struct PyPackJob {
    src: Box<dyn PackInput>,
    dst: Destination,
    opts: PackOptions,
}

/// A staged sample as Python sees it: `(index, ext, offset, length, reencoded, interval,
/// bytes_before, kept_reason, skip_reason)`.
type StagedTuple = (usize, Option<&'static str>, u64, u64, bool, Option<u32>, u64, Option<String>, Option<String>);

#[pymethods]
impl PyPackJob {
    /// Opens `src` for a pack into `dst` (a folder or an object-store URL, checked by
    /// `stoker::args::pack_destination`); `options` are `stoker pack`'s (checked by the same
    /// rules: `stoker::args::pack_options`).
    #[new]
    #[pyo3(signature = (src, dst, **options))]
    fn new(py: Python<'_>, src: String, dst: PathBuf, options: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut args = stoker::args::Args::new();
        if let Some(d) = options {
            for (k, v) in d.iter() {
                args.insert(k.extract::<String>()?, json_of(&v));
            }
        }
        let opts = stoker::args::pack_options(args).py_err()?;
        stoker::pack::check_options(&opts).py_err()?;
        let (src, dst) = py
            .detach(|| -> stoker::Result<(Box<dyn PackInput>, Destination)> {
                // The environment first: the destination's store takes its request bound.
                stoker::args::apply_env()?;
                let dst = match dst.to_str() {
                    Some(text) => stoker::args::pack_destination("dst", &serde_json::Value::String(text.into()))?,
                    None => Destination::Folder(dst), // not UTF-8: a folder (a URL is text)
                };
                let src: Box<dyn PackInput> = match stoker::source::detect(&[src])? {
                    stoker::source::DatasetKind::Folder(root) => Box::new(stoker::ImageFolder::new(root)?),
                    stoker::source::DatasetKind::Shards(specs) => Box::new(stoker::source::open_shards(&specs)?),
                    stoker::source::DatasetKind::Mixture(_) => {
                        return Err(stoker::Error::config("src", "a mixture is packed one source at a time"))
                    }
                };
                Ok((src, dst.absolute()?))
            })
            .py_err()?;
        Ok(PyPackJob { src, dst, opts })
    }

    fn __len__(&self) -> usize {
        self.src.len()
    }

    /// The order the samples are written in (the dataset's, or `shuffle`'s).
    fn order(&self) -> Vec<usize> {
        stoker::pack::sample_order(self.src.len(), &self.opts)
    }

    /// Sample `i`'s file, as skip lists name it.
    fn describe(&self, i: usize) -> PyResult<String> {
        self.check(i)?;
        Ok(self.src.describe(i).display().to_string())
    }

    /// The destination: the folder's absolute path, or the prefix's URL.
    #[getter]
    fn dst(&self) -> String {
        self.dst.describe()
    }

    /// Whether the destination is in object storage.
    #[getter]
    fn remote(&self) -> bool {
        self.dst.is_remote()
    }

    /// The shard file name prefix.
    #[getter]
    fn prefix(&self) -> String {
        self.opts.prefix.clone()
    }

    /// Refuses a destination holding another run unless `overwrite` (then removes its
    /// `*.tar`, `*.tar.idx` and `classes.json`, returned); creates it.
    fn start(&self, py: Python<'_>, overwrite: bool) -> PyResult<Vec<String>> {
        py.detach(|| -> stoker::Result<Vec<String>> {
            let removed = stoker::pack::clear_destination(&self.dst, overwrite)?;
            Ok(removed.iter().map(|p| p.display().to_string()).collect())
        })
        .py_err()
    }

    /// The bytes of `name` in the destination (`.stoker-ray/plan.json`), `None` when it is
    /// not there.
    fn read<'py>(&self, py: Python<'py>, name: String) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
        let b = py.detach(|| self.dst.read(&name)).py_err()?;
        Ok(b.map(|b| pyo3::types::PyBytes::new(py, &b)))
    }

    /// Writes `name` in the destination, whole or not at all (a file renamed into place, an
    /// object put whole).
    fn write(&self, py: Python<'_>, name: String, data: Vec<u8>) -> PyResult<()> {
        py.detach(|| self.dst.write(&name, &data)).py_err()
    }

    /// Whether `name` is in the destination.
    fn exists(&self, py: Python<'_>, name: String) -> PyResult<bool> {
        py.detach(|| self.dst.size(&name).map(|s| s.is_some())).py_err()
    }

    /// Removes `name` from the destination (one that is not there is no error).
    fn remove(&self, py: Python<'_>, name: String) -> PyResult<()> {
        py.detach(|| self.dst.remove(&name)).py_err()
    }

    /// Writes `classes.json`, unless it holds the same bytes already (a rerun changes
    /// nothing).
    fn write_classes(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| stoker::pack::write_classes(self.src.as_ref(), &self.dst)).py_err()
    }

    /// The `*.tar`, `*.tar.idx` and `classes.json` files in the destination.
    fn earlier_output(&self) -> PyResult<Vec<String>> {
        Ok(stoker::pack::earlier_output(&self.dst).py_err()?.iter().map(|p| p.display().to_string()).collect())
    }

    /// Prepares `indices` (one thread) into `staging`, a name in the destination (written
    /// whole or not at all); one tuple per sample (see `stoker.ray`).
    fn prepare(&self, py: Python<'_>, indices: Vec<usize>, staging: String) -> PyResult<Vec<StagedTuple>> {
        for &i in &indices {
            self.check(i)?;
        }
        let mut opts = self.opts.clone();
        opts.threads = 1;
        let staged = py
            .detach(|| stoker::pack::prepare_group(self.src.as_ref(), &indices, &opts, &self.dst, &staging))
            .py_err()?;
        Ok(staged
            .into_iter()
            .map(|s| match s.outcome {
                Err(why) => (s.index, None, 0, 0, false, None, 0, None, Some(why)),
                Ok(p) => {
                    let (interval, before, kept) = match p.restart {
                        None => (None, 0, None),
                        Some(Ok((iv, before))) => (Some(iv), before, None),
                        Some(Err(why)) => (None, 0, Some(why)),
                    };
                    (s.index, Some(p.ext), p.offset, p.length, p.reencoded, interval, before, kept, None)
                }
            })
            .collect())
    }

    /// Places prepared samples `(index, ext, length)`, in the order written, by the pack's
    /// one rule (`stoker::pack::Planner`): `(shard, key)` for each.
    fn plan(&self, samples: Vec<(usize, String, u64)>) -> PyResult<Vec<(usize, String)>> {
        let mut planner = stoker::pack::Planner::new(self.opts.shard_size);
        samples
            .into_iter()
            .map(|(i, ext, len)| {
                self.check(i)?;
                let at = planner.place(self.src.name(i), &ext, len, self.src.label(i));
                Ok((at.shard, at.key))
            })
            .collect()
    }

    /// The size of shard `number` if it is in the destination whole, with keys `keys` (its
    /// index read and checked against the shard's size and its first and last headers);
    /// `None` if not.
    fn verify(&self, py: Python<'_>, number: usize, keys: Vec<String>) -> Option<u64> {
        py.detach(|| stoker::pack::verify_shard(&self.dst, &self.opts.prefix, number, &keys))
    }

    /// Writes shard `number` from staged samples `(index, key, ext, staging, offset, length)`
    /// (`staging`: a name in the destination); returns its path (or URL) and size.
    fn write_shard(
        &self,
        py: Python<'_>,
        number: usize,
        samples: Vec<(usize, String, String, String, u64, u64)>,
    ) -> PyResult<(String, u64)> {
        let samples: Vec<stoker::pack::ShardSample> = samples
            .into_iter()
            .map(|(index, key, ext, staging, offset, length)| {
                self.check(index)?;
                Ok(stoker::pack::ShardSample { index, key, ext, staging, offset, length })
            })
            .collect::<PyResult<_>>()?;
        let (path, size) = py
            .detach(|| stoker::pack::write_shard(self.src.as_ref(), &self.dst, &self.opts.prefix, number, &samples))
            .py_err()?;
        Ok((path.display().to_string(), size))
    }
}

impl PyPackJob {
    /// Refuses an index past the source's end.
    fn check(&self, i: usize) -> PyResult<()> {
        if i >= self.src.len() {
            return Err(errors::config("index", format!("{i} is past the {} samples of the source", self.src.len())));
        }
        Ok(())
    }
}

/// Checks the arguments of a tokenization to a token cache as `stoker tokenize` does
/// (`text_key`, `document`, `max_document_bytes`) and expands `paths` (files, globs, folders)
/// as it does: `(files, text_key, lines, max_document_bytes)`.
#[pyfunction]
#[pyo3(signature = (paths, tokenizer, **options))]
pub fn tokenize_job(
    paths: Vec<String>,
    tokenizer: String,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(Vec<String>, String, bool, u64)> {
    let mut args = stoker::args::Args::new();
    if let Some(d) = options {
        for (k, v) in d.iter() {
            args.insert(k.extract::<String>()?, json_of(&v));
        }
    }
    args.insert("tokenizer".into(), serde_json::Value::String(tokenizer));
    args.insert("add_eos".into(), false.into());
    for (k, v) in [("batch_size", 1), ("seq_len", 1), ("world_size", 1), ("rank", 0)] {
        args.insert(k.into(), v.into());
    }
    let (config, _) = stoker::args::token_config(args).py_err()?;
    let files = stoker::tokens::expand_paths(&paths).py_err()?;
    Ok((
        files.iter().map(|p| p.display().to_string()).collect(),
        config.text_key.clone(),
        config.lines,
        config.max_document_bytes,
    ))
}

/// Writes the description of the token cache folder `out` whose `tokens.bin` and `index.bin`
/// are written, exactly as `stoker tokenize` does (`stoker::tools::tokenize::write_meta`); the
/// files hold ids of [`token_bytes`] bytes.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn write_token_cache_meta(
    py: Python<'_>,
    out: PathBuf,
    tokenizer: PathBuf,
    sources: Vec<PathBuf>,
    text_key: String,
    documents: u64,
    tokens: u64,
    failed: u64,
    failures: Vec<String>,
) -> PyResult<()> {
    py.detach(|| -> stoker::Result<()> {
        let tok = stoker::tokens::TextTokenizer::from_file(&tokenizer)?;
        let counts = stoker::tools::tokenize::CacheCounts { documents, tokens, failed, failures };
        stoker::tools::tokenize::write_meta(&out, &tok, &sources, &text_key, counts).map(|_| ())
    })
    .py_err()
}

/// Bytes per token of a token cache made with `tokenizer` (2 when every id fits a `uint16`).
#[pyfunction]
pub fn token_bytes(py: Python<'_>, tokenizer: PathBuf) -> PyResult<u8> {
    py.detach(|| stoker::tokens::TextTokenizer::from_file(&tokenizer).map(|t| t.id_width())).py_err()
}

/// Checks a Ray address (`auto`, `local`, `HOST:PORT`, `ray://HOST:PORT`) as `--ray` does.
#[pyfunction]
pub fn ray_address(address: &Bound<'_, PyAny>) -> PyResult<String> {
    stoker::args::ray_address("address", &json_of(address)).py_err()
}
