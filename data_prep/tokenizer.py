"""Tokenizers behind one small interface: `byte`, `bpe:VOCAB`, `hf:PATH_OR_NAME`, `tiktoken:NAME`.

Every tokenizer is rebuilt in worker processes from a *spec* plus an optional file saved beside the
data, so a worker never needs the parent's objects (and a trained BPE travels as `tokenizer.json`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np

from rrtrain.core import files
from rrtrain.core.child_python import environ_while
from rrtrain.core.host_locks import private_host_dir
from rrtrain.core.errors import UsageError

UINT32_MAX_VOCAB = 1 << 32
EOS_TEXT = "<|endoftext|>"
# Tried in order when an hf tokenizer's end-of-document token is not given with --eos-token.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
#: `--bos`: the beginning-of-document token a trained bpe reserves, and the names tried in an hf tokenizer (in order)
BOS_TEXT = "<|startoftext|>"
BOS_CANDIDATES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>", "<|bos|>", "[CLS]")


class Tokenizer(Protocol):
    """What the data-prep pipeline needs from a tokenizer."""

    spec: str
    vocab_size: int
    eos_id: int

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def vocab_hash(self) -> str: ...
    def save(self, out_dir: str) -> str | None: ...


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ByteTokenizer:
    """UTF-8 bytes 0..255, then `<|endoftext|>` = 256 and `<|pad|>` = 257 (reserved, never written)."""

    spec = "byte"
    vocab_size = 258
    eos_id = 256
    pad_id = 257

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.uint32) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def vocab_hash(self) -> str:
        return _sha256(b"rrtrain-byte-tokenizer-v1:eos=256:pad=257")

    def save(self, out_dir: str) -> str | None:
        return None


class HFTokenizer:
    """A `tokenizers.Tokenizer` (trained BPE or loaded from tokenizer.json / a pretrained name)."""

    def __init__(self, spec: str, tok: "object", eos_id: int) -> None:
        self.spec = spec
        self._tok = tok
        self.eos_id = eos_id
        self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))  # type: ignore[attr-defined]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self._tok.encode_batch(texts, add_special_tokens=False)  # type: ignore[attr-defined]
        return [np.asarray(e.ids, dtype=np.uint32) for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)  # type: ignore[attr-defined]

    def to_json(self) -> str:
        return self._tok.to_str(pretty=False)  # type: ignore[attr-defined]

    def vocab_hash(self) -> str:
        return _sha256(self.to_json().encode("utf-8"))

    def save(self, out_dir: str) -> str | None:
        files.atomic_write_beneath(out_dir, "tokenizer.json", self.to_json().encode("utf-8"))
        return "tokenizer.json"


TIKTOKEN_CACHE_ENV = "TIKTOKEN_CACHE_DIR"


def _private_tiktoken_cache() -> contextlib.AbstractContextManager[None]:
    """tiktoken's download cache, for the block, in a directory only the user can write: TIKTOKEN_CACHE_DIR when
    set (checked), else `$TMPDIR/rrtrain-<uid>-tiktoken` (or, when another user made that name first, a private
    directory recorded for this host: rrtrain.core.host_locks.private_host_dir). tiktoken's own default,
    /tmp/data-gym-cache, is a name anyone on the machine may have made first, and it opens the files there with
    a plain open(): a FIFO planted at an encoding's name hung prep."""
    where = os.environ.get(TIKTOKEN_CACHE_ENV)
    if not where:
        where = private_host_dir(tempfile.gettempdir(), f"rrtrain-{os.geteuid()}-tiktoken", what="tiktoken's cache")
    why = files.prepare_private_dir(where)
    if why is not None:
        raise UsageError(f"tiktoken's cache {where} ({TIKTOKEN_CACHE_ENV}): {why}: set {TIKTOKEN_CACHE_ENV} to a "
                         "directory of yours no one else can write")
    return environ_while(TIKTOKEN_CACHE_ENV, os.path.abspath(where))


