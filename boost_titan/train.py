"""Training entry point.

    torchrun --nproc_per_node=N -m boost_titan.train --job.config_file train_configs/X.toml \
        [--section.key value ...]

The worker is `boost_titan.job.entry.run`: it runs on CPU/gloo when there is no accelerator,
registers the `boost_llama` TrainSpec, parses the job once (with the `[boost]` section) and
trains with `BoostTrainer` (one `error:` line and exit code 2 for a user error, 3 for a
diverged loss, 75 after a stop by SIGTERM, SIGUSR1 or the time budget: `runtime.stopping`);
`run_to_end` gives every worker its orderly end.
The trainer gets the memory model (`boost_titan.perf.fits.rank0_prediction`), whose
prediction rank 0 logs next to the measured peak after the first step.
`./run_train.sh` validates the job with `boost_titan.check` before launching.
"""

import functools

from boost_titan.runtime.stopping import end_if_stopped_before


def main() -> None:
    end_if_stopped_before()  # torchrun restarted a stopped group: it ends before the imports
    from boost_titan.job.entry import run
    from boost_titan.perf.fits import rank0_prediction
    from boost_titan.processes.teardown import run_to_end
    from boost_titan.runtime.trainer import BoostTrainer

    trainer = functools.partial(BoostTrainer, memory_model=rank0_prediction)
    run_to_end(functools.partial(run, trainer))  # the worker's orderly end, whatever its status


if __name__ == "__main__":
    main()
