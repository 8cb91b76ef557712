"""`stoker bench --report`: the HTML report is one self-contained file, and a real headless
browser (Chromium) renders it with every chart's lines drawn.

Each line of the bench report has its own palette colour (crates/stoker-cli/src/series.rs), so
counting the pixels of a colour in the screenshot tells whether that chart's line was drawn:
the legend's swatch of a colour is 14x3 pixels, a drawn line across the plot ~1000 pixels or
more. Without a browser the screenshot test skips with the reason, unless
STOKER_REQUIRE_BROWSER is set to anything but 0 (scripts/test and scripts/test-wheel set it to 1):
then it fails.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

#: Headless browsers tried in order: Debian's `chromium-headless-shell`, then a full Chromium.
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
#: The screenshot's size (the report is laid out for 1200 px).
WIDTH, HEIGHT = 1200, 2400
#: Pixels of a series' colour that show its line was drawn (a legend swatch alone is 42).
MIN_LINE_PIXELS = 300
#: Largest per-channel difference from a series' colour that still counts as that colour.
TOLERANCE = 12
#: The lines of the bench report: (chart, legend text's start).
EXPECTED_SERIES = ("delivered", "stoker process", "resident (RSS)", "batch buffers", "time in next()")
#: A palette colour the bench report does not use (crates/stoker-cli/src/html.rs PALETTE[5]).
UNUSED_COLOR = "#8c564b"

SERIES_PATH = re.compile(r'<path class="series" data-series="([^"]*)" d="([^"]*)"[^>]*? stroke="(#[0-9a-f]{6})"')


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    why = f"no headless browser found (tried {', '.join(BROWSERS)}; Debian: apt-get install chromium-headless-shell)"
    if os.environ.get("STOKER_REQUIRE_BROWSER", "0") not in ("", "0"):
        pytest.fail(f"{why}, and STOKER_REQUIRE_BROWSER is set: run ./scripts/setup")
    pytest.skip(why)


@pytest.fixture(scope="module")
def report(stoker_bin, demo_root, tmp_path_factory) -> tuple[Path, dict]:
    """A bench of the 140-image demo set in batches of 8 over 3 epochs (51 batches), with its
    HTML report and its JSON summary."""
    out = tmp_path_factory.mktemp("report") / 'bench <&"report>.html'
    r = subprocess.run([str(stoker_bin), "bench", str(demo_root), "--batch-size", "8", "--epochs", "3",
                        "--report", str(out), "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def rgb(color: str) -> np.ndarray:
    return np.array([int(color[k:k + 2], 16) for k in (1, 3, 5)], dtype=np.int16)


def pixels_of(img: np.ndarray, color: str) -> int:
    return int((np.abs(img - rgb(color)).max(axis=2) <= TOLERANCE).sum())


def test_the_json_names_the_report_and_the_file_is_self_contained(report):
    path, summary = report
    assert summary["report"] == str(path)
    assert summary["images"] == 408 and summary["batches"] == 51
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for ref in ("http://", "https://", "src=", "href=", "@import", "<script", "<link", "<img", "url(http"):
        assert ref not in html, f"network reference {ref!r} in the report"
    # The path in the command line is escaped, not markup.
    assert 'bench &lt;&amp;&quot;report&gt;.html' in html
    assert "no data" not in html
    for name in ("Throughput", "CPU", "Memory", "Consumer waiting", "Stages", "Settings", "bottleneck: "):
        assert name in html
    stage_rows = re.findall(r"<tr><td>(read|decode|ops|buffer wait|consumer)</td>", html)
    assert stage_rows == ["read", "decode", "ops", "buffer wait", "consumer"]


def test_the_browser_draws_every_line(report, tmp_path):
    browser = find_browser()
    path, _ = report
    html = path.read_text()
    series = SERIES_PATH.findall(html)
    names = [n for n, _, _ in series]
    assert len(series) == len(EXPECTED_SERIES), names
    for expected in EXPECTED_SERIES:
        assert any(n.startswith(expected) for n in names), (expected, names)
    colors = [c for _, _, c in series]
    assert len(set(colors)) == len(colors), f"two lines share a colour: {colors}"
    assert UNUSED_COLOR not in colors
    for name, d, _ in series:
        assert d.count("L") >= 1, f"{name}: a line needs two points: {d[:200]}"

    shot = tmp_path / "shot.png"
    r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                        f"--window-size={WIDTH},{HEIGHT}", path.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.exists(), f"{browser} failed: {r.stderr[-3000:]}"
    img = np.asarray(Image.open(shot).convert("RGB")).astype(np.int16)
    assert img.shape[:2] == (HEIGHT, WIDTH), img.shape
    # Rendered, not blank: text, frames and colour everywhere.
    ink = (img.min(axis=2) < 200).mean()
    assert ink > 0.02, f"only {ink:.2%} of the page is drawn on"
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 100
    # Every line is drawn: its colour covers far more than its legend swatch.
    counts = {name: pixels_of(img, color) for name, _, color in series}
    for name, n in counts.items():
        assert n > MIN_LINE_PIXELS, f"line {name!r} has {n} pixels in the screenshot: {counts}"
    # ... and the count tells drawn lines apart: a colour the report does not use is absent.
    assert pixels_of(img, UNUSED_COLOR) < MIN_LINE_PIXELS


def test_an_unwritable_report_path_fails_before_the_run_and_names_it(stoker_bin, demo_root, tmp_path):
    bad = tmp_path / "no such folder" / "r.html"
    r = subprocess.run([str(stoker_bin), "bench", str(demo_root), "--batch-size", "8", "--report", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert f"--report: cannot create {bad}" in r.stderr, r.stderr
    assert "images/s" not in r.stdout, "the bench ran although its report could not be written"
