"""`rrtrain export RUN_DIR --hf OUT` and the loader under it (rrtrain.artifact), issue 38.

Tiny real runs (d_model 32, 2 blocks, 3 steps) of `standard` (with RoPE, so that it also has a stock form),
`review`, `mhc` and `attnres` are trained once, exported through the CLI, and loaded by transformers in ONE
subprocess where importing rrtrain is impossible (a meta-path finder refuses it, cwd elsewhere, PYTHONPATH
cleared, an empty transformers module cache): the exported directories are self-contained. Their logits must
equal rrtrain's own model's within 1e-5 (fp32). Every other registered rule is written the same way from an
untrained model with perturbed weights and loaded in the same subprocess, which also generates with each (the
generation tests). Those tests are `slow` (they train); the bundling of every rule, the tokenizers and the
refusals that need no run are in the fast tier.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from data_prep.tokenizer import ByteTokenizer, train_bpe  # noqa: E402
from rrtrain import residuals  # noqa: E402
from rrtrain.cli.main import main as cli  # noqa: E402
from rrtrain.config import Config, ModelConfig  # noqa: E402
from rrtrain.core.errors import UsageError  # noqa: E402
from rrtrain.export import bundle  # noqa: E402
from rrtrain.export.hf import write_into  # noqa: E402
from rrtrain.export.tokenizer import SAMPLE, hf_tokenizer  # noqa: E402
from rrtrain.artifact import LoadedRun, checkpoint_steps, load_run  # noqa: E402
from rrtrain.sizing import resolve_shape  # noqa: E402
from rrtrain.resolve import build_model  # noqa: E402
from trainutil import train  # noqa: E402

RULES = {"standard": ["model.pos=rope"], "review": [], "mhc": [], "attnres": []}
SMALL = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "train.max_steps=3", "train.global_batch=4",
         "train.micro_batch=4", "train.warmup_steps=1", "train.compile=false", "train.eval_every=0",
         "data.eval_batches=1", "train.log_every=1"]
TEXT = "Once upon a time, a fox found a small red ball."

#: run in the subprocess: rrtrain cannot be imported there, and whatever it loads is written to a file
LOADER = r'''
import importlib.abc, json, sys
class NoRrtrain(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("rrtrain", "data_prep", "launchers"):
            raise ImportError(f"{name}: rrtrain is not installed here")
sys.meta_path.insert(0, NoRrtrain())
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
jobs, text, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
found = {}
for name, (path, remote) in jobs.items():
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=remote)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok(text)["input_ids"]
    with torch.no_grad():
        res = model(torch.tensor([ids]), labels=torch.tensor([ids]))
    found[name] = {"class": type(model).__name__, "ids": ids, "logits": res.logits.float(), "loss": float(res.loss),
                   "max_len": model.config.max_position_embeddings, "eos": tok.eos_token_id,
                   "param_dtype": str(next(model.parameters()).dtype)}
model = AutoModelForCausalLM.from_pretrained(jobs["review"][0], trust_remote_code=True)
prompt = torch.tensor([AutoTokenizer.from_pretrained(jobs["review"][0])(text)["input_ids"][:8]])
found["generated"] = model.generate(prompt, max_new_tokens=4, do_sample=False).tolist()
found["rrtrain_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("rrtrain", "data_prep"))
torch.save(found, out)
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, stories_data: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for rule, extra in RULES.items():
        out[rule] = root / rule
        train(out[rule], stories_data, *SMALL, f"model.variant={rule}", *extra)
    return out


@pytest.fixture(scope="module")
def exports(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each rule's fp32 export, review's in bf16, standard's stock form: through the CLI."""
    root = tmp_path_factory.mktemp("exports")
    plan = {rule: (run, []) for rule, run in runs.items()}
    plan["review_bf16"] = (runs["review"], ["--dtype", "bf16"])
    plan["standard_stock"] = (runs["standard"], ["--stock"])
    out = {}
    for name, (run, flags) in plan.items():
        out[name] = root / f"hf_{name}"  # distinct names: transformers caches remote code by directory name
        assert cli(["export", str(run), "--hf", str(out[name]), *flags]) == 0
    return out


@pytest.fixture(scope="module")
def every_rule(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.Tensor]]:
    """Every registered rule, untrained but with every parameter moved off its initial value (ReZero's zeros,
    the gates' 0.5), written as an export would write it: the directory and rrtrain's logits on TEXT."""
    root = tmp_path_factory.mktemp("every_rule")
    return {rule: write_untrained(root / f"rule_{rule}", rule) for rule in residuals.names()}


