"""`python -m rrtrain NAME ...` is `rrtrain NAME ...`."""

import sys

from rrtrain.cli import main

sys.exit(main())
