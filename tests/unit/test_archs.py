"""The architecture registry: its built-in names are the `[boost] arch` choices, a name
is held by one family, every family builds what its closed-form size says, and the one
lists of choices agree with the library's."""

from __future__ import annotations

from typing import get_args

import pytest

from boost_titan.boost_llama import BoostTransformer, flavor_args, param_count
from boost_titan.boost_llama.archs import ARCHITECTURES, Architecture, register
from boost_titan.boost_llama.shapes import flavor_shape
from boost_titan.boost_llama.strategies import strategy_names
from boost_titan.config import Arch, RmsNorm, TpStrategy
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize.norm_modes import RMSNORM_MODES
from tests.helpers.toy_arch import TOY, TanhPair


def test_built_in_names_are_the_arch_choices():
    names = get_args(Arch)
    assert tuple(ARCHITECTURES)[: len(names)] == names
    assert all(ARCHITECTURES[name].name == name for name in names)


def test_a_name_is_held_by_one_family():
    with pytest.raises(ValueError, match="'cola' is registered already"):
        register(Architecture("cola", "another family"))
    assert register(TOY) is TOY  # registering the same object again is harmless


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"arch": "lowrank"}, ["unknown [boost] arch 'lowrank'", "fullrank, svd, cola, lax"]),
        ({"arch": "lax", "lax_base": "gelu"}, ["unknown [boost] lax_base 'gelu'", "svd, cola"]),
    ],
)
def test_unknown_family_is_one_line(overrides, fragments):
    with pytest.raises(ConfigError) as info:
        flavor_shape("debug", **overrides).validate()
    message = str(info.value)
    assert "\n" not in message
    assert all(f in message for f in fragments), message


@pytest.mark.parametrize("arch", [*get_args(Arch), TOY.name])
def test_each_family_builds_its_closed_form_size(arch):
    args = flavor_args("debug", vocab_size=64, arch=arch, lax_base="svd", n_layers=2)
    model = BoostTransformer(args)
    assert sum(p.numel() for p in model.parameters()) == param_count(args)
    wq = type(model.layers["1"].attention.wq).__name__
    want = {"fullrank": "Linear", TOY.name: TanhPair.__name__}.get(arch, "LowRankLinear")
    assert wq == want


def test_choice_lists_agree_with_the_library():
    assert get_args(RmsNorm) == RMSNORM_MODES
    assert get_args(TpStrategy) == strategy_names(auto=True)
