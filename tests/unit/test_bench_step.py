"""`bench step`'s one-line errors, before any worker starts (`tests/distributed/test_bench_step.py`:
a real run's report)."""

from __future__ import annotations

import pytest

from boost_titan.bench.__main__ import main
from tests.helpers import DEBUG_TOML


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["step"], "needs a job: pass --job.config_file"),
        (["step", "--steps", "0", "--job.config_file", str(DEBUG_TOML)], "must be >= 1"),
        (
            [
                "step",
                "--job.config_file",
                str(DEBUG_TOML),
                "--parallelism.tensor_parallel_degree",
                "3",
            ],
            "1 process cannot hold tp 3",
        ),
        (["step", "--job.config_file", "missing.toml"], "missing.toml not found"),
    ],
)
def test_bad_jobs_are_one_error_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")


def test_other_subcommands_still_refuse_unknown_options(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["model", "--job.config_file", str(DEBUG_TOML)])
    assert stop.value.code == 2
    assert "unrecognized arguments: --job.config_file" in capsys.readouterr().err


def _report(share: float) -> dict:
    """A `bench step` report's fields that `bench data` prints (the worker's are checked in
    tests/distributed/test_bench_step.py)."""
    step_ms = 100.0
    return {
        "job": "debug",
        "device": "cpu",
        "world_size": 2,
        "step_ms": step_ms,
        "tokens_per_step": 2048,
        "timed_steps": 5,
        "data_wait_ms": share * step_ms,
        "data_wait_ms_max": 2 * share * step_ms,
        "data_wait_share": share,
        "data_wait_share_max": 2 * share,
        "tokens_per_rank_step": 2048,
        "loader_tokens_per_s_per_rank": 2048 / (share * step_ms / 1e3),
    }


@pytest.mark.parametrize("share, verdict", [(0.004, "under 1%"), (0.02, "OVER 1%")])
def test_bench_data_times_the_debug_run_on_its_own_process_count(
    monkeypatch, capsys, share, verdict
):
    """`bench data` without a job measures debug.toml on the 2 processes its TP 2 needs,
    and says whether the steps waited for data under 1% of their time."""
    import json
    import subprocess

    from boost_titan.bench.measure import step

    seen = {}

    def torchrun_command(nproc, module, args):
        seen.update(nproc=nproc, args=args)
        return ["torchrun"]

    def run(command, env, **kwargs):  # the worker's report, as the real run writes it
        with open(env["BOOST_TITAN_STEP_REPORT"], "w") as report:
            json.dump(_report(share), report)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(step, "torchrun_command", torchrun_command)
    monkeypatch.setattr(step.subprocess, "run", run)
    monkeypatch.chdir(DEBUG_TOML.parents[1])
    assert main(["data", "--training.seq_len", "64"]) == 0
    assert seen["nproc"] == 2
    job = ["--job.config_file", "train_configs/debug.toml", "--training.seq_len", "64"]
    assert seen["args"][: len(job)] == job
    out = capsys.readouterr().out
    assert f"verdict           {verdict} of the step time waiting for data ({share:.2%}" in out
    assert f"ms median (max {2 * share * 100:.2f}): {share:.2%} of the step" in out
    assert f"loader tokens/s   {2048 / (share * 100 / 1e3):,.0f} per rank" in out
