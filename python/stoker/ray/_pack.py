"""`stoker.ray.pack`: the shards of `stoker pack`, made by Ray tasks, byte for byte.

Three steps, the engine's rules in each (`_stoker.PackJob`):

1. **prepare** (one task per group of ``files_per_task`` files, in the order `stoker pack`
   writes them): each sample read and prepared (``max_side``, ``random_access``) into a staging
   file ``DST/.stoker-ray/stage-NNNNNN.bin``, written whole or not at all;
2. **plan** (the driver): keys and shard boundaries by the pack's one rule
   (`stoker::pack::Planner`), from the prepared sizes; saved in ``DST/.stoker-ray/plan.json``;
3. **write** (one task per shard): the shard and its index from the staged bytes, put in place
   as `stoker pack` does (index first; renamed into place, or uploaded as a whole object).

The destination is a folder every node sees (a shared file system) or a prefix in object storage
(``s3://BUCKET/PREFIX``, ``gs://...``, ``az://...``; every worker needs the store's credentials
and endpoint in its environment). In object storage the staging files are objects under
``PREFIX/.stoker-ray/`` too (so the prepared bytes cross the network twice, and are deleted at
the end), and a task killed mid-upload leaves no object: an object appears only when whole.

A task killed and retried by Ray writes the same file again under the same name, so no shard is
missing or twice. A rerun with the same input and options reads the plan, keeps every shard that
is there whole (its index read and checked against the shard's size, the plan's keys, and the
shard's first and last tar headers), and prepares and writes only the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from .. import _stoker
from ..errors import StokerError
from ._cluster import KILL_ONCE_VAR, connect, wait_all

#: The folder of staging files and the plan, inside the destination.
WORK_DIR = ".stoker-ray"
_PLAN_VERSION = 1

# One PackJob per worker process and job (the source is opened once, not per task).
_JOBS: dict[str, Any] = {}


def _job(src: str, dst: str, options: dict[str, Any]) -> Any:
    key = json.dumps([src, dst, options], sort_keys=True)
    job = _JOBS.get(key)
    if job is None:
        job = _JOBS[key] = _stoker.PackJob(src, dst, **options)
    return job


def _staging(group: int) -> str:
    """The name of group ``group``'s staging file in the destination."""
    return f"{WORK_DIR}/stage-{group:06d}.bin"


