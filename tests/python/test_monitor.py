"""`stoker monitor` on small jobs made for the purpose: each job has a known pathology (or none)
and the JSON verdicts must name it. The GPU side comes from a stand-in libnvidia-ml
(``crates/stoker-cli/tests/fake_nvml.c``) whose utilisation is what the job writes into a state
file: 100 while its "GPU step" runs (a sleep), 0 while it waits for the next batch, so a starved
job shows a waiting GPU for the same reason a real one would.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GPU_STEP = '''
import os, sys, time
STATE = os.environ["STOKER_FAKE_NVML_STATE"]
def gpu(util):
    with open(STATE + ".tmp", "w") as f:
        f.write(f"{util} {8 << 30} {os.getpid()} {200000 if util else 0}\\n")
    os.replace(STATE + ".tmp", STATE)
'''

# A DataLoader whose transform costs ~40 ms of CPU per sample while the "GPU step" takes 20 ms
# per batch of 4: two workers on two cores cannot keep up.
INPUT_BOUND = GPU_STEP + '''
import torch
from torch.utils.data import DataLoader, Dataset
class Heavy(Dataset):
    def __len__(self): return 100000
    def __getitem__(self, i):
        t = time.process_time()
        x = 0
        while time.process_time() - t < 0.04:
            x += 1
        return torch.full((3, 8, 8), float(i % 7))
gpu(0)
loader = DataLoader(Heavy(), batch_size=4, num_workers=2)
end = time.time() + float(sys.argv[1])
for batch in loader:
    gpu(100); time.sleep(0.02); gpu(0)
    if time.time() > end:
        break
'''

# The same loop with a cheap transform and a deep prefetch: the GPU step dominates.
HEALTHY = GPU_STEP + '''
import torch
from torch.utils.data import DataLoader, Dataset
class Light(Dataset):
    def __len__(self): return 100000
    def __getitem__(self, i):
        return torch.full((3, 8, 8), float(i % 7))
gpu(0)
loader = DataLoader(Light(), batch_size=4, num_workers=2, prefetch_factor=8)
end = time.time() + float(sys.argv[1])
for batch in loader:
    gpu(100); time.sleep(0.1); gpu(0)
    if time.time() > end:
        break
'''

# Two processes that each spin on a core (run twice: the watched job and a neighbour).
HOG = '''
import multiprocessing as mp, sys, time
def spin(seconds):
    end = time.time() + seconds
    x = 0
    while time.time() < end:
        x += 1
if __name__ == "__main__":
    ps = [mp.Process(target=spin, args=(float(sys.argv[1]),)) for _ in range(2)]
    for p in ps: p.start()
    for p in ps: p.join()
'''

# Keeps 4 MiB more every 50 ms (written, so the pages are resident).
GROWTH = '''
import sys, time
keep = []
end = time.time() + float(sys.argv[1])
while time.time() < end:
    keep.append(bytearray(b"x") * (4 << 20))
    time.sleep(0.05)
'''


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fake_nvml")
    lib = d / "libnvidia-ml.so.1"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "crates/stoker-cli/tests/fake_nvml.c")],
                   check=True)
    return d


def monitor(stoker_bin, tmp_path, script, seconds, *extra, env=None, nvml=None, timeout=180):
    job = tmp_path / "job.py"
    job.write_text(script)
    e = dict(os.environ)
    if nvml is not None:
        e["LD_LIBRARY_PATH"] = f"{nvml}:{e.get('LD_LIBRARY_PATH', '')}"
        e["STOKER_FAKE_NVML_STATE"] = str(tmp_path / "gpu-state")
    e.update(env or {})
    cmd = [str(stoker_bin), "monitor", "--json", "--quiet", *extra, "--", sys.executable, str(job), str(seconds)]
    out = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def problems(report):
    return [v["rule"] for v in report["verdicts"] if v["severity"] != "ok"]


@pytest.fixture(scope="module")
def starved(stoker_bin, tmp_path_factory, fake_nvml):
    """The input-bound job watched once, with its JSON and its HTML report."""
    d = tmp_path_factory.mktemp("starved")
    page = d / "report.html"
    return monitor(stoker_bin, d, INPUT_BOUND, 7, "--out", str(page), nvml=fake_nvml), page


def test_a_starved_dataloader_job_is_input_bound(starved):
    r, _ = starved
    assert r["gpus"][0]["name"] == "Fake GPU 0"
    rules = problems(r)
    assert "input-bound" in rules, json.dumps(r["verdicts"], indent=1)
    v = next(v for v in r["verdicts"] if v["rule"] == "input-bound")
    assert v["share"] >= 0.3 and "loader worker" in v["evidence"], v
    # Both workers worked (a loaded host gives each less than the 7 s it would have alone).
    roles = sorted(p["role"] for p in r["processes"] if p["cpu_user_seconds"] + p["cpu_system_seconds"] > 0.1)
    assert roles.count("dataloader-worker") == 2, r["processes"]
    # The job's process is the one NVML lists on GPU 0.
    main = next(p for p in r["processes"] if p["role"] == "main")
    assert main["gpus"] and main["gpus"][0][0] == 0
    assert r["gpus"][0]["job_pids"] == [main["pid"]]


def test_the_monitor_report_renders_in_a_browser(starved, tmp_path):
    from test_html_report import SERIES_PATH, find_browser, pixels_of

    browser = find_browser()
    r, page = starved
    html = page.read_text()
    for ref in ("http://", "https://", "src=", "href=", "<script", "<link", "<img"):
        assert ref not in html, f"network reference {ref!r} in the report"
    for title in ("CPU of the job, per process", "Host CPU and run queue", "Memory", "GPU utilisation",
                  "GPU memory used", "PCIe traffic", "Processes (busiest first)", "Busiest threads",
                  "Input-bound"):
        assert title in html, title
    assert "no data" not in html
    series = SERIES_PATH.findall(html)
    names = [n for n, _, _ in series]
    assert "whole job" in names and "GPU 0" in names, names
    for name, d, _ in series:
        assert d.count("L") >= 10, f"{name}: {d[:200]}"
    shot = tmp_path / "shot.png"
    width, height = 1200, 3600
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          f"--window-size={width},{height}", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and shot.exists(), out.stderr[-3000:]
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB")).astype(np.int16)
    assert (img.min(axis=2) < 200).mean() > 0.02
    # The GPU utilisation line (the only line in its chart's colour besides the job's total CPU,
    # which shares palette entry 0) and every process line are drawn, not just their legend keys.
    for name, _, color in series:
        assert pixels_of(img, color) > 300, (name, color)


def test_a_fed_job_raises_no_alarm(stoker_bin, tmp_path, fake_nvml):
    cores = os.cpu_count() or 1
    busy_before = os.getloadavg()[0]
    r = monitor(stoker_bin, tmp_path, HEALTHY, 7, nvml=fake_nvml)
    found = problems(r)
    if found == ["host-oversubscribed"] and busy_before >= cores and r["summary"]["run_queue_mean"] > 1.25 * cores:
        # Other work on this machine (a build, a busy loop) was there before the job started and
        # really did oversubscribe it: that verdict is right. On a quiet host it would be wrong.
        print(f"host busy during the test: load {busy_before:.1f}, run queue {r['summary']['run_queue_mean']:.1f}")
        found = []
    assert found == [], json.dumps(r["verdicts"], indent=1)
    assert r["verdicts"][0]["rule"] in ("healthy", "host-oversubscribed")
    util = r["series"]["gpus"][0]["util"]
    first = next(i for i, u in enumerate(util) if u > 0)
    assert sum(util[first:]) / len(util[first:]) > 0.6, util


def test_two_cpu_hungry_jobs_on_two_cores_are_oversubscribed(stoker_bin, tmp_path):
    if (os.cpu_count() or 1) > 4:
        pytest.skip(f"needs a small host to oversubscribe with four spinning processes ({os.cpu_count()} cores)")
    neighbour_script = tmp_path / "neighbour.py"
    neighbour_script.write_text(HOG)
    neighbour = subprocess.Popen([sys.executable, str(neighbour_script), "8"])
    try:
        time.sleep(0.5)
        r = monitor(stoker_bin, tmp_path, HOG, 5, "--no-gpu")
    finally:
        neighbour.wait(timeout=60)
    rules = problems(r)
    assert "host-oversubscribed" in rules, json.dumps(r["verdicts"], indent=1)
    assert r["summary"]["run_queue_mean"] > 2.5
    assert r["summary"]["tree_cpu_wait_share"] > 0.2


def test_a_growing_job_is_named_with_the_process_that_grows(stoker_bin, tmp_path):
    r = monitor(stoker_bin, tmp_path, GROWTH, 6, "--no-gpu")
    rules = problems(r)
    assert "memory-growth" in rules, json.dumps(r["verdicts"], indent=1)
    v = next(v for v in r["verdicts"] if v["rule"] == "memory-growth")
    assert f"pid {r['target']['pid']}" in v["evidence"], v
    assert r["summary"]["tree_rss_peak_bytes"] - r["summary"]["tree_rss_first_bytes"] > 100 << 20


def test_watching_a_running_pid_and_bad_arguments(stoker_bin, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        out = subprocess.run([str(stoker_bin), "monitor", "--pid", str(sleeper.pid), "--duration", "1.5", "--json",
                              "--no-gpu", "--interval", "50ms"], capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["target"]["pid"] == sleeper.pid and r["target"]["command"] is None
    assert 20 <= r["ticks"] <= 31, r["ticks"]
    assert r["overhead"]["cpu_share_of_one_core"] < 0.05
    for args, msg in [(["--pid", "999999999"], "no process"), (["--interval", "1ms", "--", "true"], "--interval"),
                      ([], "say what to watch")]:
        out = subprocess.run([str(stoker_bin), "monitor", *args], capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and msg in out.stderr, (args, out.stderr)


def test_the_command_exit_status_passes_through(stoker_bin):
    out = subprocess.run([str(stoker_bin), "monitor", "--quiet", "--no-gpu", "--", sys.executable, "-c",
                          "import sys; sys.exit(3)"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    assert "too-short" in out.stdout or "Too few samples" in out.stdout, out.stdout
