//! `stoker index`: write the sidecar index of WebDataset tar shards made by other tools.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Flags of `stoker index`.
#[derive(Args)]
pub struct IndexArgs {
    /// Shard files.
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
}

/// Runs `stoker index`.
pub fn run(a: &IndexArgs) -> Result<()> {
    for shard in &a.shards {
        let n = stoker::source::shards::write_index(shard)?;
        println!("{}: {n} samples indexed", shard.display());
    }
    Ok(())
}
