//! The `stoker` binary: see the `stoker_cli` library for the commands.

fn main() {
    std::process::exit(stoker_cli::run_from(std::env::args_os()));
}
