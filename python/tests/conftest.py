"""Fixtures: datasets made by stoker itself (the embedded demo photos)."""

import os
import shutil

import pytest
import stoker


def _demo_folder(tmp_path_factory, name, images, seed):
    """The demo ImageFolder of `images` images under a new temporary folder, without its license file."""
    root = tmp_path_factory.mktemp(name) / "data"
    stoker.make_demo(str(root), images, seed=seed)
    os.remove(root / "LICENSE.md")
    return root


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """96 ImageNet-like JPEGs in 7 classes."""
    return _demo_folder(tmp_path_factory, "demo", 96, seed=1)


@pytest.fixture(scope="session")
def big_demo(tmp_path_factory):
    """320 images, for tests that need many batches."""
    return _demo_folder(tmp_path_factory, "big", 320, seed=2)


@pytest.fixture()
def bad_demo(demo, tmp_path):
    """The demo plus a corrupt, an empty, a truncated, a non-image and a missing file."""
    root = tmp_path / "bad"
    shutil.copytree(demo, root)
    chelsea = root / "chelsea"
    good = next(iter(sorted((root / "rocket").iterdir()))).read_bytes()
    (chelsea / "zz_empty.jpg").write_bytes(b"")
    (chelsea / "zz_text.jpg").write_bytes(b"hello, not an image")
    (chelsea / "zz_truncated.jpg").write_bytes(good[: len(good) // 2])
    (chelsea / "zz_corrupt.jpg").write_bytes(good[:600] + b"\x5a" * (len(good) - 600))
    os.symlink(chelsea / "nowhere.jpg", chelsea / "zz_missing.jpg")
    return root


def pytest_configure(config):
    """With ``STOKER_REQUIRE_TORCH=1`` (scripts/test, CI) a missing PyTorch fails the run instead
    of quietly skipping the torch hand-off tests."""
    if os.environ.get("STOKER_REQUIRE_TORCH") == "1":
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise pytest.UsageError("STOKER_REQUIRE_TORCH=1 but PyTorch is not installed: run ./scripts/setup")
