"""``stoker.PairLoader`` over image-text pair shards written by ``scripts/make-pairs.py``
(img2dataset's layout, real photos and Wikipedia captions, broken members on purpose): each
batch's images equal ``ImageLoader``'s for the same keys, its rows equal the reference
tokenizers' (``tokenizers`` with HuggingFace ``CLIPTokenizerFast`` semantics, and the port of
open_clip's ``SimpleTokenizer``), broken samples are counted skips naming their reason, and the
loader's order, resume, ranks and thread counts behave as ``ImageLoader``'s do."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import stoker
from clip_reference import SimpleTokenizer
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIP = ROOT / "tests" / "data" / "text" / "tokenizer-clip.json"
EOT = 49407


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Three shards of 12 keys (gaps, and the broken kinds in shard 0), indexed; the manifest."""
    out = tmp_path_factory.mktemp("pairs") / "pairs"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make-pairs.py"), str(out), "--shards", "3",
                    "--per-shard", "12"], check=True, capture_output=True)
    manifest = json.loads((out / "manifest.json").read_text())
    return str(out / "*.tar"), manifest


def by_kind(manifest, *kinds):
    return {s["key"]: s for s in manifest["samples"] if s["kind"] in kinds}


def pair_loader(glob, **kw):
    kw = {"tokenizer": CLIP, "preset": "imagenet-val", "dtype": "uint8", "output": "numpy", "threads": 2, **kw}
    return stoker.PairLoader(glob, 5, **kw)


def rows_of(loader):
    """Every batch as (keys, images, ids, mask), copied out of the pool."""
    return [(b["keys"], b["images"].copy(), b["input_ids"].copy(), b["attention_mask"].copy()) for b in loader]


def test_pairs_are_image_loader_pixels_and_the_reference_tokenizers_ids(pairs):
    glob, manifest = pairs
    good = by_kind(manifest, "ok", "upper_ext")
    # The same shards through ImageLoader: the pixels of every image member, by key.
    images = stoker.ImageLoader(glob, 5, preset="imagenet-val", dtype="uint8", output="numpy", threads=2)
    pixels = {}
    for b in images.batches():
        for key, img in zip(images.keys(b.indices), np.from_dlpack(b.images)):
            pixels[key] = img.copy()
    hf = Tokenizer.from_file(str(CLIP))
    hf.enable_truncation(77)
    hf.enable_padding(length=77, pad_id=EOT, pad_token="<|endoftext|>")
    seen = []
    for keys, imgs, ids, mask in rows_of(pair_loader(glob, pad_id=EOT, clean="none")):
        assert imgs.shape == (len(keys), 3, 224, 224) and ids.shape == mask.shape == (len(keys), 77)
        assert ids.dtype == mask.dtype == np.int32
        for k, key in enumerate(keys):
            assert np.array_equal(imgs[k], pixels[key]), key
            want = hf.encode(good[key]["caption"])
            assert ids[k].tolist() == want.ids and mask[k].tolist() == want.attention_mask, key
        seen += keys
    # Every good pair once, in the shards' order (no shuffle); long captions end with EOT.
    assert seen == [s["key"] for s in manifest["samples"] if s["key"] in good]
    assert len(seen) >= 18


def test_the_default_rows_are_open_clips(pairs):
    glob, manifest = pairs
    good = by_kind(manifest, "ok", "upper_ext")
    ref = SimpleTokenizer(CLIP)
    loader = pair_loader(glob)
    assert loader.context_length == 77
    n = 0
    for keys, _, ids, mask in rows_of(loader):
        for k, key in enumerate(keys):
            want, used = ref(good[key]["caption"])
            assert ids[k].tolist() == want and mask[k].tolist() == [1] * used + [0] * (77 - used), key
            n += 1
    assert n == len(good)


def test_broken_samples_are_counted_skips_with_their_reason(pairs):
    glob, manifest = pairs
    special = {s["kind"]: s["key"] for s in manifest["samples"] if s["kind"] != "ok"}
    loader = pair_loader(glob)
    keys = [k for b in loader for k in b["keys"]]
    assert special["upper_ext"] in keys  # KEY.JPG + KEY.TXT: extensions in any case
    for kind in ("no_caption", "no_image", "corrupt_image", "bad_utf8", "json_caption"):
        assert special[kind] not in keys, kind
    skipped = {pathlib.PurePath(s["path"].split(":")[-1]).stem.split(".")[0]: s["reason"]
               for s in loader.report()["skipped"]}
    assert "no caption" in skipped[special["no_caption"]] and ".txt" in skipped[special["no_caption"]]
    assert "no caption" in skipped[special["json_caption"]]
    assert "no image" in skipped[special["no_image"]]
    assert "JPEG" in skipped[special["corrupt_image"]]
    assert "not UTF-8" in skipped[special["bad_utf8"]]
    assert "caption" in [s["name"] for s in loader.report()["stages"]]
    # Strict: the first bad sample raises, naming its member.
    with pytest.raises(stoker.DecodeError, match=special["corrupt_image"] + r"\.jpg"):
        for _ in pair_loader(glob, on_error="raise"):
            pass


