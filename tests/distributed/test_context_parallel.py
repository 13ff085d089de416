"""Context parallelism equals one process of the same random weights: logits, loss and every
parameter gradient, on 4 gloo ranks (one launch for every case): CP 2 alone (fp64, load
balancing on and off, K/V rotated by all-gather and by all-to-all, GQA, a foreign
torch-native decoder, low-rank AC), CP 2 x TP 2 (btp, vanilla, megatron; fp32) and
CP 2 x FSDP 2 (fp64), and the saved activations per rank at CP 1 and 2 against the memory
model. Three runs broken on purpose (positions not sharded, the
load-balancing order not undone, one K/V chunk of the ring dropped) must differ. In the
same launch, `context_parallel_step` on foreign decoders at CP 2 and 4 (and CP 2 x BTP
TP 2), `verify=True` on one whose positions are read but unused, and docs/your_model.md's
CP example as the page shows it. Unit twin: tests/unit/test_context_parallel.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.boost_llama.strategies import boost_layout
from tests.helpers.distributed import randomize, run_on_ranks
from tests.helpers.foreign_models import CONFIG, PLAIN_LAYOUT, PlainDecoder

VOCAB, BATCH, SEQ = 64, 2, 16
FP64_TOL, FP32_RTOL = 1e-12, 1e-5
BROKEN_MIN = 1e-3
"""A broken run's relative error is at least this (the correct ones are below 1e-5)."""

# name -> (model, dtype, load balance, TP strategy or None, FSDP over (dp 2, cp 2), broken)
CASES: dict[str, tuple[str, torch.dtype, bool, str | None, bool, str | None]] = {
    "cp2": ("cola-gqa", torch.float64, True, None, False, None),
    "cp2-no-load-balance": ("cola-gqa", torch.float64, False, None, False, None),
    "cp2-alltoall": ("cola-gqa", torch.float64, True, None, False, None),
    "cp2-lax": ("lax", torch.float64, True, None, False, None),
    "cp2-fullrank": ("fullrank", torch.float64, True, None, False, None),
    "cp2-foreign": ("foreign", torch.float64, True, None, False, None),
    "cp2-tp2-btp": ("cola-gqa", torch.float32, True, "btp", False, None),
    "cp2-tp2-vanilla": ("cola-gqa", torch.float32, True, "vanilla", False, None),
    "cp2-tp2-megatron": ("fullrank", torch.float32, True, "megatron", False, None),
    "cp2-fsdp2": ("cola-gqa", torch.float64, True, None, True, None),
    "cp2-lowrank-ac": ("cola-gqa", torch.float64, True, None, False, None),
    "cp2-selective-ac": ("cola-gqa", torch.float64, True, None, False, None),
    "broken-positions-not-sharded": ("cola-gqa", torch.float64, True, None, False, "positions"),
    "broken-order-not-undone": ("cola-gqa", torch.float64, True, None, False, "order"),
    "broken-kv-chunk-dropped": ("cola-gqa", torch.float64, True, None, False, "kv"),
}

MODELS = {
    "cola-gqa": ("cola", {"n_heads": 4, "n_kv_heads": 2}),
    "lax": ("lax", {}),
    "fullrank": ("fullrank", {"n_heads": 4, "n_kv_heads": 2}),
}


class PositionedDecoder(PlainDecoder):
    """The foreign decoder taking its tokens' positions [b, s] as data (what CP needs of a
    model); its RoPE takes one row of them (every row's are the same)."""

    def forward(self, tokens, positions=None):
        x = self.tok(tokens)
        rows = slice(tokens.shape[1]) if positions is None else positions[0]
        angles = self.angles[rows]
        for block in self.blocks:
            x = block(x, angles)
        return self.lm_head(self.ln_f(x))


