"""`rrtrain prep ...`: command-line front end of the data-prep stage.

Bad input becomes one line on stderr and exit status 2 (argparse errors included); Ctrl-C or
SIGTERM leaves OUT as it was and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

from data_prep import options
from data_prep.options import PrepOptions
from data_prep.prep import run_prep
from data_prep.writer import parse_size
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError, fail

PROG = "rrtrain prep"


def build_parser() -> argparse.ArgumentParser:
    """The parser of `rrtrain prep`; every default is PrepOptions' (data_prep/options.py)."""
    d = options.default
    p = CommandParser(prog=PROG,
                      description="Tokenize and pack a corpus into MDS shards (train/, val/) plus manifest.json.")
    p.add_argument("--source", required=True,
                   help="synthetic:stories | FILE.txt|.jsonl|.parquet (.txt/.jsonl also as .gz|.zst|.bz2|.xz) | DIR (files, "
                        "or a datasets.save_to_disk dir) | hf:NAME[:SPLIT]")
    p.add_argument("--tokenizer", default=d("tokenizer"), help=f"byte | bpe:VOCAB | hf:PATH_OR_NAME | tiktoken:NAME (default: {d('tokenizer')})")
    p.add_argument("--seq-len", type=int, default=d("seq_len"), help=f"tokens per training sequence; rows hold seq_len+1 ids (default: {d('seq_len')})")
    p.add_argument("--out", required=True, help="output directory (written atomically)")
    p.add_argument("--val-fraction", type=float, default=d("val_fraction"), help=f"share of documents held out for validation, in (0, 0.5] (default: {d('val_fraction')})")
    p.add_argument("--min-val-samples", type=int, default=d("min_val_samples"),
                   help=f"validation never has fewer rows than this; set it to at least one eval batch (default: {d('min_val_samples')})")
    p.add_argument("--workers", type=int, default=d("workers"), help=f"tokenizing processes (default: {d('workers')})")
    p.add_argument("--num-docs", type=int, default=d("num_docs"), help="number of documents (synthetic size; a limit for other sources)")
    p.add_argument("--overwrite", action="store_true", help="replace an OUT that holds an rrtrain dataset (the old one stays until the new one is complete); never the working directory, a parent of it or a home")
    p.add_argument("--doc-sep", choices=options.DOC_SEPS, default=d("doc_sep"), help=".txt documents: separated by blank lines, or one per line")
    p.add_argument("--text-field", default=d("text_field"), help=f"jsonl field / parquet or dataset column holding the text (default: {d('text_field')})")
    p.add_argument("--compression", choices=options.COMPRESSIONS, default=d("compression") or "none",
                   help=f"shard compression (default: {d('compression') or 'none'})")
    p.add_argument("--seed", type=int, default=d("seed"), help=f"seed of the synthetic corpus and of the train/val split (default: {d('seed')})")
    p.add_argument("--shard-size", default=str(d("shard_size")), help=f"shard size limit before compression (default: {d('shard_size') >> 20}mb)")
    p.add_argument("--bpe-sample-docs", type=int, default=d("bpe_sample_docs"), help=f"documents a bpe tokenizer is trained on (default: {d('bpe_sample_docs')})")
    p.add_argument("--eos-token", default=d("eos_token"), help="end-of-document token of an hf tokenizer, when not one of the usual names")
    p.add_argument("--bos", action="store_true",
                   help="a beginning-of-document token before each document (hf tokenizers that have one; bpe:VOCAB "
                        "reserves <|startoftext|>; byte and tiktoken have none and are refused)")
    p.add_argument("--bos-token", default=d("bos_token"), help="with --bos: the token's name, when not one of the usual names")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument("--executor", choices=("local", "slurm"), default=None,
                   help="tokenize in --tasks array tasks: subprocesses here, or a Slurm job array (prep waits for it; "
                        "OUT's file system must be one every node sees); the dataset is the one-process one")
    p.add_argument("--tasks", type=int, default=None,
                   help="array tasks the documents are split across (a directory: by files; else by chunks)")
    p.add_argument("--partition", default=None, help="--executor slurm: the partition of the tasks")
    p.add_argument("--time-min", type=int, default=60, help="--executor slurm: each task's time limit (default: 60)")
    p.add_argument("--mem-gb", type=float, default=4.0, help="--executor slurm: each task's memory (default: 4)")
    p.epilog = "rrtrain prep --verify DIR: check every shard of a prepared dataset (hashes, token ids, indexes)"
    return p