def _kill_once(stage: str, job: Any, name: str) -> None:
    """The tests' fault (``STOKER_RAY_TEST_KILL_ONCE``, while its folder holds ``armed``): once
    per stage, leave half a file where the task writes ``name`` (in a folder: object storage
    shows nothing of an upload that did not finish), then SIGKILL this worker process."""
    folder = os.environ.get(KILL_ONCE_VAR)
    if not folder or not os.path.exists(os.path.join(folder, "armed")):
        return
    try:
        fd = os.open(os.path.join(folder, stage), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    if not job.remote:
        target = Path(job.dst) / name
        partial = target.with_name(f".{target.name}.stoker-partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(b"half a file, left by a killed task")
    os.kill(os.getpid(), signal.SIGKILL)


def _prepare_task(src: str, dst: str, options: dict[str, Any], group: int, indices: list[int]) -> list[Any]:
    job = _job(src, dst, options)
    _kill_once("prepare", job, _staging(group))
    return list(job.prepare(indices, _staging(group)))


def _write_task(src: str, dst: str, options: dict[str, Any], number: int, samples: list[Any]) -> tuple[str, int]:
    job = _job(src, dst, options)
    _kill_once("write", job, f"{job.prefix}-{number:06d}.tar")
    path, size = job.write_shard(number, [(i, k, e, _staging(g), o, n) for i, k, e, g, o, n in samples])
    return path, size


def _fingerprint(src: str, options: dict[str, Any], job: Any) -> str:
    h = hashlib.sha256(json.dumps([os.path.abspath(src), options, len(job)], sort_keys=True).encode())
    for i in range(len(job)):
        h.update(job.describe(i).encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, random_access: bool = False,
         max_side: int | None = None, shard_size: int | str = "256MiB", quality: int = 90, prefix: str = "shard",
         shuffle: bool = False, seed: int = 0, overwrite: bool = False, files_per_task: int = 256,
         address: str | None = None, task_timeout: float = 3600.0, progress: bool = True) -> dict[str, Any]:
    """Packs ``src`` (an ImageFolder, or shards to re-pack) into ``dst`` (a folder every node sees,
    or a prefix in object storage: ``s3://BUCKET/PREFIX``, ``gs://...``, ``az://...``) as
    ``stoker pack`` does (the same shards, names, indexes and ``classes.json``, byte for byte), on
    the Ray cluster at ``address`` (``None``: the one this process joined, else ``ray.init()``'s; ``"auto"``,
    ``"local"``, ``HOST:PORT``, ``ray://HOST:PORT``). Options are ``stoker pack``'s, checked by
    its rules. ``files_per_task`` files are prepared per task; a task (or a wait for the next
    one to finish) longer than ``task_timeout`` seconds is an error naming it.

    Returns the summary: ``files``, ``samples``, ``shards`` (paths), ``bytes``, ``reencoded``,
    ``skipped`` (``{index, path, reason}``, as ``stoker pack`` lists them), ``random_access``
    (with it), ``written`` and ``kept`` (shards written now, shards already there whole),
    ``removed`` and ``seconds``.
    """
    t0 = time.monotonic()
    src, dst = os.fspath(src), os.fspath(dst)
    if not isinstance(files_per_task, int) or isinstance(files_per_task, bool) or files_per_task < 1:
        raise _stoker_config("files_per_task", f"expected a positive integer, got {files_per_task!r}")
    options: dict[str, Any] = {"random_access": random_access, "max_side": max_side, "shard_size": shard_size,
                               "quality": quality, "prefix": prefix, "shuffle": shuffle, "seed": seed, "threads": 1}
    job = _job(src, dst, options)  # checks the options and the destination, opens the source
    dst = str(job.dst)  # a folder made absolute (the tasks run elsewhere), or the prefix's URL
    _JOBS[json.dumps([src, dst, options], sort_keys=True)] = job
    ray = connect(address)
    plan_name = f"{WORK_DIR}/plan.json"
    fingerprint = _fingerprint(src, options, job)
    plan: dict[str, Any] | None = None
    raw = job.read(plan_name)
    if raw is not None:
        try:
            saved = json.loads(raw)
        except ValueError:
            saved = None
        if isinstance(saved, dict) and (saved.get("version"), saved.get("fingerprint")) == (_PLAN_VERSION, fingerprint):
            plan = saved
    removed: list[str] = []
    if plan is None:
        removed = job.start(overwrite)
        plan = _make_plan(ray, job, src, dst, options, files_per_task, task_timeout, progress, fingerprint)
        job.write(plan_name, json.dumps(plan).encode())
    job.write_classes()  # not rewritten when it holds these bytes already
    shards = plan["shards"]
    todo = [k for k, s in enumerate(shards) if job.verify(k, [x[1] for x in s]) is None]
    groups = sorted({x[3] for k in todo for x in shards[k]})
    missing = [g for g in groups if not job.exists(_staging(g))]
    if missing:
        # A rerun whose staging files are gone: prepare again what the missing shards need
        # (the same bytes at the same offsets: preparing is deterministic).
        order, files_per_task = job.order(), plan["files_per_task"]
        prep = ray.remote(num_cpus=1, max_retries=3)(_prepare_task)
        refs = [prep.remote(src, dst, options, g, order[g * files_per_task:(g + 1) * files_per_task])
                for g in missing]
        wait_all(ray, refs, lambda i: f"preparing files {missing[i] * files_per_task}..", task_timeout,
                 "preparing", progress)
    write = ray.remote(num_cpus=1, max_retries=3)(_write_task)
    refs = [write.remote(src, dst, options, k, shards[k]) for k in todo]
    wait_all(ray, refs, lambda i: f"shard {todo[i]}", task_timeout, "writing shards", progress)
    sizes = [job.verify(k, [x[1] for x in s]) for k, s in enumerate(shards)]
    for k, size in enumerate(sizes):
        if size is None:
            raise StokerError(f"{dst}: shard {k} is not whole after it was written")
    _clean(job, -(-plan["summary"]["files"] // plan["files_per_task"]), prefix)
    summary = dict(plan["summary"])
    summary["shards"] = [os.path.join(dst, f"{prefix}-{k:06d}.tar") for k in range(len(shards))]
    summary["bytes"] = sum(s for s in sizes if s is not None)
    summary.update(written=len(todo), kept=len(shards) - len(todo), removed=removed,
                   seconds=round(time.monotonic() - t0, 3))
    return summary


def _stoker_config(arg: str, msg: str) -> Exception:
    from ..errors import ConfigError

    return ConfigError(f"invalid argument `{arg}`: {msg}")


def _make_plan(ray: Any, job: Any, src: str, dst: str, options: dict[str, Any], files_per_task: int,
               task_timeout: float, progress: bool, fingerprint: str) -> dict[str, Any]:
    """Prepares every group on the cluster, then places the samples by the pack's rule."""
    order = job.order()
    groups = [order[i:i + files_per_task] for i in range(0, len(order), files_per_task)]
    prep = ray.remote(num_cpus=1, max_retries=3)(_prepare_task)
    refs = [prep.remote(src, dst, options, g, ids) for g, ids in enumerate(groups)]
    staged = wait_all(ray, refs, lambda i: f"preparing files {i * files_per_task}..", task_timeout, "preparing",
                      progress)
    kept: list[tuple[int, str, int, int, int]] = []  # (index, ext, group, offset, length)
    skipped: list[dict[str, Any]] = []
    reencoded = 0
    ra: dict[str, Any] = {"recoded": 0, "bytes_before": 0, "bytes_after": 0, "kept": 0, "kept_reasons": [],
                          "intervals": {}}
    for g, results in enumerate(staged):
        for index, ext, offset, length, re, interval, before, kept_reason, skip_reason in results:
            if skip_reason is not None:
                skipped.append({"index": index, "path": job.describe(index), "reason": skip_reason})
                continue
            kept.append((index, ext, g, offset, length))
            reencoded += bool(re)
            if interval is not None:
                ra["recoded"] += 1
                ra["bytes_before"] += before
                ra["bytes_after"] += length
                ra["intervals"][str(interval)] = ra["intervals"].get(str(interval), 0) + 1
            elif kept_reason is not None:
                ra["kept"] += 1
                if len(ra["kept_reasons"]) < 20:
                    ra["kept_reasons"].append(kept_reason)
    placed = job.plan([(i, e, n) for i, e, _, _, n in kept])
    shards: list[list[Any]] = []
    for (index, ext, g, offset, length), (shard, key) in zip(kept, placed):
        if shard == len(shards):
            shards.append([])
        shards[shard].append([index, key, ext, g, offset, length])
    summary: dict[str, Any] = {"files": len(order), "samples": len(kept), "reencoded": reencoded, "skipped": skipped}
    if options["random_access"]:
        ra["intervals"] = dict(sorted(ra["intervals"].items(), key=lambda kv: int(kv[0])))
        summary["random_access"] = ra
    return {"version": _PLAN_VERSION, "fingerprint": fingerprint, "files_per_task": files_per_task,
            "shards": shards, "summary": summary}


def _clean(job: Any, groups: int, prefix: str) -> None:
    """Removes the ``groups`` staging files and, in a folder, the half-written files of killed
    tasks (the plan stays, so a rerun can skip what is there)."""
    for g in range(groups):
        job.remove(_staging(g))
    if not job.remote:
        dst = Path(job.dst)
        for p in (dst / WORK_DIR).glob(".*.stoker-partial"):
            p.unlink(missing_ok=True)
        for p in dst.glob(f".{prefix}-*.stoker-partial"):
            p.unlink(missing_ok=True)
