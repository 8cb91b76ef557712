//! What every loader class shares, written once: epochs, position and state dicts, threads,
//! sharding, held batches, the device, trace and report, and the start of an iteration
//! ([`loader_class!`]). A kind's folder writes only what is its own (its constructor, its
//! getters).
//!
//! Written as a macro rather than a base class (`#[pyclass(subclass)]` and `extends`): a base
//! would show in every class's `__mro__` and make the `@final` classes of `_stoker.pyi`
//! subclassable, and PyO3 gives a class one `#[pymethods]` block (without the `inventory`
//! registry), so the shared methods and the kind's own must be emitted together.

use crate::shared::device::HostIter;
use crate::shared::iter::Polled;

/// What a loader class adds to the shared methods. The class keeps the engine's loader, its
/// transfer stage and its device report in a field `on` ([`stoker_cuda::OnDevice`]).
pub(crate) trait LoaderClass {
    /// The engine's host iteration of this kind (what its loader's `iter()` gives).
    type Host: HostIter;
    /// The iterator class `iter()` returns.
    type Iterator;
    /// `(batch_size, rank, world_size)`, as configured.
    fn sharding(&self) -> (usize, usize, usize);
    /// The iterator class of a started iteration.
    fn iterator(&self, it: Polled<Self::Host>) -> Self::Iterator;
}

