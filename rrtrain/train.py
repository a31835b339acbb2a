"""`rrtrain train CONFIG [key=value ...]`, and the same run distributed:
`torchrun --nproc_per_node=N -m rrtrain.train CONFIG [key=value ...]`.

Exit status: 0 completed, 1 failed, 2 bad input, 3 diverged, 4 stalled, 75 preempted (stopped by a signal at a step
boundary after writing a checkpoint: restart the same command to resume), 73 another live copy of this run
holds its directory (`run.lock`; nothing was written).
"""

from __future__ import annotations

import sys

from rrtrain.errors import RUN_ERROR_EXIT, RunError, UsageError, fail
from rrtrain.resolve import load


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path, overrides = argv[0], argv[1:]
    cfg = load(path, overrides)
    from rrtrain.trainer import run

    return run(cfg)


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except UsageError as err:
        code = fail("rrtrain train", str(err))
    except RunError as err:
        fail("rrtrain train", str(err))
        code = RUN_ERROR_EXIT
    # Outside the handlers, so a failed run's objects (in cycles with the traceback) can be freed first and
    # streaming releases its shared memory. After a distributed run the process group is destroyed here too
    # (every rank raised the same error, or returned) and the interpreter is not finalised: see exit_process.
    if "rrtrain.dist" in sys.modules:
        from rrtrain import dist

        dist.exit_process(code)
    sys.exit(code)
