//! `stoker cache`: list, size and clear the decoded-pixel and token caches (groups of entries,
//! one per dataset and settings, under a cache root: `/dev/shm/stoker-cache-UID` for `ram`), and
//! (`stoker cache indexes`) the stored document indexes of text files.

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
    /// The stored document indexes of text and token files (`STOKER_INDEX_DIR`, else
    /// ~/.cache/stoker/doc-index; `--dir` here names another): data file, documents, size,
    /// stale (the file is gone or changed) or not.
    Indexes {
        /// Remove them (with `--stale`, only the stale ones).
        #[arg(long)]
        clear: bool,
        /// With `--clear`: only entries whose file is gone or changed.
        #[arg(long)]
        stale: bool,
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
            "  {name}  {:<6}  {:>9.1} MiB  idle {:>7}  {}  {} ({} {}; {})\n",
            g.kind,
            mib(g.bytes),
            age(g.idle_seconds),
            if g.in_use { "in use" } else { "idle  " },
            g.dataset,
            g.samples,
            if g.kind == "tokens" { "documents" } else { "samples" },
            g.settings
        ));
    }
    out
}

/// `stoker cache indexes`.
fn indexes(a: &CacheArgs, clear: bool, stale: bool) -> Result<()> {
    let dir = if a.dir == "ram" { stoker::args::index_dir()? } else { Some(PathBuf::from(&a.dir)) };
    let Some(dir) = dir else {
        println!("no index directory: STOKER_INDEX_DIR is off, or neither HOME nor XDG_CACHE_HOME is set");
        return Ok(());
    };
    if stale && !clear {
        bail!("--stale goes with --clear");
    }
    if clear {
        let (n, bytes) = stoker::tokens::index::clear(&dir, stale)?;
        if a.json {
            println!("{}", serde_json::json!({"dir": dir, "removed": n, "bytes": bytes}));
        } else {
            println!("{}: removed {n} index(es), {:.1} MiB freed", dir.display(), mib(bytes));
        }
        return Ok(());
    }
    let entries = stoker::tokens::index::list(&dir)?;
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"dir": dir, "bytes": total, "entries": entries}))?
        );
        return Ok(());
    }
    println!("{}: {} index(es), {:.1} MiB", dir.display(), entries.len(), mib(total));
    for e in &entries {
        let data = e.data.as_ref().map_or("(unreadable entry)".into(), |d| d.display().to_string());
        println!(
            "  {:>9.1} MiB  {:>9} docs  age {:>7}  {}  {data}",
            mib(e.bytes),
            e.documents,
            age(e.age_s),
            if e.stale { "stale" } else { "fresh" }
        );
    }
    if !entries.is_empty() {
        println!("remove them with `stoker cache indexes --clear` (`--stale`: only stale ones)");
    }
    Ok(())
}

/// Runs `stoker cache`.
pub fn run(a: &CacheArgs) -> Result<()> {
    let root = root(&a.dir);
    match &a.action {
        Some(Action::Indexes { clear, stale }) => indexes(a, *clear, *stale)?,
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
