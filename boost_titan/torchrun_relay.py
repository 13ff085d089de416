"""Run torchrun and relay its console output, ending a failed job on the worker's own error.

    python -m boost_titan.torchrun_relay torchrun [torchrun arguments ...]

`run_train.sh` launches torchrun through this. torchrun's stdout and stderr come through
one pipe; worker lines (`[rank0]:...`) pass at once; torchrun's own lines are held until
the next worker line, so what is held at the end is torchrun's closing output. When that
is torchrun's failure report (a traceback and a box naming the root cause) and a worker
printed an `error: ...` line (a user error, or a diverged loss), the report is dropped,
the worker's error is printed last without its rank prefix, and the exit status is the
failed worker's (from the box). Otherwise the
held lines are printed as they came and the exit status is torchrun's.

A stop with a checkpoint (SIGTERM, SIGUSR1 or the time budget: `runtime.stopping`) ends on
the workers' `stopped by ...` line and status `STOPPED` (75); one asked for during the last
step ends on their `... during the last step, N; training is complete ...` line and status
0; torchrun's own report of the signal (a `SignalException` traceback) is dropped.
SIGTERM, SIGHUP and SIGUSR1 are passed on to torchrun (launch it with `--signals-to-handle`
naming SIGUSR1, or SIGUSR1 kills it); SIGINT (Ctrl-C) reaches torchrun from the terminal
itself, so the relay ignores it and keeps relaying until torchrun has shut down.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterable
from typing import TextIO

from boost_titan.config.cli import fail
from boost_titan.runtime.stopping import FINISHED_LINE, STOP_LINE, STOPPED

WORKER_LINE = re.compile(r"^\[[a-z_]+\d+\]:")
"""torchrun's `--tee` prefix of worker output (`--role rank`: `[rank0]:`)."""
ROOT_CAUSE_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


def worker_error(line: str) -> str | None:
    """The `error: ...` line a worker printed, without torchrun's rank prefix."""
    match = WORKER_LINE.match(line)
    if match and line[match.end() :].startswith("error: "):
        return line[match.end() :].rstrip("\n")
    return None


def root_cause_exit(closing: list[str]) -> int | None:
    """The failed worker's exit code from torchrun's failure box; None if `closing` holds
    no failure box."""
    parts = "".join(closing).split("Root Cause", 1)
    if len(parts) < 2:
        return None
    for line in parts[1].splitlines():
        if match := ROOT_CAUSE_EXIT.match(line):
            return int(match.group(1)) or 1
    return 1


def stop_line(line: str) -> tuple[str, int] | None:
    """The stop line a worker printed (`stopped by ...`, or the last step's), without
    torchrun's rank prefix, and the status the job then ends with."""
    match = WORKER_LINE.match(line)
    text = line[match.end() :].rstrip("\n") if match else ""
    if STOP_LINE.match(text):
        return text, STOPPED
    return (text, 0) if FINISHED_LINE.match(text) else None


def relay(lines: Iterable[str], out: TextIO) -> int | None:
    """Copy `lines` to `out` as described in the module docstring; return the failed
    worker's exit status when its error replaced torchrun's report, that of a stop line
    (`stop_line`) after one, else None."""
    held: list[str] = []
    errors: list[str] = []
    stopped = None
    for line in lines:
        if WORKER_LINE.match(line):
            out.writelines(held)
            held.clear()
            out.write(line)
            out.flush()
            if (error := worker_error(line)) and error not in errors:
                errors.append(error)
            stopped = stop_line(line) or stopped
        else:
            held.append(line)
    if stopped is not None and not errors:
        if not any("SignalException" in line for line in held):
            out.writelines(held)
        out.write(stopped[0] + "\n")
        out.flush()
        return stopped[1]
    status = root_cause_exit(held)
    if not errors or status is None:
        out.writelines(held)
        out.flush()
        return None
    out.write("\n".join(errors) + "\n")
    out.flush()
    return status


USAGE = "usage: python -m boost_titan.torchrun_relay torchrun [arguments ...]"


def main(argv: list[str] | None = None) -> None:
    command = list(sys.argv[1:] if argv is None else argv)
    if command[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__.split(chr(10) + chr(10))[0]}")
        return
    if not command:
        fail(f"no command to relay; {USAGE}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except OSError as e:
        fail(
            f"cannot run {command[0]!r} ({e.strerror}); the relay runs a launcher, e.g. "
            "python -m boost_titan.torchrun_relay torchrun --nproc_per_node=2 -m "
            "boost_titan.train --job.config_file train_configs/debug.toml"
        )
    for forwarded in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(forwarded, lambda signum, _: child.send_signal(signum))
    status = relay(child.stdout, sys.stdout)
    code = child.wait()
    sys.exit(status if status is not None else (code if code >= 0 else 128 - code))


if __name__ == "__main__":
    main()
