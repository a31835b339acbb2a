"""Task names: their spelling, lm-eval's index of them, loading them, and the key a result file is named by.

lm-eval's `TaskManager` indexes its ~15,000 registered tasks in several seconds. When `include` (a directory
or YAML file of the user's own tasks) names every task asked for, the index is built over `include` alone, in
well under a second; a registered task, a group or a tag needs the whole index (where `include` still wins
over a registered task of the same name, as in lm-eval).
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from rrtrain.config import TASK_NAME
from rrtrain.core.errors import UsageError

#: a key longer than this is replaced by the first 12 hex digits of its sha256
MAX_KEY_CHARS = 120
#: the request types rrtrain's model answers (generation greedily: rrtrain.eval.generate)
OUTPUT_TYPES = ("loglikelihood", "loglikelihood_rolling", "multiple_choice", "generate_until")
#: a generation task's limit on new tokens when it names none (lm-eval's HFLM's default)
MAX_GEN_TOKS = 256


def parse_tasks(text: str | Sequence[str], where: str = "--tasks") -> list[str]:
    """`T1,T2` (or a list) -> sorted unique names; a name outside [A-Za-z0-9_.-] is one line."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [str(t).strip() for t in items]
    if not any(names):
        raise UsageError(f"{where}: no task named")
    for name in names:
        if not TASK_NAME.fullmatch(name):
            raise UsageError(f"{where}: {name!r} is not a task name (letters, digits, '_', '.', '-')")
    return sorted(set(names))


def result_key(tasks: Sequence[str], num_fewshot: Optional[int], limit: Optional[int]) -> str:
    """`a+b[-fewshotF][-limitK]`, or the first 12 hex digits of its sha256 when longer than 120 characters."""
    key = "+".join(sorted(tasks))
    if num_fewshot is not None:
        key += f"-fewshot{num_fewshot}"
    if limit is not None:
        key += f"-limit{limit}"
    return key if len(key) <= MAX_KEY_CHARS else hashlib.sha256(key.encode()).hexdigest()[:12]


def check_include(include: Optional[str | Path], where: str = "--include") -> Optional[Path]:
    """`include` as a path, once every file lm-eval will open for it is checked (rrtrain.eval.task_files)."""
    if include is None:
        return None
    path = Path(include)
    if not (path.is_dir() or (path.is_file() and path.suffix in (".yaml", ".yml"))):
        raise UsageError(f"{where}: {str(path)!r} is neither a directory nor a .yaml file")
    from rrtrain.eval import task_files

    task_files.check(path, where)
    return path


#: lm-eval's own index, built once per process (seconds each time; the installed tasks do not change)
_REGISTRY: list[Any] = []


def require_lm_eval(what: str) -> None:
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        raise UsageError(f"{what} needs lm-evaluation-harness, which is not installed: pip install 'rrtrain[eval]'")


def task_manager(tasks: Sequence[str], include: Optional[Path], where: str = "--tasks") -> Any:
    """lm-eval's TaskManager knowing every name of `tasks` (over `include` alone when that suffices); an
    unknown name is one line naming it and the closest known names."""
    import logging

    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # the index warns of every odd YAML it meets
    if include is not None:
        local = TaskManager(include_path=str(include), include_defaults=False)
        index = local.task_index
        if all(t in index and index[t].kind in (Kind.TASK, Kind.PY_TASK) for t in tasks):
            return local
        manager = TaskManager(include_path=str(include))
    else:
        if not _REGISTRY:
            _REGISTRY.append(TaskManager())
        manager = _REGISTRY[0]
    unknown = [t for t in tasks if t not in manager.task_index]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], manager.all_tasks, n=3)
        hint = f" (closest: {', '.join(close)})" if close else ""
        where_from = "lm-eval's registry" + (f" or {include}" if include is not None else "")
        raise UsageError(f"{where}: unknown task {unknown[0]!r}: not in {where_from}{hint}")
    return manager


