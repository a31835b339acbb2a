"""`rrtrain train CONFIG [key=value ...]`, and the same run distributed:
`torchrun --nproc_per_node=N -m rrtrain.train CONFIG [key=value ...]`.

Exit status: 0 completed, 1 failed, 2 bad input, 3 diverged, 4 stalled, 75 preempted (stopped by a signal at a step
boundary after writing a checkpoint: restart the same command to resume).
"""

from __future__ import annotations

import sys

from rrtrain.config import load_config
from rrtrain.errors import UsageError, fail


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path, overrides = argv[0], argv[1:]
    cfg = load_config(path, overrides)
    from rrtrain.trainer import run

    return run(cfg)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as err:
        sys.exit(fail("rrtrain train", str(err)))