def options_from_args(argv: list[str]) -> PrepOptions:
    a = build_parser().parse_args(argv)
    return PrepOptions(
        source=a.source, out=a.out, tokenizer=a.tokenizer, seq_len=a.seq_len, val_fraction=a.val_fraction,
        min_val_samples=a.min_val_samples, workers=a.workers, num_docs=a.num_docs, overwrite=a.overwrite,
        doc_sep=a.doc_sep, text_field=a.text_field, compression=None if a.compression == "none" else a.compression,
        seed=a.seed, shard_size=parse_size(a.shard_size), bpe_sample_docs=a.bpe_sample_docs, eos_token=a.eos_token,
        bos=a.bos, bos_token=a.bos_token, progress=not a.quiet,
    )


def cluster_from_args(argv: list[str]):  # noqa: ANN201 - a data_prep.cluster.ClusterOptions, or None
    """`--executor` / `--tasks` (and the Slurm task's resources), or None for one process (`--workers` only)."""
    a = build_parser().parse_args(argv)
    if a.executor is None and a.tasks is None:
        if a.partition is not None:
            raise UsageError("--partition is for --executor slurm")
        return None
    from data_prep.cluster import ClusterOptions

    return ClusterOptions(executor=a.executor or "local", tasks=a.tasks if a.tasks is not None else 1,
                          partition=a.partition, time_min=a.time_min, mem_gb=a.mem_gb)


def verify_main(argv: list[str]) -> int:
    """`rrtrain prep --verify DIR`: every shard's length, hash and token ids, every index against the manifest.

    Prints one line per problem on stderr and a JSON summary on stdout; exit 0 when clean, 2 otherwise."""
    if len(argv) != 1:
        raise UsageError("usage: rrtrain prep --verify DIR")
    from rrtrain.data.manifest import is_remote, read_manifest
    from rrtrain.data.verify import dataset_problems, read_index

    path = argv[0]
    if is_remote(path):
        raise UsageError(f"--verify reads a local directory; '{path}' is remote (verify a local copy)")
    manifest = read_manifest(path)
    problems = list(dataset_problems(path, manifest))
    for problem in problems:
        print(f"{PROG}: {path}: {problem}", file=sys.stderr)
    summary: dict[str, object] = {"path": path, "ok": not problems, "problems": len(problems)}
    for split in ("train", "val"):
        try:
            shards = read_index(os.path.join(path, split), split)
        except UsageError:
            continue
        summary[f"{split}_shards"] = len(shards)
        summary[f"{split}_samples"] = sum(int(s.get("samples", 0)) for s in shards)
        summary[f"{split}_bytes"] = sum(int((s.get("zip_data") or s.get("raw_data") or {}).get("bytes") or 0) for s in shards)
    print(json.dumps(summary))
    return 0 if not problems else 2


def main(argv: list[str] | None = None, run_array_for: Callable[..., Any] | None = None) -> int:
    """`rrtrain prep`. `run_array_for(cluster, opts)`: what runs the array tasks of `--executor/--tasks`
    (`rrtrain.cli.prep`, over the sweep side's executors, which this layer does not import)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(x in ("-h", "--help") for x in argv):
        build_parser().print_help()
        return 0
    if argv and argv[0] == "--verify":
        try:
            return verify_main(argv[1:])
        except UsageError as err:
            return fail(PROG, str(err))
    try:
        opts = options_from_args(argv)
        cluster = cluster_from_args(argv)
        if cluster is None:
            manifest = run_prep(opts)
        else:
            from data_prep.cluster import run_prep_tasks

            if run_array_for is None:
                raise UsageError("--executor/--tasks: run it as `rrtrain prep` (python -m rrtrain prep)")
            cluster.validate()
            manifest = run_prep_tasks(opts, cluster, run_array_for(cluster, opts))
    except UsageError as err:
        return fail(PROG, str(err))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the output directory was left as it was", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk, a quota, an I/O error: not bad input, but still one line
        where = f" ({err.filename})" if err.filename else ""
        fail(PROG, f"cannot write the dataset: {err.strerror or err}{where}; the output directory was left as it was")
        return 1
    if not opts.progress:
        return 0
    tr, va = manifest["splits"]["train"], manifest["splits"]["val"]
    print(json.dumps({
        "out": opts.out, "vocab_size": manifest["vocab_size"], "seq_len": manifest["seq_len"],
        "train_samples": tr["samples"], "train_tokens": tr["tokens"], "val_samples": va["samples"],
        "unigram_entropy": manifest["unigram_entropy"], "fingerprint": manifest["fingerprint"][:16],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
