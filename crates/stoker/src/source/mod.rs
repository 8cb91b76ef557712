//! Sources know *what* samples exist and read one sample's bytes on demand; they never hold the
//! bytes of the dataset. Only an index lives in memory (a few bytes per sample).

mod image_folder;
#[cfg(feature = "remote")]
mod remote;
pub mod shards;
pub mod tar;

pub use image_folder::{ImageFolder, IMG_EXTENSIONS};
pub use shards::ShardSource;

use crate::error::Result;
use std::path::PathBuf;

/// A random-access collection of encoded samples with integer labels.
pub trait Source: Send + Sync + 'static {
    /// Number of samples.
    fn len(&self) -> usize;
    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The label of sample `i`.
    fn label(&self, i: usize) -> i64;
    /// Reads the encoded bytes of sample `i` into `buf` (cleared first; its capacity is reused).
    fn read(&self, i: usize, buf: &mut Vec<u8>) -> Result<()>;
    /// Where sample `i` lives, for error messages and skip reports.
    fn describe(&self, i: usize) -> PathBuf;
    /// Sizes of the consecutive shards the samples are stored in, when the source is sharded
    /// (enables shard-aware shuffling).
    fn groups(&self) -> Option<Vec<usize>> {
        None
    }
}
