"""``scripts/make-pairs.py``: the image-text pair shards it writes hold exactly what its
``manifest.json`` says (members, captions, broken samples, gaps), the images are JPEGs of the
stated sizes, and stoker's indexer accepted every shard."""

import io
import json
import pathlib
import subprocess
import sys
import tarfile

from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[2]
KINDS = {"no_caption", "no_image", "corrupt_image", "bad_utf8", "upper_ext", "json_caption"}


def test_the_manifest_matches_the_shards(tmp_path):
    out = tmp_path / "pairs"
    run = [sys.executable, str(ROOT / "scripts" / "make-pairs.py"), str(out), "--shards", "3", "--per-shard", "10"]
    printed = subprocess.run(run, check=True, capture_output=True, text=True).stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards"] == ["00000.tar", "00001.tar", "00002.tar"]
    samples = manifest["samples"]
    assert {k: v for k, v in manifest["kinds"].items() if k != "ok"} == {k: 1 for k in KINDS}
    assert manifest["kinds"]["ok"] == len(samples) - len(KINDS) > 0
    # Keys: 10 per shard, the missing ones are gaps (no member at all), every shard has one.
    keys = [s["key"] for s in samples]
    assert sorted(keys + manifest["missing_keys"]) == [f"{s:05d}{i:04d}" for s in range(3) for i in range(10)]
    assert {k[:5] for k in manifest["missing_keys"]} == {"00000", "00001", "00002"}

    for shard in manifest["shards"]:
        with tarfile.open(out / shard) as tar:
            names = tar.getnames()
            data = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        mine = [s for s in samples if s["shard"] == shard]
        assert names == [m for s in mine for m in s["members"]], shard  # samples contiguous, in key order
        # The indexer counts image members (`KEY.JPG` too): the sample without an image is not one.
        images = [s for s in mine if any(m.lower().endswith(".jpg") for m in s["members"])]
        assert len(images) == len(mine) - (shard == "00000.tar")
        assert f"{out / shard}: {len(images)} samples indexed" in printed
        assert (out / (shard + ".idx")).stat().st_size > 0
        for s in mine:
            members = {pathlib.PurePath(m).suffix.lower(): data[m] for m in s["members"]}
            kind = s["kind"]
            meta = json.loads(members[".json"])
            assert meta["key"] == s["key"] and meta["url"].endswith(s["key"] + ".jpg")
            upper = [m for m in s["members"] if m != m.lower()]
            assert (kind == "upper_ext") == bool(upper), s
            if ".jpg" in members and kind != "corrupt_image":
                img = Image.open(io.BytesIO(members[".jpg"]))
                assert img.format == "JPEG" and img.size == (s["width"], s["height"]) == (meta["width"], meta["height"])
            if kind == "corrupt_image":
                assert members[".jpg"][:2] == b"\xff\xd8"
                try:
                    Image.open(io.BytesIO(members[".jpg"])).load()
                except Exception:
                    pass
                else:
                    raise AssertionError("the corrupt JPEG decoded")
            assert (".jpg" in members) == (kind != "no_image"), s
            if kind == "bad_utf8":
                try:
                    members[".txt"].decode("utf-8")
                except UnicodeDecodeError:
                    pass
                else:
                    raise AssertionError("the bad caption is UTF-8")
                assert s["caption"] is None and "caption" not in meta
            elif kind in ("no_caption", "json_caption"):
                assert ".txt" not in members
                assert meta.get("caption") == s["caption"]
                assert (s["caption"] is None) == (kind == "no_caption")
            else:
                assert members[".txt"].decode("utf-8") == s["caption"] == meta["caption"]
                assert len(s["caption"]) >= 20
