"""`rrtrain export RUN_DIR --hf OUT` and the loader under it (rrtrain.model.from_run), issue 38.

Tiny real runs (d_model 32, 2 blocks, 3 steps) of `standard` (with RoPE, so that it also has a stock form),
`review`, `mhc` and `attnres` are trained once, exported through the CLI, and loaded by transformers in ONE
subprocess where importing rrtrain is impossible (a meta-path finder refuses it, cwd elsewhere, PYTHONPATH
cleared, an empty transformers module cache): the exported directories are self-contained. Their logits must
equal rrtrain's own model's within 1e-5 (fp32). Every other registered rule is written the same way from an
untrained model with perturbed weights and loaded in the same subprocess. Those tests are `slow` (they train);
the bundling of every rule, the tokenizers and the refusals that need no run are in the fast tier.
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
from rrtrain.model.from_run import LoadedRun, checkpoint_steps, load_run  # noqa: E402
from rrtrain.model.sizing import resolve_shape  # noqa: E402
from rrtrain.model.transformer import build_model  # noqa: E402
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
try:
    model(prompt, attention_mask=torch.tensor([[0] + [1] * 7]))
    found["left_padding"] = "accepted"
except ValueError as err:
    found["left_padding"] = str(err)
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
    ids = torch.from_numpy(ByteTokenizer().encode_batch([TEXT])[0].astype(np.int64))[None]
    out = {}
    for rule in residuals.names():
        cfg = Config(model=ModelConfig(variant=rule, d_model=32, n_layers=2, n_heads=2, seq_len=64))
        model = build_model(cfg.model, 258, seed=0).eval()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
            logits = model(ids)
        run = LoadedRun(model=model, config=cfg, step=0, tokenizer=ByteTokenizer(), checkpoint=root,
                        shape=resolve_shape(cfg.model, 258))
        (root / f"rule_{rule}").mkdir()
        write_into(root / f"rule_{rule}", run, torch.float32, stock=False)
        out[rule] = (root / f"rule_{rule}", logits)
    return out


@pytest.fixture(scope="module")
def loaded(exports: dict[str, Path], every_rule: dict[str, tuple[Path, torch.Tensor]],
           tmp_path_factory: pytest.TempPathFactory) -> dict:
    """What transformers makes of every export, in a process where rrtrain cannot be imported."""
    work = tmp_path_factory.mktemp("elsewhere")
    jobs = {name: (str(path), not name.endswith("_stock")) for name, path in exports.items()}
    jobs.update({f"rule_{rule}": (str(path), True) for rule, (path, _) in every_rule.items()})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    result = work / "found.pt"
    proc = subprocess.run([sys.executable, "-I", "-c", LOADER, json.dumps(jobs), TEXT, str(result)], cwd=work,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(result, weights_only=False)


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
    assert r.checkpoint == runs["review"] / "checkpoints" / "step_00000003"
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
    shard = next((run / "checkpoints" / "step_00000003" / "state").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="does not match its xxh64 checksum"):
        load_run(run, 3)


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
def test_generate_and_padding(runs: dict[str, Path], loaded: dict) -> None:
    """`generate` (no cache: the sequence is recomputed) gives rrtrain's greedy tokens; left padding is refused."""
    r = load_run(runs["review"])
    x = torch.from_numpy(r.tokenizer.encode_batch([TEXT])[0][:8].astype(np.int64))[None]
    with torch.no_grad():
        for _ in range(4):
            x = torch.cat([x, r.model(x)[:, -1:].argmax(-1)], dim=1)
    assert loaded["generated"] == x.tolist()
    assert "right padding only" in loaded["left_padding"]


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


# -- the pieces, for every rule and tokenizer ----------------------------------------------


@pytest.mark.parametrize("rule", residuals.names())
def test_every_builtin_rule_bundles_without_rrtrain(rule: str) -> None:
    files = bundle.source_files(residuals.get(rule))
    for name, text in files.items():
        compile(text, name, "exec")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith("rrtrain"), f"{name}: from {node.module}"
    assert "transformer.py" in files and "exported_rule.py" in files


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
    _refused(capsys, [str(runs["review"]), "--step", "2"], tmp_path / "out", "no checkpoint at step 2 (checkpoints: 3)")


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
