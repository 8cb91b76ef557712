"""The cluster rehearsal (issue 34), on this machine: 4 ranks over image shards and JSON Lines
text on a local S3 server (moto's standalone server), launched (a) by two torchrun launchers as
two nodes of 2 ranks with a c10d rendezvous on 127.0.0.1 and (b) by ``mp.spawn`` with
``init_process_group(rank=...)``. Each launch trains with a collective every step and checks:
every rank the same number of batches; disjoint samples whose union is the epoch; the exact
resume of all four ranks; the elastic resume of the four ranks' states on 2 ranks; then the
store killed mid-epoch: every rank ends with a clear error within the bound and the launch exits
(no rank left waiting in a collective). The ranks run ``cluster/rehearsal.py`` and write what
they saw; the assertions are here."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from s3proxy import free_port

pytest.importorskip("torch", reason="PyTorch not installed: cluster rehearsal skipped")
boto3 = pytest.importorskip("boto3", reason="boto3/moto not installed: cluster rehearsal skipped")
pytest.importorskip("moto.server", reason="moto[server] not installed: cluster rehearsal skipped")
zstandard = pytest.importorskip("zstandard")
tokenizers = pytest.importorskip("tokenizers")

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "cluster" / "rehearsal.py"
DATA = HERE.parents[1] / "tests" / "data" / "text"
GPT2 = DATA / "tokenizer-gpt2.json"
EOS = 50256
WORLD = 4
IMAGES = 96  # the demo: 6 batches of 4 per rank
TEXT_FILES, DOCS_PER_FILE = 10, 600
#: A launch that is not done by then hangs (each rank's own collectives time out after 60 s).
LAUNCH_TIMEOUT = 180
#: The promise is about 2 x STOKER_OBJECT_TIMEOUT (2 s) after the store stops answering.
KILL_BOUND = 30


@pytest.fixture(scope="module")
def corpus(demo, tmp_path_factory):
    """Image shards of the demo, and 6,000 one-sentence documents of real Wikipedia text in 10
    JSON Lines files (many small documents: a reader runs ahead of the consumer by a number of
    documents, and a rank must still have files to read when the store dies), with the reference
    tokenizer's count of every token."""
    root = tmp_path_factory.mktemp("cluster")
    shards = root / "shards"
    subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(shards), "--shard-size", "256KiB"],
                   check=True, capture_output=True, timeout=120)
    raw = zstandard.ZstdDecompressor().stream_reader((DATA / "wiki-sample.jsonl.zst").open("rb")).read()
    texts = [json.loads(line)["text"] for line in raw.decode().splitlines() if line]
    sentences = [s for t in texts for p in t.split("\n") for s in re.split(r"(?<=[.!?])\s+", p.strip()) if len(s) > 20]
    docs = sentences[: TEXT_FILES * DOCS_PER_FILE]
    assert len(docs) == TEXT_FILES * DOCS_PER_FILE
    text = {f"part-{i:02d}.jsonl": "".join(json.dumps({"text": d}) + "\n"
                                           for d in docs[i * DOCS_PER_FILE: (i + 1) * DOCS_PER_FILE]).encode()
            for i in range(TEXT_FILES)}
    tok = tokenizers.Tokenizer.from_file(str(GPT2))
    tokens = Counter(t for e in tok.encode_batch(docs) for t in e.ids)
    return {"shards": shards, "text": text, "tokens": tokens}


