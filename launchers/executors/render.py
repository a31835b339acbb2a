"""sbatch scripts from the templates in `slurm/`: one array script per resource shape (its rows in its own text),
one multi-node script per multi-node run, with the run's rendezvous drawn at submission (entry.draw_rendezvous,
where submitit's jobs find theirs). Each holds the job side's program (`launchers.sweep.seal.inline_source`), which
checks what the job reads at its start and reads the run's files at its end. Every value is shell-quoted, and
names and paths that could break a script are refused before anything is written
(`launchers.sweep.expand.check_safe`)."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path

from launchers.executors.entry import draw_rendezvous
from launchers.sweep import seal
from launchers.sweep.expand import Run, check_safe
from launchers.sweep.snapshot import NO_BYTECODE
from launchers.sweep.spec import Resources
from rrtrain.core.child_python import SAFE_PATH_ENV, module_argv
from rrtrain.core.io import atomic_write_text

TEMPLATES = Path(__file__).resolve().parents[2] / "slurm"


def shape_key(r: Resources) -> str:
    return json.dumps(asdict(r), sort_keys=True)


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by resource shape, each group named after its sizes (e.g. `rr-60m+rr-150m`)."""
    by_shape: dict[str, list[Run]] = {}
    for run in runs:
        by_shape.setdefault(shape_key(run.resources), []).append(run)
    out: dict[str, list[Run]] = {}
    for members in by_shape.values():
        sizes = list(dict.fromkeys(r.size for r in members))
        out["+".join(sizes)] = members
    return out


def sbatch_lines(r: Resources, job_name: str, output: str, array: str | None) -> list[str]:
    """The `#SBATCH` header for one resource shape (values quoted)."""
    q = shlex.quote
    lines = [f"#SBATCH --job-name={q(job_name)}", f"#SBATCH --nodes={r.nodes}",
             f"#SBATCH --ntasks-per-node={1 if r.nodes > 1 else r.tasks}",
             f"#SBATCH --cpus-per-task={r.cpus_per_task if r.nodes == 1 else r.cpus_per_task * r.tasks}",
             f"#SBATCH --mem={int(r.mem_gb * 1024)}M", f"#SBATCH --time={r.time_min}",
             "#SBATCH --requeue", f"#SBATCH --signal=B:USR2@{r.signal_delay_s}", "#SBATCH --open-mode=append",
             f"#SBATCH --output={q(output)}"]
    if r.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={r.gpus_per_node}")
    if array is not None:
        lines.append(f"#SBATCH --array={array}")
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(r, key)
        if value:
            lines.append(f"#SBATCH --{key}={q(check_safe(str(value), key))}")
    for extra in r.extra_sbatch:
        lines.append(f"#SBATCH {extra}")
    return lines


def _fill(template: str, sbatch: list[str], variables: list[str]) -> str:
    """Replace the template's `# >>> sbatch` and `# >>> vars` blocks."""
    def swap(text: str, block: str, body: list[str]) -> str:
        start, end = f"# >>> {block}\n", f"# <<< {block}\n"
        i, j = text.index(start) + len(start), text.index(end)
        return text[:i] + "".join(b + "\n" for b in body) + text[j:]

    return swap(swap(template, "sbatch", sbatch), "vars", variables)


def train_argv(run: Run, python: str, config_path: Path) -> list[str]:
    """The command that trains one run on one node: torchrun when it has several tasks, with its stores on
    loopback only (`launchers.torchrun.local`; `--standalone` would listen on every interface)."""
    if run.resources.tasks > 1:
        return module_argv("launchers.torchrun.local", f"--nproc_per_node={run.resources.tasks}",
                           "-m", "rrtrain.train", str(config_path), python=python)
    return module_argv("rrtrain.train", str(config_path), python=python)


def run_command(run: Run, python: str, code: str, config_path: Path, bound: seal.Bound) -> str:
    """The same as one shell line, with the snapshot first on the import path, after the check that the snapshot
    and the config are those bound at submission (`launchers.sweep.seal`, its text in RRTRAIN_SEAL)."""
    q = shlex.quote
    check = [python, "-I", "-c"], [code, bound.code_sha256, str(config_path), bound.configs[run.id], str(run.dir)]
    env = ["env", f"PYTHONPATH={code}", f"{SAFE_PATH_ENV}=1", f"{seal.CONFIG_DIGEST_ENV}={bound.configs[run.id]}",
           *(f"{k}={v}" for k, v in NO_BYTECODE.items()), f"OMP_NUM_THREADS={run.resources.cpus_per_task}"]
    return (" ".join(map(q, check[0])) + ' "$RRTRAIN_SEAL" ' + " ".join(map(q, check[1])) + " && exec "
            + " ".join(q(a) for a in env + train_argv(run, python, config_path)))


