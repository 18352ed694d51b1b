"""``python -m cupy_flashattn {info,precompile,bench,check}`` (see :mod:`cupy_flashattn.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
