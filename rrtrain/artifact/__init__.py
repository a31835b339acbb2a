"""A trained run as an artifact: what `rrtrain eval`, `rrtrain export` and a warm start read (rrtrain/artifact/run.py
loads a run's model; rrtrain/artifact/warm.py reads `init.from`). Above `training/` (the artifact's writer and the
checkpoint manager), below `eval/` and `export/`."""

from rrtrain.artifact.run import (
    LoadedRun,
    artifact_steps,
    checkpoint_steps,
    load_run,
    model_steps,
    read_run_config,
    require_run_dir,
)

__all__ = ["LoadedRun", "artifact_steps", "checkpoint_steps", "load_run", "model_steps", "read_run_config",
           "require_run_dir"]
