"""Every TP strategy equals a single-process run of the same weights: forward, loss and
every parameter gradient, on 2 and 4 gloo ranks (fp32); `-documents`: positions and
attention reset per document (`[boost] reset_position_ids`, `reset_attention_mask`). A toy
architecture registered from outside the package (`tests/helpers/toy_arch.py`) runs among
them under BTP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.data.document_masks import DocumentOptions
from tests.helpers.distributed import randomize, run_on_ranks
from tests.helpers.toy_arch import TOY

VOCAB, BATCH, SEQ = 64, 2, 16
RTOL = 1e-5

# name -> (arch, strategy, model overrides, plan options)
CASES: dict[str, tuple[str, str, dict, dict]] = {
    "svd-btp": ("svd", "btp", {}, {}),
    "cola-btp": ("cola", "btp", {}, {}),
    "lax-btp": ("lax", "btp", {}, {}),
    "cola-btp-sync": ("cola", "btp", {}, {"rmsnorm": "sync"}),
    "cola-btp-ungrouped": ("cola", "btp", {}, {"group_linears": False}),
    "cola-btp-sync-ungrouped": ("cola", "btp", {}, {"group_linears": False, "rmsnorm": "sync"}),
    "lax-btp-ungrouped": ("lax", "btp", {}, {"group_linears": False}),
    "cola-btp-gqa": ("cola", "btp", {"n_heads": 8, "n_kv_heads": 4}, {}),
    "cola-btp-no-loss-parallel": ("cola", "btp", {}, {"loss_parallel": False}),
    "cola-btp-documents": ("cola", "btp", {}, {}),
    "svd-vanilla": ("svd", "vanilla", {}, {}),
    "cola-vanilla": ("cola", "vanilla", {}, {}),
    "lax-vanilla": ("lax", "vanilla", {}, {}),
    "lax-vanilla-ungrouped": ("lax", "vanilla", {}, {"group_linears": False}),
    "cola-vanilla-ungrouped": ("cola", "vanilla", {}, {"group_linears": False}),
    "fullrank-megatron": ("fullrank", "megatron", {}, {}),
    "toy-btp": (TOY.name, "btp", {}, {}),
    "fullrank-megatron-ungrouped": ("fullrank", "megatron", {}, {"group_linears": False}),
    # all-reduces in overlapped row blocks (apply_plan's overlap_chunks)
    "cola-btp-overlap2": ("cola", "btp", {}, {"overlap_chunks": 2}),
    "cola-btp-ungrouped-overlap4": (
        "cola",
        "btp",
        {},
        {"group_linears": False, "overlap_chunks": 4},
    ),
    "lax-btp-overlap2": ("lax", "btp", {}, {"overlap_chunks": 2}),
    "cola-vanilla-overlap2": ("cola", "vanilla", {}, {"overlap_chunks": 2}),
    "fullrank-megatron-overlap2": ("fullrank", "megatron", {}, {"overlap_chunks": 2}),
    "fullrank-megatron-ungrouped-overlap4": (
        "fullrank",
        "megatron",
        {},
        {"group_linears": False, "overlap_chunks": 4},
    ),
}


def build_model(arch: str, **overrides) -> BoostTransformer:
    """A small 3-layer model whose every parameter is random (norm weights in [0.5, 1.5],
    LaX norm biases too) and depends only on the seed."""
    torch.manual_seed(0)
    shape = dict(dim=64, n_heads=4, ffn_dim=128, n_layers=3, rank=16, max_seq_len=SEQ)
    args = flavor_args("debug", vocab_size=VOCAB, arch=arch, **(shape | overrides))
    model = BoostTransformer(args)
    model.init_weights()
    randomize(model)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    return tokens, labels


def model_inputs(name: str, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model's extra inputs: for a `-documents` case, the positions and document numbers
    of windows whose documents end at token 0, placed at a few places."""
    if not name.endswith("-documents"):
        return {}
    tokens[0, [3, 9]] = tokens[1, [0, 6, 12]] = 0
    options = DocumentOptions(0, reset_positions=True, separate_attention=True)
    marked, _ = options.mark({"input": tokens}, tokens)
    return {k: v for k, v in marked.items() if k != "input"}


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def _tp_worker(rank: int, world_size: int, cases: list[str]) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    from boost_titan.boost_llama.strategies import build_plan
    from boost_titan.parallelize import apply_plan

    mesh = init_device_mesh("cpu", (world_size,))
    results = {}
    for name in cases:
        arch, strategy, overrides, plan_options = CASES[name]
        model = build_model(arch, **overrides)
        options = {k: v for k, v in plan_options.items() if k != "overlap_chunks"}
        apply_plan(
            model,
            mesh,
            build_plan(strategy, model.args, **options),
            overlap_chunks=plan_options.get("overlap_chunks", 1),
        )
        tokens, labels = batch()
        logits = model(tokens, **model_inputs(name, tokens))
        with loss_parallel():
            loss = cross_entropy(logits, labels)
            loss.backward()
        full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
        grads = {n: full(p.grad) for n, p in model.named_parameters()}
        results[name] = (full(logits).detach(), full(loss).detach(), grads)
    return results


def _reference(name: str):
    arch, _, overrides, _ = CASES[name]
    model = build_model(arch, **overrides)
    tokens, labels = batch()
    logits = model(tokens, **model_inputs(name, tokens))
    loss = cross_entropy(logits, labels)
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def tp_results(request) -> tuple[int, dict]:
    world_size = request.param
    return world_size, run_on_ranks(_tp_worker, world_size, cases=list(CASES))[0]


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("name", list(CASES))
def test_matches_single_process(tp_results, name):
    world_size, results = tp_results
    logits, loss, grads = results[name]
    want_logits, want_loss, want_grads = _reference(name)
    assert grads.keys() == want_grads.keys()
    errors = {"logits": _rel_err(logits, want_logits), "loss": _rel_err(loss, want_loss)}
    errors |= {n: _rel_err(grads[n], g) for n, g in want_grads.items()}
    worst = max(errors, key=errors.get)
    print(f"{name} tp={world_size}: max rel err {errors[worst]:.2e} ({worst})")
    assert errors[worst] <= RTOL, f"{worst}: relative error {errors[worst]:.2e}"


@pytest.mark.parametrize(
    "a, b",
    [
        ("cola-btp", "cola-btp-sync"),
        ("cola-btp", "cola-btp-ungrouped"),
        ("cola-btp", "cola-btp-sync-ungrouped"),
        ("cola-btp", "cola-btp-overlap2"),
        ("cola-btp-ungrouped", "cola-btp-ungrouped-overlap4"),
        ("fullrank-megatron", "fullrank-megatron-overlap2"),
        ("fullrank-megatron-ungrouped", "fullrank-megatron-ungrouped-overlap4"),
    ],
)
def test_variants_agree(tp_results, a, b):
    """Online == sync RMSNorm, grouping on == off, overlapped blocks == one all-reduce,
    under the same TP degree."""
    _, results = tp_results
    (logits_a, loss_a, grads_a), (logits_b, loss_b, grads_b) = results[a], results[b]
    assert _rel_err(logits_a, logits_b) <= RTOL
    assert _rel_err(loss_a, loss_b) <= RTOL
    for n in grads_a:
        assert _rel_err(grads_a[n], grads_b[n]) <= RTOL, n
