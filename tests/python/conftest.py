"""Shared fixtures: the stoker binary and a demo dataset made by it."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def stoker_bin() -> Path:
    path = Path(os.environ.get("STOKER_BIN", ROOT / "target" / "release" / "stoker"))
    if not path.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "stoker-cli"], cwd=ROOT, check=True)
    return path


@pytest.fixture(scope="session")
def demo_root(stoker_bin, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo") / "data"
    subprocess.run([str(stoker_bin), "demo", "--out", str(root), "--images", "140", "--no-bench"], check=True)
    (root / "LICENSE.md").unlink()
    return root
