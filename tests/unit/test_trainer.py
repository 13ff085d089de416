"""BoostTrainer's pieces: the token-scaled loss, the run summary, the newest complete
checkpoint, the step's one host sync and the fault injector's wrappers
(`tests/distributed/test_trainer.py`: PP gradient scale and NaN stop under torchrun)."""

from __future__ import annotations

import json
import math
import types
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from boost_titan.checkpoint.files import latest_checkpoint
from boost_titan.runtime.restarts import Fault
from boost_titan.runtime.run_log import RunLog
from boost_titan.runtime.stopping import StopRequest
from boost_titan.runtime.trainer import BoostTrainer, TokenScaledLoss


def test_token_scaled_loss_divides_only_while_set():
    loss = TokenScaledLoss(lambda pred, labels: (pred - labels).sum())
    pred, labels = torch.tensor([3.0, 5.0]), torch.tensor([1.0, 1.0])
    assert loss(pred, labels).item() == 6.0
    loss.denominator = torch.tensor(4.0)
    assert loss(pred, labels).item() == 1.5


def test_run_log_summary(tmp_path):
    log = RunLog(path=str(tmp_path / "losses.jsonl"))
    assert log.summary(final_step=20).startswith("no steps run")
    log.start()
    log.record(11, 5.0, 1000)
    log.record(12, 4.0, 1000)
    line = log.summary(final_step=12)
    assert "ran 2 steps (11-12)" in line and "loss 5.0000 (step 11) -> 4.0000 (step 12)" in line
    assert "-1.0000" in line and "tokens/s" in line
    rows = [json.loads(row) for row in (tmp_path / "losses.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 11, "loss": 5.0, "tokens": 1000},
        {"step": 12, "loss": 4.0, "tokens": 1000},
    ]
    assert log.activations_line() is None and "saved activations" not in line
    log.saved_activations = (11, 3 * 2**20 + 2**18)
    activations = "saved activations: 3.25 MiB per step on rank 0 (step 11)"
    assert log.summary(final_step=12) == f"{line}; {activations}"


def test_latest_checkpoint_skips_incomplete(tmp_path):
    for step, complete in ((5, True), (10, True), (15, False)):
        folder = tmp_path / f"step-{step}"
        folder.mkdir()
        if complete:
            (folder / ".metadata").write_text("")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "step-10")
    assert latest_checkpoint(str(tmp_path / "missing")) is None


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _fake_trainer(step: int = 10) -> SimpleNamespace:
    """The attributes of a BoostTrainer that its step's reading of figures touches (one
    process, no parallelism, a step that logs)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    model(torch.randn(2, 4)).square().sum().backward()
    trainer = SimpleNamespace(
        step=step,
        model_parts=[model],
        device=torch.device("cpu"),
        owns_loss=True,
        stop=StopRequest(0),
        stop_reason=None,
        job_config=SimpleNamespace(
            boost=SimpleNamespace(exact_grad_norm=True), training=SimpleNamespace(max_norm=1.0)
        ),
        parallel_dims=SimpleNamespace(
            get_optional_mesh=lambda name: None, ep_enabled=False, dp_cp_enabled=False
        ),
        metrics_processor=SimpleNamespace(should_log=lambda step: step % 5 == 0),
    )
    for name in ("local_grads", "clip_gradients", "local_loss", "logged_loss", "agree_on_step"):
        setattr(trainer, name, types.MethodType(getattr(BoostTrainer, name), trainer))
    return trainer


def test_step_reads_its_figures_in_one_host_sync(one_rank, monkeypatch):
    trainer = _fake_trainer()
    want_norm = torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in trainer.model_parts[0].parameters()]).double()
    ).item()
    losses = [torch.tensor(1.25), torch.tensor(2.5)]
    syncs = []
    for method in ("item", "tolist"):
        original = getattr(torch.Tensor, method)
        counted = lambda self, *a, _o=original, _m=method: syncs.append(_m) or _o(self, *a)  # noqa: E731
        monkeypatch.setattr(torch.Tensor, method, counted)
    norm = trainer.clip_gradients()
    trainer.agree_on_step(losses, norm, trainer.logged_loss(losses))
    monkeypatch.undo()
    assert syncs == ["tolist"]
    assert trainer.step_loss == 3.75 and trainer.logged == 3.75
    assert trainer.grad_norm == pytest.approx(want_norm, rel=1e-12)
    assert trainer.stop_reason is None
    trainer.step = 11  # a step that does not log fetches no logged loss
    trainer.agree_on_step(losses, norm, trainer.logged_loss(losses))
    assert trainer.logged is None and trainer.step_loss == 3.75


def test_fault_wraps_the_step_only_where_injected(one_rank):
    untouched = _fake_trainer(step=3)
    before = {name: getattr(untouched, name) for name in ("clip_gradients", "local_loss")}
    assert Fault.from_env(1, 2, {}) is None  # no variable: nothing to install
    assert {name: getattr(untouched, name) for name in before} == before
    env = {"BOOST_TITAN_FAULT_STEP": "3", "BOOST_TITAN_FAULT_POINT": "nan"}
    trainer = _fake_trainer(step=3)
    trainer.train_step = lambda data: None
    Fault.from_env(1, 2, env).install(trainer)
    assert math.isnan(trainer.local_loss([torch.tensor(1.0)]).item())
    trainer.step = 4
    assert trainer.local_loss([torch.tensor(1.0)]).item() == 1.0
    env["BOOST_TITAN_FAULT_POINT"] = "inf"
    trainer = _fake_trainer(step=3)
    trainer.train_step = lambda data: None
    Fault.from_env(1, 2, env).install(trainer)
    assert math.isinf(trainer.clip_gradients().item())  # poisoned before clipping
    assert not any(name in BoostTrainer.train_step.__code__.co_names for name in ("fault",))
