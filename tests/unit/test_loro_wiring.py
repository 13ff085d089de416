"""LORO in the recipe (`runtime.optimizers`): the TrainSpecs' `build_optimizers_fn` finds
every low-rank pair of each model part and hands LORO the job's settings; other names
keep TorchTitan's builder. The optimizer itself is replaced by a spy here (what it was
given is the subject); `tests/distributed/test_loro_training.py` trains the real one."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.config import Optimizer as OptimizerConfig

from boost_titan.boost_llama.args import flavor_args
from boost_titan.boost_llama.model import BoostTransformer
from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import LoroSettings
from boost_titan.runtime import optimizers
from boost_titan.runtime.optimizers import low_rank_pairs, optimizers_builder
from tests.helpers.hf_models import write_pretrained

ATTENTION, MLP = ("wq", "wk", "wv", "wo"), ("w1", "w2", "w3")
"""The low-rank projections of one block."""


def _model(arch: str, n_layers: int = 2) -> BoostTransformer:
    args = flavor_args("debug", arch=arch, n_layers=n_layers, vocab_size=64, dim=64, n_heads=4)
    args.ffn_dim, args.rank = 96, 16
    args.loro = LoroSettings(exact_every=3, rewarm_steps=2, approx_scale=None)
    return BoostTransformer(args)


class Spy(torch.optim.Optimizer):
    """Stands in for `boost_titan.optim.loro.LORO`: records what the builder gave it."""

    def __init__(self, params, *, pairs, **settings):
        super().__init__(params, {"lr": settings["lr"]})
        self.pairs, self.settings = pairs, settings


@pytest.fixture
def spy(monkeypatch):
    monkeypatch.setattr(optimizers, "LoroOptimizer", Spy)


def _build(parts: list[nn.Module], name: str, **options):
    config = OptimizerConfig(name=name, lr=3e-3, eps=1e-6, weight_decay=0.1, **options)
    build = optimizers_builder(lambda part: (part.args.dim, part.args.loro))
    return build(parts, config, parallel_dims=None)


def test_pairs_are_every_projections_up_and_down_weights():
    model = _model("svd")
    projections = [
        getattr(module, name)
        for block in model.layers.values()
        for module, names in ((block.attention, ATTENTION), (block.feed_forward, MLP))
        for name in names
    ]
    pairs = low_rank_pairs(model)
    assert len(pairs) == len(projections) == 14
    assert {(id(b), id(a)) for b, a in pairs} == {
        (id(p.up.weight), id(p.down.weight)) for p in projections
    }
    assert all(b.shape[1] == a.shape[0] == 16 for b, a in pairs)
    assert low_rank_pairs(_model("fullrank")) == []


def test_loro_gets_each_parts_pairs_and_the_jobs_settings(spy):
    model = _model("svd")
    first, second = _model("svd", n_layers=1), _model("svd", n_layers=1)  # two PP stages
    for stage, block in ((first, model.layers["0"]), (second, model.layers["1"])):
        stage.layers["0"] = block
    container = _build([first, second], "LORO")
    assert isinstance(container, OptimizersContainer) and len(container.optimizers) == 2
    for stage, optimizer in zip((first, second), container.optimizers, strict=True):
        assert isinstance(optimizer, Spy)
        assert [(id(b), id(a)) for b, a in optimizer.pairs] == [
            (id(b), id(a)) for b, a in low_rank_pairs(stage)
        ]
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        assert owned == {id(p) for p in stage.parameters()}
        assert optimizer.settings == {
            "lr": 3e-3,
            "betas": (0.9, 0.95),
            "eps": 1e-6,
            "weight_decay": 0.1,
            "hidden_size": 64,
            "exact_every": 3,
            "rewarm_steps": 2,
            "approx_scale": None,
        }


def test_hf_family_builds_loro_on_its_pairs(spy, tmp_path):
    """The hf TrainSpec's builder: the converted model's pairs, the folder's hidden size."""
    from boost_titan.hf_family.args import HfModelArgs, read_config
    from boost_titan.hf_family.model import build_hf_model
    from boost_titan.hf_family.spec import build_spec

    folder = str(write_pretrained(tmp_path / "pretrained"))
    args = HfModelArgs(folder=folder, arch="svd", rank=16, config=read_config(folder))
    args.loro = LoroSettings(exact_every=4, rewarm_steps=5, approx_scale=0.5)
    model = build_hf_model(args)
    config = OptimizerConfig(name="LORO")
    (optimizer,) = build_spec().build_optimizers_fn([model], config, None).optimizers
    assert len(optimizer.pairs) == 7 * args.n_layers == len(low_rank_pairs(model))
    assert optimizer.settings["hidden_size"] == args.hidden_size
    assert optimizer.settings["approx_scale"] == 0.5


def test_other_names_keep_torchtitans_builder(spy):
    container = _build([_model("svd")], "AdamW", implementation="for-loop")
    assert type(container.optimizers[0]) is torch.optim.AdamW


@pytest.mark.parametrize(
    ("arch", "options", "message"),
    [
        ("fullrank", {}, "found no low-rank pairs"),
        ("svd", {"early_step_in_backward": True}, "early_step_in_backward"),
    ],
)
def test_builder_refuses_what_check_refuses(spy, arch, options, message):
    """A worker launched without `check` stops in one line too."""
    with pytest.raises(ConfigError, match=message):
        _build([_model(arch)], "LORO", **options)


def test_builder_refuses_replicas_outside_the_factors_mesh(spy, monkeypatch):
    """Under DDP (plain or TP-only factors) each replica would run its own exact step."""
    replicas = types.SimpleNamespace(dp_replicate_enabled=True)
    config = OptimizerConfig(name="LORO", lr=3e-3)
    build = optimizers_builder(lambda part: (part.args.dim, part.args.loro))
    with pytest.raises(ConfigError, match="cannot run under DDP"):
        build([_model("svd")], config, parallel_dims=replicas)
    monkeypatch.setattr(optimizers, "_spans_replicas", lambda factor: True)  # HSDP's meshes
    assert build([_model("svd")], config, parallel_dims=replicas).optimizers[0].pairs


def test_settings_from_boost():
    boost = types.SimpleNamespace(loro_exact_every=7, loro_rewarm_steps=0, loro_approx_scale=0.0)
    assert LoroSettings.of(boost) == LoroSettings(7, 0, None)
    boost.loro_approx_scale = 0.25
    assert LoroSettings.of(boost).approx_scale == 0.25


@pytest.mark.parametrize(
    ("arch", "lax_base", "refused"),
    [
        ("svd", "cola", None),
        ("cola", "cola", "activation or crossing"),
        ("lax", "svd", "activation or crossing"),  # no activation: the crossing alone
        ("toy", "cola", "activation or crossing"),  # registered from outside: its hook
        ("fullrank", "cola", "no low-rank pairs"),
    ],
)
def test_the_arch_hooks_decide_what_loro_trains(arch, lax_base, refused):
    import tests.helpers.toy_arch  # noqa: F401 (registers "toy")
    from boost_titan.boost_llama.spec import check_loro

    args = flavor_args("debug", arch=arch, lax_base=lax_base)
    check_loro(args, OptimizerConfig(name="AdamW"))  # any arch trains with AdamW
    if refused is None:
        check_loro(args, OptimizerConfig(name="LORO"))
        return
    with pytest.raises(ConfigError, match=f"arch {arch} .*{refused}"):
        check_loro(args, OptimizerConfig(name="LORO"))