class TiktokenTokenizer:
    """An OpenAI tiktoken encoding (needs its BPE file: network or a populated TIKTOKEN_CACHE_DIR)."""

    def __init__(self, name: str) -> None:
        try:
            import tiktoken
        except ImportError as err:
            raise UsageError(f"tokenizer 'tiktoken:{name}' needs the tiktoken package (pip install tiktoken)") from err
        try:
            with _private_tiktoken_cache():
                self._enc = tiktoken.get_encoding(name)
        except UsageError:
            raise
        except ValueError as err:
            raise UsageError(f"unknown tiktoken encoding '{name}'") from err
        except Exception as err:  # network errors: requests/urllib raise many types
            raise UsageError(f"tiktoken encoding '{name}' could not be fetched ({type(err).__name__}): offline, set "
                             "TIKTOKEN_CACHE_DIR to a directory holding its BPE file (filled once on a machine with "
                             "network: run tiktoken.get_encoding there with the same TIKTOKEN_CACHE_DIR)") from err
        self.spec = f"tiktoken:{name}"
        self.eos_id = int(self._enc.eot_token)
        self.vocab_size = int(self._enc.n_vocab)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        out = self._enc.encode_ordinary_batch(texts, num_threads=1)
        return [np.asarray(ids, dtype=np.uint32) for ids in out]

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))

    def vocab_hash(self) -> str:
        h = hashlib.sha256(self.spec.encode())
        for token, rank in sorted(self._enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
            h.update(rank.to_bytes(8, "little") + token)
        for token, rank in sorted(self._enc._special_tokens.items()):
            h.update(token.encode() + rank.to_bytes(8, "little"))
        return h.hexdigest()

    def save(self, out_dir: str) -> str | None:
        return None


def parse_spec(spec: str) -> tuple[str, str]:
    """Split 'kind:arg' and check the kind; `byte` has no argument."""
    kind, _, arg = spec.partition(":")
    if kind not in ("byte", "bpe", "hf", "tiktoken"):
        raise UsageError(f"unknown tokenizer '{spec}' (expected byte, bpe:VOCAB, hf:PATH_OR_NAME or tiktoken:NAME)")
    if kind == "byte" and arg:
        raise UsageError("tokenizer 'byte' takes no argument")
    if kind != "byte" and not arg:
        raise UsageError(f"tokenizer '{kind}:' needs an argument")
    if kind == "bpe":
        try:
            vocab = int(arg)
        except ValueError as err:
            raise UsageError(f"bpe vocabulary size must be an integer, got '{arg}'") from err
        if vocab >= UINT32_MAX_VOCAB:
            raise UsageError(f"vocabulary size {vocab} is too large for uint32 token ids (max {UINT32_MAX_VOCAB - 1})")
        if vocab < 257 + 1:
            raise UsageError(f"bpe vocabulary size {vocab} is too small: it needs the 256 byte symbols plus specials (>= 258)")
    return kind, arg


def train_bpe(vocab_size: int, texts: Iterator[str], bos: bool = False) -> HFTokenizer:
    """Train a byte-level BPE (GPT-2 style, lossless) on `texts` with `<|endoftext|>` as id 0 (and, with `bos`,
    `<|startoftext|>` as id 1)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TEXT, BOS_TEXT] if bos else [EOS_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(f"bpe:{vocab_size}", tok, int(tok.token_to_id(EOS_TEXT)))


def _find_eos(tok: "object", eos_token: str | None, spec: str) -> int:
    names = (eos_token,) if eos_token else EOS_CANDIDATES
    for name in names:
        tid = tok.token_to_id(name)  # type: ignore[attr-defined]
        if tid is not None:
            return int(tid)
    if eos_token:
        raise UsageError(f"tokenizer '{spec}' has no token '{eos_token}'")
    raise UsageError(f"tokenizer '{spec}' has none of {', '.join(EOS_CANDIDATES)}; name its end-of-document token with --eos-token")


def from_json(spec: str, data: bytes, eos_id: int | None, where: str, eos_token: str | None = None) -> HFTokenizer:
    """A tokenizer.json's bytes, read by the file layer, as a tokenizer (the tokenizers library never opens a
    path itself: a FIFO there would hang it); bytes it cannot parse are one line naming `where`. `eos_id`
    None: found by name (`eos_token`, else EOS_CANDIDATES)."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_str(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UsageError(f"{where} is not a tokenizer (not UTF-8 text, byte {err.start})") from None
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises plain Exception for what it cannot parse
        why = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise UsageError(f"{where} is not a tokenizer ({why})") from None
    return HFTokenizer(spec, tok, _find_eos(tok, eos_token, spec) if eos_id is None else eos_id)


def _read(read: Callable[[], bytes], where: str) -> bytes:
    """`read()` (a bounded read of the file layer); what the layer refuses is one line naming `where`."""
    try:
        return read()
    except OSError as err:
        raise UsageError(f"cannot read tokenizer '{where}': {err.strerror or type(err).__name__}") from None


def load_hf(arg: str, eos_token: str | None = None, spec: str | None = None) -> HFTokenizer:
    """Load a tokenizer.json (file, or a directory holding one) or a pretrained name from the Hub."""
    spec = spec or f"hf:{arg}"
    if not arg.endswith(".json"):  # a Hub name is never read from the working directory (.json: a file, never one)
        from data_prep.sources import check_hub_name

        check_hub_name(arg, "tokenizer hf:")
    if os.path.isdir(arg):
        where = os.path.join(arg, "tokenizer.json")
        if not os.path.lexists(where):
            raise UsageError(f"no tokenizer.json at '{arg}'")
        data = _read(lambda: files.read_beneath(arg, "tokenizer.json", "tokenizer"), where)
        return from_json(spec, data, None, where, eos_token)
    if os.path.lexists(arg) or arg.endswith(".json"):
        if not os.path.exists(arg) and not os.path.islink(arg):
            raise UsageError(f"no tokenizer.json at '{arg}'")
        return from_json(spec, _read(lambda: files.read_named(arg, "tokenizer"), arg), None, arg, eos_token)
    from tokenizers import Tokenizer as RustTokenizer

    try:
        tok = RustTokenizer.from_pretrained(arg)  # a name on the Hub (arg is no path here)
    except Exception as err:  # noqa: BLE001 - the Hub's and the library's errors: one line
        raise UsageError(f"cannot load tokenizer '{arg}': {str(err).splitlines()[0] if str(err) else type(err).__name__}") from err
    return HFTokenizer(spec, tok, _find_eos(tok, eos_token, spec))


