"""The training loop and what it drives: step, optimizer, callbacks, checkpoints, signals, console."""
