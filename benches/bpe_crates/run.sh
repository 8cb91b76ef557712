#!/bin/sh
# Exact byte-level BPE, the Rust crates side by side: builds this standalone project (release,
# the repository's profile) and runs it. Arguments go to the program:
#   ./run.sh [--vocab gpt2,cl100k,o200k] [--shards N] [--rounds R] [TEXT_DIR]
# Build output goes to ./target (ignored by git) unless CARGO_TARGET_DIR is set.
set -eu
cd "$(dirname "$0")"
cargo build --release --locked ${CARGO_BUILD_JOBS:+-j "$CARGO_BUILD_JOBS"}
exec "${CARGO_TARGET_DIR:-target}/release/bpe_crates" "$@"
