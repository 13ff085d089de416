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
