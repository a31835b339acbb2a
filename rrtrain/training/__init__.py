"""The training loop and what it drives: the loop (`trainer`), the one optimizer step (`step`), the learning-rate
schedule (`optim`), the interface callbacks see (`loop`) and the built-in callbacks, checkpoints, the console."""
