"""What `rrtrain prep` and a dataset's readers hand to libraries goes through the file layer first: a parquet
source (pyarrow), a saved dataset (datasets) and a dataset's tokenizer.json (tokenizers). A FIFO there is one
line, exit 2, within a bounded time (each check runs in a subprocess with a timeout: before the fix it hung); a
damaged file is one line, exit 2, never the library's traceback. Budget: about 10 s (three subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prep_helpers import prep, prep_subprocess
from trainutil import REPO, env

SMALL = ("--seq-len", "16", "--min-val-samples", "2")
#: a bound no refusal comes near (each is well under a second plus the interpreter's start-up)
TIMEOUT_S = 120


def one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    err = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in err and "Traceback" not in err, (result.returncode, err)
    assert all(w in err for w in words), err
    return err


def parquet(path: Path, docs: int = 200) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"Story {i}: the cat sat on the mat. " * 8 for i in range(docs)]}), path,
                   row_group_size=20)
    return path


def test_a_fifo_as_the_parquet_source_is_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "corpus.parquet")
    got = prep_subprocess("--source", str(tmp_path / "corpus.parquet"), "--tokenizer", "byte",
                          "--out", str(tmp_path / "out"), *SMALL, timeout=TIMEOUT_S)
    one_line(got, "corpus.parquet", "not a regular file")
    assert not (tmp_path / "out").exists()


def test_a_damaged_parquet_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = parquet(tmp_path / "good.parquet")
    data = bytearray(good.read_bytes())
    data[len(data) // 8: len(data) // 2] = b"A" * (len(data) // 2 - len(data) // 8)  # pages hit, footer whole
    (tmp_path / "damaged.parquet").write_bytes(bytes(data))
    assert prep("--source", str(tmp_path / "damaged.parquet"), "--tokenizer", "byte", "--out",
                str(tmp_path / "out"), *SMALL) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot read parquet" in err and "damaged.parquet" in err, err


def test_a_fifo_in_a_saved_dataset_is_one_line(tmp_path: Path) -> None:
    import datasets

    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["a story", "another story"]}).save_to_disk(str(saved))
    (saved / "state.json").unlink()
    os.mkfifo(saved / "state.json")
    got = prep_subprocess("--source", str(saved), "--tokenizer", "byte", "--out", str(tmp_path / "out"), *SMALL,
                          timeout=TIMEOUT_S)
    one_line(got, "state.json", "not a regular file")


def test_a_saved_dataset_naming_a_data_file_outside_it_is_one_line(tmp_path: Path) -> None:
    """`load_from_disk` joins each `_data_files` name of state.json to the directory: an absolute name opens any
    file (the third review: a FIFO named there hung prep). Refused before `datasets` opens anything."""
    import datasets

    from data_prep.sources import HFDataset
    from rrtrain.core.errors import UsageError

    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["a story", "another story"]}).save_to_disk(str(saved))
    os.mkfifo(tmp_path / "fifo")
    state = json.loads((saved / "state.json").read_text())
    state["_data_files"] = [{"filename": str(tmp_path / "fifo")}]
    (saved / "state.json").write_text(json.dumps(state))
    with pytest.raises(UsageError) as err:
        HFDataset(str(saved), from_disk=True)._check_local()
    assert "outside its directory" in str(err.value) and "\n" not in str(err.value)


@pytest.fixture
def bpe_data(tmp_path: Path) -> Path:
    out = tmp_path / "bpe"
    assert prep("--source", "synthetic:stories", "--num-docs", "60", "--tokenizer", "bpe:300", "--out", str(out),
                *SMALL) == 0
    return out


#: load_from_dataset (the in-loop evaluation's tokenizer) in a process of its own, its UsageError as a command's
LOAD = ("import sys\nfrom data_prep.tokenizer import load_from_dataset\nfrom rrtrain.core.errors import UsageError\n"
        "try:\n    load_from_dataset(sys.argv[1])\nexcept UsageError as err:\n"
        "    print(f'error: {err}', file=sys.stderr)\n    sys.exit(2)\n")


def test_a_fifo_as_a_dataset_s_tokenizer_is_one_line(bpe_data: Path) -> None:
    (bpe_data / "tokenizer.json").unlink()
    os.mkfifo(bpe_data / "tokenizer.json")
    got = subprocess.run([sys.executable, "-c", LOAD, str(bpe_data)], cwd=REPO, env=env(), capture_output=True,
                         text=True, timeout=TIMEOUT_S)
    one_line(got, "tokenizer.json", "not a regular file")


def test_a_damaged_or_outside_tokenizer_file_is_one_line(bpe_data: Path, tmp_path: Path) -> None:
    from data_prep.tokenizer import load_from_dataset
    from rrtrain.core.errors import UsageError

    assert load_from_dataset(str(bpe_data)).vocab_size == 300
    tokenizer = bpe_data / "tokenizer.json"
    (tmp_path / "theirs.json").write_bytes(tokenizer.read_bytes())
    tokenizer.write_bytes(tokenizer.read_bytes()[:500])  # truncated
    with pytest.raises(UsageError, match=r"tokenizer.json is not a tokenizer \(") as got:
        load_from_dataset(str(bpe_data))
    assert "\n" not in str(got.value)
    manifest = json.loads((bpe_data / "manifest.json").read_text())
    for name in ("../theirs.json", str(tmp_path / "theirs.json")):  # a file outside the dataset: never read
        manifest["tokenizer_file"] = name
        (bpe_data / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(UsageError, match="names no tokenizer file"):
            load_from_dataset(str(bpe_data))
    manifest["tokenizer_file"] = "linked.json"
    (bpe_data / "manifest.json").write_text(json.dumps(manifest))
    (bpe_data / "linked.json").symlink_to(tmp_path / "theirs.json")
    with pytest.raises(UsageError, match="linked.json"):
        load_from_dataset(str(bpe_data))


def test_an_hf_tokenizer_file_is_read_by_the_layer(bpe_data: Path, tmp_path: Path, capsys) -> None:
    from data_prep.tokenizer import load_hf
    from rrtrain.core.errors import UsageError

    assert load_hf(str(bpe_data)).vocab_size == 300  # a directory holding tokenizer.json
    (tmp_path / "bad.json").write_text('{"model": "not a tokenizer"}')
    with pytest.raises(UsageError, match=r"bad.json is not a tokenizer \("):
        load_hf(str(tmp_path / "bad.json"))
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(UsageError, match="fifo.json.*not a regular file"):
        load_hf(str(tmp_path / "fifo.json"))
