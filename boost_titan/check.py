"""Validate a training job in one process, without process groups.

    python -m boost_titan.check [--nproc N] --job.config_file X.toml [--section.key value ...]

Takes the same arguments as `boost_titan.train`, parsed once; the checks are
`boost_titan.job.preflight.check_job`'s. A valid job also gets its predicted peak memory
per GPU against the GPU's (`boost_titan.perf.fits`: this machine's CUDA GPU, else the
planner's default profile, said as assumed), and whether it fits; a job whose prediction
does not fit that GPU is refused (the memory line as its one `error:` line).

Exit status: 0 and `config ok: ...`; 2 and one `error: ...` line; FINISHED (4) and
`nothing to train: ...` when the dump folder's checkpoint is already at training.steps
(`run_train.sh` then launches no worker and exits 0).
"""

from __future__ import annotations

import sys

from boost_titan.config.cli import fail, job_source, parse_job_config
from boost_titan.config.errors import ConfigError
from boost_titan.config.world import pop_nproc, resolve_world
from boost_titan.job.preflight import NothingToTrain, check_job
from boost_titan.perf.fits import NOT_FIT, check_line

FINISHED = 4
"""Exit status for a job that has nothing left to train."""

HELP = f"""usage: python -m boost_titan.check [--nproc N] --job.config_file FILE
                                   [--section.key VALUE ...]

Validate a training job before any worker starts: the same arguments as
`python -m boost_titan.train` (the TOML and its overrides; list them with
`python -m boost_titan.train --help`), plus the process count.

  --nproc N   processes the job runs on (default: $NGPU, else the fewest the
              [parallelism] degrees allow)

Exit status: 0 (config ok), 2 (bad input or a job whose predicted memory does not fit
the GPU, one `error:` line), {FINISHED} (nothing to train:
the dump folder's checkpoint is already at training.steps)."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args:
        print(HELP)
        return
    try:
        nproc, rest = pop_nproc(args)
        job = parse_job_config(rest)  # the one parse of this process
        summary = check_job(job, nproc)
        memory = memory_line(job, nproc, job_source(rest))
        if NOT_FIT in memory:  # the job would run out of memory at its first step
            fail(memory)
        print(summary, flush=True)
        print(memory, flush=True)
    except ConfigError as e:
        fail(str(e))
    except NothingToTrain as e:
        print(e, flush=True)
        raise SystemExit(FINISHED) from None


def memory_line(job, nproc: int | None, where: str | None = None) -> str:
    """The parsed job's predicted memory per GPU on `nproc` processes against this machine's
    GPU (or the assumed one); `where` names the job's source (default: its TOML)."""
    import torch

    from boost_titan.job.families import family_of

    world, _ = resolve_world(job, nproc)
    family = family_of(job)
    vocab = None if family is None else family.vocab_size(job)
    device = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = (props.name, props.total_memory / 2**30)
    return check_line(job, world, vocab, device, where)


if __name__ == "__main__":
    main()
