"""The plans on decoders written without boost-titan (`tests/helpers/foreign_models.py`):
the analytic all-reduce counts per block, and a one-line error for every wrong layout.

Counts and errors run in one process on a fake process group (collectives return garbage
of the right shape; the graph is real); equality with the unsharded model runs on gloo
ranks in `tests/distributed/test_plan_reuse.py`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from boost_titan.bench.measure.fake_group import fake_tp_mesh
from boost_titan.parallelize import (
    PlanError,
    apply_plan,
    btp_plan,
    megatron_plan,
    to_low_rank,
    verify_plan,
)
from boost_titan.parallelize.debug import record_collectives
from boost_titan.parallelize.describe import collectives_under, plan_table
from tests.helpers import foreign_models as fm
from tests.helpers.plan_reuse import NORMED_LAYOUT, loss_of, plan_for, swap_blocks, tokens


# ---- counts, one process -------------------------------------------------------------------
def _collectives(model: nn.Module) -> tuple[Counter, Counter]:
    """(kind, elements per token) of every collective of one forward and one backward."""
    inputs, labels = tokens()
    count = inputs.numel()
    with record_collectives() as forward:
        logits = model(inputs)
    with record_collectives() as backward:
        loss_of(logits, labels).backward()
    return tuple(
        Counter((c.kind, c.elements_per_token(count)) for c in log.calls)
        for log in (forward, backward)
    )


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
@pytest.mark.parametrize("strategy", fm.STRATEGIES)
@pytest.mark.parametrize("name", fm.MODELS)
def test_all_reduces_per_block(name, strategy, tp):
    """One block = the model with 2 blocks minus the model with 1: only all-reduces, as
    many as the analytic count, with the sizes the plan's own description gives."""
    _, layout, expected = fm.MODELS[name]
    runs = []
    with fake_tp_mesh(tp) as mesh:
        for layers in (1, 2):
            model = fm.build(name, strategy, layers=layers)
            plan = plan_for(layout, strategy, loss_parallel=False)
            apply_plan(model, mesh, plan, src_data_rank=None)
            runs.append(_collectives(model))
    measured = [runs[1][i] - runs[0][i] for i in (0, 1)]
    assert [sum(m.values()) for m in measured] == list(expected[strategy])
    assert {kind for m in measured for kind, _ in m} == {"all_reduce"}
    unsharded = fm.build(name, strategy, layers=1)
    block0 = layout.blocks.replace("*", "0") + "."
    declared = collectives_under(unsharded, plan_for(layout, strategy), tp, block0)
    assert [Counter(calls) for calls in declared] == measured


def test_parameter_between_down_and_up_is_not_deferred():
    """A LayerNorm on the latent: each up all-reduces its own input grad (4 + 7)."""
    with fake_tp_mesh(2) as mesh:
        runs = []
        for layers in (1, 2):
            model = fm.with_normed_latents(fm.build("plain-cola", "btp", layers=layers))
            apply_plan(
                model, mesh, btp_plan(NORMED_LAYOUT, loss_parallel=False), src_data_rank=None
            )
            runs.append(_collectives(model))
    r = fm.RANK
    assert runs[1][0] - runs[0][0] == Counter(
        {("all_reduce", 3 * r + 1): 1, ("all_reduce", 2 * r + 1): 1, ("all_reduce", r): 2}
    )
    assert runs[1][1] - runs[0][1] == Counter({("all_reduce", r): 7})


def test_btp_sizes_per_block():
    """Per token: 3r+1, r, 2r+1, r forward and 3r, r, 2r, r backward; the parallel block
    5r+1, r, r and 5r, r, r."""
    r = fm.RANK
    for name, fwd, bwd in (
        ("plain-cola", [3 * r + 1, r, 2 * r + 1, r], [3 * r, r, 2 * r, r]),
        ("parallel", [5 * r + 1, r, r], [5 * r, r, r]),
    ):
        layout = fm.MODELS[name][1]
        block0 = layout.blocks.replace("*", "0") + "."
        f, b = collectives_under(fm.build(name, "btp", layers=1), btp_plan(layout), 2, block0)
        assert sorted(n for _, n in f) == sorted(fwd), name
        assert sorted(n for _, n in b) == sorted(bwd), name


def test_plan_table_reads_as_a_table():
    table = plan_table(fm.build("hf-llama", "btp"), btp_plan(fm.HF_LAYOUT), 2)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["module", "style", "weights"]
    row = next(line for line in lines if line.startswith("model.layers.*.input_layernorm"))
    assert "(x3)" in row and "all-reduce 49" in row and "BottleneckGroupNorm" in row
    assert any("GroupUp" in line and "self_attn.q_proj.up" in line for line in lines)


