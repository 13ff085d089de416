"""Each bad input is one `error:` line naming the problem and the fix, exit status 2, no
traceback (through `python -m boost_titan.check`, which `run_train.sh` runs first).
README's table of bad inputs lists these cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import DEBUG_TOML, assert_one_error, check

# name -> (arguments after --job.config_file debug.toml, fragments of the message)
CASES = {
    "unknown arch": (["--boost.arch", "lowrank"], ["arch 'lowrank'", "fullrank, svd, cola, lax"]),
    "unknown strategy": (["--boost.tp_strategy", "fast"], ["tp_strategy 'fast'", "btp"]),
    "unknown flavor": (["--model.flavor", "2B"], ["model.flavor '2B'", "7B"]),
    "negative rank": (["--boost.rank", "-1"], ["rank -1", "use 0"]),
    "rank above d": (["--boost.rank", "100000"], ["rank 100000", "1..256"]),
    "fullrank with btp": (["--boost.arch", "fullrank", "--boost.tp_strategy", "btp"],
                          ["needs a low-rank arch", "megatron"]),
    "tp not dividing heads": (["--parallelism.tensor_parallel_degree", "3", "--nproc", "3"],
                              ["n_heads 8", "3"]),
    "seq_len beyond max": (["--training.seq_len", "100000"], ["seq_len 100000", "2048"]),
    "two AC modes": (["--boost.lowrank_ac", "--activation_checkpoint.mode", "full"],
                     ["lowrank_ac", "keep one"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_model_or_parallel_setting(case, tmp_path):
    args, fragments = CASES[case]
    nproc = [] if "--nproc" in args else ["--nproc", "2"]
    dump = ["--job.dump_folder", str(tmp_path / "dump")]  # not the checkout's outputs/debug
    assert_one_error(check(*nproc, "--job.config_file", str(DEBUG_TOML), *dump, *args), *fragments)


def _debug(tmp_path: Path, *args: str):
    """check on debug.toml, 2 processes, dump folder under `tmp_path`."""
    dump = ["--job.dump_folder", str(tmp_path / "dump")]
    return check("--nproc", "2", "--job.config_file", str(DEBUG_TOML), *dump, *args)


def test_missing_dataset(tmp_path: Path):
    result = _debug(tmp_path, "--training.dataset_path", str(tmp_path / "none"))
    assert_one_error(result, "does not exist", "point it at")


def test_empty_dataset(tmp_path: Path):
    (tmp_path / "empty.txt").touch()
    result = _debug(tmp_path, "--training.dataset_path", str(tmp_path))
    assert_one_error(result, "holds no documents", "add some text")


def test_checkpoint_path_not_a_folder(tmp_path: Path):
    result = _debug(tmp_path, "--checkpoint.initial_load_path", str(tmp_path / "step-3"))
    assert_one_error(result, "is not a folder", "step-N")


def test_initial_checkpoint_without_checkpointing(tmp_path: Path):
    result = _debug(tmp_path, "--checkpoint.initial_load_path", str(tmp_path), "--checkpoint.no_enable")
    assert_one_error(result, "is ignored while checkpoint.enable is false", "add --checkpoint.enable")


def test_truncated_checkpoint(tmp_path: Path):
    """A checkpoint folder with shards but no DCP .metadata (a crash while saving)."""
    (tmp_path / "__0_0.distcp").write_bytes(b"\0" * 16)
    result = _debug(tmp_path, "--checkpoint.initial_load_path", str(tmp_path))
    assert_one_error(result, "no DCP .metadata", "complete step-N")


def test_tokenizer_model_file_path(tmp_path: Path):
    """TorchTitan raises a bare Exception for a path ending in tokenizer.model."""
    model = tmp_path / "tokenizer.model"
    model.write_text("not a tokenizer\n")
    assert_one_error(_debug(tmp_path, "--model.hf_assets_path", str(model)), "pass the folder that holds")


def test_unreadable_tokenizer(tmp_path: Path):
    (tmp_path / "tokenizer.model").write_text("not a tokenizer\n")
    result = _debug(tmp_path, "--model.hf_assets_path", str(tmp_path))
    assert_one_error(result, "is not", "tiktoken BPE file")
