"""Sweeps: expansion of a sweep file into runs (variant x size x seed), submitit executors, Slurm arrays,
requeue on preemption, sweep status. Installed with rrtrain; its modules arrive with the launchers issue."""
