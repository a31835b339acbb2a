"""Sweeps, by stage: a sweep file expanded into runs (variant x size x seed, baselines matched) and recorded
(`launchers.sweep`), submitted by one loop (`launchers.submit`) to an executor (`launchers.executors`: submitit's
Slurm job arrays, local subprocesses or in-process), pruned by successive halving (`launchers.prune`), read
back read-only (`launchers.state`), and cancelled only by `launchers.cancel`. The commands are
`rrtrain.cli.sweep` and `rrtrain.cli.status`; docs/cluster.md is the user's guide.
"""
