#!/usr/bin/env python3
"""Time to the first batch of ``stoker.TokenLoader`` on a large JSON Lines file.

Builds ``--out`` (default ``/tmp/stoker-big.jsonl``, about ``--bytes`` of text) by repeating the
Wikipedia shards of ``../shared/text`` (and ``.jsonl.zst`` beside it with ``--zst``), reads it once
into the page cache, then times ``TokenLoader(...)`` plus ``next(iter(loader))`` in a fresh
process: first with no stored document index (it is built and stored in a temporary
``index_cache``), then again (the stored index is read), plain and shuffled. Command used for
BENCHMARKS.md::

    python3 benches/first_batch_text.py --bytes 1e9 --zst
"""

import argparse
import glob
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "text"

CHILD = """
import sys, time, stoker
t0 = time.perf_counter()
l = stoker.TokenLoader(sys.argv[1], tokenizer=sys.argv[2], seq_len=2048, batch_size=8, threads=2,
                       shuffle=sys.argv[3] == "1", index_cache=sys.argv[4], output="numpy")
t1 = time.perf_counter()
next(iter(l))
print(f"{sys.argv[1]} shuffle={sys.argv[3]} {sys.argv[5]}: open {t1 - t0:.3f} s, "
      f"first batch {time.perf_counter() - t0:.3f} s, {l.documents} documents")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=float, default=1e9)
    ap.add_argument("--out", type=Path, default=Path("/tmp/stoker-big.jsonl"))
    ap.add_argument("--tokenizer", type=Path, default=SHARED / "tokenizer-gpt2.json")
    ap.add_argument("--zst", action="store_true", help="also time the file compressed with zstd -3")
    args = ap.parse_args()
    import zstandard

    if not args.out.exists():
        lines = []
        for f in sorted(glob.glob(str(SHARED / "wiki-en-2015-*.jsonl.zst"))):
            with open(f, "rb") as fh:
                lines.extend(zstandard.ZstdDecompressor().stream_reader(fh).read().splitlines(keepends=True))
        written = 0
        with open(args.out, "wb") as out:
            while written < args.bytes:
                for line in lines:
                    out.write(line)
                    written += len(line)
                    if written >= args.bytes:
                        break
    files = [args.out]
    if args.zst:
        zst = Path(str(args.out) + ".zst")
        if not zst.exists():
            subprocess.run(["zstd", "-q", "-3", "-T2", str(args.out), "-o", str(zst)], check=True)
        files.append(zst)
    for f in files:
        with open(f, "rb") as fh:  # into the page cache
            while fh.read(1 << 24):
                pass
        with tempfile.TemporaryDirectory() as store:
            for shuffle, what in (("0", "index built"), ("0", "index stored"), ("1", "index stored")):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-c", CHILD, str(f), str(args.tokenizer), shuffle, store, what],
                               check=True)
                print(f"  (process {time.perf_counter() - t:.2f} s)")


if __name__ == "__main__":
    main()
