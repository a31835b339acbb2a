"""What `rrtrain prep` takes, with every default written once: the command line's parser reads its defaults from
here, and whoever starts a prep (a sweep's `prep:`, `rrtrain check-rule`) builds its command from a `PrepOptions`
(`command`), so the two cannot drift apart.

Light on purpose (no numpy, no tokenizer until `validate`): the sweep side imports it while reading a sweep file.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

from rrtrain.core.child_python import module_argv
from rrtrain.core.errors import UsageError


@dataclass
class PrepOptions:
    """Everything `rrtrain prep` takes; the command line's defaults are these."""

    source: str
    out: str
    tokenizer: str = "byte"
    seq_len: int = 128
    val_fraction: float = 0.005
    min_val_samples: int = 64
    workers: int = 1
    num_docs: int | None = None
    overwrite: bool = False
    doc_sep: str = "blank"
    text_field: str = "text"
    compression: str | None = None  # None: uncompressed (`--compression none`)
    seed: int = 0
    shard_size: int = 64 << 20  # bytes
    bpe_sample_docs: int = 50_000
    eos_token: str | None = None
    bos: bool = False  # a beginning-of-document token before each document (`--bos`)
    bos_token: str | None = None  # its name, when not one of the usual names (tokenizer.BOS_CANDIDATES)
    progress: bool = True  # False: `--quiet`
    chunk_docs: int = 256  # documents per tokenizing chunk (not on the command line)

    @classmethod
    def given(cls, source: str, out: str, **keys: Any) -> "PrepOptions":
        """Options from keys where None means "prep's default" (a sweep's `prep:` section leaves keys unset)."""
        return cls(source=source, out=out, **{k: v for k, v in keys.items() if v is not None})

    def validate(self) -> None:
        from data_prep import tokenizer as tk

        if self.seq_len < 2:
            raise UsageError(f"--seq-len must be at least 2, got {self.seq_len}")
        if not 0 < self.val_fraction <= 0.5:
            raise UsageError(f"--val-fraction must be in (0, 0.5], got {self.val_fraction}")
        if self.min_val_samples < 1:
            raise UsageError(f"--min-val-samples must be at least 1, got {self.min_val_samples}")
        if self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        if self.num_docs is not None and self.num_docs < 1:
            raise UsageError(f"--num-docs must be at least 1, got {self.num_docs}")
        if self.doc_sep not in DOC_SEPS:
            raise UsageError(f"--doc-sep must be 'blank' or 'line', got '{self.doc_sep}'")
        if self.compression not in (None, "zstd"):
            raise UsageError(f"--compression must be 'none' or 'zstd', got '{self.compression}'")
        if self.bpe_sample_docs < 1:
            raise UsageError("--bpe-sample-docs must be at least 1")
        kind, _ = tk.parse_spec(self.tokenizer)
        if self.bos_token is not None and not self.bos:
            raise UsageError("--bos-token names the token --bos adds: give --bos too")
        if self.bos and kind in ("byte", "tiktoken"):
            raise UsageError(f"--bos: tokenizer '{self.tokenizer}' has no beginning-of-document token (use an hf: "
                             "tokenizer that has one, or bpe:VOCAB, which then reserves <|startoftext|>)")

    def argv(self) -> list[str]:
        """The `rrtrain prep` arguments that give these options: --source and --out, then each option that is not
        its default, in the parser's order (`options_from_args(o.argv()) == o`)."""
        if self.chunk_docs != default("chunk_docs"):
            raise ValueError("chunk_docs has no command-line flag; run data_prep.prep.run_prep in process instead")
        args = ["--source", self.source, "--out", self.out]
        for name, flag in FLAGS.items():
            value = getattr(self, name)
            if value == default(name):
                continue
            if name in ("overwrite", "bos"):
                args.append(flag)
            elif name == "progress":
                args.append("--quiet")
            else:
                args += [flag, str(value)]
        return args


#: `--doc-sep`: documents of a .txt separated by blank lines, or one per line
DOC_SEPS = ("blank", "line")
#: `--compression`: "none" stands for PrepOptions.compression None
COMPRESSIONS = ("none", "zstd")
#: option -> its flag, in the parser's order (source and out aside: always given)
FLAGS = {
    "tokenizer": "--tokenizer", "seq_len": "--seq-len", "val_fraction": "--val-fraction",
    "min_val_samples": "--min-val-samples", "workers": "--workers", "num_docs": "--num-docs",
    "overwrite": "--overwrite", "doc_sep": "--doc-sep", "text_field": "--text-field", "compression": "--compression",
    "seed": "--seed", "shard_size": "--shard-size", "bpe_sample_docs": "--bpe-sample-docs", "eos_token": "--eos-token",
    "bos": "--bos", "bos_token": "--bos-token", "progress": "--quiet",
}


def default(name: str) -> Any:
    """A PrepOptions field's default (source and out have none)."""
    f = {g.name: g for g in dataclasses.fields(PrepOptions)}[name]
    if f.default is dataclasses.MISSING:
        raise KeyError(f"prep option {name!r} has no default")
    return f.default


def command(opts: PrepOptions, python: str = sys.executable) -> list[str]:
    """The command line that runs `rrtrain prep` with these options in a fresh process (nothing imported from
    the current directory: rrtrain.core.child_python)."""
    return module_argv("rrtrain", "prep", *opts.argv(), python=python)
