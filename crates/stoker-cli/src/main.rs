//! The `stoker` binary: see the `stoker_cli` library for the commands.

fn main() {
    // Die quietly on a closed pipe (`stoker bench --json | head`), as command-line tools do.
    // SAFETY: setting SIGPIPE to its default disposition at start-up, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    std::process::exit(stoker_cli::run_from(std::env::args_os()));
}
