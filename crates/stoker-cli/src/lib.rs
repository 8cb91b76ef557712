//! `stoker`: bench a dataset, build and bench the embedded demo, pack and index shards, export
//! transformed samples, check the machine, watch a training job.
//!
//! The command line lives in this library so that the Python package's `stoker` entry point
//! runs the very same code ([`run_from`]); `main.rs` is a two-line wrapper. One module per
//! command; each parses its flags (clap) into a plain struct and hands the values, as text, to
//! the engine's [`stoker::args`], the one place where arguments are checked. An engine error
//! about an argument is shown with the flag's name (`--memory-limit: ...`).

mod bench;
mod bench_text;
mod cache;
mod demo;
mod doctor;
mod export;
mod html;
mod index;
mod loader_opts;
mod monitor;
mod pack;
mod ray;
mod series;
mod tokenize;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "stoker", version, about = "Keeps GPUs fed: image files to batches on a thread pool, measured.")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load a dataset as fast as possible and report throughput, CPU, memory and the bottleneck.
    Bench(bench::BenchArgs),
    /// List, size and clear the decoded-pixel caches (`stoker cache`, `stoker cache clear --all`).
    Cache(cache::CacheArgs),
    /// Build a demo ImageFolder from the embedded photos and bench it.
    Demo(demo::DemoArgs),
    /// Convert an ImageFolder into WebDataset tar shards with sidecar indexes.
    Pack(pack::PackArgs),
    /// Check this machine: CPU allowance, memory, /dev/shm, libjpeg-turbo, SIMD, GPUs (NVML),
    /// with recommendations. Works without a GPU.
    Doctor(doctor::DoctorArgs),
    /// Write the sidecar index of existing WebDataset tar shards.
    Index(index::IndexArgs),
    /// Write transformed samples to .npy files (for comparisons against other loaders).
    Export(export::ExportArgs),
    /// Tokenize text once into a token cache folder that TokenLoader reads instead
    /// (`stoker tokenize data/*.jsonl.zst --tokenizer tokenizer.json cache/`).
    Tokenize(tokenize::TokenizeArgs),
    /// Watch any training job (`--pid PID` or `-- CMD ...`): CPU, memory, I/O per process and
    /// thread, the host, the GPUs (NVML); then say why its GPU waits and what to change.
    Monitor(monitor::MonitorArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Bench(a) => bench::run(&a),
        Cmd::Cache(a) => cache::run(&a),
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Pack(a) => pack::run(&a),
        Cmd::Doctor(a) => doctor::run(&a),
        Cmd::Index(a) => index::run(&a),
        Cmd::Export(a) => export::run(&a),
        Cmd::Tokenize(a) => tokenize::run(&a),
        Cmd::Monitor(a) => monitor::run(&a),
    }
}

/// Parses `args` (the first is the program name) and runs the command; returns the process
/// exit code (0 on success, 1 on an error, which is printed as one line on stderr). `--help`
/// and argument errors print and exit the process, as clap does.
pub fn run_from<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", util::describe(&e));
            1
        }
    }
}
