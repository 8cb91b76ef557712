//! The `Tokenizer` class: a `tokenizer.json` that encodes batches of texts
//! ([`stoker::tokens::TextEncoder`]) on threads made for each call, with the GIL released and
//! Ctrl-C checked while they work. It keeps the file's bytes, for pickling and for a `fork()`
//! child, which rebuilds its tokenizer from them rather than use one its parent's threads may
//! have left mid-work.

use crate::errors::{self, IntoPy};
use crate::shared::args::json_of;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyTuple};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use stoker::tokens::{EncodedBatch, TextEncoder, TextTokenizer};

/// The origin a tokenizer given as bytes reports, when none is named.
const BYTES_ORIGIN: &str = "<bytes>";

/// A tokenizer for batches of texts (see the Python `stoker.Tokenizer`).
#[pyclass(frozen, name = "Tokenizer", module = "stoker._stoker")]
pub struct PyTokenizer {
    /// The `tokenizer.json`'s bytes.
    json: Arc<[u8]>,
    /// The file it came from, as errors name it.
    origin: PathBuf,
    /// The BOS and EOS token names it was given.
    names: (Option<String>, Option<String>),
    /// The process that built `encoder`, and the encoder. Locked only with the GIL held (so no
    /// thread holds it when Python forks).
    encoder: Mutex<(u32, Arc<TextEncoder>)>,
}

/// The encoder of `json`, with the named BOS and EOS tokens.
fn build(json: &[u8], origin: &Path, names: &(Option<String>, Option<String>)) -> stoker::Result<TextEncoder> {
    TextEncoder::new(TextTokenizer::from_json(json, origin)?, names.0.as_deref(), names.1.as_deref())
}

/// Keyword arguments as the engine's argument rules read them (`None` values left out).
fn args_of(pairs: &[(&str, Option<&Bound<'_, PyAny>>)]) -> stoker::args::Args {
    pairs.iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), json_of(v)))).collect()
}

/// A `bytearray` of `n` values of `W` bytes each (native byte order: the bytes of a NumPy
/// array of their type), from `values`.
fn bytearray<'py, const W: usize>(
    py: Python<'py>,
    n: usize,
    values: impl Iterator<Item = [u8; W]>,
) -> PyResult<Bound<'py, PyByteArray>> {
    PyByteArray::new_with(py, n * W, |buf| {
        buf.chunks_exact_mut(W).zip(values).for_each(|(b, v)| b.copy_from_slice(&v));
        Ok(())
    })
}

/// Where a tokenizer's JSON comes from.
enum Source {
    /// Its bytes, given.
    Json(Vec<u8>),
    /// Its file.
    File(PathBuf),
}

impl PyTokenizer {
    /// This process's encoder: the one built, or, in a `fork()` child, one rebuilt from the
    /// file's bytes (with the GIL released).
    fn encoder(&self, py: Python<'_>) -> PyResult<Arc<TextEncoder>> {
        let pid = std::process::id();
        {
            let held = self.encoder.lock().unwrap_or_else(|p| p.into_inner());
            if held.0 == pid {
                return Ok(held.1.clone());
            }
        }
        let fresh = Arc::new(py.detach(|| build(&self.json, &self.origin, &self.names)).py_err()?);
        *self.encoder.lock().unwrap_or_else(|p| p.into_inner()) = (pid, fresh.clone());
        Ok(fresh)
    }
}

#[pymethods]
impl PyTokenizer {
    /// `source`: the path of a `tokenizer.json` (`str` or `os.PathLike`), or its bytes (`name`
    /// is then what errors call it); `bos_token`, `eos_token`: the tokens `add_bos`/`add_eos`
    /// add (default: the first of the usual names the vocabulary has).
    #[new]
    #[pyo3(signature = (source, bos_token=None, eos_token=None, name=None))]
    fn new(
        py: Python<'_>,
        source: &Bound<'_, PyAny>,
        bos_token: Option<&Bound<'_, PyAny>>,
        eos_token: Option<&Bound<'_, PyAny>>,
        name: Option<PathBuf>,
    ) -> PyResult<Self> {
        errors::contain(|| {
            let names = stoker::args::tokenizer_names(args_of(&[("bos_token", bos_token), ("eos_token", eos_token)]))
                .py_err()?;
            let given = match source.cast::<PyBytes>() {
                Ok(b) => Some(b.as_bytes().to_vec()),
                Err(_) => source.cast::<PyByteArray>().ok().map(|b| b.to_vec()),
            };
            let source = match given {
                Some(json) => Source::Json(json),
                None => Source::File(source.extract::<PathBuf>().map_err(|_| {
                    errors::config(
                        "tokenizer",
                        format!(
                            "expected the path of a tokenizer.json (str or os.PathLike) or its bytes, got {}",
                            source.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                        ),
                    )
                })?),
            };
            let (json, origin, encoder) = py
                .detach(|| {
                    let (json, origin) = match source {
                        Source::Json(json) => (json, name.unwrap_or_else(|| BYTES_ORIGIN.into())),
                        Source::File(p) => (TextTokenizer::read(&p)?, p),
                    };
                    let encoder = build(&json, &origin, &names)?;
                    Ok((json, origin, encoder))
                })
                .py_err()?;
            let encoder = Mutex::new((std::process::id(), Arc::new(encoder)));
            Ok(PyTokenizer { json: json.into(), origin, names, encoder })
        })
    }

