"""``python -m stoker.ray pack|tokenize --job JSON``: what ``stoker pack --ray`` and ``stoker
tokenize --ray`` run. The JSON holds the values the command line checked (``stoker::args``):
``address``, ``paths``, ``values`` and ``json``; they are passed on as they are. Prints the
summary as ``stoker pack`` / ``stoker tokenize`` print theirs (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import StokerError


def _print_pack(s: dict[str, Any], dst: str) -> None:
    if s["removed"]:
        print(f"removed {len(s['removed'])} file(s) of an earlier run from {dst}")
    print(f"packed {s['samples']} samples into {len(s['shards'])} shard(s), {s['bytes'] / 2**20:.1f} MiB, "
          f"in {s['seconds']:.1f} s ({s['reencoded']} re-encoded); index beside each shard; "
          f"{s['written']} shard(s) written, {s['kept']} already there")
    ra = s.get("random_access")
    if ra is not None:
        change = (ra["bytes_after"] / max(ra["bytes_before"], 1) - 1) * 100
        print(f"random access: {ra['recoded']} JPEG(s) re-coded with restart markers, "
              f"{ra['bytes_before'] / 2**20:.1f} MiB -> {ra['bytes_after'] / 2**20:.1f} MiB ({change:+.1f}%); "
              f"{ra['kept']} kept as they were")
        for why in ra["kept_reasons"]:
            print(f"  kept: {why}")
    for k in s["skipped"]:
        print(f"skipped {k['path']}: {k['reason']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stoker.ray", description=__doc__)
    p.add_argument("command", choices=["pack", "tokenize"])
    p.add_argument("--job", required=True, help="the checked values, as JSON")
    a = p.parse_args(argv)
    job = json.loads(a.job)
    v = job["values"]
    try:
        if a.command == "pack":
            from ._pack import pack

            src, dst = job["paths"]
            s = pack(src, dst, address=job["address"], progress=not job["json"], **v)
            if job["json"]:
                print(json.dumps(s, indent=2))
            else:
                _print_pack(s, dst)
        else:
            from ._tokenize import tokenize

            *data, out = job["paths"]
            document = "line" if v["lines"] else "file"
            t = tokenize(data, v["tokenizer"], out, text_key=v["text_key"], document=document,
                         max_document_bytes=v["max_document_bytes"], address=job["address"])
            print(f"{out}: {t['documents']} documents ({t['failed']} failed, skipped), {t['tokens']} tokens, "
                  f"in {t['seconds']:.1f} s ({t['tokens'] / max(t['seconds'], 1e-9) / 1e6:.2f} M tokens/s, on Ray)")
            for f in t["failures"][:5]:
                print(f"  failed: {f}")
    except StokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
