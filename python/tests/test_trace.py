"""``ImageLoader(trace=...)``: a Chrome/Perfetto trace written at the end of each pass, on
``save_trace()`` and on deletion; its spans name the samples' files; bad arguments name
themselves."""

import gc
import json

import pytest
import stoker


def events(path):
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    return doc, names, [e for e in doc["traceEvents"] if e["ph"] != "M"]


def test_trace_spans_for_every_sample(demo, tmp_path):
    out = tmp_path / "trace.json"
    loader = stoker.ImageLoader(demo, batch_size=16, preset="imagenet-val", threads=2, output="numpy",
                                shuffle=True, trace=out)
    assert loader.trace_path == str(out)
    seen = []
    for batch in loader.batches():
        seen.extend(batch.indices)
    assert len(seen) == 96
    doc, names, evs = events(out)  # written at the end of the pass
    assert doc["otherData"]["max_events"] == 200_000 and doc["otherData"]["dropped_events"] == 0
    for stage in ("read", "decode", "ops"):
        spans = {e["args"]["index"]: e for e in evs if e["name"] == stage}
        assert sorted(spans) == sorted(seen), stage
        for e in spans.values():
            assert e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0
            assert e["args"]["path"].startswith(str(demo)) and e["args"]["path"].endswith(".jpg")
            assert names[e["tid"]].startswith("stoker-io-" if stage == "read" else "stoker-decode-")
    delivered = [e["args"]["batch"] for e in evs if e["name"] == "deliver"]
    assert delivered == list(range(6))
    waits = [e for e in evs if e["name"] == "wait"]
    assert len(waits) == 6 and all(names[e["tid"]].startswith("consumer") for e in waits)


def test_save_trace_and_small_ring(demo, tmp_path):
    out = tmp_path / "ring.json"
    loader = stoker.ImageLoader(demo, batch_size=16, preset="imagenet-val", threads=2, output="numpy",
                                trace=str(out), trace_events=20)
    it = loader.batches()
    next(it)
    it.close()
    asked = tmp_path / "asked.json"
    assert loader.save_trace(asked) == str(asked)
    doc, _, evs = events(asked)
    # Batch 0 alone records 16 * 3 sample spans and a deliver; how many later events the
    # workers add before close() depends on the machine, so only the ring's bound is asserted.
    assert len(evs) == 20 and doc["otherData"]["max_events"] == 20
    assert doc["otherData"]["dropped_events"] >= 16 * 3 + 1 - 20
    assert not out.exists()
    del loader, it
    gc.collect()
    _, _, evs = events(out)  # written when the loader is deleted
    assert 0 < len(evs) <= 20


def test_trace_arguments_are_checked(demo, tmp_path):
    with pytest.raises(stoker.ConfigError, match="`trace_events`: must be at least 1"):
        stoker.ImageLoader(demo, preset="imagenet-val", trace=tmp_path / "t.json", trace_events=0)
    with pytest.raises(stoker.ConfigError, match="`trace_events`: needs trace"):
        stoker.ImageLoader(demo, preset="imagenet-val", trace_events=10)
    with pytest.raises(stoker.ConfigError, match="`trace`.*does not exist"):
        stoker.ImageLoader(demo, preset="imagenet-val", trace=tmp_path / "no" / "t.json")
    plain = stoker.ImageLoader(demo, preset="imagenet-val")
    assert plain.trace_path is None
    with pytest.raises(stoker.ConfigError, match="`trace`: tracing is off"):
        plain.save_trace(tmp_path / "x.json")
