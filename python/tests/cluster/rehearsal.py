"""One rank of the cluster rehearsal (python/tests/test_cluster.py), run by torchrun
(``rehearsal.py CONFIG``: the rank from torchrun's environment) or by ``mp.spawn``
(``rehearsal.py --spawn CONFIG``: 4 processes, ``init_process_group(rank=...)``, no ``RANK`` or
``WORLD_SIZE`` in the environment, so the loaders take their rank from torch.distributed).

Every rank runs the same phases, in lockstep, a training loop with a collective every step:
image shards, then JSON Lines text, from the S3 test server (an epoch, its exact resume, its
elastic resume on 2 ranks), then each kind again while the store is killed mid-epoch. Each rank
writes what it saw to ``OUT/rank<R>.json`` after every phase (the test asserts on it); an
exception is written there as ``fatal`` before the rank exits with it.
"""

import hashlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections import Counter
from datetime import timedelta

WORLD = 4
IMAGE_STEPS_SAVED = 2  # batches before the images' state is saved
TEXT_STEPS_SAVED = 3  # batches before the text's state is saved
EOS = 50256


def digest(array):
    return hashlib.sha1(array.tobytes()).hexdigest()[:16]


class Rank:
    def __init__(self, cfg):
        import torch
        import torch.distributed as dist

        self.cfg, self.torch, self.dist = cfg, torch, dist
        self.rank = dist.get_rank()
        self.out = {"rank": self.rank, "pid": os.getpid(), "launcher": os.getppid(),
                    "local_rank": os.environ.get("LOCAL_RANK")}

    # -- plumbing ---------------------------------------------------------------------------------

    def save(self):
        path = os.path.join(self.cfg["out"], f"rank{self.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.out, f)
        os.replace(path + ".tmp", path)

    def check_rank(self, loader, what):
        got = (loader.rank, loader.world_size)
        want = (self.rank, self.dist.get_world_size())
        if got != want:
            raise AssertionError(f"{what}: the loader is rank {got[0]} of {got[1]}, torch.distributed says "
                                 f"rank {want[0]} of {want[1]}")

    def everyone(self, flag):
        """The collective of every step (as DDP's gradient all-reduce): the MIN over the ranks of
        'I have a batch and no error'. Two float64s, unlike the loader's own agreement (one int32),
        so that ranks out of step fail or time out instead of quietly pairing the two."""
        t = self.torch.tensor([float(flag)] * 2, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t[0].item())

    def loop(self, it, record, save_after=None, save=None):
        """A training epoch: a batch (or the loader's end) on every rank, then the collective.
        Returns the steps taken; 'uneven' is set when this rank still had a batch after another
        had none (the counts must be equal)."""
        steps = 0
        while True:
            try:
                batch = next(it)
            except StopIteration:
                batch = None
            if not self.everyone(batch is not None):
                if batch is not None:
                    self.out.setdefault("uneven", []).append(steps)
                return steps
            record(batch)
            steps += 1
            if steps == save_after:
                save()

    # -- images -----------------------------------------------------------------------------------

    def image_loader(self, **kw):
        import stoker

        args = dict(batch_size=4, preset="imagenet-val", shuffle=True, seed=3, output="torch")
        args.update(kw)
        loader = stoker.ImageLoader("s3://data/train/*.tar", **args)
        loader.set_epoch(1)
        return loader

    def images(self):
        torch = self.torch
        loader = self.image_loader()
        self.check_rank(loader, "ImageLoader")
        main = {"len": len(loader), "indices": [], "pixels": []}
        states = {}

        def record(store):
            def f(b):
                images = torch.from_dlpack(b.images)
                store["indices"].append([int(i) for i in b.indices])
                store["pixels"].append(digest(images.numpy()))
            return f

        def save():
            states["mine"] = json.loads(json.dumps(loader.state_dict()))

        main["steps"] = self.loop(loader.batches(), record(main), IMAGE_STEPS_SAVED, save)
        main["storage"] = loader.report().get("storage")
        self.out["images"] = main
        self.save()

        # Exact resume: a new loader given this rank's state delivers exactly the remaining batches.
        again = self.image_loader()
        again.load_state_dict(states["mine"])
        resumed = {"len": len(again), "indices": [], "pixels": []}
        resumed["steps"] = self.loop(again.batches(), record(resumed))
        self.out["images_resumed"] = resumed

        # Elastic resume 4 -> 2: ranks 0 and 1 continue the epoch from every rank's state.
        everyone = [None] * WORLD
        self.dist.all_gather_object(everyone, states["mine"])
        if self.rank < 2:
            two = self.image_loader(rank=self.rank, world_size=2)
            two.load_state_dict(everyone)
            elastic = {"len": len(two), "indices": [], "pixels": []}
            for b in two.batches():
                record(elastic)(b)
            self.out["images_elastic"] = elastic
        self.dist.barrier()
        self.save()

    # -- text -------------------------------------------------------------------------------------

    def text_loader(self, data="s3://data/text/*.jsonl", **kw):
        import stoker

        args = dict(tokenizer=self.cfg["tokenizer"], seq_len=256, batch_size=4, pack="best_fit", pack_window=8,
                    shuffle=True, seed=5, output="torch")
        args.update(kw)
        loader = stoker.TokenLoader(data, **args)
        loader.set_epoch(1)
        return loader

    def text(self):
        loader = self.text_loader()
        self.check_rank(loader, "TokenLoader")
        pad = self.out["pad"] = loader.special_ids()["pad"]

        def tokens(ids):
            c = Counter(ids.reshape(-1).tolist())
            for special in {EOS, pad} - {None}:
                c.pop(special, None)
            return c

        def record(store):
            def f(b):
                ids = b["input_ids"].numpy()
                store["rows"].append(digest(ids))
                store["tokens"].update(tokens(ids))
            return f

        def done(store):
            store["tokens"] = {str(k): v for k, v in store["tokens"].items()}
            return store

        # This rank's whole stream, without agreeing with the others (even_batches=False): what
        # the run under torch.distributed must deliver a prefix of.
        ref = {"rows": [], "tokens": Counter()}
        for b in self.text_loader(even_batches=False):
            record(ref)(b)
        self.out["text_alone"] = done(ref)

        main = {"rows": [], "tokens": Counter()}
        states, before = {}, {"tokens": Counter()}

        def save():
            states["mine"] = json.loads(json.dumps(loader.state_dict()))
            before["tokens"] = Counter(main["tokens"])

        main["steps"] = self.loop(iter(loader), record(main), TEXT_STEPS_SAVED, save)
        self.out["text"] = done(main)
        self.out["text_before_save"] = done(before)
        self.save()

        again = self.text_loader()
        again.load_state_dict(states["mine"])
        resumed = {"rows": [], "tokens": Counter()}
        resumed["steps"] = self.loop(iter(again), record(resumed))
        self.out["text_resumed"] = done(resumed)

        everyone = [None] * WORLD
        self.dist.all_gather_object(everyone, states["mine"])
        if self.rank < 2:
            # World 2 inside the job of 4: the two ranks do not agree through the 4-rank group.
            two = self.text_loader(rank=self.rank, world_size=2, even_batches=False)
            two.load_state_dict(everyone)
            elastic = {"rows": [], "tokens": Counter()}
            for b in two:
                record(elastic)(b)
            self.out["text_elastic"] = done(elastic)
        self.dist.barrier()
        self.save()

    # -- the store killed mid-epoch ---------------------------------------------------------------

    def killed(self, name, loader, it, server):
        """Takes a batch on every rank, kills ``server`` (rank 0), then trains on as a careful
        trainer does: the collective every step says whether every rank still has a batch and no
        error; once one has not, a rank still holding batches leaves the collectives and drains its
        own loader until its own error. Records the error and its delay after the kill."""
        import stoker

        result = self.out[name] = {"before_kill": 0, "after_kill": 0, "drained": 0, "error": None}
        killed_at = None

        def failed(e):
            # Written at once: should this rank then wait in a collective, the test still sees it.
            result["error"] = {"type": type(e).__name__, "message": str(e),
                               "dataset": isinstance(e, stoker.DatasetError)}
            if killed_at is not None:
                result["seconds_after_kill"] = time.monotonic() - killed_at
            self.save()

        while True:
            batch = None
            try:
                batch = next(it)
            except StopIteration:
                pass
            except Exception as e:  # noqa: BLE001 - recorded and asserted on by the test
                failed(e)
            if not self.everyone(batch is not None):
                break
            if killed_at is None:
                result["before_kill"] += 1
                self.dist.barrier()  # every rank has its first batch of the epoch
                if self.rank == 0:
                    os.kill(server["pid"], signal.SIGKILL)
                    wait_refused(server["port"])
                self.dist.barrier()
                killed_at = time.monotonic()
            else:
                result["after_kill"] += 1
        while batch is not None and result["error"] is None:
            # Another rank stopped: no more collectives; this rank's own loader must end too.
            try:
                batch = next(it)
                result["drained"] += 1
            except StopIteration:
                batch = None
            except Exception as e:  # noqa: BLE001
                failed(e)
        if result["error"] is None and killed_at is not None:
            result["seconds_after_kill"] = time.monotonic() - killed_at
        del it, loader
        self.save()
        self.dist.barrier()  # nobody is left behind in a collective

    def kill_images(self):
        os.environ["STOKER_OBJECT_TIMEOUT"] = "2"
        # Two images a batch, one batch prefetched, at most 512 KiB of parts (about two of this
        # rank's 4-5 parts of 256 KiB shards) fetched ahead (a quarter of memory_limit): most of
        # this rank's 24 samples are still to be read when the store dies. The default failure
        # policy: a store that stops answering ends the pass with its error (samples are not
        # skipped one by one).
        loader = self.image_loader(batch_size=2, prefetch=1, threads=1, dtype="uint8", memory_limit="2MiB")
        self.killed("images_killed", loader, loader.batches(), self.cfg["main"])

    def kill_text(self):
        os.environ["STOKER_OBJECT_TIMEOUT"] = "2"
        os.environ["AWS_ENDPOINT"] = self.cfg["spare"]["endpoint"]
        # A bucket on a server of its own. The reader runs ~750 documents ahead of the consumer
        # (its credits), about half of this rank's 1,500: files of it are still to be opened.
        loader = self.text_loader("s3://spare/*.jsonl", threads=1)
        self.killed("text_killed", loader, iter(loader), self.cfg["spare"])


def wait_refused(port, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"the server on port {port} still answers after SIGKILL")


def run(cfg):
    import torch.distributed as dist

    r = Rank(cfg)
    start = time.monotonic()
    try:
        for phase in (r.images, r.text, r.kill_images, r.kill_text):
            phase()
            r.out.setdefault("seconds", {})[phase.__name__] = round(time.monotonic() - start, 2)
            r.save()
    except BaseException:
        r.out["fatal"] = traceback.format_exc()[-4000:]
        r.save()
        raise
    dist.destroy_process_group()


def torchrun_main(cfg):
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    run(cfg)


def spawned(rank, cfg):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    run(cfg)


if __name__ == "__main__":
    if sys.argv[1] == "--spawn":
        import torch.multiprocessing as mp

        with open(sys.argv[2]) as f:
            config = json.load(f)
        mp.spawn(spawned, args=(config,), nprocs=WORLD, join=True)
    else:
        with open(sys.argv[1]) as f:
            torchrun_main(json.load(f))
