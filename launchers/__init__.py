"""Sweeps: a sweep file expanded into runs (variant x size x seed, baselines matched), submitted through
submitit (Slurm job arrays), local subprocesses or in-process, requeued on preemption, and their status.

spec (the sweep file) -> expand (runs) -> record (sweep.json) -> snapshot (the code) -> render (sbatch) ->
slurm_executor | local_executor | debug_executor -> entry (the job's entry point); runstate + scheduler ->
status_cli. `rrtrain sweep` is sweep_cli; docs/cluster.md is the user's guide.
"""
