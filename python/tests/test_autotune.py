"""Autotuning (threads/prefetch='auto', cpu_budget) and the host-wide CPU registry, from Python."""

import os
import time

import pytest
import stoker
from helpers import digest


@pytest.fixture(autouse=True)
def unshared(monkeypatch):
    """Other stoker processes on the host must not change these tests' shares."""
    monkeypatch.setenv("STOKER_SHARED_BUDGET", "0")
    monkeypatch.delenv("STOKER_NUM_THREADS", raising=False)



def test_auto_batches_equal_fixed_ones(demo):
    kw = dict(batch_size=16, preset="imagenet-train", shuffle=True, seed=5, output="numpy")
    fixed = stoker.ImageLoader(demo, threads=1, **kw)
    auto = stoker.ImageLoader(demo, threads="auto", prefetch="auto", cpu_budget=3, **kw)
    assert digest(fixed) == digest(auto)
    t = auto.report()["tuning"]
    assert t["threads_auto"] and t["prefetch_auto"] and t["threads_max"] == 3
    assert t["shared"] is False and "STOKER_SHARED_BUDGET" in t["note"]
    f = fixed.report()["tuning"]
    assert (f["threads_auto"], f["threads_active"], f["threads_max"]) == (False, 1, 1)


def test_slow_consumer_lowers_threads(big_demo):
    loader = stoker.ImageLoader(big_demo, 4, preset="imagenet-train", cpu_budget=4, output="numpy")
    for _ in loader:
        time.sleep(0.03)
    t = loader.report()["tuning"]
    assert t["converged"] and t["threads_active"] < t["threads_max"] == 4, t
    assert any(d["knob"] == "threads" and d["to"] < d["from"] for d in t["decisions"]), t
    assert "(auto, 4 started" in loader.report_text()


def test_arguments_are_checked():
    for bad in (0, -1.5, "many", True):
        with pytest.raises(stoker.ConfigError, match="`cpu_budget`"):
            stoker.ImageLoader("/nonexistent", 4, preset="imagenet-val", cpu_budget=bad)
    with pytest.raises(stoker.ConfigError, match="`prefetch`"):
        stoker.ImageLoader("/nonexistent", 4, preset="imagenet-val", prefetch="later")


def test_loaders_share_a_registry(demo, tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_SHARED_BUDGET", "1")
    monkeypatch.setenv("STOKER_BUDGET_FILE", str(tmp_path / "budget"))
    cores = os.cpu_count() or 1
    a = stoker.ImageLoader(demo, 8, preset="imagenet-val", cpu_budget=cores, output="numpy")
    b = stoker.ImageLoader(demo, 8, preset="imagenet-val", cpu_budget=cores, output="numpy")
    next(iter(a))
    time.sleep(0.6)
    next(iter(a))
    ta, tb = a.report()["tuning"], b.report()["tuning"]
    assert ta["shared"] and tb["shared"]
    assert ta["share"] + tb["share"] <= max(cores, 2), (ta, tb)
    assert ta["processes_sharing"] == 1 and ta["registry"] == str(tmp_path / "budget")
    lines = (tmp_path / "budget").read_text().splitlines()
    assert len(lines) == 2 and all(line.split()[0] == str(os.getpid()) for line in lines)
    del a, b
    import gc

    gc.collect()
    assert (tmp_path / "budget").read_text() == ""
