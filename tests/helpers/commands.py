"""Our commands in child processes: run one, read its one-line error, hold a dump folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT


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
