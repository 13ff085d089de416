"""Command line: a 2-process training smoke run (the shared `two_process_run`)."""

from __future__ import annotations

import re

LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


def test_two_process_training_learns(two_process_run):
    """debug.toml (CoLA, BTP TP=2) on 2 CPU processes: the logged loss goes down."""
    output = two_process_run.output
    training = "\n".join(line for line in output.splitlines() if "validate step" not in line)
    losses = [(int(s), float(v)) for s, v in LOSS.findall(training)]
    assert [s for s, _ in losses] == [1, 5, 10], output[-4000:]
    assert losses[-1][1] < losses[0][1] - 0.5, losses
    assert "Summary: ran 10 steps (1-10)" in output
    assert (two_process_run.folder / "checkpoint" / "step-10" / ".metadata").is_file()
    assert len(two_process_run.rows) == 10