def load_tasks(manager: Any, tasks: Sequence[str], num_fewshot: Optional[int], where: str = "--tasks") -> dict:
    """The tasks loaded (their data read: lm-eval's `TaskManager.load`), few-shot counts set as
    `lm_eval.simple_evaluate` sets them (`num_fewshot` overrides a task's own count unless that is 0; none
    given and none in the task: 0; the few-shot sampler's seed 1234); a task of another output type is refused.
    A generation task's settings are checked against the model's length once it is known (`check_generation`)."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # reading a task's data draws progress bars: a refusal must stay one line
    try:
        with hub_names_only(where):
            loaded = manager.load(list(tasks))
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - a task's own YAML or data (a download without network...): one line
        why = f"{type(err).__name__}: {err}".splitlines()[0]
        raise UsageError(f"{where}: cannot load {', '.join(tasks)}: {why}") from None
    finally:
        if shown:
            datasets.enable_progress_bars()
    for name, task in loaded["tasks"].items():
        kind = task.get_config("output_type")
        if kind not in OUTPUT_TYPES:
            raise UsageError(f"{where}: task {name!r} is a {kind} task; rrtrain evaluates {', '.join(OUTPUT_TYPES)} "
                             "tasks")
        if num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
    return loaded


@contextlib.contextmanager
def hub_names_only(where: str) -> Iterator[None]:
    """While lm-eval builds tasks (which read their data as they are built), each dataset a task names is checked
    before `datasets` looks it up: `datasets` takes a `dataset_path` such as `EleutherAI/lambada_openai` first as
    a directory relative to the working directory, so a co-tenant who can write it would choose a registry
    task's data. A Hub name that is a path there is refused in one line (data_prep.sources.hub_name_refusal),
    before any download. The check sits on `datasets.load.dataset_module_factory`, the one step every
    `load_dataset` takes from a name to a place, however a task imported it; a builder of `datasets` (json,
    csv...) is never looked up there, and its `data_files` are local paths by `datasets`' own rule."""
    from datasets import load as hf_load

    from data_prep.sources import hub_name_refusal
    from rrtrain.eval.task_files import PACKAGED_BUILDERS

    real = hf_load.dataset_module_factory

    def checked(path: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, str) and path not in PACKAGED_BUILDERS:
            refusal = hub_name_refusal(path, f"{where}: dataset_path")
            if refusal is not None:
                raise UsageError(refusal)
        return real(path, *args, **kwargs)

    hf_load.dataset_module_factory = checked
    try:
        yield
    finally:
        hf_load.dataset_module_factory = real


#: lm-eval's default few-shot seed (simple_evaluate's fewshot_random_seed)
FEWSHOT_SEED = 1234


def generation_problem(gen_kwargs: Any, seq_len: int, default: int = MAX_GEN_TOKS) -> Optional[str]:
    """Why rrtrain cannot generate as a task's `generation_kwargs` ask (None: it can): it decodes greedily, and the
    limit on new tokens must leave room for a context in the model's length (HFLM's own condition)."""
    from lm_eval.models.utils import normalize_gen_kwargs

    try:
        kwargs = normalize_gen_kwargs(dict(gen_kwargs or {}), default)
    except (TypeError, ValueError) as err:
        return f"its generation_kwargs cannot be read ({err})"
    if kwargs.get("do_sample"):
        return "it samples (do_sample, or a temperature above 0); rrtrain decodes greedily"
    if kwargs.get("num_beams") not in (None, 1):
        return f"it searches {kwargs['num_beams']} beams; rrtrain decodes greedily"
    if kwargs["max_gen_toks"] >= seq_len:
        return (f"it generates up to {kwargs['max_gen_toks']} tokens, leaving no room for a context in the model's "
                f"{seq_len}: set its generation_kwargs.max_gen_toks below {seq_len}")
    return None


def check_generation(loaded: dict, seq_len: int, where: str = "--tasks") -> None:
    """Every generation task of `loaded` one that rrtrain's model of length `seq_len` can run; one line if not."""
    for name, task in loaded["tasks"].items():
        if task.get_config("output_type") == "generate_until":
            problem = generation_problem(task.get_config("generation_kwargs"), seq_len)
            if problem:
                raise UsageError(f"{where}: task {name!r}: {problem}")
