"""`python -m rrtrain NAME ...` is `rrtrain NAME ...`."""

import sys

from rrtrain.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