    /// The ids of each of `texts` (a list of `str`), encoded on `threads` threads made for the
    /// call (`None`/`'auto'`: `STOKER_NUM_THREADS`, else the CPU allowance) with the GIL
    /// released: `(ids, offsets)`, the bytes of a `uint32` array of every text's ids end to end
    /// and of an `int64` array of where each text's start (one more than there are texts).
    #[pyo3(signature = (texts, add_bos=None, add_eos=None, add_special_tokens=None, threads=None))]
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        add_bos: Option<&Bound<'py, PyAny>>,
        add_eos: Option<&Bound<'py, PyAny>>,
        add_special_tokens: Option<&Bound<'py, PyAny>>,
        threads: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyByteArray>, Bound<'py, PyByteArray>)> {
        errors::contain(|| {
            let opts = stoker::args::encode_options(args_of(&[
                ("add_bos", add_bos),
                ("add_eos", add_eos),
                ("add_special_tokens", add_special_tokens),
                ("threads", threads),
            ]))
            .py_err()?;
            let encoder = self.encoder(py)?;
            let mut interrupt: Option<PyErr> = None;
            let done = py.detach(|| {
                let mut poll = || {
                    Python::attach(|py| match py.check_signals() {
                        Ok(()) => true,
                        Err(e) => {
                            interrupt = Some(e);
                            false
                        }
                    })
                };
                encoder.encode_batch(&texts, &opts, &mut poll)
            });
            if let Some(e) = interrupt {
                py.detach(move || drop(done));
                return Err(e);
            }
            let done: EncodedBatch = done.py_err()?;
            // A Ctrl-C that came while the last texts were encoded is raised from this call.
            py.check_signals()?;
            let ids = bytearray(py, done.len(), done.pieces().flatten().map(|id| id.to_ne_bytes()))?;
            let offsets = bytearray(py, done.offsets().len(), done.offsets().iter().map(|o| o.to_ne_bytes()))?;
            Ok((ids, offsets))
        })
    }

    /// The encoder's name (`"stoker byte-level BPE"`, `"tokenizers 1.0"` or `"tokenizers"`)
    /// and why the file got it.
    #[getter]
    fn engine(&self, py: Python<'_>) -> PyResult<(String, String)> {
        let e = self.encoder(py)?;
        let (name, why) = e.tokenizer.engine();
        Ok((name.to_string(), why.to_string()))
    }

    /// The vocabulary size (added tokens included).
    #[getter]
    fn vocab_size(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.encoder(py)?.tokenizer.vocab_size())
    }

    /// The id `add_bos` adds (`None`: the tokenizer has none).
    #[getter]
    fn bos_id(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        Ok(self.encoder(py)?.bos)
    }

    /// The id `add_eos` adds (`None`: the tokenizer has none).
    #[getter]
    fn eos_id(&self, py: Python<'_>) -> PyResult<Option<u32>> {
        Ok(self.encoder(py)?.eos)
    }

    /// The file the tokenizer came from (or the name it was given with its bytes).
    #[getter]
    fn origin(&self) -> String {
        self.origin.display().to_string()
    }

    /// The `tokenizer.json`'s bytes.
    fn json_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.json)
    }

    /// Pickles as the file's bytes (not its path: the file need not exist where it is
    /// unpickled), its name and the token names.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let me = slf.get();
        let args = (me.json_bytes(py), me.names.0.clone(), me.names.1.clone(), me.origin());
        Ok((slf.get_type().into_any(), args.into_pyobject(py)?))
    }

    /// `Tokenizer(origin, engine=...)`.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let e = self.encoder(py)?;
        Ok(format!("Tokenizer({:?}, engine={:?})", self.origin(), e.tokenizer.engine().0))
    }
}
