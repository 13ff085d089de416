"""The training worker behind `python -m boost_titan.train` (and `bench step`'s worker).

Importing this module changes nothing. `run` prepares the process (`prepare_process`: CPU/gloo
when there is no accelerator, every family's TrainSpec registered), parses the job once
(`parse_job_config`, which adds the `[boost]` section) and trains it (`train`: TorchTitan's
`main` on that parsed job). User errors (`ConfigError`) and a diverged loss end the worker
with one `error:` line and exit code 2 or 3, a stop with a checkpoint (`runtime.stopping`)
with its line and 75. Every worker ends through `boost_titan.processes.teardown.run_to_end`
(groups destroyed, no interpreter finalization: a finished run cannot end in a SIGABRT).
Rank 0 holds the dump folder's lock for the whole run (`boost_titan.runtime.dump_lock`: one
job per folder) and warns when torchrun restarts are enabled over its shared TCPStore
(`boost_titan.runtime.restarts`).

`./run_train.sh` validates the job with `boost_titan.check` first, but never in a worker's
process (torchrun starts new ones), and a worker may be launched without it (`torchrun -m
boost_titan.train`): so the worker checks again what would otherwise fail on some rank only,
or late (`run`: the parallel degrees against the process count, right after the parse;
`train`: the run limits, CUDA graphs, the optimizer and TorchTitan's own assertions, before
the trainer is built; the dump folder's lock; the data, tokenizer and checkpoints where they
are read).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

import torch
import torchtitan
from torchtitan.tools.logging import init_logger, logger

from boost_titan.config import check_cuda_graphs, check_documents, check_run_limits
from boost_titan.config.bounds import check_bounds
from boost_titan.config.cli import fail, parse_job_config
from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import check_optimizer
from boost_titan.config.titan_settings import check_titan_settings
from boost_titan.config.world import resolve_world
from boost_titan.data.held_out import point_titan_validation_at_held_out
from boost_titan.data.tokenizer import DefaultAssetsWarningFilter
from boost_titan.job.families import register_families
from boost_titan.processes.teardown import end_process_groups
from boost_titan.runtime.device import use_cpu_if_no_accelerator
from boost_titan.runtime.dump_lock import DumpFolderLock
from boost_titan.runtime.nonfinite import TrainingDiverged
from boost_titan.runtime.restarts import shared_store_warning
from boost_titan.runtime.stopping import STOPPED, StoppedEarly, record_stop
from boost_titan.runtime.trainer import BoostTrainer


def prepare_process() -> None:
    """CPU processes and gloo when there is no accelerator, every family's TrainSpec
    registered (`job.families`), and a warning of torchdata's silenced; before the
    trainer is built."""
    use_cpu_if_no_accelerator()
    register_families()
    # torchdata's StatefulDataLoader calls a deprecated torch API on every construction.
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


def _drop_error_file() -> None:
    """Keep torchrun from replaying this worker's traceback for an already reported error."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path and os.path.exists(path):
        os.remove(path)


def run(trainer_cls: type[BoostTrainer] = BoostTrainer) -> int:
    """Prepare the process, parse the job once (one-line errors), then train it with
    `trainer_cls`; SystemExit 2 on a user error, 3 on a diverged loss; returns STOPPED after
    a stop before the last step, else 0."""
    prepare_process()
    rank0 = os.environ.get("RANK", "0") == "0"
    warning = shared_store_warning()
    if warning and rank0:
        print(warning, file=sys.stderr, flush=True)
    logging.getLogger().addFilter(DefaultAssetsWarningFilter())  # TorchTitan logs to the root
    lock = None
    try:
        init_logger()  # before the parse: TorchTitan's warnings about the job reach its log
        job = parse_job_config(sys.argv[1:], titan_warnings=True)
        if job.comm.mode not in ("fake_backend", "local_tensor"):  # those simulate NGPU ranks
            resolve_world(job, int(os.environ.get("WORLD_SIZE", "1")))  # degrees fit the ranks
        if rank0:
            lock = DumpFolderLock(job.job.dump_folder)
            lock.acquire()
        train(trainer_cls, job)
    except ConfigError as e:
        _drop_error_file()
        fail(str(e), code=2)
    except TrainingDiverged as e:
        _drop_error_file()
        fail(str(e), code=3)
    except StoppedEarly as e:  # its line is printed; torchrun's error file keeps it
        record_stop(str(e))
        return STOPPED
    finally:
        # BoostTrainer.close() ends the groups; this covers a trainer that never got built
        # (then `run_to_end` ends the process: `boost_titan.processes.teardown`).
        end_process_groups(finished=False)
        if lock is not None:
            lock.release()
    return 0


def train(trainer_cls: type[BoostTrainer], job) -> None:
    """TorchTitan 0.2.2's `main` (`torchtitan/train.py`) on the parsed `job`, after the
    worker's checks (module docstring): build the trainer, train (or save the seed
    checkpoint), close it and end the process group."""
    logger.info(
        "torchtitan version: %s (0.0.0 means __version__ is not defined correctly).",
        torchtitan.__version__,
    )
    check_run_limits(job.boost)
    check_cuda_graphs(job.boost, job.parallelism.pipeline_parallel_degree)
    check_documents(job.boost, job.model.name, job.parallelism)
    check_titan_settings(job)
    check_optimizer(job)
    check_bounds(job)
    point_titan_validation_at_held_out(job)
    trainer = None
    try:
        trainer = trainer_cls(job)
        if job.comm.mode == "local_tensor":  # as TorchTitan: the model is not fully built
            logger.info("Local tensor mode enabled - skipping training execution")
            return
        if job.checkpoint.create_seed_checkpoint:
            assert int(os.environ["WORLD_SIZE"]) == 1, (
                "Must create seed checkpoint using a single device, to disable sharding."
            )
            assert job.checkpoint.enable, (
                "Must enable checkpointing when creating a seed checkpoint."
            )
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            trainer.train()
    except Exception:
        if trainer:
            trainer.close()
        raise
    trainer.close()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    logger.info("Process group destroyed")
