"""Warm starts (`init.from`, rrtrain/artifact/warm.py, issue 46), in-process: a tiny ArceeForCausalLM made here with
transformers maps onto `standard` with identical logits; an rrtrain export (untrained, perturbed weights, written
as `rrtrain export` writes it) comes back with identical logits; a LlamaForCausalLM (gated MLP), another rule,
another shape and a bad file are each one line. The trained round trip through `rrtrain train` is in
tests/unit/rrtrain/export/test_export_hf.py (slow). Runtime: about a second (the fast ones import no transformers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("safetensors")

from rrtrain.artifact.warm import read_source  # noqa: E402
from rrtrain.config import Config, ModelConfig  # noqa: E402
from rrtrain.core.errors import UsageError  # noqa: E402
from rrtrain.model.transformer import Transformer  # noqa: E402
from rrtrain.resolve import build_model, model_spec  # noqa: E402

VOCAB = 258
IDS = torch.tensor([[5, 17, 200, 3, 99, 42, 7, 255, 1, 64]])


def spec(rule: str = "standard", d_model: int = 32, **extra):
    m = ModelConfig(variant=rule, d_model=d_model, n_layers=2, n_heads=2, seq_len=16, pos="rope", **extra)
    return model_spec(m, VOCAB)


def warm_model(source: str, want) -> Transformer:
    warm = read_source(source, want)
    with torch.device("cpu"):
        model = Transformer(want, seed=None).eval()
    model.load_state_dict(warm.state, strict=True)
    return model


def arcee(tmp_path: Path, **over) -> tuple[Path, torch.Tensor]:
    s = spec().shape
    kw = dict(vocab_size=VOCAB, hidden_size=s.d_model, intermediate_size=s.d_ff, num_hidden_layers=s.n_layers,
              num_attention_heads=s.n_heads, num_key_value_heads=s.n_heads, head_dim=s.head_dim, hidden_act="gelu",
              max_position_embeddings=s.seq_len, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
              attention_bias=False, mlp_bias=False)
    kw.update(over)
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.ArceeForCausalLM(transformers.ArceeConfig(**kw)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # norms off 1: every tensor matters
        want = model(IDS).logits
    out = tmp_path / "arcee"
    model.save_pretrained(str(out))
    return out, want


@pytest.mark.slow  # in-process, but it imports transformers' modeling code (10-20 s on two busy cores)
def test_an_arcee_checkpoint_warm_starts_standard_with_identical_logits(tmp_path: Path) -> None:
    path, want = arcee(tmp_path)
    with torch.no_grad():
        got = warm_model(f"hf:{path}", spec())(IDS)
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()


def test_an_export_round_trips_with_identical_logits(tmp_path: Path) -> None:
    cfg = Config(model=ModelConfig(variant="review", d_model=32, n_layers=2, n_heads=2, seq_len=16, pos="rope"))
    model = build_model(cfg.model, VOCAB, seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        want = model(IDS)
    # what `rrtrain export` writes of the model (rrtrain/export/hf.py: config.json's `rrtrain` section, the weights
    # under `model.`), without transformers' import; the trained round trip through the CLI is test_export_hf's
    from safetensors.torch import save_file

    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"architectures": ["RrtrainForCausalLM"],
                                                 "rrtrain": {**model.spec.to_dict(), "step": 0, "tokenizer": "byte"}}))
    save_file({f"model.{k}": v.contiguous().clone() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"))
    with torch.no_grad():
        got = warm_model(str(out), model.spec)(IDS)
    assert torch.equal(got, want)
    with pytest.raises(UsageError, match="holds rule 'review', this run trains 'standard'") as err:
        read_source(str(out), spec())
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="has d_model=32, this run's model has d_model=64"):
        read_source(str(out), spec("review", d_model=64))


def arcee_config(**over) -> dict:
    """config.json of an ArceeForCausalLM of spec()'s shape, written by hand (transformers is not needed to refuse)."""
    s = spec().shape
    cfg = {"architectures": ["ArceeForCausalLM"], "vocab_size": VOCAB, "hidden_size": s.d_model,
           "intermediate_size": s.d_ff, "num_hidden_layers": s.n_layers, "num_attention_heads": s.n_heads,
           "num_key_value_heads": s.n_heads, "head_dim": s.head_dim, "hidden_act": "gelu", "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": True, "attention_bias": False,
           "mlp_bias": False}
    cfg.update(over)
    return cfg


def hf_dir(path: Path, config: dict, weights: bytes = b"never read") -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_mismatches_are_one_line(tmp_path: Path) -> None:
    path = hf_dir(tmp_path / "arcee", arcee_config())
    with pytest.raises(UsageError, match="hidden_size is 32, this run's model needs 64"):
        read_source(f"hf:{path}", spec(d_model=64))
    with pytest.raises(UsageError, match="only the `standard` rule maps onto one"):
        read_source(f"hf:{path}", spec("review"))
    with pytest.raises(UsageError, match="hidden_act is 'silu', this run's model needs 'gelu'"):
        read_source(f"hf:{hf_dir(tmp_path / 'silu', arcee_config(hidden_act='silu'))}", spec())
    llama = hf_dir(tmp_path / "llama", {"architectures": ["LlamaForCausalLM"], "hidden_size": 32})
    with pytest.raises(UsageError, match="LlamaForCausalLM: its MLP is gated") as err:
        read_source(f"hf:{llama}", spec())
    assert "\n" not in str(err.value)
    (path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(UsageError, match="is not a safetensors file"):
        read_source(f"hf:{path}", spec())
    with pytest.raises(UsageError, match="is neither a run directory"):
        read_source(str(tmp_path / "nowhere"), spec())


@pytest.mark.slow  # a refusal, but a fresh training process (over 10 s): kept out of the fast tier's budget
def test_rrtrain_train_refuses_a_mismatch_in_one_line_and_writes_nothing(tmp_path: Path, stories_data: Path) -> None:
    """Through `rrtrain train`: exit 2, one line, no run directory (the source is checked before it is made)."""
    from trainutil import train

    path, _ = arcee(tmp_path)
    run = tmp_path / "run"
    done = train(run, stories_data, "model.variant=standard", "model.d_model=64", "model.n_layers=2", "model.n_heads=2", "model.pos=rope",
                 f"init.from=hf:{path}", expect=2)
    lines = [l for l in done.stderr.splitlines() if "init.from" in l]
    assert len(lines) == 1 and "hidden_size is 32, this run's model needs 64" in lines[0], done.stderr[-2000:]
    assert not run.exists()
