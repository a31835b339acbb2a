"""The depth study's data: the built-in synthetic stories, BPE-tokenized and packed in memory.

`rrtrain prep` writes MDS shards that the trainer reads through mosaicml-streaming, which the lent GPU machines
lack; the study needs torch, numpy and `tokenizers` only. So it runs `rrtrain prep`'s own pieces (the synthetic
corpus, the BPE trainer, the packer, the unigram entropy) without writing shards: documents are encoded, each
followed by EOS, concatenated and cut into rows of seq_len + 1 tokens, as `rrtrain prep` packs them. The
entropy is that of the training rows' token stream: the loss of the best context-free model, the level a
stalled run sits at.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from data_prep import tokenizer as tk
from data_prep.pack import Packer
from data_prep.sources import open_source
from data_prep.writer import unigram_entropy
from rrtrain.core.errors import UsageError


@dataclass(frozen=True)
class TokenRows:
    """Packed rows of seq_len + 1 token ids: `train` for the optimizer, `val` held out."""

    train: np.ndarray  # (n_train, seq_len + 1) int64
    val: np.ndarray  # (n_val, seq_len + 1) int64
    vocab_size: int
    tokenizer: str
    unigram_entropy: float  # nats, of the training rows' tokens
    documents: int

    @property
    def seq_len(self) -> int:
        return int(self.train.shape[1]) - 1

    def manifest(self) -> dict:
        """What `rrtrain.resolve.resolve` and the monitor read from a prepared dataset's manifest."""
        return {"vocab_size": self.vocab_size, "seq_len": self.seq_len, "unigram_entropy": self.unigram_entropy}


def story_rows(num_docs: int, tokenizer: str, seq_len: int, val_rows: int, seed: int = 0) -> TokenRows:
    """`num_docs` synthetic stories (seed `seed`), the tokenizer (`bpe:N` trained on them, or `byte`), packed into
    rows; the last `val_rows` rows are held out. UsageError when the corpus gives too few rows."""
    if num_docs < 1 or seq_len < 2 or val_rows < 1:
        raise UsageError(f"depth study data: num_docs ({num_docs}), seq_len ({seq_len}) and val_rows ({val_rows}) "
                         "must be at least 1, 2 and 1")
    docs = [d for d in itertools.islice(open_source("synthetic:stories", num_docs=num_docs, seed=seed), num_docs)
            if d.strip()]
    tok = tk.build(tokenizer, texts=iter(docs)) if tk.parse_spec(tokenizer)[0] == "bpe" else tk.build(tokenizer)
    packer = Packer(seq_len + 1, tok.eos_id, np.dtype(np.int64))
    rows = [r for ids in tok.encode_batch(docs) if (r := packer.add(ids)) is not None]
    packed = np.concatenate(rows) if rows else np.zeros((0, seq_len + 1), np.int64)
    if len(packed) < val_rows + 1:
        raise UsageError(f"depth study data: {num_docs} documents give {len(packed)} rows of {seq_len + 1} tokens; "
                         f"need more than {val_rows} (raise the number of documents)")
    train, val = packed[:-val_rows], packed[-val_rows:]
    entropy = unigram_entropy(np.bincount(train.ravel(), minlength=tok.vocab_size))
    return TokenRows(train=train, val=val, vocab_size=int(tok.vocab_size), tokenizer=tok.spec,
                     unigram_entropy=float(entropy), documents=len(docs))
