"""The Hugging Face path in one process: `hf_layout` of real transformers classes (tiny
random configs, no download), every refusal and misuse in one line, `to_low_rank`'s SVD
init, `save_hf` -> `from_pretrained` / `load_hf`, and the all-reduces per block of each
plan on each class (fake process group). Equality with the unsharded model on gloo ranks
and the DCP TP 2 -> TP 4 chain: tests/distributed/test_plan_reuse.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist

from boost_titan.bench.measure.fake_group import fake_tp_mesh
from boost_titan.hf_refusals import refusal_table, refusals
from boost_titan.parallelize import (
    LowRankLinear,
    PlanError,
    apply_plan,
    hf_layout,
    load_hf,
    megatron_plan,
    resolve_plan,
    save_hf,
    to_low_rank,
)
from boost_titan.parallelize.debug import record_collectives
from boost_titan.parallelize.low_rank import svd_factors
from tests.helpers import foreign_models as fm
from tests.helpers import hf_models as hm
from tests.helpers.plan_reuse import loss_of, plan_for, tokens

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny GEMMs and SVDs: one intra-op thread (two spin against each other on a shared
    2-core machine: 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- layouts -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", hm.CLASSES)
def test_layout_of_each_class(name):
    """Every projection, norm, embedding and head named; head_dim from the config; every
    plan resolves on the model it is for (the converted one for btp and vanilla)."""
    model = hm.build(name, "megatron")
    layout = hf_layout(model)
    assert layout.head_dim == 8 and layout.blocks == "model.layers.*"
    assert layout.shared_inputs == {
        "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
    }
    assert layout.own_inputs == ("self_attn.o_proj", "mlp.down_proj")
    head_norms = ("self_attn.q_norm", "self_attn.k_norm") if name == "tf-qwen3" else ()
    assert layout.head_norms == head_norms
    assert (layout.embedding, layout.final_norm, layout.head) == (
        "model.embed_tokens",
        "model.norm",
        "lm_head",
    )
    for strategy in fm.STRATEGIES:
        built = hm.build(name, strategy)
        assert hf_layout(built) == layout
        assert resolve_plan(built, plan_for(layout, strategy), tp=4)


def test_head_dim_comes_from_the_config():
    """A head_dim set apart from hidden_size / heads (16, not 8) is the one the layout uses."""
    model = hm.build("tf-llama", "megatron", head_dim=16)
    assert hf_layout(model).head_dim == 16


# ---- refusals and misuse: one line each ------------------------------------------------------
EXPECTED = {
    "GPT-2 (`GPT2LMHeadModel`)": "GPT2LMHeadModel is not a transformers causal LM of the Llama",
    "GPT-NeoX": "GPTNeoXForCausalLM is not a transformers causal LM of the Llama structure",
    "fused qkv (Phi-3)": "Phi3ForCausalLM fuses q, k and v in one projection (self_attn.qkv",
    "LayerNorm (StableLM)": "StableLmForCausalLM uses LayerNorm (input_layernorm)",
    "`1 + weight` norm (Gemma)": "GemmaForCausalLM: model.layers.0.input_layernorm (GemmaRMS",
    "tied embeddings": "LlamaForCausalLM ties lm_head to embed_tokens",
    "kv heads (2) that do not split over TP 4": "model.layers.0.self_attn.k_proj: 2 attention",
    "config.head_dim that disagrees with q_proj": "LlamaForCausalLM: config.head_dim 16 x",
    "HF's loss (`labels=`) with `loss_parallel=True`": "HF's own loss (labels=...) cannot read",
    "the same, with a hand-written `ModelLayout`": "HF's own loss (labels=...) cannot read",
    "`save_pretrained` after `apply_plan`": "save_pretrained cannot write the DTensor shards",
    "`head_dim` left at 0 (2 kv heads, TP 4)": "model.layers.0.self_attn.q_proj: its attention",
    "`apply_plan` on a sharded model": "LlamaForCausalLM is already sharded (apply_plan ran",
    "`to_low_rank` twice": "model.layers.0.self_attn.q_proj is a LowRankLinear, not an",
    "`to_low_rank(activation='gelu')`": "activation must be None or 'silu', got 'gelu'",
}


def test_every_refusal_is_one_line():
    rows = refusals()
    assert [what for _, what, _ in rows] == list(EXPECTED)
    for _, what, message in rows:
        assert message.startswith(EXPECTED[what]), (what, message)
        assert "\n" not in message and len(message) < 240, message


def test_refusal_table_renders_every_case():
    table = refusal_table().splitlines()
    assert len(table) == 2 + len(EXPECTED) and all(line.startswith("|") for line in table)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rank": 0}, "rank must be an integer >= 1, got 0"),
        ({"init": "zeros"}, "init must be one of svd, random, got 'zeros'"),
    ],
)
def test_to_low_rank_arguments(kwargs, message):
    model = hm.build("tf-llama", "megatron")
    with pytest.raises(PlanError, match=f"^{message}$"):
        to_low_rank(model, **({"rank": 8} | kwargs), layout=hf_layout(model))


def test_misnamed_layout_entry_is_refused():
    import dataclasses

    model = hm.build("tf-llama", "megatron")
    layout = dataclasses.replace(hf_layout(model), own_inputs=("self_attn.out_proj",))
    with pytest.raises(PlanError, match="^'model.layers.\\*.self_attn.out_proj' matches no"):
        to_low_rank(model, 8, layout=layout)


# ---- SVD init ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", hm.CLASSES)
def test_full_rank_svd_reproduces_the_model(name):
    """Rank >= min(d_in, d_out): the pairs are exact factorisations (biases kept)."""
    model = hm.build(name, "megatron")
    inputs, _ = tokens()
    with torch.no_grad():
        want = model(inputs).logits
        to_low_rank(model, 1000, layout=hf_layout(model), activation=None)
        got = model(inputs).logits
    assert isinstance(model.model.layers[0].mlp.down_proj, LowRankLinear)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_rank_r_error_is_the_singular_value_tail():
    """||W - up down||_F / ||W||_F = sqrt(sum_{i>=r} s_i^2 / sum s_i^2), and each factor
    holds sqrt(s): the column norms of up and the row norms of down are sqrt(s_i)."""
    model = hm.build("tf-llama", "megatron")
    linear = model.model.layers[1].mlp.gate_proj
    weight = linear.weight.detach().clone()
    s = torch.linalg.svd(weight.double()).S
    for rank in (4, 16, 40):
        pair = LowRankLinear(64, 96, rank)
        up, down = svd_factors(weight, rank)
        pair.up.weight.data, pair.down.weight.data = up, down
        error = (weight - pair.up.weight @ pair.down.weight).norm() / weight.norm()
        tail = (s[rank:].square().sum() / s.square().sum()).sqrt()
        assert error.item() == pytest.approx(tail.item(), rel=1e-4, abs=1e-6)
        root = s[:rank].sqrt().float()
        torch.testing.assert_close(up.norm(dim=0), root, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(down.norm(dim=1), root, rtol=1e-4, atol=1e-6)
    to_low_rank(model, 16, layout=hf_layout(model))
    converted = model.model.layers[1].mlp.gate_proj
    product = converted.up.weight @ converted.down.weight
    assert ((weight - product).norm() / weight.norm()).item() == pytest.approx(
        (s[16:].square().sum() / s.square().sum()).sqrt().item(), rel=1e-4
    )


# ---- save and reload -------------------------------------------------------------------------
@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_save_then_from_pretrained(world_of_one, tmp_path):
    """A full-rank model sharded by megatron -> `save_hf` -> plain `from_pretrained`; a
    converted model sharded by btp -> `save_hf` -> `load_hf`: equal logits."""
    from transformers import AutoModelForCausalLM

    inputs, _ = tokens()
    for strategy in ("megatron", "btp"):
        model = hm.build("tf-qwen2", strategy)
        apply_plan(model, world_of_one, plan_for(hf_layout(model), strategy, loss_parallel=False))
        save_hf(model, tmp_path / strategy)
        with torch.no_grad():
            want = model(inputs).logits
            if strategy == "megatron":
                reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / strategy)
            else:
                reloaded = load_hf(tmp_path / strategy)
            got = reloaded(inputs).logits
        assert type(reloaded).__name__ == "Qwen2ForCausalLM"
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), strategy


# ---- all-reduces per block, fake process group ---------------------------------------------
def _collectives(model) -> tuple[Counter, Counter]:
    inputs, labels = tokens()
    with record_collectives() as forward:
        logits = model(inputs).logits
    with record_collectives() as backward:
        loss_of(logits, labels).backward()
    return tuple(Counter(c.kind for c in log.calls) for log in (forward, backward))


COUNT_CASES = [(n, s, 2) for n in hm.CLASSES for s in fm.STRATEGIES]
COUNT_CASES += [("tf-llama", s, 4) for s in fm.STRATEGIES]


@pytest.mark.parametrize("name, strategy, tp", COUNT_CASES)
def test_all_reduces_per_block(name, strategy, tp):
    """One block = the model with 2 blocks minus the model with 1: btp 4/4, vanilla 7/4,
    megatron 2/2 all-reduces (forward/backward), and nothing else (TP 4: Llama only, the
    counts do not depend on the degree). Qwen3 under btp and megatron: 2 more backward,
    the weight grads of q_norm and k_norm (head_dim elements each, per call); under vanilla
    every rank holds all heads: none."""
    runs = []
    with fake_tp_mesh(tp) as mesh:
        for layers in (1, 2):
            model = hm.build(name, strategy, layers=layers)
            plan = plan_for(hf_layout(model), strategy, loss_parallel=False)
            apply_plan(model, mesh, plan, src_data_rank=None)
            runs.append(_collectives(model))
    measured = [runs[1][i] - runs[0][i] for i in (0, 1)]
    assert measured == [Counter(all_reduce=n) for n in hm.all_reduces_per_block(name, strategy)]


def test_megatron_refuses_the_converted_model():
    model = hm.build("tf-llama", "btp")
    with pytest.raises(PlanError, match="is a LowRankLinear, not an nn.Linear"):
        resolve_plan(model, megatron_plan(hf_layout(model)), tp=2)


def test_library_does_not_import_transformers():
    """transformers and safetensors are imported inside the functions that need them: no
    module of boost_titan.parallelize imports them at its top level."""
    import ast
    from pathlib import Path

    import boost_titan.parallelize as library

    for path in Path(library.__file__).parent.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] in ("transformers", "safetensors") for n in names), (
                f"{path.name} imports {names} at import time"
            )
