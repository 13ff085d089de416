"""TorchTitan's dataloader, whose saved position is read without running code.

TorchTitan stores each data-parallel rank's loader state in the checkpoint as
`pickle.dumps` bytes and restores it with `pickle.loads`, which calls whatever a checkpoint
from elsewhere names. `CheckpointedDataloader` keeps that format (checkpoints stay
TorchTitan's) and unpickles it through the checkpoint allowlist
(`boost_titan.checkpoint.safe_load`); TorchTitan's own loader (the one its models, e.g.
`llama3`, build) only ever receives a state the checkpoint's load vetted already
(`boost_titan.checkpoint.reads.GuardedPlanner`). A dataset whose position is
the same on every rank (`reshardable`: prepared data, `boost_titan.data.mix`) is saved under
one key (`SHARED_KEY`), so a checkpoint resumes at another data-parallel degree.
"""

from __future__ import annotations

import pickle
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.tools.logging import logger

from boost_titan.checkpoint.safe_load import UnsafeCheckpoint, loads
from boost_titan.config.errors import ConfigError

SHARED_KEY = "all_dp_ranks"
"""The loader state's key for a dataset whose position every rank shares."""


def _reshardable(loader: ParallelAwareDataloader) -> bool:
    """Every rank's position is the same (`data.mix`); False for TorchTitan's own datasets."""
    return getattr(loader.dataset, "reshardable", False)


class CheckpointedDataloader(ParallelAwareDataloader):
    """`ParallelAwareDataloader` whose `load_state_dict` unpickles through the allowlist."""

    def state_dict(self) -> dict[str, Any]:
        if not _reshardable(self):
            return super().state_dict()
        # every rank's position is the same (`data.mix`): one key, loadable at any DP degree
        state = pickle.dumps(StatefulDataLoader.state_dict(self))
        return {SHARED_KEY: state, "world_size": self.dp_world_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:  # a checkpoint without loader state: start at the beginning
            return
        key = SHARED_KEY if _reshardable(self) and SHARED_KEY in state_dict else self._rank_id
        if key not in state_dict:
            logger.warning(
                f"DataLoader state is empty for dp rank {self.dp_rank}, expected key "
                f"{self._rank_id}"
            )
            return
        saved = state_dict["world_size"]
        if key != SHARED_KEY and saved != self.dp_world_size:
            raise ConfigError(
                f"the checkpoint's dataloader state is for {saved} data-parallel ranks but "
                f"this job has {self.dp_world_size}; resume with the same data-parallel "
                "degree, or add --checkpoint.exclude_from_loading dataloader"
            )
        try:
            state = loads(state_dict[key])
        except UnsafeCheckpoint as e:
            raise ConfigError(
                f"the checkpoint's dataloader state ({key}): {e.what}; refusing to "
                "load it, a checkpoint holds tensors and metadata only"
            ) from None
        except Exception as e:  # not a pickle, or a damaged one
            raise ConfigError(
                f"the checkpoint's dataloader state ({key}) does not unpickle "
                f"({type(e).__name__}); add --checkpoint.exclude_from_loading dataloader"
            ) from None
        try:
            StatefulDataLoader.load_state_dict(self, state)
        except Exception as e:  # a state of another loader, or altered
            raise ConfigError(
                f"the checkpoint's dataloader state ({key}) does not fit this "
                f"loader ({type(e).__name__}); add --checkpoint.exclude_from_loading dataloader"
            ) from None
