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
    if code:
        import gc

        from rrtrain import dist

        # The failed run's objects sit in reference cycles with the traceback; freeing them now (as a normal
        # return does) lets streaming release its shared memory before exit instead of warning about it.
        gc.collect()
        dist.teardown()  # every rank raised the same error; leaving the group up aborts at exit
    sys.exit(code)  # outside the handlers: the run's objects are freed before exit (streaming cleans up)
