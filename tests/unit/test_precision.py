"""The run's precision in one phrase: what `Precision` says of each setting and what
`check` prints (`tests/distributed/test_precision.py`: the dtypes of one training step on 2
ranks)."""

from __future__ import annotations

import pytest
import torch

from boost_titan.config.precision import Precision, no_autocast
from tests.helpers import ROOT

BF16 = ("--training.mixed_precision_param", "bfloat16")


def _training(dtype: str = "float32", param: str = "bfloat16", reduce: str = "float32"):
    from types import SimpleNamespace

    return SimpleNamespace(dtype=dtype, mixed_precision_param=param, mixed_precision_reduce=reduce)


def test_precision_phrases():
    bf16 = Precision.of(_training())
    assert bf16.casts_for_compute
    assert bf16.describe(fsdp=False) == "bf16 compute, fp32 master weights and gradient reductions"
    fp32 = Precision.of(_training(param="float32"))
    assert not fp32.casts_for_compute and fp32.describe(fsdp=True) == "fp32"
    full = Precision.of(_training(dtype="bfloat16"))
    assert not full.casts_for_compute
    assert full.describe(fsdp=False).startswith("bf16 weights, gradients and optimizer state")
    upcast = Precision.of(_training(dtype="bfloat16", param="float32"))
    assert upcast.describe(fsdp=True).endswith(", fp32 compute")
    assert not upcast.describe(fsdp=False).endswith("compute")
    with no_autocast(None, "bfloat16", "cpu"):
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize(
    "config, nproc, args, phrase",
    [
        ("debug", 2, BF16, "(tp 2), bf16 compute, fp32 master weights and gradient reductions,"),
        ("debug", 2, (), "(tp 2), fp32, vocab 4096,"),
        (
            "7B",
            4,
            ("--boost.allow_toy_corpus",),
            "(tp 4), bf16 compute, fp32 master weights and gradient reductions,",
        ),
    ],
    ids=["debug-bf16", "debug-fp32", "7B"],
)
def test_check_states_the_precision(config, nproc, args, phrase, tmp_path):
    from tests.helpers.commands import check

    summary = check(
        [
            "--nproc",
            str(nproc),
            "--job.config_file",
            str(ROOT / "train_configs" / f"{config}.toml"),
            "--job.dump_folder",
            str(tmp_path),
            *args,
        ]
    )
    assert phrase in summary, summary
