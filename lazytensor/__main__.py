"""``python -m lazytensor ...``: the command line of :mod:`lazytensor.cli.main`."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
