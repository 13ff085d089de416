"""Loading never runs code from a checkpoint: the allowlist (`boost_titan.checkpoint.
safe_load`), DCP's guarded loads (`boost_titan.checkpoint.reads`), TorchTitan's dataloader
state, and every reader of a checkpoint (`check`, the trainer's check before it loads,
`export`, `eval`, `generate`, `load_sharded`), each given payloads that would create a
marker file through os.system, subprocess or builtins.eval
(`tests/distributed/test_safe_load.py`: a checkpoint the trainer wrote, through `check`
and `run_train.sh`).
"""

from __future__ import annotations

import io
import pickle
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader

from boost_titan import eval as eval_command
from boost_titan import export as export_command
from boost_titan import generate as generate_command
from boost_titan.check import main as check_main
from boost_titan.checkpoint.agree import Choice, check_checkpoint_to_load
from boost_titan.checkpoint.reads import GuardedPlanner, GuardedReader
from boost_titan.checkpoint.safe_load import (
    UnsafeCheckpoint,
    load_saved,
    loads,
    read_metadata,
    vet_byte_items,
)
from boost_titan.config.errors import ConfigError
from boost_titan.data.loader import CheckpointedDataloader
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import (
    PAYLOAD_NAMES,
    debug_args,
    payload,
    plant_byte_item,
    plant_metadata,
    save_checkpoint,
    save_model_checkpoint,
)

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
DCP_READS = (FileSystemReader.read_metadata, DefaultLoadPlanner.load_bytes)
"""DCP's own reads, as imported."""
REFUSED = "refusing to load it; a checkpoint holds tensors and metadata only"
# where -> (payload kind, plant(folder, kind, marker)): the places a checkpoint holds pickles
PLACES = {
    ".metadata": ("os", plant_metadata),
    "byte item": ("subprocess", lambda f, k, m: plant_byte_item(f, "train_state.step", k, m)),
    "dataloader state": (
        "eval",
        lambda f, k, m: plant_byte_item(f, "dataloader.dp_rank_0", k, m, nested=True),
    ),
}


@pytest.fixture
def unguarded():
    """DCP's reads stay as torch ships them: the code under test guards its own loads
    (`GuardedReader`, `GuardedPlanner`), never torch's classes."""
    yield
    assert (FileSystemReader.read_metadata, DefaultLoadPlanner.load_bytes) == DCP_READS


def _planted(source: Path, folder: Path, place: str) -> tuple[Path, Path, str]:
    """A copy of the checkpoint `source` at `folder` with the payload of `place`; (folder,
    marker, what the refusal names)."""
    shutil.copytree(source, folder)
    kind, plant = PLACES[place]
    marker = folder.parent / f"{folder.name}-MARKER"
    plant(folder, kind, marker)
    return folder, marker, PAYLOAD_NAMES[kind]


# ---- the allowlist -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(PAYLOAD_NAMES))
def test_allowlist_refuses_each_payload_and_runs_nothing(kind, tmp_path):
    """As a pickle (protocol 5, `.metadata`'s and TorchTitan's) and as a torch.save archive
    (protocol 2, a byte item's): refused by name; the same payload unpickled plainly runs."""
    marker = tmp_path / "MARKER"
    planted = payload(kind, marker)
    archive = io.BytesIO()
    torch.save(planted, archive)
    for load in (
        lambda: loads(pickle.dumps(planted)),
        lambda: load_saved(io.BytesIO(archive.getvalue())),
    ):
        with pytest.raises(UnsafeCheckpoint) as refusal:
            load()
        assert refusal.value.what == f"asks for {PAYLOAD_NAMES[kind]}"
    assert not marker.exists()
    pickle.loads(pickle.dumps(planted))
    assert marker.exists()  # the payload is real


class _Counting(IterableDataset, Stateful):
    """0, 1, 2, ... with its position as state."""

    def __init__(self) -> None:
        self.next = 0

    def __iter__(self):
        while True:
            self.next += 1
            yield torch.tensor(self.next - 1)

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = state["next"]