class Server:
    """moto's S3 server on 127.0.0.1, a process of its own (a rank kills it)."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready(self):
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    pytest.fail("the S3 test server did not start")
                time.sleep(0.05)
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                            region_name="us-east-1")

    def config(self):
        return {"endpoint": self.endpoint, "port": self.port, "pid": self.proc.pid}

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture()
def stores(corpus):
    """Two fresh servers (the launch kills both): ``main`` with the image shards (``data/train``)
    and the text (``data/text``), ``spare`` with the text again (``spare/``), for the second kill."""
    main, spare = Server(), Server()
    try:
        client = main.ready()
        client.create_bucket(Bucket="data")
        for p in sorted(corpus["shards"].iterdir()):
            client.upload_file(str(p), "data", f"train/{p.name}")
        for name, body in corpus["text"].items():
            client.put_object(Bucket="data", Key=f"text/{name}", Body=body)
        client = spare.ready()
        client.create_bucket(Bucket="spare")
        for name, body in corpus["text"].items():
            client.put_object(Bucket="spare", Key=name, Body=body)
        yield {"main": main, "spare": spare}
    finally:
        main.stop()
        spare.stop()


def _environment(stores):
    """This process's environment without any rank of its own, with the S3 settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "STOKER_OBJECT_TIMEOUT")}
    env.update({"AWS_ENDPOINT": stores["main"].endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1", "OMP_NUM_THREADS": "1"})
    return env


def _launch(tmp_path, stores, commands):
    """Runs the launcher commands (each in a session of its own, so a hang is ended with all its
    ranks); returns the ranks' records, the exit statuses and the logs."""
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"out": str(out), "tokenizer": str(GPT2), "port": free_port(),
                                  "main": stores["main"].config(), "spare": stores["spare"].config()}))
    env = _environment(stores)
    procs, logs = [], []
    for k, cmd in enumerate(commands):
        log = tmp_path / f"launcher{k}.log"
        logs.append(log)
        with log.open("w") as f:
            procs.append(subprocess.Popen([*cmd, str(config)], env=env, stdout=f, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    ranks = {}
    for r in range(WORLD):
        path = out / f"rank{r}.json"
        ranks[r] = json.loads(path.read_text()) if path.exists() else {}
    text = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    return ranks, codes, text


def _check(ranks, codes, logs, corpus, stores):
    assert all(ranks.values()), f"ranks that wrote nothing: {[r for r, o in ranks.items() if not o]}\n{logs}"
    # The phases every rank completed are checked first, so a failure later still shows these.
    done = set.intersection(*(set(o) for o in ranks.values()))
    if "images_resumed" in done:
        _check_images(ranks, corpus)
    if "text_resumed" in done:
        _check_text(ranks, corpus)
    fatal = {r: o["fatal"] for r, o in ranks.items() if "fatal" in o}
    killed = {r: {k: o[k] for k in ("images_killed", "text_killed") if k in o} for r, o in ranks.items()}
    assert not fatal, ("a rank failed:\n" + "\n".join(f"rank {r}:\n{t}" for r, t in fatal.items())
                       + f"\nthe kill phases' records: {json.dumps(killed, indent=1)}")
    assert None not in codes, (f"the launch was still running after {LAUNCH_TIMEOUT} s\n"
                               f"the kill phases' records: {json.dumps(killed, indent=1)}\n{logs}")
    _check_killed(ranks, "images_killed", stores["main"], "s3://data/train/")
    _check_killed(ranks, "text_killed", stores["spare"], "s3://spare/")
    assert codes == [0] * len(codes), f"the launch did not exit cleanly: {codes}\n{logs}"


def _check_images(ranks, corpus):
    main = [ranks[r]["images"] for r in range(WORLD)]
    # Every rank the same number of batches (a collective every step, none uneven).
    assert [m["steps"] for m in main] == [m["len"] for m in main] == [IMAGES // WORLD // 4] * WORLD
    assert not any("uneven" in ranks[r] for r in range(WORLD))
    # Disjoint samples whose union is the epoch.
    seen = [i for m in main for b in m["indices"] for i in b]
    assert sorted(seen) == list(range(IMAGES))
    # Each rank downloads its own samples' bytes (shuffle=True over S3: runs of shards), in a few
    # requests: together no more than the shards hold, no sample read alone.
    total = sum(p.stat().st_size for p in corpus["shards"].glob("*.tar"))
    storage = [m["storage"] for m in main]
    assert sum(s["part_bytes"] for s in storage) <= total, (total, storage)
    assert all(s["direct_reads"] == 0 and s["part_requests"] <= 8 for s in storage), storage
    # Exact resume of every rank: the same samples and pixels as the rest of its epoch.
    for r in range(WORLD):
        resumed = ranks[r]["images_resumed"]
        assert resumed["len"] == main[r]["len"] and resumed["steps"] == main[r]["steps"] - 2
        assert resumed["indices"] == main[r]["indices"][2:], f"rank {r}"
        assert resumed["pixels"] == main[r]["pixels"][2:], f"rank {r}"
    # Elastic resume 4 -> 2: the 64 samples no rank had delivered, each once, 8 batches a rank.
    before = [i for m in main for b in m["indices"][:2] for i in b]
    after = [ranks[r]["images_elastic"] for r in range(2)]
    assert [a["len"] for a in after] == [len(a["indices"]) for a in after] == [8, 8]
    got = [i for a in after for b in a["indices"] for i in b]
    assert len(got) == len(set(got)) == IMAGES - len(before) == 64
    assert sorted(got + before) == list(range(IMAGES))


def _tokens(store):
    return Counter({int(k): v for k, v in store["tokens"].items()})


def _check_text(ranks, corpus):
    specials = {EOS, ranks[0]["pad"]} - {None}  # the ranks count neither (EOS ends, pads rows)
    everything = Counter({t: n for t, n in corpus["tokens"].items() if t not in specials})
    alone = [ranks[r]["text_alone"] for r in range(WORLD)]
    main = [ranks[r]["text"] for r in range(WORLD)]
    # The four ranks' streams hold every token of the epoch's documents exactly once (best-fit
    # packing drops nothing): disjoint documents whose union is the epoch.
    assert sum((_tokens(a) for a in alone), Counter()) == everything
    # Under torch.distributed every rank delivers the same number of batches, a collective every
    # step: the first rows of its own stream, as many as the shortest stream has.
    steps = min(len(a["rows"]) for a in alone)
    assert [m["steps"] for m in main] == [steps] * WORLD and steps > 10, [len(a["rows"]) for a in alone]
    for r in range(WORLD):
        assert main[r]["rows"] == alone[r]["rows"][:steps], f"rank {r}"
    # Exact resume of every rank from its state after 3 batches.
    for r in range(WORLD):
        resumed = ranks[r]["text_resumed"]
        assert resumed["rows"] == main[r]["rows"][3:], f"rank {r}"
    # Elastic resume 4 -> 2: what the 4 ranks delivered before their states and what 2 ranks
    # delivered after them are together every token of the epoch, exactly once.
    before = sum((_tokens(ranks[r]["text_before_save"]) for r in range(WORLD)), Counter())
    after = sum((_tokens(ranks[r]["text_elastic"]) for r in range(2)), Counter())
    assert before + after == everything, (sum((before + after - everything).values()),
                                          sum((everything - before - after).values()))


def _check_killed(ranks, phase, server, prefix):
    results = {r: ranks[r].get(phase) for r in range(WORLD)}
    assert all(results.values()), f"{phase}: ranks without a record: {results}"
    named = []
    for r, res in results.items():
        assert res["before_kill"] == 1, (phase, r, res)
        e = res["error"]
        assert e is not None, f"{phase}: rank {r} ended without an error after the store was killed: {res}"
        assert e["dataset"], f"{phase}: rank {r}: not a stoker.DatasetError: {e}"
        # Within the bound, counted from the kill (every rank waits at a barrier around it).
        assert res["seconds_after_kill"] < KILL_BOUND, (phase, r, res)
        names_store = server.endpoint in e["message"] or prefix in e["message"]
        named.append(names_store)
        if phase == "images_killed":
            # Each rank's own reads fail: the error names the store and the object.
            assert names_store, f"{phase}: rank {r}: {e}"
        else:
            # A rank whose own reads failed names the store; the others may instead be told
            # that another rank's loader failed (the loaders agree on every step).
            assert names_store or "another rank" in e["message"], f"{phase}: rank {r}: {e}"
    assert any(named), f"{phase}: no rank's error names the store: {results}"


def test_torchrun_two_nodes_of_two_ranks(tmp_path, stores, corpus):
    """(a) Two torchrun launchers as two nodes (``--nnodes 2 --nproc-per-node 2``), c10d
    rendezvous on 127.0.0.1; the launcher given ``is_host=1`` holds the rendezvous store."""
    port = free_port()

    def node(k):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "rehearsal",
                "--rdzv-conf", f"is_host={1 - k}", "--local-addr", "127.0.0.1", "--max-restarts", "0",
                "--monitor-interval", "0.5", str(SCRIPT)]

    ranks, codes, logs = _launch(tmp_path, stores, [node(0), node(1)])
    _check(ranks, codes, logs, corpus, stores)
    # Two ranks on each launcher (node), local ranks 0 and 1 on each.
    nodes = {}
    for r in range(WORLD):
        nodes.setdefault(ranks[r]["launcher"], []).append(ranks[r]["local_rank"])
    assert sorted(sorted(v) for v in nodes.values()) == [["0", "1"], ["0", "1"]], nodes


def test_mp_spawn_with_init_process_group_rank(tmp_path, stores, corpus):
    """(b) ``mp.spawn`` of 4 processes, each ``init_process_group(rank=...)`` over TCP, no rank
    in the environment: the loaders take rank and world size from torch.distributed."""
    ranks, codes, logs = _launch(tmp_path, stores, [[sys.executable, str(SCRIPT), "--spawn"]])
    _check(ranks, codes, logs, corpus, stores)
