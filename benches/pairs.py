#!/usr/bin/env python3
"""Image-text pairs per CPU-second: ``stoker.PairLoader`` against open_clip's WebDataset pipeline,
same shards, same outputs, steady state, interleaved runs.

Both read the img2dataset-style shards that ``scripts/make-pairs.py`` writes (``KEY.jpg``,
``KEY.txt``, ``KEY.json``; the broken samples of shard 0 are skipped by both) and deliver, per
batch of ``--batch-size`` pairs, CLIP's training input: images cropped by
``RandomResizedCrop(224, scale=(0.9, 1.0))`` with bicubic resampling, as float32 NCHW normalized
with OpenAI CLIP's mean and std, and captions as CLIP token ids (``tests/data/text/tokenizer-clip.json``,
77 tokens: start, text, end, padded with the end token 49407):

- ``reference``: what open_clip 3.3.0's ``get_wds_dataset`` builds for training with
  ``--dataset-resampled`` (``src/open_clip_train/data.py``): ``ResampledShards`` →
  ``tarfile_to_samples`` → ``shuffle(5000, initial=1000)`` → ``select`` (has a txt and an image) →
  ``decode("pilrgb")`` → ``rename(image="jpg;png;jpeg;webp", text="txt")`` →
  ``map_dict(image=preprocess, text=tokenize)`` → ``to_tuple("image", "text")`` → ``batched``, read by
  ``WebLoader(batch_size=None, num_workers=--workers, persistent_workers=True)``; errors go to a handler
  that warns and continues. ``preprocess`` is open_clip's train transform (``image_transform`` with
  its default ``AugmentationCfg``): torchvision's ``RandomResizedCrop(224, scale=(0.9, 1.0),
  interpolation=BICUBIC)`` on the PIL image, RGB, ``ToTensor()``, ``Normalize(OPENAI_DATASET_MEAN,
  OPENAI_DATASET_STD)``. ``tokenize`` is open_clip's ``HFTokenizer`` for one caption, as ``TokenizeText``
  calls it in the worker: ``transformers``' ``CLIPTokenizerFast`` (built from the same tokenizer.json)
  with ``max_length=77, padding="max_length", truncation=True, return_tensors="pt"``, ``input_ids[0]``
  kept (open_clip drops the attention mask; the tokenizer computes it anyway). The ``HFTokenizer``'s
  default caption cleaning (``ftfy.fix_text``, ``html.unescape`` twice, whitespace collapsed) runs only
  with ``--clean open_clip`` (stoker's ``clean="open_clip"`` then: the same but ftfy); the default
  ``--clean none`` leaves it out on both sides, so the reference does less than open_clip does.
  ``TOKENIZERS_PARALLELISM=false``, as open_clip's tokenizer module sets.
- ``stoker``: ``stoker.PairLoader(shards, batch_size, tokenizer, context_length=77, pad_id=49407,
  clean=--clean, caption="txt", transforms=[RandomResizedCrop(224, scale=(0.9, 1.0),
  interpolation="bicubic"), ToTensor(), Normalize(mean, std)], shuffle=True, drop_last=True,
  threads=--threads, device="cpu", output="torch")``, epoch after epoch (``set_epoch``); where the
  installed stoker's ``RandomResizedCrop`` has no ``interpolation`` it resamples bilinearly (the
  results say which: ``stoker_interpolation``). Batches are dicts: ``images``
  float32 [B, 3, 224, 224], ``input_ids`` and ``attention_mask`` int32 [B, 77], ``keys``. The shards
  are indexed first (``stoker index``, not timed) where an index is missing, or always with
  ``--reindex``.

Each run is a process of its own. It builds its loader, iterates, and measures the CPU time of its
whole process tree (its own ``RUSAGE_SELF``, in which every stoker thread is, plus ``utime + stime``
from ``/proc/<pid>/stat`` of every live descendant: the DataLoader's workers) and the wall time
between batch ``--skip`` and batch ``--skip + --measure``: steady state, after the start-up (imports,
the workers' forks, the shuffle buffer's first 1,000 samples per worker, stoker's first reads) and
with the data repeating (the reference resamples shards for ever, stoker runs epoch after epoch), so
no loader's read-ahead (the DataLoader's ``prefetch_factor`` 2 batches per worker, stoker's queues)
covers the measured batches: its queues are full at both ends of the window and the work done in
the window is the work for as many batches. (The reference's shuffle buffer still grows from 1,000
to 5,000 raw samples per worker during the window, one extra tar member group read per sample: a
few percent of its work at most.) The consumer only touches each batch (one element of each tensor).
Each run also records what the rest of the machine used meanwhile (``others_cpu_s``: busy time in
``/proc/stat`` less the run's own): contention costs CPU time per pair too (shared caches), so a run
during which others used more than ``--busy`` (10%) of its CPU time is redone, after ``--busy-wait``
seconds, up to ``--retries`` times (the discarded runs are kept in the JSON).

Runs alternate (reference stoker reference stoker ...); ``--rounds`` of them. Reported: medians of
pairs per CPU-second, pairs per wall second and the CPU split (main process, workers), and the median
of the ratios stoker / reference paired per round. The issue's target is 4x in pairs per CPU-second.

``--check`` (no timing): one pass over the shards with each pipeline, in order, no shuffling, no
workers: both must deliver the same keys (the good samples of the manifest), and stoker's
``input_ids`` and ``attention_mask`` must equal ``transformers``' for every key.

Data (``/work/bench-data/pairs``: 8 shards, 2,688 samples, longer side 256..512 px)::

    python scripts/make-pairs.py /work/bench-data/pairs --shards 8 --per-shard 400 \\
        --photos /work/shared/photos --min-side 256 --max-side 512 --no-index

Dependencies, in one environment with stoker installed (``pip install .``)::

    python -m pip install torch torchvision webdataset transformers pillow zstandard numpy ftfy

Command for BENCHMARKS.md::

    python benches/pairs.py --check && python benches/pairs.py --rounds 5 --out benches/results/pairs.json

The reference alone (``--only reference``) needs no stoker.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path("/work/bench-data/pairs")
TOKENIZER = ROOT / "tests" / "data" / "text" / "tokenizer-clip.json"
KINDS = ("reference", "stoker")
#: open_clip's ``OPENAI_DATASET_MEAN`` / ``OPENAI_DATASET_STD`` (src/open_clip/constants.py).
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
#: open_clip's ``_SAMPLE_SHUFFLE_SIZE`` / ``_SAMPLE_SHUFFLE_INITIAL`` (src/open_clip_train/data.py).
SHUFFLE_SIZE, SHUFFLE_INITIAL = 5000, 1000
PAD_ID = 49407
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- CPU time of a process tree

def descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (``/proc/<pid>/task/*/children``, recursively)."""
    out, stack = [], [pid]
    while stack:
        q = stack.pop()
        for f in glob.glob(f"/proc/{q}/task/*/children"):
            try:
                with open(f) as fh:
                    kids = [int(x) for x in fh.read().split()]
            except OSError:
                continue
            out.extend(kids)
            stack.extend(kids)
    return out


