"""The plans on decoders written without boost-titan (`tests/helpers/foreign_models.py`,
and real transformers models, `tests/helpers/hf_models.py`) on gloo ranks at TP 2 and 4:
equal to the unsharded model (forward, loss, every gradient), the README's own-model
example, `verify`, and the HF save chain: the TP 2 launch trains one step and saves (HF
folder and DCP), the one-process test reloads the folder, the TP 4 launch loads the DCP
checkpoint (`tests/unit/test_plan_reuse.py` and `tests/unit/test_hf.py`: the analytic
all-reduce counts and the one-line errors, in one process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from boost_titan.checkpoint.sharded import load_sharded, save_sharded
from boost_titan.examples import hf_llama, own_model
from boost_titan.parallelize import (
    ModelLayout,
    PlanError,
    apply_plan,
    btp_plan,
    hf_layout,
    load_hf,
    save_hf,
)
from tests.helpers import foreign_models as fm
from tests.helpers import hf_models as hm
from tests.helpers.distributed import run_on_ranks
from tests.helpers.plan_reuse import NORMED_LAYOUT, loss_of, plan_for, swap_blocks, tokens

RTOL = 1e-5


# ---- equality with the unsharded model, gloo ranks -----------------------------------------
class ResidualMean(fm.Block):
    """Centres the residual stream over the hidden dim: wrong on a sharded residual, and
    invisible to every check but verify."""

    def forward(self, x, angles):
        return super().forward(x - x.mean(-1, keepdim=True), angles)


CASES = [(name, strategy) for name in [*fm.MODELS, *hm.CLASSES] for strategy in fm.STRATEGIES]
EXTRA = [
    "hf-llama-btp-loss-parallel",
    "plain-cola-btp-sync",
    "plain-cola-btp-ungrouped",
    "plain-cola-megatron-ungrouped",
    "plain-cola-vanilla-ungrouped",
    "normed-latent-btp",
    "normed-latent-vanilla",
]


def _extra(name: str) -> tuple[str, str, dict]:
    return {
        "hf-llama-btp-loss-parallel": ("hf-llama", "btp", {"loss_parallel": True}),
        "plain-cola-btp-sync": ("plain-cola", "btp", {"rmsnorm": "sync"}),
        "plain-cola-btp-ungrouped": ("plain-cola", "btp", {"group_linears": False}),
        "plain-cola-megatron-ungrouped": ("plain-cola", "megatron", {"group_linears": False}),
        "plain-cola-vanilla-ungrouped": ("plain-cola", "vanilla", {"group_linears": False}),
        "normed-latent-btp": ("plain-cola", "btp", {"normed": True}),
        "normed-latent-vanilla": ("plain-cola", "vanilla", {"normed": True}),
    }[name]


def _model(name: str, strategy: str, options: dict) -> tuple[nn.Module, ModelLayout, dict]:
    """The case's model, layout and plan options."""
    options = dict(options)
    if name in hm.CLASSES:
        model = hm.build(name, strategy)
        return model, hf_layout(model), options
    if options.pop("normed", False):
        return fm.with_normed_latents(fm.build(name, strategy)), NORMED_LAYOUT, options
    return fm.build(name, strategy), fm.MODELS[name][1], options


def _all_cases() -> dict[str, tuple[str, str, dict]]:
    cases = {f"{n}-{s}": (n, s, {"loss_parallel": False}) for n, s in CASES}
    for name in EXTRA:
        model, strategy, options = _extra(name)
        cases[name] = (model, strategy, {"loss_parallel": False} | options)
    return cases


def _run(model: nn.Module, loss_parallel: bool):
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel as loss_parallel_context

    inputs, labels = tokens()
    logits = hm.logits_of(model(inputs))
    if loss_parallel:
        with loss_parallel_context():
            loss = loss_of(logits, labels)
            loss.backward()
    else:
        loss = loss_of(logits, labels)
        loss.backward()
    full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
    grads = {n: full(p.grad) for n, p in model.named_parameters()}
    return full(logits).detach(), full(loss).detach(), grads


def _outcome(run: Callable[[], Any]) -> Any:
    """run()'s result, or the message of the PlanError it raises."""
    try:
        return run()
    except PlanError as e:
        return str(e)


def _hf_chain(mesh, folder: str) -> dict:
    """TP 2: `output_hidden_states`, one SGD step on a btp-sharded HF Llama, then its
    logits, `save_hf` and `save_sharded`; TP 4: the logits after `load_sharded` of that
    checkpoint."""
    model = hm.build("tf-llama", "btp")
    apply_plan(model, mesh, btp_plan(hf_layout(model), loss_parallel=False))
    inputs, labels = tokens()
    if mesh.size() == 2:
        with torch.no_grad():
            hidden = [h.clone() for h in model(inputs, output_hidden_states=True).hidden_states]
        loss_of(hm.logits_of(model(inputs)), labels).backward()
        torch.optim.SGD(model.parameters(), lr=0.5).step()
        save_hf(model, f"{folder}/hf")
        save_sharded(model, f"{folder}/dcp")
    else:
        load_sharded(model, f"{folder}/dcp")
    with torch.no_grad():
        return {"logits": hm.logits_of(model(inputs))} | (
            {"hidden": hidden} if mesh.size() == 2 else {}
        )


