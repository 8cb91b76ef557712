//! [`MixSource`]: the sources of a mixture as one source, numbered one after another, each
//! with its labels moved by its own offset (datasets with different class lists).

use super::{open, Dataset, Source, StorageReport};
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

/// Where one source of a mixture lives and how its labels are shifted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartSpec {
    /// What [`super::detect`] opens: an ImageFolder root, a pack folder, shards, globs, URLs.
    pub roots: Vec<String>,
    /// Added to every label of the source.
    pub label_offset: i64,
}

/// The sources of a mixture, as one.
pub struct MixSource {
    parts: Vec<(Arc<dyn Source>, i64)>,
    /// Where each source's samples start.
    starts: Vec<usize>,
    len: usize,
}

impl MixSource {
    /// The sources, with their label offsets, in order.
    pub fn new(parts: Vec<(Arc<dyn Source>, i64)>) -> Result<MixSource> {
        let mut starts = Vec::with_capacity(parts.len());
        let mut len = 0usize;
        for (s, _) in &parts {
            starts.push(len);
            len = len.checked_add(s.len()).filter(|&n| n <= u32::MAX as usize).ok_or_else(|| {
                Error::Dataset(format!("the mixture's sources hold over {} samples together", u32::MAX))
            })?;
        }
        Ok(MixSource { parts, starts, len })
    }

    /// The source of sample `i` and its index there.
    fn locate(&self, i: usize) -> (&(Arc<dyn Source>, i64), usize) {
        let d = self.starts.partition_point(|&s| s <= i) - 1;
        (&self.parts[d], i - self.starts[d])
    }
}

impl Source for MixSource {
    fn len(&self) -> usize {
        self.len
    }

    fn label(&self, i: usize) -> i64 {
        let ((s, offset), j) = self.locate(i);
        s.label(j) + offset
    }

    fn read(&self, i: usize, buf: &mut Vec<u8>, max_bytes: u64) -> Result<()> {
        let ((s, _), j) = self.locate(i);
        s.read(j, buf, max_bytes)
    }

    fn describe(&self, i: usize) -> PathBuf {
        let ((s, _), j) = self.locate(i);
        s.describe(j)
    }

    fn parts(&self) -> Option<Vec<usize>> {
        Some(self.parts.iter().map(|(s, _)| s.len()).collect())
    }

    fn abandon_reads(&self) {
        for (s, _) in &self.parts {
            s.abandon_reads();
        }
    }

    /// Each source is told its own samples' order (its share of the budget: by its share of
    /// the reads).
    fn plan_reads(&self, order: &[u32], budget: u64, lag: usize) {
        let mut mine: Vec<Vec<u32>> = vec![vec![]; self.parts.len()];
        for &i in order {
            let d = self.starts.partition_point(|&s| s <= i as usize) - 1;
            mine[d].push(i - self.starts[d] as u32);
        }
        for ((s, _), o) in self.parts.iter().zip(&mine) {
            if s.is_remote() && !o.is_empty() {
                let share = (budget as f64 * o.len() as f64 / order.len().max(1) as f64) as u64;
                s.plan_reads(o, share.max(super::readahead::PART_BYTES.min(budget)), lag);
            }
        }
    }

    /// Every source in object storage keeps its parts in the cache (a group of its own); an
    /// error when none is.
    fn use_shard_cache(&self, spec: &crate::shell::store::StoreSpec) -> Result<()> {
        let mut any = false;
        for (s, _) in self.parts.iter().filter(|(s, _)| s.is_remote()) {
            s.use_shard_cache(spec)?;
            any = true;
        }
        if !any {
            return Err(Error::config(
                "shard_cache",
                "keeps parts of tar shards in object storage; no source of this mixture is",
            ));
        }
        Ok(())
    }

    fn is_remote(&self) -> bool {
        self.parts.iter().any(|(s, _)| s.is_remote())
    }

    fn storage_report(&self) -> Option<StorageReport> {
        StorageReport::merge(self.parts.iter().filter_map(|(s, _)| s.storage_report()))
    }
}

/// Opens every source of a mixture ([`open`] each part's roots) as one [`Dataset`]: its class
/// names are the first source's, with the names of the others' classes that an offset moves past
/// them appended (so class `k` names the class that label `k` means where the offsets make the
/// lists line up); entries that are not samples are listed from every source.
pub fn open_mixture(parts: &[PartSpec]) -> Result<Dataset> {
    let mut sources = Vec::with_capacity(parts.len());
    let mut classes: Vec<OsString> = vec![];
    let mut not_samples = vec![];
    let mut kinds = vec![];
    for p in parts {
        let d = open(&p.roots)?;
        kinds.push(d.kind);
        for (k, name) in d.classes.iter().enumerate() {
            let label = k as i64 + p.label_offset;
            if label >= classes.len() as i64 {
                classes.resize(label as usize, OsString::new());
                classes.push(name.clone());
            }
        }
        not_samples.extend(d.not_samples);
        sources.push((d.source, p.label_offset));
    }
    let kind = super::DatasetKind::Mixture(kinds);
    Ok(Dataset { source: Arc::new(MixSource::new(sources)?), classes, kind, not_samples })
}