def test_torchtitan_checkpoint_loads_the_same_through_the_guard(tmp_path, unguarded):
    """A checkpoint shaped as TorchTitan writes one (tensors, optimizer settings, train
    state, the dataloader's pickled position): the allowlisted reads equal DCP's own, and the
    dataloader resumes where it stopped."""
    loader = CheckpointedDataloader(_Counting(), dp_rank=0, dp_world_size=1, batch_size=2)
    batches = iter(loader)
    [next(batches) for _ in range(3)]
    state = {
        "w": torch.randn(4, 4),
        "optimizer": {"param_groups": [{"lr": 3e-3, "betas": (0.9, 0.95), "foreach": None}]},
        "train_state": {"step": 3, "ntokens_seen": 96},
        "dataloader": loader.state_dict(),
    }
    folder = str(tmp_path / "step-3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    metadata = read_metadata(folder)
    plain = FileSystemReader(folder).read_metadata()
    assert metadata.state_dict_metadata == plain.state_dict_metadata
    assert metadata.storage_data == plain.storage_data
    vet_byte_items(folder, metadata)

    def load(flatten: bool | None = None, guarded: bool = False) -> dict:
        """The saved values through DCP (`guarded`: through `GuardedReader` and
        `GuardedPlanner`): a nested state dict (flattened by the planner), or with
        `flatten=False` one keyed by the flat names."""
        loaded = {
            "w": torch.zeros(4, 4),
            "optimizer": {"param_groups": [{"lr": 0.0, "betas": (), "foreach": 1}]},
            "train_state": {"step": 0, "ntokens_seen": 0},
            "dataloader": {"dp_rank_0": b"", "world_size": 0},
        }
        if flatten is False:
            loaded = {"train_state.step": 0, "dataloader.dp_rank_0": b""}
        nested = flatten is not False  # flat: the caller's dict itself is filled in
        kind = GuardedPlanner if guarded else DefaultLoadPlanner
        planner = kind(flatten_state_dict=nested, flatten_sharded_tensors=nested)
        reader = GuardedReader(folder) if guarded else FileSystemReader(folder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(loaded, storage_reader=reader, planner=planner, no_dist=True)
        return loaded

    reference, flat_reference = load(), load(flatten=False)
    loaded = load(guarded=True)
    assert torch.equal(loaded.pop("w"), state["w"])
    assert loaded == {k: v for k, v in reference.items() if k != "w"}
    assert loaded["dataloader"] == state["dataloader"]
    assert (
        load(flatten=False, guarded=True)
        == flat_reference
        == {
            "train_state.step": 3,
            "dataloader.dp_rank_0": state["dataloader"]["dp_rank_0"],
        }
    )
    resumed = CheckpointedDataloader(_Counting(), dp_rank=0, dp_world_size=1, batch_size=2)
    resumed.load_state_dict(loaded["dataloader"])
    assert next(iter(resumed)).tolist() == next(batches).tolist() == [6, 7]


@pytest.mark.parametrize("place", list(PLACES))
def test_guarded_dcp_load_refuses_and_runs_nothing(place, tmp_path, unguarded):
    """DCP's load through `GuardedReader` and `GuardedPlanner` (the trainer's) refuses each
    place, the dataloader state in a byte item before any loader receives it: TorchTitan's
    own loader, which calls `pickle.loads`, is the one here."""
    source = tmp_path / "source"
    save_checkpoint(source, debug_args("cola"))
    folder, marker, name = _planted(source, tmp_path / "step-3", place)
    loader = ParallelAwareDataloader(_Counting(), dp_rank=0, dp_world_size=1, batch_size=2)
    state = {"train_state": {"step": 0, "ntokens_seen": 0}, "dataloader": loader}
    reader, planner = GuardedReader(str(folder)), GuardedPlanner()
    with pytest.raises((CheckpointException, UnsafeCheckpoint)) as refusal:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
    assert f"asks for {name}" in str(refusal.value)
    assert not marker.exists()


# ---- every reader of a checkpoint ------------------------------------------------------------
def _check(capsys, *args: str) -> str:
    """`python -m boost_titan.check` in this process: exit 2 and one `error:` line."""
    with pytest.raises(SystemExit) as exit_info:
        check_main(["--nproc", "2", "--job.config_file", str(DEBUG_TOML), *args])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exit_info.value.code == 2 and out == "", (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("resume", [False, True], ids=["initial_load_path", "resume folder"])
@pytest.mark.parametrize("place", list(PLACES))
def test_check_refuses_each_place(place, resume, capsys, tmp_path):
    """`check` (which `run_train.sh` runs before any worker) on a planted checkpoint given
    as `checkpoint.initial_load_path` or found in the dump folder."""
    source = save_model_checkpoint(tmp_path / "source", with_state=True)
    dump = tmp_path / "dump"
    folder = dump / "checkpoint" / "step-3" if resume else tmp_path / "seed" / "step-3"
    folder.parent.mkdir(parents=True)
    folder, marker, name = _planted(source, folder, place)
    initial = [] if resume else ["--checkpoint.initial_load_path", str(folder)]
    line = _check(capsys, "--job.dump_folder", str(dump), *initial)
    where = "the checkpoint to resume from," if resume else "checkpoint.initial_load_path"
    part = ".metadata" if place == ".metadata" else "__0_0.distcp ("
    assert line.startswith(f"error: {where} {folder}: {part}"), line
    assert line.endswith(f"asks for {name}: {REFUSED}"), line
    assert not marker.exists()


def test_trainer_checks_what_it_will_load(tmp_path):
    """Before TorchTitan loads, every rank reads the checkpoint it will load through the
    allowlist: its own dump folder's step-N of rank 0's pick, else a DCP initial_load_path
    (not an export)."""
    source = save_model_checkpoint(tmp_path / "source", with_state=True)
    resume, marker, name = _planted(source, tmp_path / "dump" / "step-3", "byte item")
    initial, _, _ = _planted(source, tmp_path / "seed", ".metadata")
    checkpointer = SimpleNamespace(
        folder=str(resume.parent), initial_load_path=str(initial), initial_load_in_hf=False
    )
    picked = Choice("rank 0's folder", folder_exists=True, step=3)
    with pytest.raises(ConfigError, match=f"resume from, {resume}: .* asks for {name}: "):
        check_checkpoint_to_load(checkpointer, picked)
    none = Choice("rank 0's folder", folder_exists=False, step=-1)
    with pytest.raises(ConfigError, match=f"initial_load_path {initial}: .metadata asks for"):
        check_checkpoint_to_load(checkpointer, none)
    check_checkpoint_to_load(checkpointer, Choice("", True, -1))  # loads nothing
    checkpointer.initial_load_in_hf = True  # an export: safetensors, no pickle to read
    check_checkpoint_to_load(checkpointer, none)
    assert not marker.exists() and not (tmp_path / "seed-MARKER").exists()


COMMANDS = {  # command -> (its main, the place planted, arguments after --checkpoint DIR)
    "export": (export_command.main, "byte item", ["--arch", "cola", "--out", "{tmp}/out"]),
    "eval": (eval_command.main, "dataloader state", ["--arch", "cola"]),
    "generate": (generate_command.main, ".metadata", ["--arch", "cola", "--prompt", "x"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_commands_refuse_a_planted_checkpoint(command, capsys, tmp_path, unguarded):
    main, place, args = COMMANDS[command]
    source = tmp_path / "source"
    save_checkpoint(source, debug_args("cola"))
    folder, marker, name = _planted(source, tmp_path / "step-3", place)
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(folder), *(a.format(tmp=tmp_path) for a in args)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: --checkpoint {folder}: ") and f"asks for {name}" in lines[0]
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_load_sharded_refuses_a_planted_checkpoint(tmp_path, unguarded):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from boost_titan.checkpoint.sharded import load_sharded, save_sharded
    from boost_titan.examples.own_model import LAYOUT, Decoder
    from boost_titan.parallelize import apply_plan, btp_plan
    from boost_titan.processes.teardown import end_process_groups

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = apply_plan(Decoder(), mesh, btp_plan(LAYOUT, loss_parallel=False))
        save_sharded(model, tmp_path / "source")
        folder, marker, name = _planted(tmp_path / "source", tmp_path / "sharded", ".metadata")
        with pytest.raises(UnsafeCheckpoint, match=f".metadata asks for {name}"):
            load_sharded(model, folder)
    finally:
        end_process_groups(finished=False)
    assert not marker.exists()
