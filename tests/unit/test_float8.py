"""float8 settings: TorchTitan's and torchao's recipes, which GEMMs qualify and why not, and
the one-line errors of bad settings (`tests/distributed/test_float8.py`: float8 GEMMs
inside the TP plans on gloo ranks)."""

from __future__ import annotations

import typing

import pytest
import torch

from boost_titan.config.errors import ConfigError
from boost_titan.kernels.float8 import RECIPES
from boost_titan.parallelize.float8 import gemm_skip_reason, group_skip_reason
from tests.helpers.float8_model import build_model


def test_recipes_are_torchtitans_and_torchaos():
    from torchao.float8 import Float8LinearRecipeName
    from torchtitan.config.job_config import Float8Linear

    titan = typing.get_args(typing.get_args(Float8Linear.__annotations__["recipe_name"])[0])
    assert set(RECIPES) == set(titan) == {r.value for r in Float8LinearRecipeName}


@pytest.mark.parametrize(
    "shape, fqn, filters, reason",
    [
        ((48, 32), "layers.0.attention.wq.down", [], None),
        ((48, 40), "layers.0.attention.wq.down", [], "K 40 is not a multiple of 16"),
        ((8, 64), "layers.0.attention.wq.down", [], "N 8 is not a multiple of 16"),
        ((4096, 4096), "output", ["output"], "in filter_fqns"),
        ((192, 2048), "x", ["auto_filter_small_kn"], "below torchao's tensorwise size threshold"),
        ((8192, 8192), "x", ["auto_filter_small_kn"], None),
    ],
)
def test_gemm_skip_reason(shape, fqn, filters, reason):
    assert gemm_skip_reason(*shape, fqn, "tensorwise", filters) == reason


def test_grouped_gemm_follows_its_filtered_member():
    fqns = ("layers.0.attention.wq.down", "layers.0.attention.wk.down")
    assert group_skip_reason(96, 32, fqns, "rowwise", []) is None
    reason = group_skip_reason(96, 32, fqns, "rowwise", ["wk"])
    assert reason == "grouped with a module in filter_fqns"
    assert group_skip_reason(96, 32, fqns[:1], "rowwise", ["wq"]) == "in filter_fqns"
    # the small-GEMM filter judges the grouped shape, not membership: a large group qualifies
    auto = ["auto_filter_small_kn"]
    assert group_skip_reason(3 * 4096, 4096, fqns, "tensorwise", auto) is None
    assert group_skip_reason(96, 32, fqns, "tensorwise", auto) == (
        "below torchao's tensorwise size threshold"
    )


def _job(**float8):
    from types import SimpleNamespace

    settings = (
        dict(recipe_name=None, filter_fqns=[], emulate=False, enable_fsdp_float8_all_gather=False)
        | float8
    )
    return SimpleNamespace(
        model=SimpleNamespace(converters=["quantize.linear.float8"], name="boost_llama"),
        quantize=SimpleNamespace(linear=SimpleNamespace(float8=SimpleNamespace(**settings))),
    )


def _one_line(error: Exception, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_gpu_without_float8_is_refused_unless_emulated(monkeypatch):
    from boost_titan.runtime.job_float8 import validate_float8

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    with pytest.raises(ConfigError) as error:
        validate_float8(_job())
    _one_line(error.value, "8.0", "emulate = true")
    validate_float8(_job(emulate=True))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    validate_float8(_job())


@pytest.mark.parametrize(
    "settings, fragments",
    [
        ({"recipe_name": "fast"}, ["'fast'", "tensorwise, rowwise, rowwise_with_gw_hp"]),
        (
            {"recipe_name": "rowwise_with_gw_hp", "filter_fqns": ["auto_filter_small_kn"]},
            ["no thresholds", "drop auto_filter_small_kn"],
        ),
        ({"enable_fsdp_float8_all_gather": True}, ["set it to false"]),
    ],
)
def test_bad_float8_settings(settings, fragments):
    from boost_titan.runtime.job_float8 import validate_float8

    with pytest.raises(ConfigError) as error:
        validate_float8(_job(**settings))
    _one_line(error.value, *fragments)


def test_nothing_qualifies_is_one_line_error():
    """Per-rank GEMM dims all off the 16 grid (r = 8): float8 would change nothing."""
    from boost_titan.runtime.job_float8 import apply_job_float8

    model = build_model("cola", rank=8)
    with pytest.raises(ConfigError) as error:
        apply_job_float8(model, _job(filter_fqns=["output"]))
    _one_line(
        error.value,
        "none of the 29 projections",
        "N 8 is not a multiple of 16 (14)",
        "in filter_fqns (1)",
        "would change nothing",
    )
