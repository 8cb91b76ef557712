"""The ``stoker`` command installed with the package: the same Rust CLI as the native binary."""

import sys

from . import _stoker


def main() -> None:
    sys.exit(_stoker.cli_main(["stoker", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