def proc_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` in seconds (0 where it has gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICK  # fields 14-17 of proc(5), after "pid (comm)"


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(v) - v[3] - v[4]) / TICK


def tree_cpu() -> tuple[float, float, int]:
    """``(this process's CPU seconds, its descendants' CPU seconds, number of descendants)``."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    kids = descendants(os.getpid())
    return r.ru_utime + r.ru_stime, sum(proc_cpu(p) for p in kids), len(kids)


# ---------------------------------------------------------------- the two pipelines

def shards(a: argparse.Namespace) -> list[str]:
    urls = sorted(glob.glob(str(Path(a.data) / "*.tar")))
    if not urls:
        raise SystemExit(f"{a.data}: no .tar shards (make them with scripts/make-pairs.py, see --help)")
    return urls


def clean_fn(kind: str):
    """open_clip's caption cleaning before the HF tokenizer (``get_clean_fn``), or none."""
    if kind == "none":
        return lambda text: text
    import html

    import ftfy

    def whitespace(text: str) -> str:  # _clean_whitespace: whitespace_clean(basic_clean(text))
        text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
        return " ".join(text.split()).strip()

    return whitespace


def hf_tokenizer(a: argparse.Namespace):
    from transformers import CLIPTokenizerFast

    tok = CLIPTokenizerFast(tokenizer_file=str(a.tokenizer))
    tok.padding_side = "right"  # as HFTokenizer forces
    assert tok.pad_token_id == PAD_ID, tok.pad_token_id
    return tok


def reference_loader(a: argparse.Namespace, check: bool = False):
    """open_clip's training pipeline (see the docstring); ``check``: one pass in shard order, no
    shuffle, no workers, with each sample's key and caption."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torchvision.transforms as T
    import webdataset as wds

    tok, clean = hf_tokenizer(a), clean_fn(a.clean)

    def tokenize(text):  # open_clip's TokenizeText -> HFTokenizer.__call__(text)[0]
        return tok([clean(text)], max_length=a.context_length, padding="max_length", truncation=True,
                   return_tensors="pt").input_ids[0]

    def maybe_rgb(img):  # open_clip's MaybeConvertMode
        return img if img.mode == "RGB" else img.convert("RGB")

    def has_caption_and_image(sample):  # open_clip's filter_no_caption_or_no_image
        return "txt" in sample and any(k in sample for k in ("png", "jpg", "jpeg", "webp"))

    preprocess = T.Compose([
        T.RandomResizedCrop(224, scale=(0.9, 1.0), interpolation=getattr(T.InterpolationMode,
                                                                          a.reference_interpolation.upper())),
        maybe_rgb,
        T.ToTensor(),
        T.Normalize(mean=MEAN, std=STD),
    ])
    urls, handler = shards(a), wds.warn_and_continue
    if check:
        stages = [wds.SimpleShardList(urls), wds.tarfile_to_samples(handler=handler)]
    else:
        stages = [wds.ResampledShards(urls), wds.tarfile_to_samples(handler=handler),
                  wds.shuffle(bufsize=a.shuffle_buffer, initial=a.shuffle_initial)]
    stages += [
        wds.select(has_caption_and_image),
        wds.decode("pilrgb", handler=handler),
        wds.rename(image="jpg;png;jpeg;webp", text="txt"),
    ]
    if check:
        stages += [wds.map_dict(image=preprocess, text=lambda t: (tokenize(t), t)),
                   wds.to_tuple("__key__", "image", "text")]
        return wds.DataPipeline(*stages)
    stages += [
        wds.map_dict(image=preprocess, text=tokenize),
        wds.to_tuple("image", "text"),
        wds.batched(a.batch_size, partial=False),
    ]
    return wds.WebLoader(wds.DataPipeline(*stages), batch_size=None, shuffle=False, num_workers=a.workers,
                         persistent_workers=a.workers > 0)


def stoker_interpolation() -> str:
    """``bicubic`` where this stoker's ``RandomResizedCrop`` takes ``interpolation``, else its only
    one, ``bilinear`` (the reference stays bicubic: recorded in the results)."""
    import inspect

    from stoker import transforms as T

    return "bicubic" if "interpolation" in inspect.signature(T.RandomResizedCrop).parameters else "bilinear"


def stoker_loader(a: argparse.Namespace, shuffle: bool = True):
    import stoker
    from stoker import transforms as T

    threads = a.threads if a.threads == "auto" else int(a.threads)
    interpolation = {"interpolation": "bicubic"} if stoker_interpolation() == "bicubic" else {}
    return stoker.PairLoader(
        shards(a), batch_size=a.batch_size, tokenizer=str(a.tokenizer), context_length=a.context_length,
        pad_id=PAD_ID, clean=a.clean, caption="txt",
        transforms=[T.RandomResizedCrop(224, scale=(0.9, 1.0), **interpolation), T.ToTensor(),
                    T.Normalize(MEAN, STD)],
        shuffle=shuffle, seed=a.seed, drop_last=shuffle, threads=threads, device="cpu", output="torch",
        dct_scaling=a.stoker_dct_scaling == "on")


def reference_batches(a: argparse.Namespace):
    for images, ids in reference_loader(a):  # resampled: never ends
        yield images, ids


def stoker_batches(a: argparse.Namespace):
    loader = stoker_loader(a)
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for b in loader:
            yield b["images"], b["input_ids"]
        epoch += 1


# ---------------------------------------------------------------- one run (child process)

def child(kind: str, a: argparse.Namespace) -> None:
    t_start = time.perf_counter()
    batches = reference_batches(a) if kind == "reference" else stoker_batches(a)
    pairs = touched = 0
    first = None
    for k, (images, ids) in enumerate(batches):
        if k == 0:
            first = time.perf_counter() - t_start
        touched += float(images[0, 0, 0, 0]) != 0.0 or int(ids[0, 0]) != 0  # the consumer's only work
        if k == a.skip:
            (s0, d0, _), w0, m0 = tree_cpu(), time.perf_counter(), machine_busy()
        elif k > a.skip:
            pairs += images.shape[0]
            if k == a.skip + a.measure:
                (s1, d1, n), w1, m1 = tree_cpu(), time.perf_counter(), machine_busy()
                shape = [list(images.shape), str(images.dtype), list(ids.shape), str(ids.dtype)]
                break
    main_s, workers_s, wall = s1 - s0, d1 - d0, w1 - w0
    print(json.dumps({"kind": kind, "pairs": pairs, "wall_s": wall, "cpu_s": main_s + workers_s,
                      "cpu_main_s": main_s, "cpu_workers_s": workers_s, "processes": 1 + n,
                      "pairs_per_cpu_s": pairs / (main_s + workers_s), "pairs_per_wall_s": pairs / wall,
                      "first_batch_s": first, "batch": shape, "loadavg": os.getloadavg()[0],
                      "others_cpu_s": m1 - m0 - main_s - workers_s}), flush=True)
    sys.stderr.flush()
    os._exit(0)  # the workers die with us; no teardown to wait for


# ---------------------------------------------------------------- --check

def check(a: argparse.Namespace) -> dict:
    """Both pipelines, one pass each in order: the same keys, and stoker's ids equal transformers'."""
    manifest = json.loads((Path(a.data) / "manifest.json").read_text())
    good = {s["key"] for s in manifest["samples"] if s["kind"] in ("ok", "upper_ext")}
    tok, clean = hf_tokenizer(a), clean_fn(a.clean)
    ref = {}
    for key, image, (ids, caption) in reference_loader(a, check=True):
        assert tuple(image.shape) == (3, 224, 224), image.shape
        enc = tok(clean(caption), max_length=a.context_length, padding="max_length", truncation=True)
        assert enc["input_ids"] == ids.tolist()
        ref[key] = (enc["input_ids"], enc["attention_mask"])
    out = {"manifest_good": len(good), "reference_pairs": len(ref), "reference_keys_match": set(ref) == good}
    try:
        loader = stoker_loader(a, shuffle=False)
    except (ImportError, AttributeError) as e:
        out["stoker"] = f"not run: {e!r}"
        return out
    keys, bad, shape = [], [], None
    for b in loader:
        shape = [list(b["images"].shape), str(b["images"].dtype), list(b["input_ids"].shape),
                 str(b["input_ids"].dtype)]
        for i, key in enumerate(b["keys"]):
            keys.append(key)
            want = ref.get(key)
            got = (b["input_ids"][i].tolist(), b["attention_mask"][i].tolist())
            if want is None or got != (list(want[0]), list(want[1])):
                bad.append({"key": key, "stoker": [str(x) for x in got],
                            "transformers": want and [str(list(x)) for x in want]})
    out.update({"stoker_pairs": len(keys), "stoker_keys_match": set(keys) == good and len(keys) == len(set(keys)),
                "stoker_batch": shape, "ids_mismatches": len(bad), "first_mismatch": bad[0] if bad else None})
    return out


# ---------------------------------------------------------------- parent

def machine() -> dict:
    from importlib import metadata

    model = None
    with open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    versions = {}
    for pkg in ["stoker", "torch", "torchvision", "webdataset", "transformers", "tokenizers", "pillow", "numpy"]:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu_model": model,
            "platform": platform.platform(), "python": platform.python_version(), "versions": versions,
            "loadavg_at_start": os.getloadavg()}


def data_summary(a: argparse.Namespace) -> dict:
    manifest = json.loads((Path(a.data) / "manifest.json").read_text())
    sides = sorted(max(s["width"], s["height"]) for s in manifest["samples"] if s["width"])
    q = statistics.quantiles(sides, n=4)
    return {"path": str(a.data), "shards": len(manifest["shards"]), "samples": len(manifest["samples"]),
            "kinds": manifest["kinds"], "bytes": sum(os.path.getsize(u) for u in shards(a)),
            "longer_side_px": {"min": sides[0], "q1": q[0], "median": q[1], "q3": q[2], "max": sides[-1]}}


def index(a: argparse.Namespace) -> None:
    """``stoker index`` on the shards that have no index yet (all with --reindex); not timed."""
    import importlib.util

    if importlib.util.find_spec("stoker") is None:
        print("stoker is not installed: no index, no stoker runs", file=sys.stderr)
        return
    todo = [u for u in shards(a) if a.reindex or not Path(u + ".idx").exists()]
    if todo:
        subprocess.run([sys.executable, "-m", "stoker.cli", "index", *todo], check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA, help="folder of .tar shards and manifest.json")
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER)
    p.add_argument("--context-length", type=int, default=77)
    p.add_argument("--clean", choices=["none", "open_clip"], default="none",
                   help="caption cleaning before tokenizing (open_clip: HFTokenizer's default, 'whitespace')")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2, help="the reference's DataLoader workers")
    p.add_argument("--threads", default="auto", help="stoker's threads (a number or auto)")
    p.add_argument("--shuffle-buffer", type=int, default=SHUFFLE_SIZE)
    p.add_argument("--shuffle-initial", type=int, default=SHUFFLE_INITIAL)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", type=int, default=10, help="batches before the measured window")
    p.add_argument("--measure", type=int, default=100, help="batches measured")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--busy", type=float, default=0.1,
                   help="a run during which other processes used more than this fraction of its CPU time is redone")
    p.add_argument("--retries", type=int, default=3, help="redone runs at most, per run (the last one is kept)")
    p.add_argument("--busy-wait", type=float, default=30.0, help="seconds to wait before redoing a run")
    p.add_argument("--only", choices=KINDS)
    p.add_argument("--reference-interpolation", choices=["bicubic", "bilinear"], default="bicubic",
                   help="the reference crop's resampling: open_clip's bicubic, or bilinear as stoker's")
    p.add_argument("--stoker-dct-scaling", choices=["on", "off"], default="on",
                   help="stoker's DCT-scaled JPEG decode (on by default; off decodes every image whole)")
    p.add_argument("--check", action="store_true", help="compare the pipelines' outputs (no timing)")
    p.add_argument("--reindex", action="store_true", help="run `stoker index` even where an index exists")
    p.add_argument("--out", type=Path, help="JSON results (e.g. benches/results/pairs.json)")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child, a)
        return
    kinds = [a.only] if a.only else list(KINDS)
    if "stoker" in kinds or a.check:
        index(a)
    if a.check:
        out = check(a)
        print(json.dumps(out, indent=1))
        ok = out["reference_keys_match"] and out.get("stoker_keys_match", True) and not out.get("ids_mismatches")
        sys.exit(0 if ok else 1)
    result = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
              "data": data_summary(a), "config": {k: str(v) for k, v in vars(a).items() if k != "child"}}
    if "stoker" in kinds:
        result["config"]["stoker_interpolation"] = stoker_interpolation()
    base = [sys.executable, __file__, "--data", str(a.data), "--tokenizer", str(a.tokenizer),
            "--context-length", str(a.context_length), "--clean", a.clean, "--batch-size", str(a.batch_size),
            "--workers", str(a.workers), "--threads", str(a.threads), "--shuffle-buffer", str(a.shuffle_buffer),
            "--shuffle-initial", str(a.shuffle_initial), "--seed", str(a.seed), "--skip", str(a.skip),
            "--measure", str(a.measure), "--reference-interpolation", a.reference_interpolation,
            "--stoker-dct-scaling", a.stoker_dct_scaling]
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    discarded: list[dict] = []
    for r in range(a.rounds):
        for kind in kinds:
            for attempt in range(1 + a.retries):
                t0 = time.perf_counter()
                proc = subprocess.run(base + ["--child", kind], capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{kind} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                run["process_wall_s"] = time.perf_counter() - t0
                busy = run["busy"] = run["others_cpu_s"] > a.busy * run["cpu_s"]
                note = ("" if not busy else "  (busy machine: again)" if attempt < a.retries
                        else "  (busy machine: kept)")
                print(f"round {r} {kind:9s} {run['pairs_per_cpu_s']:7.1f} pairs/CPU-s  {run['pairs_per_wall_s']:7.1f}"
                      f" pairs/s  CPU main {run['cpu_main_s']:.2f} s + workers {run['cpu_workers_s']:.2f} s"
                      f"  wall {run['wall_s']:.2f} s ({run['process_wall_s']:.0f} s in all)"
                      f"  others {run['others_cpu_s']:.1f} CPU-s{note}",
                      flush=True)
                if not busy or attempt == a.retries:
                    break
                discarded.append(run)
                time.sleep(a.busy_wait)
            runs[kind].append(run)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("pairs_per_cpu_s", "pairs_per_wall_s", "cpu_s",
                                                                "cpu_main_s", "cpu_workers_s", "wall_s",
                                                                "first_batch_s", "others_cpu_s")}
           for k, v in runs.items()}
    result["medians"] = med
    if len(kinds) == 2:
        cpu = [s["pairs_per_cpu_s"] / r["pairs_per_cpu_s"] for r, s in zip(runs["reference"], runs["stoker"])]
        wall = [s["pairs_per_wall_s"] / r["pairs_per_wall_s"] for r, s in zip(runs["reference"], runs["stoker"])]
        result["ratio_stoker_over_reference"] = {
            "pairs_per_cpu_s": {"median": statistics.median(cpu), "all": cpu},
            "pairs_per_wall_s": {"median": statistics.median(wall), "all": wall},
            "target_pairs_per_cpu_s": 4.0, "meets_target": statistics.median(cpu) >= 4.0}
    result["machine"]["loadavg_at_end"] = os.getloadavg()
    result["runs"] = runs
    result["discarded_busy_runs"] = discarded
    print(f"\n| {'pipeline':9s} | pairs/CPU-s | pairs/s | CPU-s main | CPU-s workers | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, m in med.items():
        print(f"| {k:9s} | {m['pairs_per_cpu_s']:.1f} | {m['pairs_per_wall_s']:.1f} | {m['cpu_main_s']:.2f} |"
              f" {m['cpu_workers_s']:.2f} | {m['wall_s']:.2f} |")
    if "ratio_stoker_over_reference" in result:
        r = result["ratio_stoker_over_reference"]
        print(f"\nstoker / reference, median of paired ratios: {r['pairs_per_cpu_s']['median']:.2f}x pairs per"
              f" CPU-second (target 4x), {r['pairs_per_wall_s']['median']:.2f}x pairs per second")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
