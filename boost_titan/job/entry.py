"""The training worker behind `python -m boost_titan.train` (and `bench step`'s worker).

Importing it prepares the process before torchtitan is imported: it adds the `[boost]`
config section to the arguments, runs on CPU/gloo when there is no accelerator and registers
the `boost_llama` TrainSpec; `run` runs TorchTitan's `main` with `BoostTrainer`. User errors
(`ConfigError`) and a diverged loss end the worker with one `error:` line and exit code 2
or 3, a stop with a checkpoint (`runtime.stopping`) with its line and 75. Every worker
ends through `boost_titan.parallelize.teardown.run_to_end` (groups destroyed, no
interpreter finalization: a finished run cannot end in a SIGABRT).
`./run_train.sh` validates the job with `boost_titan.check` before launching. Rank 0 holds
the dump folder's lock for the whole run (`boost_titan.runtime.dump_lock`: one job per
folder) and warns when torchrun restarts are enabled over its shared TCPStore
(`boost_titan.runtime.restarts`).
"""

import sys

from boost_titan.config.cli import with_boost_section

# Before any torchtitan import: ConfigManager binds sys.argv[1:] as a default at import time.
sys.argv[1:] = with_boost_section(sys.argv[1:])

import logging  # noqa: E402
import os  # noqa: E402
import warnings  # noqa: E402

from boost_titan.runtime.device import use_cpu_if_no_accelerator  # noqa: E402

use_cpu_if_no_accelerator()
# torchdata's StatefulDataLoader calls a deprecated torch API on every construction.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

# isort: off
import boost_titan.boost_llama.spec  # noqa: E402, F401  (registers the boost_llama TrainSpec)
from torchtitan.train import main as titan_main  # noqa: E402

# isort: on
from boost_titan.config.cli import fail, parse_job_config  # noqa: E402
from boost_titan.config.errors import ConfigError  # noqa: E402
from boost_titan.data.tokenizer import DefaultAssetsWarningFilter  # noqa: E402
from boost_titan.parallelize.teardown import end_process_groups  # noqa: E402
from boost_titan.runtime.dump_lock import DumpFolderLock  # noqa: E402
from boost_titan.runtime.nonfinite import TrainingDiverged  # noqa: E402
from boost_titan.runtime.restarts import shared_store_warning  # noqa: E402
from boost_titan.runtime.stopping import STOPPED, StoppedEarly, record_stop  # noqa: E402
from boost_titan.runtime.trainer import BoostTrainer  # noqa: E402


def _drop_error_file() -> None:
    """Keep torchrun from replaying this worker's traceback for an already reported error."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path and os.path.exists(path):
        os.remove(path)


def run(trainer_cls: type[BoostTrainer] = BoostTrainer) -> int:
    """Parse (one-line errors), then train with `trainer_cls`; SystemExit 2 on a user
    error, 3 on a diverged loss; returns STOPPED after a stop before the last step, else 0."""
    rank0 = os.environ.get("RANK", "0") == "0"
    warning = shared_store_warning()
    if warning and rank0:
        print(warning, file=sys.stderr, flush=True)
    logging.getLogger().addFilter(DefaultAssetsWarningFilter())  # TorchTitan logs to the root
    lock = None
    try:
        job = parse_job_config(sys.argv[1:])
        if rank0:
            lock = DumpFolderLock(job.job.dump_folder)
            lock.acquire()
        titan_main(trainer_cls)
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
        # (then `run_to_end` ends the process: `boost_titan.parallelize.teardown`).
        end_process_groups(finished=False)
        if lock is not None:
            lock.release()
    return 0
