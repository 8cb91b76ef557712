//! What every batch class shares, written once: `__len__` and `index`, and by group `indices`
//! and `device` ([`batch_class!`]); the values come from [`crate::shared::held`], host or device.

/// The one `#[pymethods]` block of a batch class: the kind's own methods (the braces) and the
/// shared ones. Every batch class gets `__len__` and `index`; the groups named in
/// `shares [...]` add:
/// - `indices` (batches of dataset samples: images, arrays): the samples' dataset indices;
/// - `device` (images, tokens): where the batch is, `cpu` or `cuda:N`.
///
/// The class keeps its batch in a field `inner` ([`crate::shared::device::Held`]).
macro_rules! batch_class {
    ($class:ident, shares [$($group:ident)*], { $($own:tt)* }) => {
        $crate::shared::batch::batch_class!(@add $class, [$($group)*], [$($own)*]);
    };

    (@add $class:ident, [indices $($rest:ident)*], [$($acc:tt)*]) => {
        $crate::shared::batch::batch_class!(@add $class, [$($rest)*], [$($acc)*
            /// Dataset indices of the samples (rows).
            #[getter]
            fn indices(&self) -> Vec<u32> {
                self.inner.indices()
            }
        ]);
    };

    (@add $class:ident, [device $($rest:ident)*], [$($acc:tt)*]) => {
        $crate::shared::batch::batch_class!(@add $class, [$($rest)*], [$($acc)*
            /// `cpu` or `cuda:N`.
            #[getter]
            fn device(&self) -> String {
                self.inner.device()
            }
        ]);
    };

    (@add $class:ident, [], [$($acc:tt)*]) => {
        #[::pyo3::pymethods]
        impl $class {
            $($acc)*

            /// Samples (rows) in the batch.
            fn __len__(&self) -> usize {
                self.inner.len()
            }

            /// Batch number within the epoch.
            #[getter]
            fn index(&self) -> usize {
                self.inner.index()
            }
        }
    };
}
pub(crate) use batch_class;
