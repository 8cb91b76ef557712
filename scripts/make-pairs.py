#!/usr/bin/env python3
"""Writes image-text pair shards as img2dataset and DataComp leave them, broken members included.

    python scripts/make-pairs.py OUT_DIR [--shards 4] [--per-shard 32] [--seed 0] [--photos DIR]
        [--min-side 64] [--max-side 320] [--no-index]

Each shard `OUT_DIR/NNNNN.tar` is a WebDataset tar: per sample `KEY.jpg`, `KEY.txt` (the caption,
UTF-8) and `KEY.json` (`caption`, `url`, `key`, `status`, `width`, `height`, `original_width`,
`original_height`, as img2dataset writes them), members of one sample next to each other, in key
order. Keys are img2dataset's (shard number then index, 9 digits) with gaps: img2dataset writes
only the downloads that succeeded, so about one key in six is missing (at least one
per shard).

Images: random crops of the photos in `--photos DIR` (default: the demo photos embedded in stoker,
made with `stoker.make_demo`, so the script runs on a clean clone; `/work/shared/photos` on the
development machine is another choice), resized so that the longer side is `--min-side` to
`--max-side` pixels (default 64..320, small shards for tests; 256..512 spans what img2dataset leaves
with the usual settings: `--image_size 256` for LAION-400M, 384 for LAION-2B, and DataComp's 512
with `keep_ratio_largest`, a longer side of at most 512) and saved as JPEG with Pillow.
Captions: sentences of `tests/data/text/wiki-sample.jsonl.zst` (Wikipedia, CC BY-SA 3.0).

Broken and unusual samples, on purpose, in shard 0 (one of each, listed in `manifest.json` with
their `kind`):
- `no_caption`: an image with neither `.txt` nor a caption in its `.json`;
- `no_image`: a caption (`.txt`, `.json`) with no image;
- `corrupt_image`: a `.jpg` whose bytes after the JPEG header are garbage;
- `bad_utf8`: a `.txt` that is not UTF-8 (Latin-1 bytes), and no caption in its `.json`;
- `upper_ext`: `KEY.JPG` and `KEY.TXT` (extensions match case-insensitively: a good sample);
- `json_caption`: a `.jpg` and a `.json` with a `caption`, no `.txt` (a good sample for a reader
  that takes the caption from the JSON field).

`OUT_DIR/manifest.json` lists every shard, every sample (key, shard, members, kind, caption as
written, image size) and the missing keys. Then the shards are indexed with stoker's own indexer
(`stoker index OUT_DIR/*.tar`, through the installed package) unless `--no-index`; it counts the
samples with an image member (`KEY.JPG` included), so the `no_image` sample is not in its count.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tarfile
import tempfile
from pathlib import Path

import zstandard
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
WIKI = ROOT / "tests" / "data" / "text" / "wiki-sample.jsonl.zst"
#: The broken or unusual kinds, each once in shard 0 (see the docstring).
SPECIAL = ["no_caption", "no_image", "corrupt_image", "bad_utf8", "upper_ext", "json_caption"]


def sentences() -> list[str]:
    """Sentences of the Wikipedia sample, 20 to 400 characters long."""
    raw = zstandard.ZstdDecompressor().stream_reader(WIKI.open("rb")).read().decode()
    out = []
    for line in raw.splitlines():
        for s in json.loads(line)["text"].replace("\n", " ").split(". "):
            s = s.strip()
            if 20 <= len(s) <= 400:
                out.append(s if s.endswith(".") else s + ".")
    return out


def photos(folder: Path | None, seed: int, tmp: Path) -> list[Image.Image]:
    """The source images: `folder`'s, or the demo's (a few JPEGs made by `stoker.make_demo`)."""
    if folder is None:
        import stoker

        folder = tmp / "demo"
        stoker.make_demo(str(folder), 14, seed=seed)
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not paths:
        raise SystemExit(f"{folder}: no .jpg, .jpeg or .png images")
    return [Image.open(p).convert("RGB") for p in paths]


def picture(rng: random.Random, sources: list[Image.Image], sides: tuple[int, int]) -> tuple[bytes, int, int, int, int]:
    """A random crop of a source, resized to a longer side in `sides`: `(jpeg, width, height, original
    width, original height)`."""
    src = rng.choice(sources)
    w, h = src.size
    cw, ch = rng.randint(max(8, w // 4), w), rng.randint(max(8, h // 4), h)
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    scale = rng.uniform(*sides) / max(cw, ch)
    out_w, out_h = max(8, round(cw * scale)), max(8, round(ch * scale))
    img = src.crop((x, y, x + cw, y + ch)).resize((out_w, out_h), Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=rng.randint(75, 95))
    return buf.getvalue(), out_w, out_h, cw, ch


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-shard", type=int, default=32, help="keys per shard before the gaps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--photos", type=Path, default=None, help="a folder of images (default: stoker's demo)")
    ap.add_argument("--min-side", type=int, default=64, help="shortest longer side of an image, pixels")
    ap.add_argument("--max-side", type=int, default=320, help="longest longer side of an image, pixels")
    ap.add_argument("--no-index", action="store_true", help="do not run `stoker index` on the shards")
    a = ap.parse_args()
    if a.shards < 1 or a.per_shard < len(SPECIAL) + 1:
        raise SystemExit(f"need --shards >= 1 and --per-shard >= {len(SPECIAL) + 1}")
    if not 8 <= a.min_side <= a.max_side:
        raise SystemExit("need 8 <= --min-side <= --max-side")
    rng = random.Random(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    texts = sentences()
    samples, missing, shards = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        sources = photos(a.photos, a.seed, Path(tmp))
        for s in range(a.shards):
            name = f"{s:05d}.tar"
            shards.append(name)
            keys = [f"{s:05d}{i:04d}" for i in range(a.per_shard)]
            # The special kinds take the first keys of shard 0 (none of them is a gap).
            kinds = list(SPECIAL) if s == 0 else []
            # At least one gap in every shard, after the special kinds.
            gap = keys[rng.randrange(len(kinds), len(keys))]
            with tarfile.open(a.out / name, "w", format=tarfile.USTAR_FORMAT) as tar:
                for key in keys:
                    if key == gap or (not kinds and rng.random() < 1 / 6):
                        missing.append(key)
                        continue
                    kind = kinds.pop(0) if kinds else "ok"
                    jpeg, w, h, ow, oh = picture(rng, sources, (a.min_side, a.max_side))
                    caption: str | None = rng.choice(texts)
                    meta = {
                        "caption": caption,
                        "url": f"https://example.com/images/{key}.jpg",
                        "key": key,
                        "status": "success",
                        "width": w,
                        "height": h,
                        "original_width": ow,
                        "original_height": oh,
                    }
                    members: list[tuple[str, bytes]] = []
                    txt: bytes | None = caption.encode()
                    if kind == "no_caption":
                        caption, txt = None, None
                        del meta["caption"]
                    elif kind == "no_image":
                        jpeg = b""
                    elif kind == "corrupt_image":
                        jpeg = jpeg[:200] + bytes(rng.randrange(256) for _ in range(len(jpeg) - 200))
                    elif kind == "bad_utf8":
                        txt = "Caf\u00e9 cr\u00e8me on a na\u00efve table.".encode("latin-1")
                        caption = None
                        del meta["caption"]
                    elif kind == "json_caption":
                        txt = None
                    ext = ("JPG", "JSON", "TXT") if kind == "upper_ext" else ("jpg", "json", "txt")
                    if jpeg:
                        members.append((f"{key}.{ext[0]}", jpeg))
                    members.append((f"{key}.{ext[1]}", json.dumps(meta, ensure_ascii=False).encode()))
                    if txt is not None:
                        members.append((f"{key}.{ext[2]}", txt))
                    for member, data in members:
                        add(tar, member, data)
                    samples.append(
                        {
                            "key": key,
                            "shard": name,
                            "kind": kind,
                            "members": [m for m, _ in members],
                            "caption": caption,
                            "width": w if jpeg else None,
                            "height": h if jpeg else None,
                        }
                    )
    manifest = {
        "shards": shards,
        "samples": samples,
        "missing_keys": missing,
        "kinds": {k: sum(1 for x in samples if x["kind"] == k) for k in ["ok", *SPECIAL]},
    }
    (a.out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    print(f"{a.out}: {len(shards)} shards, {len(samples)} samples, {len(missing)} keys missing")
    if not a.no_index:
        from stoker import _stoker

        rc = _stoker.cli_main(["stoker", "index", *(str(a.out / n) for n in shards)])
        if rc != 0:
            raise SystemExit(f"stoker index failed ({rc})")


if __name__ == "__main__":
    main()
