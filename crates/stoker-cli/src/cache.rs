//! `stoker cache`: list, size and clear the decoded-pixel caches (groups of entries, one per
//! dataset and pixel settings, under a cache root: `/dev/shm/stoker-cache-UID` for `ram`).

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use stoker::cache::{self, GroupInfo};

/// Flags of `stoker cache`.
#[derive(Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    action: Option<Action>,
    /// The cache root: `ram` (default: /dev/shm/stoker-cache-UID) or the directory given as
    /// `cache=` / `--cache`.
    #[arg(long, global = true, default_value = "ram")]
    dir: String,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Action {
    /// List the groups (the default): dataset, settings, size, idle time, in use.
    List,
    /// Remove idle groups: `--all`, or those unused for longer than `--older-than`. Groups in
    /// use by a running loader are never removed.
    Clear {
        /// Remove groups idle for longer than this (`3600`, `90m`, `12h`, `7d`).
        #[arg(long)]
        older_than: Option<String>,
        /// Remove every idle group.
        #[arg(long)]
        all: bool,
    },
}

fn root(dir: &str) -> PathBuf {
    if dir == "ram" {
        cache::ram_root()
    } else {
        PathBuf::from(dir)
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn age(s: u64) -> String {
    match s {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} d", s / 86_400),
    }
}

fn table(groups: &[GroupInfo]) -> String {
    let mut out = String::new();
    for g in groups {
        let name = g.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        out.push_str(&format!(
            "  {name}  {:>9.1} MiB  idle {:>7}  {}  {} ({} samples; {})\n",
            mib(g.bytes),
            age(g.idle_seconds),
            if g.in_use { "in use" } else { "idle  " },
            g.dataset,
            g.samples,
            g.settings
        ));
    }
    out
}

/// Runs `stoker cache`.
pub fn run(a: &CacheArgs) -> Result<()> {
    let root = root(&a.dir);
    match &a.action {
        None | Some(Action::List) => {
            let groups = cache::list_groups(&root);
            if a.json {
                let total: u64 = groups.iter().map(|g| g.bytes).sum();
                let v = serde_json::json!({"root": root, "bytes": total, "groups": groups});
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else if groups.is_empty() {
                println!("{}: no cache", root.display());
            } else {
                let total: u64 = groups.iter().map(|g| g.bytes).sum();
                println!("{}: {} group(s), {:.1} MiB", root.display(), groups.len(), mib(total));
                print!("{}", table(&groups));
                println!("remove idle groups with `stoker cache clear --all` or `--older-than 12h`");
            }
        }
        Some(Action::Clear { older_than, all }) => {
            let older = match (older_than, all) {
                (Some(_), true) => bail!("--older-than and --all cannot both be given"),
                (None, false) => bail!("say what to remove: --all (every idle group) or --older-than AGE"),
                (Some(t), false) => Some(stoker::args::duration("--older-than", t)?),
                (None, true) => None,
            };
            let done = cache::clear(&root, older)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&done)?);
            } else {
                let freed: u64 = done.removed.iter().map(|g| g.bytes).sum();
                println!("{}: removed {} group(s), {:.1} MiB freed", root.display(), done.removed.len(), mib(freed));
                print!("{}", table(&done.removed));
                if !done.in_use.is_empty() {
                    println!("left {} group(s) in use by running loaders:", done.in_use.len());
                    print!("{}", table(&done.in_use));
                }
                if !done.kept.is_empty() {
                    println!("kept {} group(s) used more recently", done.kept.len());
                }
            }
        }
    }
    Ok(())
}
