"""``python -m mr2_probe``: the ``mr2-probe`` command, as ``python -m extract`` is
``mr2-extract``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
