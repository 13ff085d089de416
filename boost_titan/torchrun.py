"""torchrun whose agent acts on the first termination signal only.

    python -m boost_titan.torchrun [torchrun arguments ...]

torchrun's agent turns each handled signal (SIGTERM, SIGUSR1 with `--signals-to-handle`...)
into a `SignalException`, then signals the workers and waits up to `--shutdown-timeout`
for them. A second signal during that wait (a scheduler that signals the whole process
group, a relay that passes the signal on, an impatient user) raises again inside the
shutdown: the agent sends SIGTERM on top of the first signal and can hang with its workers
gone (seen with two SIGUSR1s on torch 2.13). Here the agent ignores every handled signal
once the first has arrived, so the workers finish their save and torchrun exits when they
do. `run_train.sh` and `scripts/slurm_train.sbatch` launch torchrun through this.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

import torch.distributed.elastic.multiprocessing.api as elastic_api
from torch.distributed.run import main as torchrun_main

_first_signal_handler = elastic_api._terminate_process_handler


def _handle_once(signum: int, frame: FrameType | None) -> None:
    """torchrun's handler for the first signal; every handled signal is ignored after it."""
    for handled in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        if signal.getsignal(handled) is _handle_once:
            signal.signal(handled, signal.SIG_IGN)
    _first_signal_handler(signum, frame)


def main() -> None:
    # torchrun installs `_terminate_process_handler`, looked up in its module when the
    # workers start.
    elastic_api._terminate_process_handler = _handle_once
    sys.exit(torchrun_main())


if __name__ == "__main__":
    main()