/// The one `#[pymethods]` block of a loader class: the kind's own methods (the braces) and
/// the shared ones. Every loader class gets `set_epoch`, `resume_pending`, `threads`, `held`,
/// `batch_size`, `rank`, `world_size`, `device`, `report_json`, `report_text`, the state
/// methods `state_json`, `load_state_json`, `load_states_json` (over the engine loader's
/// one state surface, `stoker::shell::resume`, and `stoker::args::load_state_dict`) and
/// `iter`; the groups named in `shares [...]` add:
/// - `positioned` (a sampler position: images, arrays): `__len__`, `mixture_json`, `state`, `elastic_json`,
///   `load_state` (a fork child's), `fingerprint_json`;
/// - `traced` (images, tokens): `trace_path`, `save_trace`;
/// - `device_report` (arrays, tokens): `device_report_json`.
///
/// ```ignore
/// loader_class! { PyArrayLoader => PyArrayIter, shares [positioned device_report], {
///     #[new]
///     fn new(/* ... */) -> PyResult<Self> { /* ... */ }
/// } }
/// ```
///
/// The class implements [`LoaderClass`] with `Iterator` the class after `=>`; the bodies call
/// the engine loader `self.on.loader` by the method names the engine's loaders share.
macro_rules! loader_class {
    ($class:ident => $iter:ident, shares [$($group:ident)*], { $($own:tt)* }) => {
        $crate::shared::loader::loader_class!(@add $class => $iter, [$($group)*], [$($own)*]);
    };

    (@add $class:ident => $iter:ident, [positioned $($rest:ident)*], [$($acc:tt)*]) => {
        $crate::shared::loader::loader_class!(@add $class => $iter, [$($rest)*], [$($acc)*
            /// Batches per epoch on this rank (of the current epoch: a continued elastic epoch
            /// has its own count).
            fn __len__(&self) -> usize {
                self.on.loader.len()
            }

            /// The mixture's sources as JSON (`[{name, weight, share, exhausted, samples,
            /// start}]`), or `None` when the loader reads one dataset.
            fn mixture_json(&self) -> Option<String> {
                let sources = self.on.loader.sampler().mixture_sources()?;
                ::serde_json::to_string(&sources).ok()
            }

            /// `(seed, epoch, next_batch)`.
            fn state(&self) -> (u64, u64, usize) {
                let s = self.on.loader.state().state;
                (s.seed, s.epoch, s.next_batch)
            }

            /// The elastic base of the current epoch as JSON (`None`: a normal epoch).
            fn elastic_json(&self) -> ::pyo3::PyResult<Option<String>> {
                $crate::errors::contain(|| $crate::shared::args::elastic_json(self.on.loader.state().elastic))
            }

            /// Restores a position (of the elastic epoch `elastic_json`, when given);
            /// `resume=False` keeps it only as the position (a fork child continuing its
            /// parent's loader), not as a point the next iteration resumes from.
            #[pyo3(signature = (seed, epoch, next_batch, resume=true, elastic_json=None))]
            fn load_state(
                &self,
                seed: u64,
                epoch: u64,
                next_batch: usize,
                resume: bool,
                elastic_json: Option<&str>,
            ) -> ::pyo3::PyResult<()> {
                use $crate::errors::IntoPy;
                $crate::errors::contain(|| {
                    let elastic = $crate::shared::args::elastic_of(elastic_json)?;
                    let state = ::stoker::SamplerState { seed, epoch, next_batch };
                    self.on.loader.adopt_state(::stoker::shell::sampled::SampledState { state, elastic }, resume).py_err()
                })
            }

            /// What a saved state is valid for, as JSON (see `stoker::Fingerprint`).
            fn fingerprint_json(&self, py: ::pyo3::Python<'_>) -> ::pyo3::PyResult<String> {
                $crate::errors::contain(|| {
                    // Computed on first use (the images' hashes every sample): without the GIL.
                    let json = py.detach(|| ::serde_json::to_string(&self.on.loader.fingerprint()));
                    json.map_err(|e| $crate::errors::to_py(::stoker::Error::Internal(e.to_string())))
                })
            }

        ]);
    };

    (@add $class:ident => $iter:ident, [traced $($rest:ident)*], [$($acc:tt)*]) => {
        $crate::shared::loader::loader_class!(@add $class => $iter, [$($rest)*], [$($acc)*
            /// The trace file (`trace=`), or None when tracing is off.
            #[getter]
            fn trace_path(&self) -> Option<String> {
                self.on.loader.trace_path().map(|p| p.display().to_string())
            }

            /// Writes the trace recorded so far to `path` (default: the `trace=` file) now, with
            /// the GIL released; returns the path written.
            #[pyo3(signature = (path=None))]
            fn save_trace(
                &self,
                py: ::pyo3::Python<'_>,
                path: Option<::std::path::PathBuf>,
            ) -> ::pyo3::PyResult<String> {
                use $crate::errors::IntoPy;
                $crate::errors::contain(|| {
                    let written = py.detach(|| self.on.loader.write_trace(path.as_deref())).py_err()?;
                    Ok(written.display().to_string())
                })
            }
        ]);
    };

    (@add $class:ident => $iter:ident, [device_report $($rest:ident)*], [$($acc:tt)*]) => {
        $crate::shared::loader::loader_class!(@add $class => $iter, [$($rest)*], [$($acc)*
            /// `{requested, used, note}` of the `device=` argument, as JSON.
            fn device_report_json(&self) -> String {
                ::serde_json::to_string(&self.on.device).unwrap_or_default()
            }
        ]);
    };

    (@add $class:ident => $iter:ident, [], [$($acc:tt)*]) => {
        #[::pyo3::pymethods]
        impl $class {
            $($acc)*

            /// Selects the epoch; the engine checks the value (a non-negative integer).
            fn set_epoch(&self, epoch: &::pyo3::Bound<'_, ::pyo3::PyAny>) -> ::pyo3::PyResult<()> {
                self.on.loader.set_epoch($crate::shared::args::epoch_of(epoch)?);
                Ok(())
            }

            /// Whether a loaded state waits for the next iteration.
            #[getter]
            fn resume_pending(&self) -> bool {
                self.on.loader.resume_pending()
            }

            /// Worker threads (decode, copy or tokenize, by kind).
            #[getter]
            fn threads(&self) -> usize {
                self.on.loader.threads()
            }

            /// Batches currently held by Python (tensors or arrays alive).
            #[getter]
            fn held(&self) -> usize {
                self.on.loader.held()
            }

            /// Samples (rows) per batch.
            #[getter]
            fn batch_size(&self) -> usize {
                $crate::shared::loader::LoaderClass::sharding(self).0
            }

            /// This process's rank.
            #[getter]
            fn rank(&self) -> usize {
                $crate::shared::loader::LoaderClass::sharding(self).1
            }

            /// Ranks sharing the data.
            #[getter]
            fn world_size(&self) -> usize {
                $crate::shared::loader::LoaderClass::sharding(self).2
            }

            /// Where batches are delivered: `cpu` or `cuda:N`.
            #[getter]
            fn device(&self) -> String {
                self.on.device.used.clone()
            }

            /// The report (stages, starvation, the bottleneck verdict, the kind's section) as
            /// JSON.
            fn report_json(&self) -> ::pyo3::PyResult<String> {
                ::serde_json::to_string(&self.on.loader.report())
                    .map_err(|e| $crate::errors::to_py(::stoker::Error::Internal(e.to_string())))
            }

            /// The report's human summary.
            fn report_text(&self) -> String {
                self.on.loader.report().to_text()
            }

            /// The state dict (`state_dict()`) as JSON.
            fn state_json(&self, py: ::pyo3::Python<'_>) -> ::pyo3::PyResult<String> {
                use $crate::errors::IntoPy;
                // The images' fingerprint is computed on first use (it hashes every sample): without the GIL.
                $crate::errors::contain(|| Ok(py.detach(|| self.on.loader.state_dict()).py_err()?.to_string()))
            }

            /// Restores a state dict given as JSON (`load_state_dict`): checked field by field
            /// and against this loader's fingerprint, each error naming the field.
            fn load_state_json(&self, py: ::pyo3::Python<'_>, state_json: &str) -> ::pyo3::PyResult<()> {
                $crate::errors::contain(|| {
                    use $crate::errors::IntoPy;
                    let state = $crate::shared::args::state_value(state_json, "a dict from state_dict()")?;
                    py.detach(|| ::stoker::args::load_state_dict(&self.on.loader, &state)).py_err()
                })
            }

            /// Continues a run saved by several ranks: the JSON list of every rank's state dict
            /// (any number of ranks; what no saved rank delivered is dealt to this loader's
            /// ranks).
            fn load_states_json(&self, py: ::pyo3::Python<'_>, states_json: &str) -> ::pyo3::PyResult<()> {
                $crate::errors::contain(|| {
                    use $crate::errors::IntoPy;
                    let states = $crate::shared::args::state_value(states_json, "a list of state_dict()s")?;
                    py.detach(|| ::stoker::args::load_state_dicts(&self.on.loader, &states)).py_err()
                })
            }

            /// Starts iterating from the current state; ends any previous iteration of this
            /// loader (its buffers return to the pool, its next batch is an error).
            fn iter(&self, py: ::pyo3::Python<'_>) -> ::pyo3::PyResult<$iter> {
                use $crate::errors::IntoPy;
                $crate::errors::contain(|| {
                    let it = py
                        .detach(|| {
                            let host = self.on.loader.iter()?;
                            $crate::shared::device::Iter::start(host, self.on.stage.as_ref())
                        })
                        .py_err()?;
                    let it = $crate::shared::iter::raise_pending_signal(py, it)?;
                    Ok($crate::shared::loader::LoaderClass::iterator(self, $crate::shared::iter::Polled::new(it)))
                })
            }
        }
    };
}
pub(crate) use loader_class;
