"""What a sweep's runs are doing, read-only: one run's state from its files (`runstate`), what Slurm says
(`scheduler`), the sweep-level flags (`flags`), what pruning saved (`pruning`), the status of the whole sweep
(`status`) and what `--watch` keeps between refreshes (`cache`). Nothing here writes into a run, signals or
cancels: that is `launchers.cancel`."""
