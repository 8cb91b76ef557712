"""Names are bytes: Linux allows any byte but ``/`` and NUL in a file name, and scraped datasets
hold names that are not UTF-8. torchvision's ``ImageFolder`` loads them (Python shows them as
``os.listdir`` does: UTF-8 with ``surrogateescape``); so does stoker, with the same classes, the
same sample order and the same labels, and a bad file with such a name is skipped and named
readably in the report. The datasets are made from bytes paths with ``os.mkdir``/``open``."""

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import stoker
from helpers import run_bounded

PIL = pytest.importorskip("PIL.Image")

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# (class folder, file) as bytes; every file is a solid gray PNG whose value identifies it.
FILES = [
    (b"caf\xc3\xa9", b"z.png"),           # 'café': valid UTF-8
    (b"caf\xe9", b"x\xff.png"),           # Latin-1 'café': not UTF-8
    (b"caf\xe9", b"a.png"),
    (b"caf\xe9/sub\x80", b"b.PNG"),       # a subfolder whose name is not UTF-8
    (b"caf\xe9/sub", b"c.png"),
    (b"\xff\xfe", b"\xe9.png"),
    (b"plain", b"\xc3.png"),              # a truncated sequence: '\udcc3'
    (b"plain", b"\xc3\xa9.png"),          # 'é'
    (b"plain", b"\xee\x80\x80.png"),      # U+E000, which sorts after every escaped byte
    (b"plain", b"\xf0\x90\x80\x80.png"),  # U+10000
    (b"plain", b"\xed\xa0\x80.png"),      # an encoded surrogate: not UTF-8 either
    (b"plain", b"A.png"),
]


def make_tree(root: Path) -> dict[bytes, int]:
    """Writes FILES under ``root`` through bytes paths; returns each file's gray value."""
    base = os.fsencode(root)
    values = {}
    for k, (folder, name) in enumerate(FILES):
        d = os.path.join(base, folder)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, name)
        value = 10 + 15 * k
        PIL.new("RGB", (8, 8), (value, value, value)).save(os.fsdecode(path), format="PNG")
        values[path] = value
    return values


def torchvision_samples(root: str) -> tuple[list[str], list[tuple[str, int]]]:
    """``torchvision.datasets.ImageFolder``'s classes and samples (``find_classes`` and
    ``make_dataset`` of torchvision/datasets/folder.py, line for line)."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {name: i for i, name in enumerate(classes)}
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(root, target_class)
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    instances.append((path, class_index))
    return classes, instances


def load(root: Path, **kw: Any) -> stoker.ImageLoader:
    return stoker.ImageLoader(root, len(FILES), transforms=[stoker.transforms.Resize((4, 4))], output="numpy",
                              threads=2, **kw)


def test_names_that_are_not_utf8_load_like_torchvision(tmp_path):
    root = tmp_path / "data"
    values = make_tree(root)
    classes, samples = torchvision_samples(str(root))
    loader = load(root)
    assert loader.classes == classes
    assert loader.classes == sorted(n for n in os.listdir(root) if (root / n).is_dir())
    assert "caf\udce9" in loader.classes and "\udcff\udcfe" in loader.classes
    (images, labels), = list(loader)
    assert labels.tolist() == [label for _, label in samples]
    # Each image is the file torchvision puts at that index (its gray value says which).
    assert images[:, 0, 0, 0].tolist() == [values[os.fsencode(path)] for path, _ in samples]
    assert loader.report()["skipped"] == []


def test_a_resumed_state_of_such_a_dataset(tmp_path):
    root = tmp_path / "data"
    make_tree(root)
    a = stoker.ImageLoader(root, 3, transforms=[stoker.transforms.Resize((4, 4))], output="numpy", shuffle=True)
    it = iter(a)
    next(it)
    state = json.loads(json.dumps(a.state_dict()))
    rest = [x.copy() for x, _ in it]
    b = stoker.ImageLoader(root, 3, transforms=[stoker.transforms.Resize((4, 4))], output="numpy", shuffle=True)
    b.load_state_dict(state)
    for x, want in zip((x for x, _ in b), rest, strict=True):
        np.testing.assert_array_equal(x, want)


SKIP = """
import json, sys
import stoker
loader = stoker.ImageLoader(sys.argv[1], 4, preset="imagenet-val", output="numpy", threads=2,
                            on_error=sys.argv[2])
n, error = 0, None
try:
    for images, labels in loader:
        n += len(labels)
except stoker.StokerError as e:
    error = {"type": type(e).__name__, "message": str(e)}
print(json.dumps({"images": n, "error": error, "skipped": loader.report()["skipped"], "classes": loader.classes},
                 ensure_ascii=True))
"""


def test_a_bad_file_with_such_a_name_is_skipped_and_named_readably(demo, tmp_path):
    root = tmp_path / "data"
    base = os.fsencode(root)
    good = next(iter(sorted((demo / "rocket").iterdir()))).read_bytes()
    for folder, name, data in [(b"r\xe9cup", b"good\xff.jpg", good), (b"r\xe9cup", b"bad\xff.jpg", b"not an image"),
                               (b"ok", b"fine.jpg", good)]:
        os.makedirs(os.path.join(base, folder), exist_ok=True)
        with open(os.path.join(base, folder, name), "wb") as f:
            f.write(data)
    bad = os.fsdecode(os.path.join(base, b"r\xe9cup", b"bad\xff.jpg"))
    # The text the report shows: the path with U+FFFD for each byte that is not UTF-8.
    readable = bad.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    assert readable.endswith("/r\ufffdcup/bad\ufffd.jpg")
    r = run_bounded([sys.executable, "-c", SKIP, str(root), "skip"], 120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["images"] == 2 and out["error"] is None, out
    assert [s["path"] for s in out["skipped"]] == [readable], out
    assert out["skipped"][0]["reason"], out
    assert out["classes"] == ["ok", "r\udce9cup"]
    r = run_bounded([sys.executable, "-c", SKIP, str(root), "raise"], 120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["error"]["type"] == "DecodeError" and readable in out["error"]["message"], out