def build(spec: str, *, eos_token: str | None = None, texts: Iterator[str] | None = None,
          bos: bool = False) -> Tokenizer:
    """Build the tokenizer a spec names; `bpe` trains on `texts` (the corpus or a sample of it), reserving a
    beginning-of-document token when `bos`."""
    kind, arg = parse_spec(spec)
    tok: Tokenizer
    if kind == "byte":
        tok = ByteTokenizer()
    elif kind == "bpe":
        if texts is None:
            raise ValueError("bpe needs texts to train on")
        tok = train_bpe(int(arg), texts, bos=bos)
    elif kind == "hf":
        tok = load_hf(arg, eos_token)
    else:
        tok = TiktokenTokenizer(arg)
    if tok.vocab_size >= UINT32_MAX_VOCAB:
        raise UsageError(f"vocabulary size {tok.vocab_size} is too large for uint32 token ids")
    return tok


def vocab_estimate(spec: str) -> int | None:
    """The vocabulary a prep with this tokenizer will give, known before any data is read (a sweep's dry run
    sizes its models with it): `byte`'s, `bpe:VOCAB`'s target, a local `hf:` tokenizer's; None for a Hub name or
    tiktoken, which are never fetched for an estimate."""
    kind, arg = parse_spec(spec)
    if kind == "byte":
        return ByteTokenizer().vocab_size
    if kind == "bpe":
        return int(arg)
    if kind == "hf" and os.path.lexists(arg):
        return load_hf(arg).vocab_size
    return None


def find_bos(tok: Tokenizer, bos_token: str | None = None) -> int:
    """The beginning-of-document token `--bos` puts before each document: `bos_token` by name, else the first
    of BOS_CANDIDATES the tokenizer has. A tokenizer without one (byte, tiktoken, most hf ones of the GPT-2
    family), or whose only candidate is its end-of-document token, is refused in one line naming it."""
    inner = getattr(tok, "_tok", None)
    if inner is None:
        raise UsageError(f"--bos: tokenizer '{tok.spec}' has no beginning-of-document token")
    for name in (bos_token,) if bos_token else BOS_CANDIDATES:
        tid = inner.token_to_id(name)  # type: ignore[attr-defined]
        if tid is None:
            continue
        if int(tid) == tok.eos_id:
            raise UsageError(f"--bos: the beginning-of-document token '{name}' of tokenizer '{tok.spec}' is its "
                             "end-of-document token too; documents could not be told apart")
        return int(tid)
    if bos_token:
        raise UsageError(f"--bos: tokenizer '{tok.spec}' has no token '{bos_token}'")
    raise UsageError(f"--bos: tokenizer '{tok.spec}' has no beginning-of-document token (none of "
                     f"{', '.join(BOS_CANDIDATES)}); name it with --bos-token")


def reload(spec: str, saved_file: str | None, eos_id: int) -> Tokenizer:
    """Rebuild a tokenizer in a worker process (or a reader) from its spec and saved file (read by the layer:
    a regular file, not a link, of bounded size)."""
    kind, arg = parse_spec(spec)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "tiktoken":
        return TiktokenTokenizer(arg)
    if saved_file is None:
        raise ValueError(f"tokenizer '{spec}' needs its saved tokenizer.json")
    return from_json(spec, _read(lambda: files.read_bytes(saved_file, "tokenizer"), saved_file), eos_id, saved_file)


def load_from_dataset(data_dir: str) -> Tokenizer:
    """The tokenizer a prepared dataset was written with (for decoding samples, and in-loop evaluation): its
    manifest checked field by field (rrtrain.data.manifest), its saved file a plain name inside the dataset,
    read beneath it (no link, no FIFO, bounded)."""
    from rrtrain.data.manifest import read_manifest

    man = read_manifest(data_dir)
    spec, saved = man.get("tokenizer") or "byte", man.get("tokenizer_file")
    if not isinstance(spec, str) or not isinstance(man.get("eos_id"), int):
        raise UsageError(f"the manifest of {data_dir} records no usable tokenizer")
    kind, _ = parse_spec(spec)
    if kind in ("byte", "tiktoken"):
        return reload(spec, None, man["eos_id"])
    if not isinstance(saved, str) or not saved or "/" in saved or saved in (".", ".."):
        raise UsageError(f"the manifest of {data_dir} names no tokenizer file for '{spec}'")
    where = os.path.join(data_dir, saved)
    return from_json(spec, _read(lambda: files.read_beneath(data_dir, saved, "tokenizer"), where), man["eos_id"], where)