def test_captions_from_a_json_field(pairs):
    glob, manifest = pairs
    special = {s["kind"]: s["key"] for s in manifest["samples"] if s["kind"] != "ok"}
    by_txt = {k: i.tolist() for keys, _, ids, _ in rows_of(pair_loader(glob)) for k, i in zip(keys, ids)}
    loader = pair_loader(glob, caption="json")
    by_json = {k: i.tolist() for keys, _, ids, _ in rows_of(loader) for k, i in zip(keys, ids)}
    # The JSON's caption is the .txt's; the sample with a JSON caption alone now counts, the
    # one whose JSON has no caption does not.
    assert set(by_json) == set(by_txt) | {special["json_caption"]}
    assert all(by_json[k] == v for k, v in by_txt.items())
    reasons = " ".join(s["reason"] for s in loader.report()["skipped"])
    assert "its JSON member has no \"caption\"" in reasons
    urls = {k: i for keys, _, ids, _ in rows_of(pair_loader(glob, caption="json:url")) for k, i in zip(keys, ids)}
    assert set(urls) == set(by_json) | {special["bad_utf8"], special["no_caption"]}
    with pytest.raises(stoker.ConfigError, match="caption"):
        pair_loader(glob, caption="csv")


def test_order_resume_ranks_and_threads(pairs):
    glob, _ = pairs
    kw = {"preset": "imagenet-train", "shuffle": True, "seed": 5}

    def run(loader):
        return [(keys, imgs.tobytes(), ids.tobytes()) for keys, imgs, ids, _ in rows_of(loader)]

    whole = run(pair_loader(glob, threads=1, **kw))
    assert run(pair_loader(glob, threads=3, **kw)) == whole
    for k in (1, len(whole) - 1):
        loader = pair_loader(glob, **kw)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        again = pair_loader(glob, **kw)
        again.load_state_dict(state)
        assert run(again) == whole[k:], k
    # A state of other captions is refused.
    with pytest.raises(stoker.ConfigError):
        pair_loader(glob, context_length=32, **kw).load_state_dict(state)
    ranks = [[k for keys, *_ in rows_of(pair_loader(glob, rank=r, world_size=2, **kw)) for k in keys] for r in (0, 1)]
    # DistributedSampler's split: equal shares, padded by repeating samples from the start.
    every = sorted(k for keys, *_ in whole for k in keys)
    assert len(ranks[0]) == len(ranks[1]) == (len(every) + 1) // 2
    assert sorted(set(ranks[0]) | set(ranks[1])) == every
    assert len(set(ranks[0]) & set(ranks[1])) == len(every) % 2


def test_what_a_pair_loader_refuses(pairs, demo):
    glob, _ = pairs
    with pytest.raises(stoker.ConfigError, match="shards"):
        pair_loader(demo)
    with pytest.raises(stoker.ConfigError, match="startoftext"):
        pair_loader(glob, tokenizer=ROOT / "tests" / "data" / "text" / "tokenizer-gpt2.json")
    with pytest.raises(stoker.ConfigError, match="context_length"):
        pair_loader(glob, context_length=1)
    with pytest.raises(stoker.ConfigError, match="mixture"):
        stoker.PairLoader({"a": (glob, 1)}, tokenizer=CLIP)
    with pytest.raises(stoker.ConfigError, match="indices.*past the dataset"):
        pair_loader(glob).keys([0, 10**6])


def test_open_clip_bicubic_transforms(pairs):
    """open_clip's own image transforms: bicubic ``Resize(224)`` + ``CenterCrop(224)`` (val), the
    same pixels as ImageLoader's for each key; bicubic ``RandomResizedCrop(224, scale=(0.9, 1.0))``
    (train), the same at 1 and 3 threads, and in the fingerprint: a bilinear state is refused."""
    from stoker import transforms as T

    glob, _ = pairs
    val = [T.Resize(224, interpolation="bicubic"), T.CenterCrop(224)]
    images = stoker.ImageLoader(glob, 5, transforms=val, output="numpy", threads=2)
    pixels = {}
    for b in images.batches():
        for key, img in zip(images.keys(b.indices), np.from_dlpack(b.images)):
            pixels[key] = img.copy()
    bilinear = {}
    for keys, imgs, *_ in rows_of(pair_loader(glob, preset=None, transforms=[T.Resize(224), T.CenterCrop(224)])):
        bilinear.update(zip(keys, imgs))
    seen = 0
    for keys, imgs, *_ in rows_of(pair_loader(glob, preset=None, transforms=val)):
        for key, img in zip(keys, imgs):
            assert np.array_equal(img, pixels[key]), key
            assert not np.array_equal(img, bilinear[key]), key
            seen += 1
    assert seen >= 18
    train = [T.RandomResizedCrop(224, scale=(0.9, 1.0), interpolation="bicubic")]
    kw = {"preset": None, "transforms": train, "shuffle": True, "seed": 2}
    whole = [imgs.tobytes() for _, imgs, *_ in rows_of(pair_loader(glob, threads=1, **kw))]
    assert [imgs.tobytes() for _, imgs, *_ in rows_of(pair_loader(glob, threads=3, **kw))] == whole
    loader = pair_loader(glob, **kw)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    with pytest.raises(stoker.ConfigError):
        pair_loader(glob, preset=None, transforms=[T.RandomResizedCrop(224, scale=(0.9, 1.0))],
                    shuffle=True, seed=2).load_state_dict(state)