def _worker(rank: int, world_size: int, folder: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    results = {}
    for case, (name, strategy, options) in _all_cases().items():
        model, layout, options = _model(name, strategy, options)
        apply_plan(model, mesh, plan_for(layout, strategy, **options))
        results[case] = _run(model, options["loss_parallel"])
    # a PlanError is kept as the result: it fails its own test, not every case of the rank
    model = fm.build("plain-cola", "btp")
    results["verify-ok"] = _outcome(
        lambda: apply_plan(model, mesh, btp_plan(fm.PLAIN_LAYOUT), verify=True) is model
    )
    model = swap_blocks(fm.build("plain-cola", "btp"), ResidualMean)
    results["verify-caught"] = _outcome(
        lambda: apply_plan(model, mesh, btp_plan(fm.PLAIN_LAYOUT), verify=True) and None
    )
    results["example"] = _outcome(lambda: own_model.main(steps=6))
    results["hf-chain"] = _hf_chain(mesh, folder)
    if world_size == 2:
        results["hf-example"] = _outcome(lambda: hf_llama.main(2, f"{folder}/example"))
    return results


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> str:
    """Where the TP 2 launch saves and the TP 4 launch loads."""
    return str(tmp_path_factory.mktemp("hf-chain"))


@pytest.fixture(scope="module")
def launch(hf_folder) -> Callable[[int], dict]:
    """Rank 0's results of the launch at a TP degree, made once; TP 4 after TP 2, whose
    checkpoint it loads."""
    done: dict[int, dict] = {}

    def results(tp: int) -> dict:
        if tp == 4:
            results(2)
        if tp not in done:
            done[tp] = run_on_ranks(_worker, tp, folder=hf_folder)[0]
        return done[tp]

    return results


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def tp_results(request, launch) -> tuple[int, dict]:
    return request.param, launch(request.param)


@pytest.fixture(scope="module")
def tp2_results(launch) -> dict:
    return launch(2)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("case", list(_all_cases()))
def test_matches_unsharded_model(tp_results, case):
    tp, results = tp_results
    model, _, _ = _model(*_all_cases()[case])
    inputs, labels = tokens()
    logits = hm.logits_of(model(inputs))
    loss = loss_of(logits, labels)
    loss.backward()
    got_logits, got_loss, got_grads = results[case]
    want = {n: p.grad for n, p in model.named_parameters()}
    assert got_grads.keys() == want.keys()
    errors = {"logits": _rel_err(got_logits, logits.detach()), "loss": _rel_err(got_loss, loss)}
    errors |= {n: _rel_err(got_grads[n], g) for n, g in want.items()}
    worst = max(errors, key=errors.get)
    print(f"{case} tp={tp}: max rel err {errors[worst]:.2e} ({worst})")
    assert errors[worst] <= RTOL, f"{worst}: relative error {errors[worst]:.2e}"


def test_readme_example(tp_results):
    """`boost_titan/examples/own_model.py`: verify passes, 4 + 4 all-reduces per block,
    and AdamW lowers the loss."""
    _, results = tp_results
    example = results["example"]
    assert isinstance(example, dict), example
    assert (example["forward"], example["backward"]) == (4, 4)
    assert example["losses"][-1] < example["losses"][0] - 0.1


def test_verify_passes_a_good_model_and_catches_a_sharded_mean(tp_results):
    _, results = tp_results
    assert results["verify-ok"] is True, results["verify-ok"]
    message = results["verify-caught"]
    assert message is not None and message.startswith("verify: ") and "\n" not in message


def test_hf_save_and_reload(tp_results, hf_folder):
    """TP 2: the HF folder reloads on one process (`load_hf`) with the sharded model's
    logits; TP 4: the TP 2 DCP checkpoint loads with the same logits."""
    tp, results = tp_results
    got = results["hf-chain"]["logits"]
    if tp == 2:
        torch.save(got, f"{hf_folder}/tp2-logits.pt")
        reloaded = load_hf(f"{hf_folder}/hf")
        with torch.no_grad():
            want = reloaded(tokens()[0]).logits
    else:
        want = torch.load(f"{hf_folder}/tp2-logits.pt")
    error = _rel_err(got, want)
    print(f"hf chain tp={tp}: max rel err {error:.2e}")
    assert error <= RTOL


def test_hf_hidden_states_under_btp(tp2_results):
    """docs/huggingface.md: under btp each hidden state but the last is this rank's slice of
    the hidden dim (rank 0: the first d / TP features); the last (after the final norm) is
    whole. At TP 2."""
    model = hm.build("tf-llama", "btp")
    with torch.no_grad():
        want = model(tokens()[0], output_hidden_states=True).hidden_states
    got = tp2_results["hf-chain"]["hidden"]
    width = want[0].shape[-1] // 2
    assert [g.shape[-1] for g in got] == [width] * (len(want) - 1) + [2 * width]
    for g, w in zip(got[:-1], want[:-1], strict=True):
        assert _rel_err(g, w[..., :width]) <= RTOL
    assert _rel_err(got[-1], want[-1]) <= RTOL


def test_hf_example(tp2_results):
    """`boost_titan/examples/hf_llama.py` at TP 2: verify passes, the steps run, and the
    folder it saves reloads on one process with the sharded model's logits."""
    example = tp2_results["hf-example"]
    assert isinstance(example, dict), example
    assert example["reload_error"] <= RTOL and len(example["losses"]) == 2