def heredoc(name: str, text: str, export: bool = False) -> list[str]:
    """`NAME=$(cat <<'END' ... END)`: `text` as a shell variable, kept verbatim in the script's text."""
    end = f"RRTRAIN_{name}_END"
    if f"\n{end}\n" in f"\n{text}\n":
        raise ValueError(f"{name} holds its own heredoc terminator")
    return [f"{'export ' if export else ''}{name}=$(cat <<'{end}'", *text.splitlines(), end, ")"]


def render(out: Path, name: str, runs: list[Run], python: str, code: str, configs: dict[str, Path]) -> list[dict]:
    """Write the scripts and manifests for `runs`; returns one entry per script: path, runs, how to submit."""
    q = shlex.quote
    slurm_dir = out / "slurm"
    for text, what in ((python, "python path"), (code, "code snapshot path"), (str(out), "sweep directory")):
        check_safe(text, what)
    scripts = []
    bound = seal.bind(code, configs)  # what each job checks before it imports anything of the sweep directory
    source = seal.inline_source()
    for group, members in group_runs(runs).items():
        r = members[0].resources
        if r.nodes == 1:
            rows = [f"{m.id}\t{m.dir}\t{run_command(m, python, code, configs[m.id], bound)}" for m in members]
            array = f"0-{len(members) - 1}%{min(len(members), r.array_parallelism)}"
            header = sbatch_lines(r, f"{name}-{group}", str(slurm_dir / "logs" / f"array-{group}-%A_%a.out"), array)
            variables = ['MANIFEST="${1:-}"', f"MAX_REQUEUES={r.max_requeues}", f"PYTHON={q(python)}",
                         *heredoc("ROWS", "\n".join(rows)), *heredoc("RRTRAIN_SEAL", source, export=True)]
            script = slurm_dir / f"array-{group}.sbatch"
            atomic_write_text(script, _fill((TEMPLATES / "array.sbatch").read_text(), header, variables))
            scripts.append({"script": str(script), "runs": [m.id for m in members], "array": array,
                            "submit": f"sbatch {q(str(script))}"})
            continue
        for m in members:
            header = sbatch_lines(r, f"{name}-{m.id}", str(slurm_dir / "logs" / f"{m.id}-%j.out"), None)
            rdzv = draw_rendezvous(out, m.id)  # at submission, readable by the user only
            variables = [f"PYTHON={q(python)}", f"CODE={q(code)}", f"RUN_DIR={q(str(m.dir))}",
                         f"CODE_SHA256={bound.code_sha256}", f"CONFIG_SHA256={bound.configs[m.id]}",
                         *heredoc("RRTRAIN_SEAL", source),
                         f"GPUS_PER_NODE={max(1, r.tasks)}", f'RDZV_FILE="${{RRTRAIN_RDZV_FILE:-{q(str(rdzv))}}}"',
                         'RDZV_DIR="${RDZV_DIR:-$HOME/.rrtrain/rendezvous}"',
                         f'AGENT_DIR="${{RRTRAIN_AGENT_DIR:-{q(str(slurm_dir / "torchrun"))}}}"',
                         'RDZV_PORT="${RDZV_PORT:-}"',
                         'RDZV_HOST="${RDZV_HOST:-}"',
                         'RDZV_TIMEOUT_S="${RDZV_TIMEOUT_S:-300}"', 'STEP_GRACE_S="${STEP_GRACE_S:-60}"',
                         f"MAX_REQUEUES={r.max_requeues}", *(f"export {k}={v}" for k, v in NO_BYTECODE.items()),
                         'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"',
                         'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"']
            script = slurm_dir / f"multinode-{m.id}.sbatch"
            atomic_write_text(script, _fill((TEMPLATES / "multinode.sbatch").read_text(), header, variables))
            scripts.append({"script": str(script), "runs": [m.id], "array": None,
                            "submit": f"sbatch {q(str(script))} {q(str(configs[m.id]))}"})
    return scripts