def write_untrained(out: Path, rule: str, pos: str = "learned") -> tuple[Path, torch.Tensor]:
    """An untrained `rule` (d_model 32, 2 blocks, seq_len 64) with every parameter moved off its initial value,
    written into `out` as an export writes it: the directory and rrtrain's logits on TEXT."""
    ids = torch.from_numpy(ByteTokenizer().encode_batch([TEXT])[0].astype(np.int64))[None]
    cfg = Config(model=ModelConfig(variant=rule, d_model=32, n_layers=2, n_heads=2, seq_len=64, pos=pos))
    model = build_model(cfg.model, 258, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        logits = model(ids)
    run = LoadedRun(model=model, config=cfg, step=0, tokenizer=ByteTokenizer(), checkpoint=out.parent,
                    shape=resolve_shape(cfg.model, 258))
    out.mkdir()
    write_into(out, run, torch.float32, stock=False)
    return out, logits


def transformers_env(work: Path) -> dict[str, str]:
    """A process environment for loading exports: its own empty transformers cache, offline, one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


#: LOADER's and GENERATOR's scripts, each with its own argv, one after the other in ONE process: transformers'
#: import (about 10 s of CPU) is paid once
BOTH = r"""
import json, sys
for code, argv in json.loads(sys.argv[1]):
    sys.argv = ["-c", *argv]
    exec(compile(code, "<-c>", "exec"), {"__name__": "__main__"})
"""


@pytest.fixture(scope="module")
def in_transformers(exports: dict[str, Path], every_rule: dict[str, tuple[Path, torch.Tensor]],
                    tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """What transformers makes of every export (LOADER), and what generation with each of GENERATION's exports
    gives (GENERATOR), in one process where rrtrain cannot be imported; the generation first, so that the
    loader's look at the modules loaded at its end covers both."""
    work = tmp_path_factory.mktemp("elsewhere")
    rope = tmp_path_factory.mktemp("generation")
    generate = {rule: str(path) for rule, (path, _) in every_rule.items()}
    generate.update({f"{rule}_rope": str(write_untrained(rope / f"rope_{rule}", rule, "rope")[0])
                     for rule in ROPE_RULES})
    load = {name: (str(path), not name.endswith("_stock")) for name, path in exports.items()}
    load.update({f"rule_{rule}": (str(path), True) for rule, (path, _) in every_rule.items()})
    found, made = work / "found.pt", work / "generated.pt"
    parts = [(GENERATOR, [json.dumps(generate), json.dumps(PROMPTS), str(NEW_TOKENS), str(made)]),
             (LOADER, [json.dumps(load), TEXT, str(found)])]
    proc = subprocess.run([sys.executable, "-I", "-c", BOTH, json.dumps(parts)], cwd=work,
                          env=transformers_env(work), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(found, weights_only=False), torch.load(made, weights_only=False)


@pytest.fixture(scope="module")
def loaded(in_transformers: tuple[dict, dict]) -> dict:
    """What transformers makes of every export, in a process where rrtrain cannot be imported."""
    return in_transformers[0]


def rrtrain_logits(run: Path) -> tuple[list[int], torch.Tensor]:
    r = load_run(run)
    ids = [int(i) for i in r.tokenizer.encode_batch([TEXT])[0]]
    with torch.no_grad():
        return ids, r.model(torch.tensor([ids])).float()


# -- the loader ------------------------------------------------------------------------------


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_load_run_gives_the_model_config_step_and_tokenizer(runs: dict[str, Path]) -> None:
    r = load_run(runs["review"])
    assert checkpoint_steps(runs["review"]) == [3] and r.step == 3
    assert r.checkpoint == runs["review"] / "artifact" / "step_00000003"  # the artifact training wrote
    assert r.config.model.variant == "review" and isinstance(r.tokenizer, ByteTokenizer)
    assert not r.model.training and next(r.model.parameters()).dtype == torch.float32
    # the weights are the trained ones: the loss on a validation-like text is what 3 steps give, not chance
    ids = torch.from_numpy(r.tokenizer.encode_batch([TEXT])[0].astype(np.int64))[None]
    with torch.no_grad():
        assert r.model(ids[:, :-1], ids[:, 1:]).item() < np.log(258) - 0.1
    assert load_run(runs["review"], 3, dtype=torch.bfloat16).model.tok_emb.weight.dtype == torch.bfloat16


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_load_run_checks_the_files_against_the_manifest(runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["review"], run)
    shutil.rmtree(run / "artifact")  # a run from before artifacts: its checkpoint is read
    shard = next((run / "checkpoints" / "step_00000003" / "state").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="does not match its xxh64 checksum"):
        load_run(run, 3)


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_a_checkpoints_recorded_shape_past_its_weights_is_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    """train_state.json's shape (another user's run) naming a model far larger than the weights stored: refused
    before the model is built, not the allocator's traceback."""
    run = tmp_path / "run"
    shutil.copytree(runs["review"], run)
    shutil.rmtree(run / "artifact")
    state = run / "checkpoints" / "step_00000003" / "train_state.json"
    record = json.loads(state.read_text())
    record["shape"]["d_model"] = 2**30
    state.write_text(json.dumps(record))
    with pytest.raises(UsageError, match="the recorded shape needs .* weights, more than the .* stored"):
        load_run(run, 3)


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_the_artifact_holds_the_checkpoints_weights_bit_for_bit(runs: dict[str, Path], tmp_path: Path) -> None:
    """Training's artifact (Engine.full_model_state) against the checkpoint read by the engines' offline reader
    (rrtrain/parallel/consolidate.py), for a run that ended before artifacts existed: the same tensors, bit for
    bit; model.json rebuilds the model and carries the tokenizer reference."""
    for rule, run in runs.items():
        from_artifact = load_run(run)
        legacy = tmp_path / rule
        shutil.copytree(run, legacy)
        shutil.rmtree(legacy / "artifact")
        from_checkpoint = load_run(legacy)
        assert from_checkpoint.checkpoint.parent.name == "checkpoints" and from_checkpoint.step == from_artifact.step
        a, b = from_artifact.model.state_dict(), from_checkpoint.model.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), rule
        record = from_artifact.record
        assert record["step"] == 3 and record["model"]["variant"] == rule and record["tokenizer"]["tokenizer"] == "byte"
        assert from_artifact.tokenizer.vocab_hash() == from_checkpoint.tokenizer.vocab_hash()
    art = runs["review"] / "artifact" / "step_00000003"
    assert sorted(p.name for p in art.iterdir() if not p.name.startswith(".")) == ["model.json", "model.safetensors"]
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in art.iterdir())


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_a_run_whose_checkpoints_link_to_scratch_exports_and_evaluates(runs: dict[str, Path], stories_data: Path,
                                                                       tmp_path: Path, capsys) -> None:
    """A run from before artifacts whose checkpoints/ the user moved to scratch and linked: export and eval read its
    checkpoint through the link, as training resumes through it (docs/reliability.md, "Where rrtrain follows a
    link"). Before, both said it had no checkpoint."""
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    shutil.copytree(runs["review"], run)
    shutil.rmtree(run / "artifact")
    shutil.move(run / "checkpoints", scratch)
    (run / "checkpoints").symlink_to(scratch)
    a, b = load_run(runs["review"]).model.state_dict(), load_run(run).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cli(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    assert cli(["eval", str(run), "--data", str(stories_data)]) == 0
    assert "rrtrain eval: validation loss on" in capsys.readouterr().out


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_a_warm_start_from_an_export_starts_from_its_weights(runs: dict[str, Path], exports: dict[str, Path],
                                                          stories_data: Path, tmp_path: Path) -> None:
    """The HF round trip: `init.from=EXPORT_DIR` gives the new run the exported weights (its one step at a learning
    rate of 1e-30 moves no weight measurably: its artifact's logits are the source's), a fresh optimizer, and
    RUN/init.json names the source and its sha256."""
    import hashlib

    new = tmp_path / "warm"
    train(new, stories_data, *SMALL, "model.variant=review", "train.max_steps=1", "train.lr=1e-30",
          f"init.from={exports['review']}")
    record = json.loads((new / "init.json").read_text())
    weights = exports["review"] / "model.safetensors"
    assert record["source"] == str(exports["review"]) and record["kind"] == "export"
    assert record["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    ids, want = rrtrain_logits(runs["review"])
    got = load_run(new)
    assert got.step == 1
    with torch.no_grad():
        logits = got.model(torch.tensor([ids])).float()
    assert torch.allclose(logits, want, rtol=0, atol=1e-5), (logits - want).abs().max()


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_the_export_has_a_model_card_no_marker_and_its_parent_made(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "new" / "parent" / "hf"
    assert cli(["export", str(runs["review"]), "--hf", str(out)]) == 0
    assert not any(p.name.startswith(".rrtrain") for p in out.rglob("*"))
    card = (out / "README.md").read_text()
    r = load_run(runs["review"])
    for fact in ("`review`", f"{sum(p.numel() for p in r.model.parameters()):,} parameters", "tokens seen | 768",
                 f"validation loss | {r.val_loss:.4f}", str(r.config.data.path)):
        assert fact in card, fact


def review_artifact(run_dir: Path, pos: str = "learned") -> tuple[Path, torch.nn.Module]:
    """A small review model's artifact of step 7, as training writes it (a byte tokenizer), and the model."""
    from rrtrain.training import artifact

    model = build_model(ModelConfig(variant="review", d_model=32, n_layers=1, n_heads=2, seq_len=16, pos=pos), 258,
                        seed=0)

    class Engine:
        inner = model

        def full_model_state(self):
            return {k: v.float() for k, v in model.state_dict().items()}

    ref = {"tokenizer": "byte", "tokenizer_file": None, "eos_id": 256, "bos_id": None, "vocab_size": 258,
           "tokenizer_hash": ByteTokenizer().vocab_hash(), "data_dir": None}
    return artifact.write(Engine(), run_dir, 7, 100, 1.5, ref, is_main=True), model


def test_a_tampered_artifact_is_refused_in_one_line(tmp_path: Path) -> None:
    """model.json's sha256 guards the weights; a record that is not one is one line."""
    from rrtrain.artifact.run import load_artifact

    out, model = review_artifact(tmp_path)
    assert out == tmp_path / "artifact" / "step_00000007"
    loaded, record, tok = load_artifact(out)
    assert record["step"] == 7 and isinstance(tok, ByteTokenizer)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    blob = bytearray((out / "model.safetensors").read_bytes())
    blob[-1] ^= 1
    (out / "model.safetensors").write_bytes(bytes(blob))
    with pytest.raises(UsageError, match="does not match the sha256") as got:
        load_artifact(out)
    assert "\n" not in str(got.value)
    (out / "model.json").write_text('{"format": 9}')
    with pytest.raises(UsageError, match="is not a model artifact's record"):
        load_artifact(out)


FORGED = {  # a field of model.json another user rewrote (the weights' sha256 still matches): what it names
    "tokenizer spec a number": (("tokenizer", "tokenizer"), 5, "tokenizer reference"),
    "tokenizer spec a list": (("tokenizer", "tokenizer"), ["byte"], "tokenizer reference"),
    "eos a string": (("tokenizer", "eos_id"), "256", "tokenizer reference"),
    "width a float": (("model", "shape", "d_model"), 1e9, "model.shape"),
    "width 10^12": (("model", "shape", "d_model"), 10**12, "model.shape"),
    "width 2^30": (("model", "shape", "d_model"), 2**30, "weights, more than the"),
    "heads that do not divide the width": (("model", "shape", "n_heads"), 3, "d_model=32 is not divisible by n_heads=3"),
    "blocks past the weights": (("model", "shape", "n_layers"), 4000, "weights, more than the"),
    "a knob of the wrong type": (("model", "residual", "gate_rank"), "x", "gate_rank"),
    "an unknown knob": (("model", "residual", "gate_rnk"), 1, "gate_rnk"),
    "norm_eps a string": (("model", "norm_eps"), "x", "model.norm_eps"),
    "norm_eps a list": (("model", "norm_eps"), [1], "model.norm_eps"),
    "an unknown rule": (("model", "variant"), ["review"], "model.variant"),
    "an eod past the vocabulary": (("model", "eod_id"), 10**6, "model.eod_id"),
    "document positions unknown": (("model", "doc_positions"), ["x"], "model.doc_positions"),
}


@pytest.mark.parametrize("field, value, names", FORGED.values(), ids=FORGED.keys())
def test_a_forged_model_record_is_one_line_before_anything_is_built(field, value, names, tmp_path: Path) -> None:
    """Each of these ended `rrtrain export`, `eval` and `init.from=` in a traceback (AttributeError, TypeError,
    the allocator's RuntimeError for 10^15 bytes): the record is checked field by field, and its shape against
    the weights stored, before a model is built."""
    from rrtrain.artifact.run import load_artifact

    out, _ = review_artifact(tmp_path)
    record = json.loads((out / "model.json").read_text())
    place = record
    for key in field[:-1]:
        place = place[key]
    place[field[-1]] = value
    (out / "model.json").write_text(json.dumps(record))
    with pytest.raises(UsageError) as got:
        load_artifact(out)
    assert names in str(got.value) and "\n" not in str(got.value), str(got.value)


FORGED_MODELS = {  # model.json rewritten as a whole (weights and sha256 untouched) to name a model that is not them
    "2^30 positions of a RoPE model": ("rope", {"shape": {"seq_len": 2**30}}, "never stores"),
    "a rule of 2^17 streams": ("learned", {"variant": "hc", "residual": {"streams": 2**17}},
                               "does not hold this model"),
}


@pytest.mark.parametrize("pos, model, names", FORGED_MODELS.values(), ids=FORGED_MODELS.keys())
def test_a_record_of_a_model_the_weights_are_not_is_one_line_before_any_memory_is_taken(pos, model, names,
                                                                                         tmp_path: Path) -> None:
    """RoPE's tables (built from the shape, never stored) and a rule's own tensors (HC's n x n mixing per
    sublayer) are not in the shape's weight count: these asked the allocator for 64 GiB and ended in its
    traceback (a smaller number would have been granted and filled). The model is built on the meta device and
    compared with the weights first."""
    from rrtrain.artifact.run import load_artifact

    out, _ = review_artifact(tmp_path, pos)
    record = json.loads((out / "model.json").read_text())
    record["model"]["shape"].update(model.pop("shape", {}))
    record["model"].update(model)
    (out / "model.json").write_text(json.dumps(record))
    with pytest.raises(UsageError) as got:
        load_artifact(out)
    assert names in str(got.value) and "\n" not in str(got.value), str(got.value)


def test_a_rope_models_tables_are_built_up_to_what_its_weights_justify(tmp_path: Path) -> None:
    """The bound on the tables is not a bound on context: a genuine RoPE artifact loads, and so does its record
    asking for 2^16 positions (tables of 2^20 numbers for a model of ~28,000 weights, within the slack)."""
    from rrtrain.artifact.run import load_artifact

    out, model = review_artifact(tmp_path, "rope")
    loaded, _, _ = load_artifact(out)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    record = json.loads((out / "model.json").read_text())
    record["model"]["shape"]["seq_len"] = 2**16
    (out / "model.json").write_text(json.dumps(record))
    assert load_artifact(out)[0].spec.shape.seq_len == 2**16


# -- the exported model, loaded without rrtrain ---------------------------------------------


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
@pytest.mark.parametrize("rule", list(RULES))
def test_remote_code_gives_rrtrains_logits(rule: str, runs: dict[str, Path], loaded: dict) -> None:
    ids, want = rrtrain_logits(runs[rule])
    got = loaded[rule]
    assert got["class"] == "RrtrainForCausalLM"
    assert got["ids"] == ids  # the exported tokenizer encodes as the run's
    assert got["logits"].shape == want.shape
    assert torch.allclose(got["logits"], want, rtol=0, atol=1e-5), (got["logits"] - want).abs().max()
    expected_loss = torch.nn.functional.cross_entropy(want[0, :-1], torch.tensor(ids[1:]))
    assert got["loss"] == pytest.approx(float(expected_loss), abs=1e-5)
    assert got["max_len"] == 64 and got["eos"] == 256


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
@pytest.mark.parametrize("rule", residuals.names())
def test_every_rule_loads_without_rrtrain(rule: str, every_rule: dict, loaded: dict) -> None:
    """Every registered rule (not only the four trained above), from its copied source."""
    got, want = loaded[f"rule_{rule}"]["logits"], every_rule[rule][1]
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_generate_gives_rrtrains_greedy_tokens(runs: dict[str, Path], loaded: dict) -> None:
    """`generate` (with its key/value cache) of a trained export gives rrtrain's own greedy tokens."""
    r = load_run(runs["review"])
    x = torch.from_numpy(r.tokenizer.encode_batch([TEXT])[0][:8].astype(np.int64))[None]
    with torch.no_grad():
        for _ in range(4):
            x = torch.cat([x, r.model(x)[:, -1:].argmax(-1)], dim=1)
    assert loaded["generated"] == x.tolist()


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_exports_are_self_contained(exports: dict[str, Path], loaded: dict) -> None:
    assert loaded["rrtrain_modules"] == []
    for name, path in exports.items():
        for py in path.glob("*.py"):
            for node in ast.walk(ast.parse(py.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    assert not (node.module or "").startswith(("rrtrain", "data_prep")), f"{name}/{py.name}"
                if isinstance(node, ast.Import):
                    assert not any(a.name.startswith("rrtrain") for a in node.names), f"{name}/{py.name}"


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_bf16_export_loads(exports: dict[str, Path], loaded: dict) -> None:
    from safetensors import safe_open

    with safe_open(str(exports["review_bf16"] / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert json.loads((exports["review_bf16"] / "config.json").read_text())["dtype"] == "bfloat16"
    fp32, bf16 = loaded["review"]["logits"], loaded["review_bf16"]["logits"]
    assert torch.isfinite(bf16).all() and (bf16 - fp32).abs().max() < 0.05


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_standard_exports_as_stock_arcee(runs: dict[str, Path], exports: dict[str, Path], loaded: dict) -> None:
    assert not list(exports["standard_stock"].glob("*.py"))  # no remote code at all
    ids, want = rrtrain_logits(runs["standard"])
    got = loaded["standard_stock"]
    assert got["class"] == "ArceeForCausalLM" and got["ids"] == ids
    assert torch.allclose(got["logits"], want, rtol=0, atol=1e-5), (got["logits"] - want).abs().max()


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_export_writes_the_usual_files(exports: dict[str, Path]) -> None:
    files = {p.name for p in exports["mhc"].iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "modeling_rrtrain.py", "configuration_rrtrain.py", "mhc.py", "transformer.py"} <= files
    config = json.loads((exports["mhc"] / "config.json").read_text())
    assert config["model_type"] == "rrtrain" and config["rrtrain"]["variant"] == "mhc"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_rrtrain.RrtrainForCausalLM"
    assert config.get("tie_word_embeddings", True) is True and config["rrtrain"]["residual"]["streams"] == 4
    assert json.loads((exports["mhc"] / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    assert not [p for p in exports["mhc"].parent.iterdir() if p.name.startswith(".")]  # no staging left


# -- generation: padding, the key/value cache, the length (untrained exports: fast) ------------

#: run in a subprocess where rrtrain cannot be imported: generation with every export, written to a file
GENERATOR = r"""
import importlib.abc, json, sys
class NoRrtrain(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("rrtrain", "data_prep", "launchers"):
            raise ImportError(f"{name}: rrtrain is not installed here")
sys.meta_path.insert(0, NoRrtrain())
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
jobs, prompts, new, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
greedy = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)  # min: no row stops early at EOS

def without_cache(model, ids, eos):
    # greedy decoding by whole forwards, no generate: what the cached decode must equal
    for _ in range(new):
        with torch.no_grad():
            logits = model(ids).logits[:, -1]
        logits[:, eos] = float("-inf")
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids

def refusal(call):
    try:
        call()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None

found = {}
for name, path in jobs.items():
    model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(path)
    eos = tok.eos_token_id
    f = found[name] = {"tokenizer_keys": sorted(tok(prompts[0]).keys()), "padding_side": tok.padding_side}
    batch = tok(prompts, padding=True, return_tensors="pt")  # left-padded (the tokenizer's side)
    res = model.generate(**batch, **greedy, output_logits=True, return_dict_in_generate=True)
    f["batched"] = {"mask": batch["attention_mask"], "tokens": res.sequences, "logits": torch.stack(res.logits, 1)}
    f["single"], f["no_cache"], f["no_cache_generate"] = [], [], []
    for p in prompts:
        one = tok(p, return_tensors="pt")  # generate(**tokenizer(text)): input_ids and attention_mask
        r = model.generate(**one, **greedy, output_logits=True, return_dict_in_generate=True)
        f["single"].append({"tokens": r.sequences[0], "logits": torch.stack(r.logits, 1)[0],
                            "cache": (type(r.past_key_values).__name__, int(r.past_key_values.get_seq_length()))
                            if r.past_key_values is not None else None})
        f["no_cache"].append(without_cache(model, one["input_ids"], eos)[0])
        f["no_cache_generate"].append(model.generate(**one, **greedy, use_cache=False)[0])
    with torch.no_grad():
        f["padded_logits"] = {}
        for side in ("left", "right"):
            tok.padding_side = side
            b = tok(prompts, padding=True, return_tensors="pt")
            f["padded_logits"][side] = (b["attention_mask"], model(**b).logits)
        f["unpadded_logits"] = [model(**tok(p, return_tensors="pt")).logits[0] for p in prompts]
        one = tok(prompts[0], return_tensors="pt")
        one = {**one, "token_type_ids": torch.zeros_like(one["input_ids"])}
        f["with_token_type_ids"] = model(**one).logits[0]
    f["generate_with_token_type_ids"] = refusal(lambda: model.generate(**one, max_new_tokens=2, do_sample=False))
    tok.padding_side = "left"
    text = pipeline("text-generation", model=model, tokenizer=tok)(prompts[1], max_new_tokens=new,
                                                                   min_new_tokens=new, do_sample=False)
    f["pipeline"] = text[0]["generated_text"]
    f["decoded_single"] = tok.decode(f["single"][1]["tokens"])
    n = model.config.max_position_embeddings
    long = torch.randint(0, eos, (1, n - 4))
    f["max_len"] = n
    past = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)  # min: no EOS ends it before the length
    f["too_long_generate"] = refusal(lambda: model.generate(long, **past))
    f["too_long_no_cache"] = refusal(lambda: model.generate(long, **past, use_cache=False))
    f["too_long_forward"] = refusal(lambda: model(torch.randint(0, eos, (1, n + 1))))
    f["full_length"] = model(torch.randint(0, eos, (1, n))).logits.shape[1]
torch.save(found, out)
"""

PROMPTS = [TEXT[:21], TEXT[:6], TEXT[:14]]  # three lengths: two rows of each batch are padded
NEW_TOKENS = 5
ROPE_RULES = ("standard", "mhc")  # RoPE's positions, with a single-stream state and a multi-stream one
#: every rule with learned positions (every_rule's exports), and ROPE_RULES with RoPE
GENERATION = [*residuals.names(), *(f"{rule}_rope" for rule in ROPE_RULES)]


@pytest.fixture(scope="module")
def generated(in_transformers: tuple[dict, dict]) -> dict:
    """What generation with each of GENERATION's exports gives, in a process where rrtrain cannot be imported."""
    return in_transformers[1]


@pytest.mark.slow  # trains tiny runs; the transformers process generates with every rule's export
@pytest.mark.parametrize("name", GENERATION)
def test_left_padded_batch_generates_as_each_prompt_alone(name: str, generated: dict) -> None:
    """Batched greedy generation over left-padded prompts gives each prompt's own tokens, and its logits at every
    step within 1e-5: padding is not attended to and positions start at each row's first real token."""
    got = generated[name]
    assert got["padding_side"] == "left"
    mask, tokens, logits = got["batched"]["mask"], got["batched"]["tokens"], got["batched"]["logits"]
    assert not bool(mask.all())  # the batch is padded
    for row, single in enumerate(got["single"]):
        pads = int((mask[row] == 0).sum())
        assert pads == mask.shape[1] - len(single["tokens"]) + NEW_TOKENS
        assert tokens[row, pads:].tolist() == single["tokens"].tolist(), row
        diff = (logits[row] - single["logits"]).abs().max()
        assert diff <= 1e-5, (row, float(diff))


@pytest.mark.slow  # trains tiny runs; the transformers process generates with every rule's export
@pytest.mark.parametrize("name", GENERATION)
def test_padded_forward_gives_the_unpadded_logits(name: str, generated: dict) -> None:
    """Left and right padding alike: the real tokens' logits are those of the prompt alone."""
    got = generated[name]
    for side, (mask, logits) in got["padded_logits"].items():
        for row, want in enumerate(got["unpadded_logits"]):
            real = logits[row][mask[row].bool()]
            assert real.shape == want.shape, (side, row)
            diff = (real - want).abs().max()
            assert diff <= 1e-5, (side, row, float(diff))
            assert torch.isfinite(logits[row]).all(), (side, row)  # padded positions stay finite too


@pytest.mark.slow  # trains tiny runs; the transformers process generates with every rule's export
@pytest.mark.parametrize("name", GENERATION)
def test_cached_generation_equals_decoding_without_cache(name: str, generated: dict) -> None:
    """`generate` (a DynamicCache by default) gives the tokens of greedy decoding by whole forwards, for every
    rule: attention's keys and values are all the state a rule carries across positions."""
    got = generated[name]
    for row, single in enumerate(got["single"]):
        # the cache was used: it holds every token but the last generated one
        assert single["cache"] == ("DynamicCache", len(single["tokens"]) - 1), row
        assert single["tokens"].tolist() == got["no_cache"][row].tolist(), row
        assert got["no_cache_generate"][row].tolist() == got["no_cache"][row].tolist(), row


@pytest.mark.slow  # trains tiny runs; the transformers process generates with every rule's export
def test_tokenizer_output_goes_straight_into_generate(generated: dict) -> None:
    """`model.generate(**tokenizer(text))` works (the single-prompt generations above are made so): the
    tokenizer returns no token_type_ids, and the model ignores them when given."""
    for got in generated.values():
        assert got["tokenizer_keys"] == ["attention_mask", "input_ids"]
        torch.testing.assert_close(got["with_token_type_ids"], got["unpadded_logits"][0], rtol=0, atol=0)
        assert got["generate_with_token_type_ids"] is None  # generate passes them on, the model takes them


@pytest.mark.slow  # trains tiny runs; the transformers process generates with every rule's export
def test_text_generation_pipeline(generated: dict) -> None:
    for name, got in generated.items():
        assert got["pipeline"] == got["decoded_single"], name
        assert got["pipeline"].startswith(PROMPTS[1]) and len(got["pipeline"]) > len(PROMPTS[1]), name


@pytest.mark.slow  # trains tiny runs; the transformers process generates with every rule's export
def test_generating_past_the_length_is_a_clear_error(generated: dict) -> None:
    """The first forward past max_position_embeddings (64) is a ValueError naming both lengths; 64 is fine."""
    for name, got in generated.items():
        assert got["max_len"] == 64 and got["full_length"] == 64, name
        for key in ("too_long_generate", "too_long_no_cache"):
            assert got[key] == ("ValueError: a sequence of 65 tokens is longer than the model's maximum length of "
                                "64 tokens (its seq_len, max_position_embeddings)"), (name, key, got[key])
        assert (got["too_long_forward"] or "").startswith("ValueError: a sequence of 65 tokens is longer"), name


# -- the pieces, for every rule and tokenizer ----------------------------------------------


def test_the_model_package_is_copied_as_it_is() -> None:
    """rrtrain/model/ and rrtrain/residuals/ file by file, unchanged, less the registry; every
    relative import names a copied file, none reaches rrtrain; the modeling file names each copied file."""
    files = bundle.package_files()
    root = Path(bundle.__file__).resolve().parents[1]
    expected = {p.name for d in ("model", "residuals") for p in (root / d).glob("*.py")}
    expected -= {"__init__.py"}
    assert set(files) == expected and {"transformer.py", "spec.py", "builtin.py", "base.py", "mhc.py"} <= expected
    for name, text in files.items():
        assert text == next((root / d / name) for d in ("model", "residuals") if (root / d / name).exists()).read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert node.level in (0, 1), f"{name}: from {'.' * node.level}{node.module}"
                if node.level == 0:
                    assert not (node.module or "").startswith(("rrtrain", "data_prep")), f"{name}: {node.module}"
                else:
                    assert f"{node.module}.py" in files, f"{name}: from .{node.module}"
    modeling = bundle.template_files(sorted(f[:-3] for f in files))["modeling_rrtrain.py"]
    assert bundle.MARKER not in modeling
    assert all(f"from .{f[:-3]} import __name__ as" in modeling for f in files)
    assert {spec.name for spec in residuals.BUILTIN} == set(residuals.names())  # every built-in rule travels


def test_a_rule_from_another_package_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its module imports rrtrain, which an export does not carry: one line, nothing written."""
    from rrtrain.residuals import RuleSpec
    from rrtrain.residuals.single import PreNormSite, SingleStream

    monkeypatch.setattr(residuals, "_RULES", dict(residuals._RULES))
    outside = residuals.register(RuleSpec(name="_outside", site=PreNormSite, stream=SingleStream, summary="x"))
    with pytest.raises(UsageError, match="residual rule '_outside' comes from another package"):
        bundle.write(tmp_path, outside)
    assert not list(tmp_path.iterdir())
    bundle.check_exportable(residuals.get("review"))  # a built-in rule is rrtrain's own


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_tokenizer_encodes_as_the_runs(kind: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    texts = ["Once upon a time there was a little fox.", "The fox ran home. <|endoftext|> The end."] * 40
    tok = ByteTokenizer() if kind == "byte" else train_bpe(300, iter(texts))
    hf_tokenizer(tok, 64).save_pretrained(str(tmp_path))
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in (SAMPLE, TEXT, "x<|endoftext|>y", " leading and trailing  ", "ünï 🦊\n\t"):
        assert again(text, verbose=False)["input_ids"] == [int(i) for i in tok.encode_batch([text])[0]], text
    assert again.eos_token_id == tok.eos_id


# -- bad input: one line, exit 2, nothing written -------------------------------------------


def _refused(capsys: pytest.CaptureFixture, argv: list[str], out: Path, message: str) -> None:
    before = sorted(p.name for p in out.parent.iterdir()) if out.parent.is_dir() else []
    assert cli(["export", *argv, "--hf", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rrtrain export: error: ") and "\n" not in err and message in err, err
    assert (sorted(p.name for p in out.parent.iterdir()) if out.parent.is_dir() else []) == before


def test_not_a_run_dir(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _refused(capsys, [str(tmp_path / "empty")], tmp_path / "out", "is not a run directory")


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_step_without_a_checkpoint(capsys: pytest.CaptureFixture, runs: dict[str, Path], tmp_path: Path) -> None:
    _refused(capsys, [str(runs["review"]), "--step", "2"], tmp_path / "out", "no model at step 2 (steps: 3)")


def test_run_without_any_checkpoint(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {variant: review}\n")
    (run / "metrics.jsonl").write_text("")
    _refused(capsys, [str(run)], tmp_path / "out", "has no checkpoint")


def test_existing_non_empty_out(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """Refused before the run is even looked at."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _refused(capsys, [str(tmp_path / "no-such-run")], out, "exists and is not empty")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_bad_dtype(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    _refused(capsys, [str(tmp_path), "--dtype", "fp16"], tmp_path / "out", "--dtype")


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_stock_for_a_rule_without_one(capsys: pytest.CaptureFixture, runs: dict[str, Path], tmp_path: Path) -> None:
    _refused(capsys, [str(runs["review"]), "--stock"], tmp_path / "out", "only 'standard' has a stock architecture")


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_config_that_does_not_validate(capsys: pytest.CaptureFixture, runs: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(runs["review"], run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("variant: review", "variant: reviewx"))
    _refused(capsys, [str(run)], tmp_path / "out", "does not validate")


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_tokenizer_that_does_not_match_the_checkpoint(capsys: pytest.CaptureFixture, runs: dict[str, Path],
                                                      stories_data: Path, tmp_path: Path) -> None:
    """A dataset (its manifest and tokenizer.json: what the loader reads) prepared with a trained BPE of 300."""
    data = tmp_path / "bpe_data"
    data.mkdir()
    tok = train_bpe(300, iter(["Once upon a time there was a fox."] * 50))
    manifest = json.loads((stories_data / "manifest.json").read_text())
    manifest.update(tokenizer=tok.spec, tokenizer_file=tok.save(str(data)), tokenizer_hash=tok.vocab_hash(),
                    vocab_size=tok.vocab_size, eos_id=tok.eos_id)
    (data / "manifest.json").write_text(json.dumps(manifest))
    _refused(capsys, [str(runs["review"]), "--data", str(data)], tmp_path / "out",
             "does not match the checkpoint's embedding (258 rows)")


def test_an_output_others_can_write_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """The trust_remote_code module would go where a co-tenant can replace it: refused before the run is read."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    assert cli(["export", str(tmp_path / "no-run"), "--hf", str(shared / "hf")]) == 2
    err = capsys.readouterr().err
    assert "' can be written by its group (mode 0775)" in err and err.count("\n") == 1
    assert not (shared / "hf").exists()


@pytest.mark.slow  # trains tiny runs (rrtrain.train in a subprocess)
def test_an_export_is_the_users_alone_under_a_shared_umask(runs: dict[str, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from rrtrain.core import files
    from rrtrain.export.hf import export_hf

    monkeypatch.delenv(files.GROUP_READ_ENV, raising=False)
    old = os.umask(0o002)
    try:
        export_hf(runs["review"], tmp_path / "hf")  # in-process, not under a command's umask
    finally:
        os.umask(old)
    made = [tmp_path / "hf", *(tmp_path / "hf").rglob("*")]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in made if p.stat().st_mode & 0o777 not in (0o700, 0o600)} == {}
    assert (tmp_path / "hf" / "modeling_rrtrain.py").is_file()