def test_plan_command(capsys):
    from boost_titan.plan import main

    assert main(["--strategy", "btp", "--flavor", "debug"]) == 0
    out = capsys.readouterr().out
    assert "layers.*.attention_norm (x4)" in out and "all-reduce 193" in out
    assert "forward  4: all-reduce 193, all-reduce 129, all-reduce 64, all-reduce 64" in out
    model = "boost_titan.examples.own_model"
    argv = ["--model", f"{model}:Decoder", "--layout", f"{model}:LAYOUT", "--tp", "4"]
    assert main(argv) == 0
    assert "backward 4: all-reduce 96, all-reduce 64, all-reduce 32, all-reduce 32" in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit):
        main([*argv[:4], "--tp", "8"])
    assert capsys.readouterr().err.strip() == (
        "error: blocks.0.attn.k_proj.up: 4 attention heads do not split over TP 8; "
        "choose a TP degree that divides the number of heads (and of kv heads)"
    )
    foreign = "tests.helpers.foreign_models"
    with pytest.raises(SystemExit):  # a model class that needs arguments
        main(["--model", f"{foreign}:HFLlama", "--layout", f"{foreign}:HF_LAYOUT"])
    assert "builds the model without arguments" in capsys.readouterr().err


def test_library_imports_nothing_of_the_product():
    """Importing `boost_titan.parallelize` loads nothing of the product or torchtitan (its
    import statements, lazy ones included, are held by tests/unit/test_architecture.py)."""
    import subprocess
    import sys

    code = (
        "import sys, boost_titan.parallelize\n"
        "bad = [m for m in sys.modules if m.startswith(('torchtitan', 'boost_titan.'))\n"
        "       and not m.startswith(('boost_titan.parallelize', 'boost_titan.kernels'))]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- wrong layouts: one-line errors, one process ---------------------------------------------
def _apply(model: nn.Module, plan, tp: int = 2, run: bool = False) -> None:
    with fake_tp_mesh(tp) as mesh:
        apply_plan(model, mesh, plan, src_data_rank=None)
        if run:
            inputs, labels = tokens()
            logits = model(inputs)
            if isinstance(logits, DTensor):
                logits = logits.full_tensor()
            loss_of(logits, labels).backward()


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_misspelled_fqn():
    layout = dataclasses.replace(
        fm.PLAIN_LAYOUT,
        shared_inputs={
            "ln1": ("attn.q_prj", "attn.k_proj", "attn.v_proj"),
            "ln2": ("mlp.gate_proj", "mlp.up_proj"),
        },
    )
    with pytest.raises(PlanError) as e:
        _apply(fm.build("plain-cola", "btp"), btp_plan(layout))
    assert _one_line(e) == "blocks.0.attn.q_prj does not exist; fix the FQN in ModelLayout"


@pytest.mark.parametrize("strategy", ["btp", "megatron"])
def test_position_embedding_laid_out_unlike_the_tokens(strategy):
    """A GPT-2-style learned position embedding beside the token embedding, listed in the
    plan in another style than the tokens': the model would add a sharded and a replicated
    hidden state (a raw shape error in its own code). Refused in one line before anything
    is touched; listed alike, the plan applies."""
    from boost_titan.parallelize import Replicated, ShardedEmbedding

    model = fm.build("plain-cola", strategy)
    model.pos = nn.Embedding(64, model.tok.embedding_dim)
    plan = plan_for(fm.PLAIN_LAYOUT, strategy)
    same, other = (ShardedEmbedding, Replicated)[:: 1 if strategy == "btp" else -1]
    with pytest.raises(PlanError) as e:
        _apply(model, {**plan, "pos": other()})
    assert _one_line(e) == (
        f"pos is {other.__name__} but tok is {same.__name__}: embeddings that add into the "
        f"residual stream must be laid out alike; make pos a {same.__name__}"
    )
    _apply(model, {**plan, "pos": same()})


def test_unknown_block_pattern():
    layout = dataclasses.replace(fm.PLAIN_LAYOUT, blocks="layers.*")
    with pytest.raises(PlanError, match="matches no module"):
        _apply(fm.build("plain-cola", "btp"), btp_plan(layout))


def test_consumer_missing_from_the_layout():
    layout = dataclasses.replace(
        fm.PLAIN_LAYOUT,
        shared_inputs={
            "ln1": ("attn.q_proj", "attn.k_proj"),
            "ln2": ("mlp.gate_proj", "mlp.up_proj"),
        },
    )
    with pytest.raises(PlanError) as e:
        _apply(fm.build("plain-cola", "btp"), btp_plan(layout))
    assert "v_proj.down.weight" in _one_line(e) and "not covered" in str(e.value)


@pytest.mark.parametrize("strategy", fm.STRATEGIES)
def test_consumer_listed_under_the_wrong_norm(strategy):
    layout = dataclasses.replace(
        fm.PLAIN_LAYOUT,
        shared_inputs={
            "ln1": ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj"),
            "ln2": ("mlp.up_proj",),
        },
    )
    with pytest.raises(PlanError) as e:
        _apply(fm.build("plain-cola", strategy), plan_for(layout, strategy), run=True)
    assert "mlp.gate_proj" in _one_line(e) and "ln1" in str(e.value)


@pytest.mark.parametrize("strategy", fm.STRATEGIES)
def test_consumer_listed_as_own_input(strategy):
    """v_proj reads ln1's output but is listed with the projections of their own input."""
    layout = dataclasses.replace(
        fm.PLAIN_LAYOUT,
        shared_inputs={
            "ln1": ("attn.q_proj", "attn.k_proj"),
            "ln2": ("mlp.gate_proj", "mlp.up_proj"),
        },
        own_inputs=("attn.o_proj", "mlp.down_proj", "attn.v_proj"),
    )
    with pytest.raises(PlanError) as e:
        _apply(fm.build("plain-cola", strategy), plan_for(layout, strategy), run=True)
    assert "shared_inputs" in _one_line(e) and "blocks.0." in str(e.value)


def test_members_take_their_own_columns_in_compiled_forwards():
    """Compiled forwards get no eager split of the group output: each member narrows its
    own span, which must be the same columns."""
    model = fm.build("parallel", "btp")
    plan = btp_plan(fm.PARALLEL_LAYOUT)
    _apply(model, plan)
    instance = plan["h.*.norm"].spec.bind(model, "h.0.norm", "norm")
    out = torch.randn(3, instance.width)
    narrowed = [instance.take(i, out) for i in range(len(instance.firsts))]
    instance.hand_out(out)
    assert all(torch.equal(n, instance.take(i, out)) for i, n in enumerate(narrowed))
    assert torch.equal(torch.cat(narrowed, -1), out)


class NormLeak(fm.Block):
    """Gates attention with a statistic of the norm output: a reader the layout omits."""

    def forward(self, x, angles):
        h = self.ln1(x)
        x = x + torch.sigmoid(h.mean(-1, keepdim=True)) * self.attn(h, angles)
        return x + self.mlp(self.ln2(x))


@pytest.mark.parametrize("strategy", fm.STRATEGIES)
def test_norm_output_read_outside_the_layout(strategy):
    model = swap_blocks(fm.build("plain-cola", strategy), NormLeak)
    with pytest.raises(PlanError) as e:
        _apply(model, plan_for(fm.PLAIN_LAYOUT, strategy), run=True)
    assert "blocks.0.ln1's output is also read by code outside" in _one_line(e)


class LeakyLatent(fm.LowRank):
    """Adds a statistic of its latent to its output: the latent bypasses the up."""

    def forward(self, x):
        z = F.silu(self.down(x))
        return self.up(z) + z.mean(-1, keepdim=True)


def test_latent_reaching_output_past_its_up():
    model = fm.build("plain-cola", "btp")
    model.blocks[1].attn.k_proj.__class__ = LeakyLatent
    with pytest.raises(PlanError) as e:
        _apply(model, btp_plan(fm.PLAIN_LAYOUT), run=True)
    assert "latent of blocks.1.attn.k_proj reaches the block's output" in _one_line(e)
    model = fm.build("plain-cola", "btp")
    model.blocks[1].attn.k_proj.__class__ = LeakyLatent
    layout = dataclasses.replace(fm.PLAIN_LAYOUT, defer_latent_grads=False)
    _apply(model, btp_plan(layout), run=True)  # the suggested fix runs


def test_relayed_latents_are_never_deferred():
    """`to_low_rank(crossing=True)` relays each latent to the next block through module
    state, past the graph check: the groups must not defer (the same collectives as with
    defer_latent_grads=False, where a deferred block 0 would all-reduce 3r once, not r x 3)."""
    runs = []
    with fake_tp_mesh(2) as mesh:
        for defer in (True, False):
            model = fm.build("hf-llama", "megatron")  # nn.Linear projections
            to_low_rank(model, fm.RANK, layout=fm.HF_LAYOUT, init="random", crossing=True)
            layout = dataclasses.replace(
                fm.HF_LAYOUT, crossing=("cross", "latent_norm"), defer_latent_grads=defer
            )
            apply_plan(model, mesh, btp_plan(layout, loss_parallel=False), src_data_rank=None)
            runs.append(_collectives(model))
    assert runs[0] == runs[1]
    assert runs[0][1][("all_reduce", 3 * fm.RANK)] == 0  # no group deferred


class SideChannel(fm.LowRank):
    """Mixes in the previous block's latent, kept on a shared object (LaX-like crossing
    through module state): the up's input depends on more than its own latent."""

    shared: dict = {}

    def forward(self, x):
        z = F.silu(self.down(x))
        previous = SideChannel.shared.get("latent")
        SideChannel.shared["latent"] = z
        return self.up(z if previous is None else z + previous)


def test_latent_mixed_with_another_tensor():
    model = fm.build("plain-cola", "btp")
    for block in model.blocks:
        block.attn.q_proj.__class__ = SideChannel
    SideChannel.shared.clear()
    with pytest.raises(PlanError) as e:
        _apply(model, btp_plan(fm.PLAIN_LAYOUT), run=True)
    assert "blocks.1.attn.q_proj computes its up-projection's input from more" in _one_line(e)


def test_heads_must_split():
    model = fm.build("plain-cola", "btp", heads=6, kv_heads=6, dim=48)
    layout = dataclasses.replace(fm.PLAIN_LAYOUT)
    with pytest.raises(PlanError) as e:
        _apply(model, btp_plan(layout), tp=4)
    assert "6 attention heads do not split over TP 4" in _one_line(e)
    assert str(e.value).startswith("blocks.0.attn.q_proj.up:")


def test_megatron_plan_needs_full_linears():
    with pytest.raises(PlanError) as e:
        _apply(fm.build("plain-cola", "btp"), megatron_plan(fm.PLAIN_LAYOUT))
    assert "not an nn.Linear" in _one_line(e)


def test_low_rank_plan_needs_pairs():
    with pytest.raises(PlanError) as e:
        _apply(fm.build("plain-cola", "megatron"), btp_plan(fm.PLAIN_LAYOUT))
    assert "is not a low-rank pair" in _one_line(e)


def test_tied_weights_refused():
    model = fm.build("plain-cola", "btp")
    model.lm_head.weight = model.tok.weight
    with pytest.raises(PlanError, match="tied weights"):
        _apply(model, btp_plan(fm.PLAIN_LAYOUT))


def test_nothing_touched_before_the_checks_pass():
    model = fm.build("plain-cola", "btp")
    before = {n: p.clone() for n, p in model.state_dict().items()}
    layout = dataclasses.replace(fm.PLAIN_LAYOUT, head="head")
    with pytest.raises(PlanError):
        _apply(model, btp_plan(layout))
    assert all(type(p) is torch.Tensor or isinstance(p, nn.Parameter) for p in model.parameters())
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    assert "forward" not in model.blocks[0].ln1.__dict__


class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm, self.head = nn.Embedding(16, 8), nn.RMSNorm(8), nn.Linear(8, 16)

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.normed(self.emb(tokens)))


class _DropsNormWeightInBackward(_TinyLM):
    """The right values, but the input grad misses the norm weight: right at weight 1."""

    def normed(self, x: torch.Tensor) -> torch.Tensor:
        n = F.rms_norm(x, (8,))
        return n + n.detach() * (self.norm.weight - 1)


def test_verify_moves_vectors_off_unit_values():
    """verify's step runs with norm weights and biases moved off 1 and 0, so a backward
    that drops the norm weight is caught on a freshly initialised model; the model gets
    its own values back."""
    torch.manual_seed(0)
    good, reference = _TinyLM(), _TinyLM()
    before = {k: v.clone() for k, v in good.state_dict().items()}
    assert verify_plan(good, reference) < 1e-5
    assert all(torch.equal(before[k], v) for k, v in good.state_dict().items())
    broken = _DropsNormWeightInBackward()
    assert torch.equal(broken.norm.weight, torch.ones(8))
    with pytest.raises(PlanError, match=r"^verify: emb\.weight gradient differs"):
        verify_plan(broken, _TinyLM())
