"""``python -m somatize``: the ``somatize`` command, for where the console script is not
on ``PATH`` (see ``somatize.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
