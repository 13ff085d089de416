"""Try to reproduce the suspected cause of a finished run's SIGABRT: a gloo rank that leaves
the interpreter with live process groups while its peer is still up may abort ("terminate
called without an active exception"); one that destroys them first should not.

    python scripts/teardown_abort.py [RUNS]      (default 6 runs per variant, ~2 min)

Each run is a 2-rank torchrun job of this file: both ranks all-reduce on the default group
and a second gloo group (as TorchTitan's async checkpointer makes), then rank 1 sleeps 3 s
while rank 0 exits, with or without `destroy_process_group`. Prints per variant how many
runs exited non-zero and how many printed the abort (`runtime/teardown.py` ends every run
with destroyed groups either way).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ABORT = "terminate called"


def worker(destroy: bool) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    second = dist.new_group(backend="gloo")
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    dist.all_reduce(tensor, group=second)
    if dist.get_rank() == 1:
        time.sleep(3)
    if destroy:
        dist.destroy_process_group()


def launch(destroy: bool) -> tuple[int, str]:
    """One 2-rank job: its exit status and output."""
    env = os.environ | {"TEARDOWN_DESTROY": str(int(destroy)), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", __file__]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout + result.stderr


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    for destroy in (False, True):
        results = [launch(destroy) for _ in range(runs)]
        failed = sum(code != 0 for code, _ in results)
        aborted = sum(ABORT in output for _, output in results)
        what = "destroy_process_group first" if destroy else "live process groups at exit"
        print(f"{what}: {failed} of {runs} runs exited non-zero, {aborted} printed the abort")


if __name__ == "__main__":
    if "TEARDOWN_DESTROY" in os.environ:
        worker(os.environ["TEARDOWN_DESTROY"] == "1")
    else:
        main()
