//! The composition root: "where batches go" (a device string, resolved once by [`place`])
//! plus "what to load" (a dataset or arrays, and their validated config) become a loader whose
//! buffer pool is in the right memory (page-locked for a GPU) and, on a GPU, its transfer
//! stage. The CLI and both Python loader classes build their loaders here and nowhere else; a
//! new loader kind adds one method to [`Target`].

use crate::{place, DeviceStage, Placement};
use stoker::arrays::{ArrayConfig, ArrayLoader, Column};
use stoker::image::gpu_job::DecodeOn;
use stoker::report::DeviceReport;
use stoker::shell::kind::Kind;
use stoker::source::Dataset;
use stoker::tokens::{TextTokenizer, TokenConfig, TokenLoader};
use stoker::{Loader, LoaderConfig, Result};

/// A resolved device: where batches will go, and the report of what was asked and used.
#[derive(Debug)]
pub struct Target {
    placement: Placement,
    report: DeviceReport,
}

/// A loader composed for its device.
pub struct OnDevice<L> {
    /// The host loader (its pool page-locked when a stage follows it).
    pub loader: L,
    /// The transfer stage, when batches go to a GPU.
    pub stage: Option<DeviceStage>,
    /// What was asked for and what is used (`cuda:N` or `cpu`, with why for `auto`).
    pub device: DeviceReport,
}

impl Target {
    /// Resolves `device` (`cpu`, `cuda`, `cuda:N`, `auto`; `cuda` means `cuda:{ordinal}`):
    /// a GPU that is asked for and unusable is an error here, before any data is opened.
    pub fn resolve(device: &str, ordinal: u32) -> Result<Self> {
        let (placement, report) = place(device, ordinal)?;
        Ok(Target { placement, report })
    }

    /// Whether batches go to a GPU.
    pub fn on_gpu(&self) -> bool {
        matches!(self.placement, Placement::Cuda(_))
    }

    /// The image loader over `dataset`: entries that are not samples are listed in its report,
    /// the labels of a GPU batch get device buffers of their own (so keeping them never keeps
    /// the images' buffer), the stage records into the loader's trace, and the report says
    /// which device is used.
    ///
    /// With `decode="gpu"` or `"auto"` on a GPU, the stage decodes the share of each batch the
    /// loader leaves to it (nvJPEG and stoker's resampler); where GPU decode cannot start, `gpu`
    /// is an error saying why and `auto` decodes on the CPU, the report's device note saying why.
    pub fn image_loader(mut self, dataset: &Dataset, config: LoaderConfig) -> Result<OnDevice<Loader>> {
        let (prefetch, limit, decode) = (config.prefetch, config.memory_limit, config.decode);
        let decoder = match (&self.placement, decode) {
            (Placement::Cuda(gpu), d) if d.uses_gpu() => match crate::gpu_decode::GpuDecoder::new(gpu) {
                Ok(dec) => Some(dec),
                Err(e) if d == DecodeOn::Auto => {
                    self.report.note = Some(format!("decode='auto' decodes on the CPU: {e}"));
                    None
                }
                Err(e) => return Err(e),
            },
            _ => None,
        };
        let loader = Loader::new_in(dataset.source.clone(), config, self.placement.allocator())?;
        loader.report_not_samples(&dataset.not_samples);
        let mut on = self.on_device(loader, prefetch, limit)?;
        if let Some(dec) = decoder {
            let share = on.loader.leave_to_gpu(decode).ok_or_else(|| stoker::Error::Internal("no GPU share".into()))?;
            let split = crate::gpu_decode::Split::new(share, decode == DecodeOn::Auto);
            on.stage = on.stage.map(|s| s.with_gpu_decode(crate::GpuDecode::new(dec, split)));
        }
        Ok(on)
    }

    /// The array loader over `columns`, one device region per column; with a mixture in
    /// `config`, `columns` are its sources' columns one source after another, `per_source`
    /// each; the report says which device is used.
    pub fn array_loader(
        self,
        columns: Vec<Column>,
        per_source: usize,
        config: ArrayConfig,
    ) -> Result<OnDevice<ArrayLoader>> {
        let (prefetch, limit) = (config.prefetch, config.memory_limit);
        let loader = if config.sampler.mixture.is_some() {
            let mut columns = columns.into_iter();
            let sources: Vec<Vec<Column>> = std::iter::from_fn(|| {
                let source: Vec<Column> = columns.by_ref().take(per_source).collect();
                (!source.is_empty()).then_some(source)
            })
            .collect();
            ArrayLoader::mixture_in(sources, config, self.placement.allocator())?
        } else {
            ArrayLoader::new_in(columns, config, self.placement.allocator())?
        };
        self.on_device(loader, prefetch, limit)
    }

    /// The token loader over `paths`, one device region per array of a batch (`input_ids`,
    /// `labels`, `position_ids`, `cu_seqlens`, `sources`); the report says which device is used.
    pub fn token_loader(
        self,
        paths: &[std::path::PathBuf],
        tokenizer: Option<TextTokenizer>,
        config: TokenConfig,
    ) -> Result<OnDevice<TokenLoader>> {
        let (prefetch, limit) = (config.prefetch, config.memory_limit);
        let loader = TokenLoader::new_in(paths, tokenizer, config, self.placement.allocator())?;
        self.on_device(loader, prefetch, limit)
    }

    /// The weighted mixture of token sources `config.mixture`, row by row, its batches shaped
    /// as the token loader's; the report says which device is used.
    pub fn token_mixture(
        self,
        tokenizer: Option<TextTokenizer>,
        config: TokenConfig,
    ) -> Result<OnDevice<stoker::tokens::pipeline::TokenMixLoader>> {
        let (prefetch, limit) = (config.prefetch, config.memory_limit);
        let loader = stoker::tokens::pipeline::TokenMixLoader::new_in(tokenizer, config, self.placement.allocator())?;
        self.on_device(loader, prefetch, limit)
    }

    /// The device hand-off of every kind: on a GPU, a transfer stage with a device buffer per
    /// region of the kind's batches ([`Kind::regions`], its detached regions apart), recording
    /// into the loader's trace; the loader's report says which device is used.
    fn on_device<K: Kind>(
        self,
        loader: stoker::shell::kind::Loader<K>,
        prefetch: usize,
        limit: Option<u64>,
    ) -> Result<OnDevice<stoker::shell::kind::Loader<K>>> {
        let (kind, tracer) = (loader.kind(), loader.tracer().cloned());
        let stage = self
            .placement
            .stage(kind.regions(), prefetch, limit)?
            .map(|s| s.with_detached(kind.detached()).with_tracer(tracer));
        loader.telemetry().set_device(self.report.clone());
        Ok(OnDevice { loader, stage, device: self.report })
    }
}