def build_model(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    """A small model whose every parameter is random, and its layout."""
    torch.manual_seed(0)
    if name == "foreign":
        model = PositionedDecoder(dict(CONFIG, rank=16), act="silu")
        layout = dataclasses.replace(PLAIN_LAYOUT, attention=("attn",))
    else:
        arch, overrides = MODELS[name]
        shape = dict(dim=64, n_heads=4, ffn_dim=128, n_layers=2, rank=16, max_seq_len=SEQ)
        args = flavor_args("debug", vocab_size=VOCAB, arch=arch, **(shape | overrides))
        model = BoostTransformer(args)
        model.init_weights()
        layout = boost_layout(args)
    randomize(model)
    return model.to(dtype), layout


MEMORY_SEQ = 1024


def saved_activations_by_layout(mesh) -> dict[tuple[int, int], int]:
    """Bytes the debug model's forward keeps for backward (`PeakSavedActivations`, RMSNorm
    saving what CUDA's fused kernel saves) on one rank of one sequence of MEMORY_SEQ
    tokens, fp32, by (cp, BTP tp): (1, 1) this rank alone, (2, 1) over mesh["cp"], (2, 2)
    over mesh["cp"] x mesh["other"]."""
    from boost_titan.bench.measure.fake_group import fused_rms_norm_saves
    from boost_titan.boost_llama.strategies import build_plan
    from boost_titan.parallelize import apply_plan
    from boost_titan.parallelize.context_parallel import apply_context_parallel, shard_sequence
    from boost_titan.runtime.saved_activations import PeakSavedActivations

    args = flavor_args("debug", vocab_size=VOCAB)
    measured = {}
    for cp, tp in ((1, 1), (2, 1), (2, 2)):
        torch.manual_seed(0)
        model = BoostTransformer(args)
        model.init_weights()
        tokens = torch.randint(0, VOCAB, (1, MEMORY_SEQ))
        positions = torch.arange(MEMORY_SEQ).expand(1, MEMORY_SEQ)
        if tp > 1:
            apply_plan(model, mesh["other"], build_plan("btp", model.args))
        if cp > 1:
            apply_context_parallel(model, mesh["cp"], boost_layout(args))
            tokens, positions = shard_sequence(mesh["cp"], (tokens, positions))
        counter = PeakSavedActivations([model])
        with fused_rms_norm_saves(), counter.watching():
            model(tokens, positions=positions if cp > 1 else None)
        measured[cp, tp] = counter.peak
    return measured


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    return tokens, labels


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """TorchTitan's loss: summed over tokens (divided by the global token count after)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1), reduction="sum")


def _drop_second_chunk(rotater_cls):
    """The ring's K/V of the step after the first replaced by zeros (one chunk dropped)."""
    original = rotater_cls.next_buffer

    def next_buffer(self):
        return torch.zeros_like(original(self))

    return original, next_buffer


def _cp_worker(rank: int, world_size: int, cases: list[str]) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    from torch.distributed.tensor.parallel import loss_parallel

    from boost_titan.boost_llama.parallelize import apply_ac_mode
    from boost_titan.boost_llama.strategies import build_plan
    from boost_titan.parallelize import apply_plan
    from boost_titan.parallelize.context_parallel import (
        apply_context_parallel,
        load_balancing,
        shard_sequence,
        unshard_sequence,
    )
    from boost_titan.parallelize.debug import record_collectives
    from boost_titan.runtime.device import force_sum_reductions

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("other", "cp"))
    cp = mesh["cp"]
    cp_group = cp.get_group()
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    results = {}
    for name in cases:
        model_name, dtype, balance, strategy, fsdp, broken = CASES[name]
        model, layout = build_model(model_name, dtype)
        if strategy is not None:
            apply_plan(model, mesh["other"], build_plan(strategy, model.args))
        rotate = "alltoall" if name.endswith("alltoall") else "allgather"
        apply_context_parallel(model, cp, layout, rotate=rotate)
        if name.endswith("-ac"):
            apply_ac_mode(model, name.split("-")[1], tp_degree=1)
        tokens, labels = batch()
        positions = torch.arange(SEQ).expand(BATCH, SEQ)
        if fsdp:  # the batch split over "other" (dp_shard), FSDP over dp_shard x cp
            half = slice(mesh["other"].get_local_rank(), None, 2)
            tokens, labels, positions = tokens[half], labels[half], positions[half]
            fully_shard(model, mesh=mesh._flatten("dp_cp"))
            model.set_gradient_divide_factor(1.0)  # the loss is divided by the global tokens
            force_sum_reductions(model)
        tokens, labels, positions = shard_sequence(
            cp, (tokens, labels, positions), load_balance=balance
        )
        if broken == "positions":  # what a model computing its own positions gets
            positions = torch.arange(SEQ // 2).expand(positions.shape)
        original = None
        if broken == "kv":
            original, dropped = _drop_second_chunk(ring._AllGatherRotater)
            ring._AllGatherRotater.next_buffer = dropped
        try:
            with record_collectives() as log, load_balancing(balance):
                logits = model(tokens, positions=positions)
                with loss_parallel():
                    loss = loss_sum(logits, labels) / (BATCH * SEQ)
                    loss.backward()
        finally:
            if original is not None:
                ring._AllGatherRotater.next_buffer = original
        loss = full(loss).detach()
        dist.all_reduce(loss, group=None if fsdp else cp_group)
        if not fsdp:  # FSDP reduces the gradients itself
            for p in model.parameters():
                dist.all_reduce(
                    p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad, group=cp_group
                )
        unwrapped = lambda n: n.replace("._checkpoint_wrapped_module", "")  # noqa: E731
        grads = {unwrapped(n): full(p.grad) for n, p in model.named_parameters()}
        local = full(logits).detach().contiguous()
        shards = [torch.empty_like(local) for _ in range(2)]
        dist.all_gather(shards, local, group=cp_group)
        if fsdp:
            pieces = [torch.empty_like(local) for _ in range(4)]
            dist.all_gather(pieces, local)
            shards = [torch.cat([pieces[2 * other + c] for other in range(2)], 0) for c in range(2)]
            shards = [s[[0, 1]] for s in shards]
        logits = unshard_sequence(shards, load_balance=balance and broken != "order")
        results[name] = (logits, loss, grads, log.calls)
    results["saved_activations"] = saved_activations_by_layout(mesh)
    whole = init_device_mesh("cpu", (4,))
    results["step"] = step_results({2: (cp, mesh["other"]), 4: (whole, None)})
    return results


STEP_CASES = {  # name -> (cp_models kind, ModelLayout.attention, verify, BTP TP 2 first)
    "position-ids": ("position-ids", "attn", True, False),
    "tf-llama": ("tf-llama", "self_attn", True, False),
    "block-sdpa": ("block-sdpa", "", True, False),
    "position-ids-btp": ("position-ids", "attn", True, True),
    "checked-positions": ("checked-positions", "attn", False, False),
    "checked-positions-verified": ("checked-positions", "attn", True, False),
}
STEP_OFFSET = 7
"""The batch's positions start here (not at 0)."""


def step_batch(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens and labels [b, s] (some labels -100) and positions with an offset: [s], or
    [b, s] for transformers' Llama (its rotary embedding takes no other)."""
    tokens, labels = batch()
    labels[0, :5] = -100
    positions = torch.arange(SEQ) + STEP_OFFSET
    return tokens, labels, positions.expand(BATCH, SEQ) if kind == "tf-llama" else positions


def step_model(kind: str, attention: str) -> tuple[torch.nn.Module, object]:
    """The `cp_models` decoder, or transformers' LlamaForCausalLM (SDPA, GQA, low-rank
    pairs, every parameter random, fp64) with its `hf_layout`; both with `attention`."""
    from boost_titan.parallelize import hf_layout
    from tests.helpers import cp_models, hf_models

    if kind != "tf-llama":
        return cp_models.build(kind, attention=(attention,))
    model = hf_models.build(kind, "btp", layers=2, attn_implementation="sdpa").double()
    return model, dataclasses.replace(hf_layout(model), attention=(attention,))


def step_results(meshes: dict) -> dict:
    """`context_parallel_step` on the foreign decoders of `cp_models` at each CP degree
    (cp -> (CP mesh, TP mesh or None)): (loss, every gradient) or the PlanError's
    message; and the docs page's example at CP 2 (`docs`)."""
    from torch.distributed.tensor import DTensor

    from boost_titan.parallelize import (
        PlanError,
        apply_context_parallel,
        apply_plan,
        btp_plan,
        context_parallel_step,
    )
    from tests.helpers import cp_models

    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    results = {}
    for cp, (mesh, tp_mesh) in meshes.items():
        for name, (kind, attention, verify, tp) in STEP_CASES.items():
            if tp and tp_mesh is None:
                continue
            model, layout = step_model(kind, attention)
            if tp:
                apply_plan(model, tp_mesh, btp_plan(layout, loss_parallel=False))
            apply_context_parallel(model, mesh, layout)
            tokens, labels, positions = step_batch(kind)
            try:
                loss = context_parallel_step(
                    model, tokens, labels, positions=positions, verify=verify
                )
            except PlanError as e:
                results[name, cp] = str(e)
                continue
            results[name, cp] = loss, {n: full(p.grad) for n, p in model.named_parameters()}
    model, layout = cp_models.build("position-ids")
    apply_context_parallel(model, meshes[2][0], layout)
    tokens, labels, _ = step_batch("position-ids")
    try:  # each CP rank a batch of its own (a data seed per rank)
        context_parallel_step(model, (tokens + meshes[2][0].get_local_rank()) % VOCAB, labels)
    except PlanError as e:
        results["different-batches"] = str(e)
    namespace: dict = {}
    exec(page_example(), namespace)  # noqa: S102 - the docs page's own code
    results["docs"] = namespace["train_cp"](meshes[2][0])
    return results


def page_example() -> str:
    """The python block of docs/your_model.md that calls `context_parallel_step`."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "your_model.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)
    return next(b for b in blocks if "context_parallel_step(" in b)


def _reference(name: str):
    model_name, dtype = CASES[name][:2]
    model, _ = build_model(model_name, dtype)
    tokens, labels = batch()
    logits = model(tokens)
    loss = loss_sum(logits, labels) / (BATCH * SEQ)
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def cp_results() -> dict:
    return run_on_ranks(_cp_worker, 4, cases=list(CASES))[0]


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _errors(name: str, cp_results: dict) -> dict[str, float]:
    logits, loss, grads, _ = cp_results[name]
    want_logits, want_loss, want_grads = _reference(name)
    errors = {"logits": _rel_err(logits, want_logits), "loss": _rel_err(loss, want_loss)}
    assert grads.keys() == want_grads.keys()
    errors |= {n: _rel_err(grads[n], want_grads[n]) for n in want_grads}
    return errors


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[5] is None])
def test_matches_single_process(cp_results, name):
    tol = FP64_TOL if CASES[name][1] == torch.float64 else FP32_RTOL
    errors = _errors(name, cp_results)
    bad = {k: e for k, e in errors.items() if not e <= tol}
    assert not bad, f"{name}: relative errors above {tol}: {bad}"
    grads = {k: e for k, e in errors.items() if k not in ("logits", "loss")}
    print(
        f"| {name} | {str(CASES[name][1]).removeprefix('torch.')} | {errors['logits']:.1e} | "
        f"{errors['loss']:.1e} | {max(grads.values()):.1e} ({len(grads)} gradients) |"
    )


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[5] is not None])
def test_broken_on_purpose_differs(cp_results, name):
    errors = _errors(name, cp_results)
    assert errors["logits"] > BROKEN_MIN, f"{name}: {errors['logits']}"
    print(f"| {name} | logits {errors['logits']:.1e} |")


def _kv_elements(name: str, tp: int = 1) -> int:
    """Elements of one rank's un-repeated K and V shard per block: 2 x b x s/cp x kv heads
    / tp x head_dim."""
    _, overrides = MODELS[CASES[name][0]]
    heads = overrides.get("n_kv_heads", 4) // tp
    return 2 * BATCH * (SEQ // 2) * heads * (64 // 4)


@pytest.mark.parametrize("name, tp", [("cp2", 1), ("cp2-tp2-btp", 2)])
def test_ring_moves_unrepeated_kv(cp_results, name, tp):
    """The forward ring (all-gather rotation) moves each block's K/V shard once, at the
    K/V heads' size (GQA: 2 K/V heads for 4 query heads, not repeated): per block and
    micro-batch, 2 x b x s/cp x n_kv/tp x head_dim elements per rank."""
    calls = cp_results[name][3]
    # the ring's payloads are flat (K and V concatenated); TP's all-gathers are not
    gathers = [c for c in calls if c.kind == "all_gather" and len(c.shape) == 1 and not c.backward]
    assert [c.numel for c in gathers] == [_kv_elements(name, tp)] * 2  # 2 blocks
    volume = _kv_elements(name, tp) * CASES[name][1].itemsize
    assert all(c.nbytes == volume for c in gathers)
    print(f"{name}: K/V ring bytes per block and micro-batch per rank {volume}")


@pytest.mark.parametrize("name", ["cp2-lowrank-ac", "cp2-selective-ac"])
def test_ac_replays_no_cp_collective(cp_results, name):
    """Low-rank and (op-level) selective AC under CP issue exactly the collectives of the
    run without AC (backward recomputes no ring attention: its output and log-sum-exp are
    kept)."""
    plain, checkpointed = cp_results["cp2"][3], cp_results[name][3]
    assert [c for c in plain if c.backward]  # the ring's backward collectives
    assert checkpointed == plain


def test_btp_latent_all_reduces_unchanged_per_token(cp_results):
    """Under CP 2 x BTP TP 2 every forward latent all-reduce carries the rank's b x s/cp
    tokens at BTP's widths (3r+1, r, 2r+1, r per block, r = 16): unchanged per token, so
    its bytes per rank fall by cp."""
    calls = cp_results["cp2-tp2-btp"][3]
    latents = [
        c.shape
        for c in calls
        if c.kind == "all_reduce" and not c.backward and len(c.shape) == 3 and c.shape[-1] > 1
    ]
    assert latents == [(BATCH, SEQ // 2, w) for w in (49, 16, 33, 16)] * 2


def test_saved_activations_per_rank_halve_and_match_the_memory_model(cp_results):
    """The debug model at seq 1024 (one sequence, fp32): what a rank's forward keeps for
    backward at CP 2 is within 10% of half of CP 1's (each rank holds half the tokens; the
    rest: the ring's head-major output copied for wo, the shard's RoPE rows), and the
    memory model's whole-model figure (`memory.forward_saved_bytes`: blocks and ends)
    equals the measurement at CP 1, CP 2 and CP 2 x BTP TP 2."""
    from boost_titan.boost_llama.shapes import flavor_shape
    from boost_titan.perf import memory
    from boost_titan.perf.layout import TrainingLayout

    measured = cp_results["saved_activations"]
    one, two = measured[1, 1], measured[2, 1]
    assert abs(two - one / 2) <= 0.1 * one / 2, measured
    args = flavor_shape("debug", arch="cola")
    for (cp, tp), nbytes in measured.items():
        plan = TrainingLayout("btp", tp=tp, cp=cp, seq_len=MEMORY_SEQ, micro_batch=1, dtype="fp32")
        assert memory.forward_saved_bytes(args, plan) == nbytes, (cp, tp)
    print(f"saved activations per rank, seq {MEMORY_SEQ}, by (cp, tp): {measured} bytes")


def _step_reference(kind: str):
    from tests.helpers.hf_models import logits_of

    model, _ = step_model(kind, "")
    tokens, labels, positions = step_batch(kind)
    logits = logits_of(model(tokens, position_ids=positions))
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _step_errors(name: str, cp: int, cp_results: dict) -> dict[str, float]:
    loss, grads = cp_results["step"][name, cp]
    want_loss, want_grads = _step_reference(STEP_CASES[name][0])
    assert grads.keys() == want_grads.keys()
    return {"loss": _rel_err(loss, want_loss)} | {
        n: _rel_err(grads[n], want_grads[n]) for n in want_grads
    }


@pytest.mark.parametrize(
    "name, cp",
    [("position-ids", 2), ("position-ids", 4), ("block-sdpa", 2), ("block-sdpa", 4)]
    + [("tf-llama", 2), ("tf-llama", 4), ("position-ids-btp", 2)],
)
def test_step_matches_single_process(cp_results, name, cp):
    """`context_parallel_step` (sharding, loss divisor, gradient sum; verify on) on a foreign
    decoder taking `position_ids` [s] starting at 7, some labels -100, every parameter
    random (1-D ones in [0.5, 1.5]), fp64: the loss and every gradient equal one process,
    with attention in its own module, SDPA in the block's forward (named by ""),
    transformers' LlamaForCausalLM (`hf_layout`: `position_ids` [b, s], GQA), and
    after a BTP TP 2 plan (CP 2 x TP 2; BTP's norms take their statistic in fp32, so
    1e-5 there)."""
    errors = _step_errors(name, cp, cp_results)
    tol = FP32_RTOL if STEP_CASES[name][3] else FP64_TOL
    bad = {k: e for k, e in errors.items() if not e <= tol}
    assert not bad, f"{name} at CP {cp}: relative errors above {tol}: {bad}"
    print(f"{name} CP {cp}: largest relative error {max(errors.values()):.1e}")


@pytest.mark.parametrize("cp", [2, 4])
def test_verify_catches_positions_read_but_unused(cp_results, cp):
    """A model that reads `position_ids` (a bounds check) but computes RoPE from 0..s-1
    passes the first-forward checks and trains wrong; `verify=True` refuses it in one line."""
    errors = _step_errors("checked-positions", cp, cp_results)
    assert max(errors.values()) > BROKEN_MIN, errors
    message = cp_results["step"]["checked-positions-verified", cp]
    assert isinstance(message, str) and "\n" not in message, message
    assert message.startswith("context_parallel_step verify: the CP forward differs"), message
    print(f"CP {cp} unverified: largest relative error {max(errors.values()):.2f}; {message}")


def test_docs_page_example_trains_as_one_process(cp_results):
    """docs/your_model.md's CP example, run as the page shows it at CP 2: its losses equal
    a plain one-process loop of the same model, data and AdamW (fp32)."""
    from boost_titan.examples.own_model import VOCAB, Decoder

    torch.manual_seed(0)
    model = Decoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, VOCAB, (8, 65), generator=torch.Generator().manual_seed(1))
    want = []
    for step in range(4):
        batch = data[2 * step : 2 * step + 2]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        want.append(loss.item())
    got = cp_results["step"]["docs"]
    print(f"docs example CP 2 losses {got}, one process {want}")
    assert got == pytest.approx(want, rel=1e-5, abs=0)


def test_step_refuses_different_batches_on_the_cp_ranks(cp_results):
    message = cp_results["step"].get("different-batches", "no error")
    assert message.startswith(
        "context_parallel_step: the ranks of the CP group passed different batches"
    ), message
