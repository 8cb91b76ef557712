"""What every test directory shares (tests/python, python/tests, tests/gpu)."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _index_store(tmp_path_factory):
    """Stored document indexes go to a folder of this run, not to ~/.cache (the user's)."""
    if os.environ.get("STOKER_INDEX_DIR"):
        yield
        return
    os.environ["STOKER_INDEX_DIR"] = str(tmp_path_factory.mktemp("doc-index"))
    yield
    del os.environ["STOKER_INDEX_DIR"]
