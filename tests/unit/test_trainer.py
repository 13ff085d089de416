"""BoostTrainer's pieces: the token-scaled loss, the run summary, the newest complete
checkpoint (`tests/distributed/test_trainer.py`: PP gradient scale and NaN stop under
torchrun)."""

from __future__ import annotations

import json

import torch

from boost_titan.checkpoint.files import latest_checkpoint
from boost_titan.runtime.run_log import RunLog
from boost_titan.runtime.trainer import TokenScaledLoss


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
