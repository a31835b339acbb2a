"""`rrtrain train CONFIG [key=value ...]`, and the same run distributed:
`torchrun --nproc_per_node=N -m rrtrain.train CONFIG [key=value ...]`.

Exit status: 0 completed, 1 failed, 2 bad input, 3 diverged, 4 stalled, 75 preempted (stopped by a signal at a step
boundary after writing a checkpoint: restart the same command to resume), 73 another live copy of this run
holds its directory (`run.lock`; nothing was written).
"""

from __future__ import annotations

import sys

from rrtrain.resolve import load


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path, overrides = argv[0], argv[1:]
    cfg = load(path, overrides)
    from rrtrain.training.trainer import run

    return run(cfg)


if __name__ == "__main__":
    from rrtrain.cli.main import main as cli_main

    sys.exit(cli_main(["train", *sys.argv[1:]]))  # the same handling of errors and of the exit as `rrtrain train`
