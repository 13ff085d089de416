"""The job's processes: importing the worker's entry or the TrainSpec changes nothing, the
worker prepares its process and parses its job once in `run`, and `check` parses once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import DEBUG_TOML, ROOT

IMPORT_CHANGES_NOTHING = """
import json, sys, warnings
import torchtitan.tools.utils as titan_utils
from torchtitan.protocols.train_spec import get_train_spec

def registered():
    try:
        get_train_spec("boost_llama")
        return True
    except ValueError:
        return False

sys.argv[1:] = ["--job.config_file", "x.toml"]
before = (list(sys.argv), titan_utils.device_type, len(warnings.filters))
import boost_titan.train
from boost_titan.job import entry
after = (list(sys.argv), titan_utils.device_type, len(warnings.filters))
imported = {"unchanged": before == after, "registered": registered()}
entry.prepare_process()
entry.prepare_process()  # a second call changes nothing more
from boost_titan.runtime.device import on_cpu
prepared = {"registered": registered(), "cpu": titan_utils.device_type == "cpu" or not on_cpu()}
print(json.dumps({"imported": imported, "prepared": prepared}))
"""


def test_importing_the_worker_changes_nothing():
    """No argv rewritten, device switched, warning filtered or TrainSpec registered at import
    (of `boost_titan.train` and `boost_titan.job.entry`, which imports `boost_llama.spec`);
    `prepare_process` does it, and again is harmless."""
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_CHANGES_NOTHING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["imported"] == {"unchanged": True, "registered": False}
    assert seen["prepared"] == {"registered": True, "cpu": True}


@pytest.fixture
def parses(monkeypatch) -> list[tuple]:
    """The arguments of every TorchTitan ConfigManager parse in this process, from now on."""
    from torchtitan.config import ConfigManager

    seen: list[tuple] = []
    parse = ConfigManager.parse_args

    def counted(self, *args, **kwargs):
        seen.append(args)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(ConfigManager, "parse_args", counted)
    return seen


def test_check_parses_the_job_once(parses, tmp_path, capsys):
    from boost_titan.check import main

    main(["--nproc", "2", "--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("config ok:") and out[1].startswith("memory: predicted"), out
    assert len(parses) == 1


def test_the_worker_parses_the_job_once_and_trains_that(parses, tmp_path, monkeypatch):
    """`run` hands the trainer the job it parsed, with the `[boost]` section, and parses
    nothing else (TorchTitan's `main` would parse `sys.argv` again)."""
    import logging

    from boost_titan.job.entry import run

    built = []

    class Recorded:
        """A trainer that records the job it is built with and trains nothing."""

        def __init__(self, job):
            built.append(job)

        def train(self) -> None:
            pass

        def close(self) -> None:
            pass

    args = ["--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["boost_titan.train", *args])
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # a worker of debug.toml's 2-process job (TP 2)
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)  # TorchTitan's logging sets it
    root = logging.getLogger()
    handlers, level, filters = list(root.handlers), root.level, list(root.filters)
    try:
        assert run(Recorded) == 0
    finally:  # `run` sets up TorchTitan's logging on the root logger
        root.handlers[:], root.filters[:] = handlers, filters
        root.setLevel(level)
    assert len(parses) == 1 and len(built) == 1
    assert built[0].job.dump_folder == str(tmp_path)
    assert built[0].boost.arch == "cola"  # the [boost] section was added
