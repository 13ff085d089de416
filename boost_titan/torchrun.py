"""torchrun whose agent acts on the first termination signal only, never restarts a stopped
group, and exits 75 after a stop.

    python -m boost_titan.torchrun [torchrun arguments ...]

torchrun's agent turns each handled signal (SIGTERM, SIGUSR1 with `--signals-to-handle`...)
into a `SignalException`, then signals the workers and waits up to `--shutdown-timeout`
for them. A second signal during that wait (a scheduler that signals the whole process
group, a relay that passes the signal on, an impatient user) raises again inside the
shutdown: the agent sends SIGTERM on top of the first signal and can hang with its workers
gone (seen with two SIGUSR1s on torch 2.13). Here the agent ignores every handled signal
once the first has arrived, so the workers finish their save and torchrun exits when they
do.

Stock torchrun exits 1 whenever a worker exits non-zero (a `ChildFailedError` report) or a
handled signal arrived (a `SignalException` traceback), and with `--max-restarts` left it
restarts a group whose worker exited non-zero. Workers that stopped with a checkpoint exit
`STOPPED` (75, `runtime.stopping`); here such a group is never restarted, and torchrun
exits with `exit_status` of the workers' statuses: 75 after a stop, 0 when the run was
complete (a signal during the last step), with neither report. `run_train.sh` and
`scripts/slurm_train.sbatch` launch torchrun through this.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterable
from types import FrameType

import torch.distributed.elastic.multiprocessing.api as elastic_api
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main as torchrun_main

from boost_titan.runtime.stopping import STOPPED
from boost_titan.runtime.torch_internals import replace_torchrun_agent

_first_signal_handler = elastic_api._terminate_process_handler
_monitor_workers = LocalElasticAgent._monitor_workers
_shutdown = LocalElasticAgent._shutdown
WORKER_STATUS: dict[int, int | None] = {}
"""Local rank -> exit status of this agent's workers after its last shutdown."""


def _handle_once(signum: int, frame: FrameType | None) -> None:
    """torchrun's handler for the first signal; every handled signal is ignored after it."""
    for handled in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        if signal.getsignal(handled) is _handle_once:
            signal.signal(handled, signal.SIG_IGN)
    _first_signal_handler(signum, frame)


def exit_status(statuses: Iterable[int | None]) -> int | None:
    """STOPPED when the workers stopped (each exited STOPPED or 0, one at least STOPPED), 0
    when every one exited 0, None for anything else (a failure: torchrun's own report)."""
    statuses = list(statuses)
    if not statuses or any(s not in (0, STOPPED) for s in statuses):
        return None
    return STOPPED if STOPPED in statuses else 0


def _monitor_stopped_as_final(self: LocalElasticAgent, worker_group):
    """torchrun's monitor, with no restart left once the group's failures are all stops."""
    result = _monitor_workers(self, worker_group)
    failures = [f.exitcode for f in result.failures.values()]
    if result.is_failed() and exit_status(failures) == STOPPED:
        self._remaining_restarts = 0
    return result


def _shutdown_noting_status(self: LocalElasticAgent, *args, **kwargs) -> None:
    """torchrun's shutdown of the workers, then their exit statuses into WORKER_STATUS."""
    _shutdown(self, *args, **kwargs)
    handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
    WORKER_STATUS.update({rank: h.proc.poll() for rank, h in handlers.items()})


def main() -> None:
    # torchrun installs `_terminate_process_handler`, looked up in its module when the
    # workers start.
    replace_torchrun_agent(_handle_once, _monitor_stopped_as_final, _shutdown_noting_status)
    try:
        torchrun_main()
    except ChildFailedError as e:
        status = exit_status(f.exitcode for f in e.failures.values())
        if status is None:
            raise
        sys.exit(status)
    except SignalException:
        status = exit_status(WORKER_STATUS.values())
        if status is None:
            raise
        sys.exit(status)


if __name__ == "__main__":
    main()
