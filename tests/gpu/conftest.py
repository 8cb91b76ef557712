"""Fixtures of the GPU tests: a demo ImageFolder made by stoker itself (the embedded photos)."""

import pytest
import stoker


@pytest.fixture(scope="session")
def gpu_demo(tmp_path_factory):
    """300 ImageNet-like JPEGs in a few classes: 10 batches of 32 (the last one holds 12)."""
    root = tmp_path_factory.mktemp("gpu-demo") / "data"
    assert stoker.make_demo(str(root), 300, seed=3) == 300
    (root / "LICENSE.md").unlink(missing_ok=True)
    return root
