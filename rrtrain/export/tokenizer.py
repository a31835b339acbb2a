"""A run's tokenizer as transformers loads it: `AutoTokenizer.from_pretrained(OUT)` encodes text to the same ids.

- `byte`: a `tokenizers` byte-level BPE with no merges: GPT-2's byte-to-character map (ByteLevel, without its
  word-splitting regex) and a vocabulary that gives byte b the id b, then `<|endoftext|>` = 256 and `<|pad|>` = 257.
  rrtrain's byte tokenizer writes the text of a special token as its bytes, so the special tokens are split
  as text here too (`split_special_tokens`).
- `bpe:N` and `hf:...`: their own `tokenizer.json`; a post-processor that would add tokens (a BOS) is dropped,
  since rrtrain encodes without them and the model never saw them.
- `tiktoken:NAME`: converted by transformers' own tiktoken converter.

Whatever the kind, it returns `input_ids` and `attention_mask` only (no `token_type_ids`, so
`model.generate(**tokenizer(text))` passes nothing the model does not take) and pads on the left (what batched
generation needs; the model takes either side). The written tokenizer is checked against the run's on a sample
text before anything is kept: one that would give other ids is refused (UsageError), never written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_prep.tokenizer import EOS_TEXT, ByteTokenizer, HFTokenizer, TiktokenTokenizer, Tokenizer
from rrtrain.core.errors import UsageError

PAD_TEXT = "<|pad|>"
#: what the exported tokenizer returns, and the model takes
MODEL_INPUTS = ("input_ids", "attention_mask")
#: what the round-trip check encodes: words, spaces, newlines, tabs, punctuation, digits, multi-byte characters
SAMPLE = ("Once upon a time, a small fox said: \"Héllo — 世界!\"\n\n\tIt's 3.14159 ÷ 2;  double  spaces,"
          " ünïcödé, emoji 🦊, and <b>tags</b>.\nThe end ")


def _byte_level() -> Any:
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    chars = bytes_to_unicode()  # byte -> the printable character ByteLevel writes it as
    tok = RustTokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOS_TEXT, special=True), AddedToken(PAD_TEXT, special=True)])
    return tok


def hf_tokenizer(tok: Tokenizer, max_length: int) -> Any:
    """A transformers `PreTrainedTokenizerFast` that encodes as `tok` does."""
    from transformers import PreTrainedTokenizerFast

    # no token_type_ids (the model has one segment); padding on the left, where generation needs it
    common = {"model_max_length": max_length, "clean_up_tokenization_spaces": False,
              "model_input_names": list(MODEL_INPUTS), "padding_side": "left"}
    if isinstance(tok, ByteTokenizer):
        fast = PreTrainedTokenizerFast(tokenizer_object=_byte_level(), eos_token=EOS_TEXT, pad_token=PAD_TEXT,
                                       split_special_tokens=True, **common)
    elif isinstance(tok, HFTokenizer):
        from tokenizers import Tokenizer as RustTokenizer

        rust = RustTokenizer.from_str(tok.to_json())
        rust.post_processor = None
        eos = rust.id_to_token(tok.eos_id)
        fast = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=eos, **common)
    elif isinstance(tok, TiktokenTokenizer):
        import tempfile

        from tokenizers import Tokenizer as RustTokenizer
        from transformers.integrations.tiktoken import convert_tiktoken_to_fast

        with tempfile.TemporaryDirectory() as tmp:
            convert_tiktoken_to_fast(tok._enc, tmp)
            rust = RustTokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
        fast = PreTrainedTokenizerFast(tokenizer_object=rust, eos_token=rust.id_to_token(tok.eos_id), **common)
    else:
        raise UsageError(f"tokenizer '{tok.spec}' cannot be exported")
    return fast


def check_same_ids(fast: Any, tok: Tokenizer, text: str = SAMPLE) -> None:
    """Refuse a converted tokenizer that encodes `text` to other ids than the run's."""
    want = [int(i) for i in tok.encode_batch([text])[0]]
    got = list(fast(text, verbose=False)["input_ids"])
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise UsageError(f"the tokenizer '{tok.spec}' cannot be written so that transformers encodes as rrtrain "
                         f"does (they differ from token {first}); nothing was written")


def write(out_dir: Path, tok: Tokenizer, max_length: int) -> list[str]:
    """tokenizer.json, tokenizer_config.json (with the eos token) and special_tokens_map.json into `out_dir`."""
    fast = hf_tokenizer(tok, max_length)
    check_same_ids(fast, tok)
    return sorted(Path(p).name for p in fast.save_pretrained(str(out_dir)) if Path(p).exists())
