"""The ``stoker`` command installed with the package: the same Rust CLI as the native binary."""

import os
import sys

from . import _stoker
from .loader import find_nvjpeg


def main() -> None:
    # `stoker doctor` and `stoker bench --decode gpu` find nvJPEG where the package would.
    find_nvjpeg()
    # `stoker pack --ray` and `stoker tokenize --ray` run `python -m stoker.ray` with this Python.
    os.environ.setdefault("STOKER_PYTHON", sys.executable)
    sys.exit(_stoker.cli_main(["stoker", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
