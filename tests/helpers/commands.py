"""Our commands in child processes: run one (or many `check`s in one child), read its
one-line error, hold a dump folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


def check(args: list[str]) -> str:
    """`job.preflight.check_job` on train's arguments (and `--nproc`) in this process:
    `boost_titan.check`'s validation, its `config ok` line returned, its errors raised."""
    from boost_titan.config.cli import parse_job_config
    from boost_titan.config.world import pop_nproc
    from boost_titan.job.preflight import check_job

    nproc, args = pop_nproc(args)
    return check_job(parse_job_config(args), nproc)


def clean_env() -> dict[str, str]:
    """This process's environment without the variables a torchrun job sets."""
    return {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE", "RANK")}


def run_module(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository root, outside any torchrun job."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=clean_env() | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# `boost_titan.check`'s main on each argv in turn, fds 1 and 2 redirected to a file per case:
# whatever a case prints, logging and tracebacks included, is its output.
_CHECK_RUNNER = """
import json, os, sys, traceback
from boost_titan.check import main

argvs, results = json.loads(sys.argv[1]), []
for i, argv in enumerate(argvs):
    path = f"{sys.argv[2]}.{i}"
    with open(path, "w+b") as out:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(out.fileno(), 2)
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code or 0
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
        out.seek(0)
        results.append([code, out.read().decode("utf-8")])
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def check_each(argvs: list[list[str]], scratch: Path) -> list[subprocess.CompletedProcess]:
    """`python -m boost_titan.check ARGV` for each argv, in one child process (one
    interpreter start instead of one per case)."""
    env = clean_env() | {"PYTHONPATH": str(ROOT)}
    results = scratch / "results.json"
    child = subprocess.run(
        [sys.executable, "-c", _CHECK_RUNNER, json.dumps(argvs), str(results)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    return [
        subprocess.CompletedProcess(argv, code, output, "")
        for argv, (code, output) in zip(argvs, json.loads(results.read_text()), strict=True)
    ]


def assert_one_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Non-zero exit, exactly one `error:` line in the output, no traceback; return it."""
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


HOLDER = (
    "import sys, time\n"
    "from boost_titan.runtime.dump_lock import DumpFolderLock\n"
    "DumpFolderLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
)


def hold_lock(folder: Path) -> subprocess.Popen:
    """A process that holds `folder`'s lock until killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env() | {"PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder
