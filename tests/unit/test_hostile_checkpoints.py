"""Issue 39's hostile checkpoints, rebuilt by hand on a checkpoint of the debug.toml model
(`tests.helpers.hostile.CASES`): each is one `error:` line naming the file and what is
wrong, the same from `check`, the trainer's check before it loads, `export`, `eval` and
`generate`; no payload runs, no class changes, no FIFO blocks. Also: TorchTitan's own
dataloader (`--model.name llama3`) unpickles through the allowlist, step folders are read
as TorchTitan reads them, and the allowlist's limits in isolation. The fuzzer over the same
readers: `test_checkpoint_fuzz.py`."""

from __future__ import annotations

import pathlib
import pickle
import shutil
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata
from torchtitan.components.dataloader import ParallelAwareDataloader

from boost_titan import eval as eval_command
from boost_titan import export as export_command
from boost_titan import generate as generate_command
from boost_titan.check import main as check_main
from boost_titan.checkpoint import safe_load
from boost_titan.checkpoint.agree import Choice, agree_on_checkpoint, check_checkpoint_to_load
from boost_titan.config.errors import ConfigError
from boost_titan.processes.teardown import end_process_groups
from boost_titan.runtime.resume import read_states
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import debug_args, save_checkpoint, save_model_checkpoint
from tests.helpers.hostile import CASES, hostile_pickles, read_metadata

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
READERS = ["check", "trainer", "export", "eval", "generate"]
COMMANDS = {
    "export": (export_command.main, ["--arch", "cola", "--out", "{tmp}/out"]),
    "eval": (eval_command.main, ["--arch", "cola"]),
    "generate": (generate_command.main, ["--arch", "cola", "--prompt", "x"]),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Clean checkpoints (with TorchTitan's non-tensor items) of the debug.toml job's model
    (for `check` and the trainer) and of the cola debug model (for the commands)."""
    root = tmp_path_factory.mktemp("sources")
    job = save_model_checkpoint(root / "job", with_state=True)
    save_checkpoint(root / "cola", debug_args("cola"))
    return {"job": job, "cola": root / "cola"}


def _one_line(capsys, exit_info) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, (out, err)
    assert lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _check(capsys, dump: pathlib.Path, *args: str) -> str:
    """The one `error:` line of `check` on debug.toml, 2 processes, dump folder `dump`."""
    argv = ["--nproc", "2", "--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(dump)]
    with pytest.raises(SystemExit) as exit_info:
        check_main([*argv, *args])
    return _one_line(capsys, exit_info)


def _read(reader: str, folder: pathlib.Path, dump: pathlib.Path, capsys, tmp) -> str:
    """What `reader` says of the checkpoint `folder` (a step-3 folder of `dump`)."""
    if reader == "check":
        return _check(capsys, dump)
    if reader == "trainer":
        checkpointer = SimpleNamespace(folder=str(folder.parent), initial_load_path="")
        with pytest.raises(ConfigError) as refusal:
            check_checkpoint_to_load(checkpointer, Choice(str(folder.parent), True, 3))
        return f"error: {refusal.value}"
    main, args = COMMANDS[reader]
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(folder), *(a.format(tmp=tmp) for a in args)])
    return _one_line(capsys, exit_info)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("case", list(CASES))
def test_each_hostile_checkpoint_is_one_line_from_every_reader(
    case, reader, sources, capsys, tmp_path
):
    said, plant = CASES[case]
    dump = tmp_path / "dump"
    folder = dump / "checkpoint" / "step-3"
    shutil.copytree(sources["job" if reader in ("check", "trainer") else "cola"], folder)
    marker = tmp_path / "MARKER"
    plant(folder, marker)
    getstate, path_str = (
        Metadata.__dict__.get("__getstate__"),
        pathlib.PosixPath.__dict__.get("_str"),
    )
    line = _read(reader, folder, dump, capsys, tmp_path)
    assert said in line and str(folder) in line, line
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert Metadata.__dict__.get("__getstate__") is getstate
    assert pathlib.PosixPath.__dict__.get("_str") is path_str


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_titan_dataloader_receives_only_vetted_state(sources, tmp_path):
    """`--model.name llama3` uses TorchTitan's own `ParallelAwareDataloader`, whose
    `load_state_dict` calls `pickle.loads`: the trainer's load (`resume.read_states`) vets
    the pickle in the dataloader's byte item first, so a protocol-0 payload is one line and
    runs nothing; a clean state loads (nothing of TorchTitan is patched)."""
    import torch.distributed.checkpoint as dcp

    loader = ParallelAwareDataloader(list(range(8)), dp_rank=0, dp_world_size=1, batch_size=2)
    titan_load = ParallelAwareDataloader.load_state_dict
    folder = tmp_path / "step-3"
    shutil.copytree(sources["job"], folder)
    said, plant = CASES["dataloader protocol-0 os.system"]
    plant(folder, tmp_path / "MARKER")
    with pytest.raises(ConfigError) as refusal:
        read_states({"dataloader": loader}, str(folder), None, str(folder), "fix")
    line = str(refusal.value)
    assert line.startswith(f"cannot load the checkpoint {folder} (UnsafeCheckpoint: "), line
    assert "dataloader.dp_rank_0" in line and said in line and "\n" not in line, line
    assert not (tmp_path / "MARKER").exists()
    batches = iter(loader)
    next(batches)
    dcp.save({"dataloader": loader}, checkpoint_id=str(tmp_path / "clean"), no_dist=True)
    resumed = ParallelAwareDataloader(list(range(8)), dp_rank=0, dp_world_size=1, batch_size=2)
    read_states({"dataloader": resumed}, str(tmp_path / "clean"), None, "clean", "fix")
    assert next(iter(resumed)).tolist() == next(batches).tolist() == [2, 3]
    assert ParallelAwareDataloader.load_state_dict is titan_load


def test_check_refuses_a_llama3_checkpoint_with_a_payload(sources, capsys, tmp_path):
    """`check` of a TorchTitan llama3 job vets the dataloader state of its resume folder."""
    dump = tmp_path / "dump"
    folder = dump / "checkpoint" / "step-3"
    shutil.copytree(sources["job"], folder)
    said, plant = CASES["dataloader protocol-0 os.system"]
    plant(folder, tmp_path / "MARKER")
    line = _check(capsys, dump, "--model.name", "llama3", "--model.flavor", "debugmodel")
    assert said in line and "dataloader.dp_rank_0" in line, line
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("name", ["step-0002", "step-2.bak", "old-step-2"])
def test_step_folders_as_torchtitan_reads_them(name, sources, capsys, tmp_path):
    """TorchTitan counts `step-0002` (or `step-2.bak`) as step 2, then loads `step-2`:
    `check` and the trainer's agreement both say so in one line (not "resumes from step 2",
    not "put the dump folder on a shared file system")."""
    folder = tmp_path / "dump" / "checkpoint"
    shutil.copytree(sources["job"], folder / name)
    line = _check(capsys, tmp_path / "dump", "--checkpoint.enable")
    assert f"{name} counts as step 2 for TorchTitan" in line and "rename" in line, line
    checkpointer = SimpleNamespace(folder=str(folder))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match=f"{name} counts as step 2 for TorchTitan"):
            agree_on_checkpoint(checkpointer, -1)
    finally:
        end_process_groups(finished=False)


# ---- the allowlist's limits --------------------------------------------------------------------
@pytest.mark.parametrize("name", list(hostile_pickles(pathlib.Path("M"))))
def test_unpickler_refuses_each_hostile_pickle(name, tmp_path):
    """Each hostile pickle is refused by `loads` (protocol 0 included, whatever the first
    byte), with no payload run and no class changed."""
    marker = tmp_path / "MARKER"
    getstate = Metadata.__dict__.get("__getstate__")
    with pytest.raises(pickle.UnpicklingError):
        safe_load.loads(hostile_pickles(marker)[name])
    assert not marker.exists() and Metadata.__dict__.get("__getstate__") is getstate


def test_unpickler_limits(monkeypatch):
    """Depth and opcode caps hold at their limits: MAX_DEPTH nests, one more does not."""
    ok = pickle.dumps({(((),),): [[[1]]]}, protocol=4)
    assert safe_load.loads(ok) == {(((),),): [[[1]]]}
    monkeypatch.setattr(safe_load, "MAX_DEPTH", 3)
    with pytest.raises(safe_load.UnsafeCheckpoint, match="deeper than 3"):
        safe_load.loads(ok)
    monkeypatch.setattr(safe_load, "MAX_DEPTH", 64)
    monkeypatch.setattr(safe_load, "MAX_OPCODES", 10)
    with pytest.raises(safe_load.UnsafeCheckpoint, match="more than 10 pickle opcodes"):
        safe_load.loads(pickle.dumps(list(range(20)), protocol=4))
    monkeypatch.setattr(safe_load, "MAX_OPCODES", 40)  # weighted: a set keeps 16, an int 1
    assert safe_load.loads(b"\x80\x04(" + b"K\x07" * 20 + b"l.") == [7] * 20
    with pytest.raises(safe_load.UnsafeCheckpoint, match="more than 40 pickle opcodes"):
        safe_load.loads(b"\x80\x04(" + b"\x8f" * 3 + b"l.")


def test_a_failed_load_is_one_line(tmp_path, monkeypatch):
    """A read that fails inside the trainer's load (DCP's CheckpointException, a
    BaseException) is one ConfigError line naming the checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from boost_titan.runtime import resume

    def load(*args, **kwargs) -> None:
        raise CheckpointException("load", {1: (ValueError("bad\nbytes"), None)})

    monkeypatch.setattr(dcp, "load", load)
    checkpointer = SimpleNamespace(folder=str(tmp_path), initial_load_path="")
    monkeypatch.setattr(resume, "states_to_load", lambda checkpointer, model_only: {})
    with pytest.raises(ConfigError) as refusal:
        read = resume.Resume(Choice(str(tmp_path), True, 3), metadata=SimpleNamespace())
        resume.load_checkpoint(checkpointer, read)  # its .metadata read already
    line = str(refusal.value)
    assert line.startswith(
        f"cannot load the checkpoint {tmp_path / 'step-3'} (ValueError: bad bytes)"
    )
    assert "\n" not in line


def test_file_names_are_relative_without_dot_dot(tmp_path):
    """A `relative_path` is refused when absolute or with a `..` part, even one that lands
    inside the folder (what an open resolves through `sub` may differ from the text), and
    when a symlink takes it out; a plain name inside is its size."""
    from boost_titan.checkpoint.dcp_layout import BadCheckpoint, check_file

    (tmp_path / "sub").mkdir()
    (tmp_path / "x").write_bytes(b"123")
    (tmp_path / "link").symlink_to(tmp_path.parent)
    assert check_file(str(tmp_path), "x") == 3
    for name in ("sub/../x", str(tmp_path / "x"), f"link/{tmp_path.name}/../x"):
        with pytest.raises(BadCheckpoint, match="outside the checkpoint folder"):
            check_file(str(tmp_path), name)


def test_a_byte_item_is_capped_before_it_is_read(sources, tmp_path, monkeypatch):
    """A byte item declaring more than MAX_ITEM_BYTES (DCP reads one whole into memory) is
    refused from its `.metadata`, before the file is read."""
    from boost_titan.checkpoint import dcp_layout

    folder = tmp_path / "step-3"
    shutil.copytree(sources["job"], folder)
    metadata = read_metadata(folder)
    size = next(i.length for i in metadata.storage_data.values() if i.length)
    monkeypatch.setattr(dcp_layout, "MAX_ITEM_BYTES", 100)
    with pytest.raises(dcp_layout.BadCheckpoint, match=r"declares [\d,]+ bytes \(most: 100\)"):
        dcp_layout.check_layout(str(folder), metadata)
    monkeypatch.setattr(dcp_layout, "MAX_ITEM_BYTES", size * 1000)
    dcp_layout.check_layout(str(folder), metadata)


# ---- issue 46: folders, hash floods, zip records -------------------------------------------
def test_a_step_folder_linked_elsewhere_is_refused(sources, capsys, tmp_path):
    """A run's `checkpoint/step-3` that is a symlink to a folder elsewhere (whose files pass
    every check against their own folder) is one line from `check` and from the trainer's
    check before it loads; the real folder passes `check_confined`."""
    from boost_titan.checkpoint.dcp_layout import check_confined

    elsewhere = tmp_path / "elsewhere" / "step-3"
    shutil.copytree(sources["job"], elsewhere)
    check_confined(str(elsewhere))
    folder = tmp_path / "dump" / "checkpoint" / "step-3"
    folder.parent.mkdir(parents=True)
    folder.symlink_to(elsewhere)
    said = f"is a symlink to {elsewhere}, outside {folder.parent}"
    line = _check(capsys, tmp_path / "dump")
    assert said in line and str(folder) in line, line
    checkpointer = SimpleNamespace(folder=str(folder.parent), initial_load_path="")
    with pytest.raises(ConfigError, match=said):
        check_checkpoint_to_load(checkpointer, Choice(str(folder.parent), True, 3))


def test_unpickler_counts_key_hashes(monkeypatch):
    """A dict, set or frozenset of COUNTED_FROM keys or more may hold MAX_SAME_HASH keys of
    one hash, not one more, however it is built (SETITEM, SETITEMS, DICT, ADDITEMS,
    FROZENSET); distinct keys are not limited; a PUT index is below 2**32."""
    alike = [k * ((1 << 61) - 1) for k in range(1, 30)]  # all hash to 0
    assert len({hash(k) for k in alike}) == 1
    big = {k: str(k) for k in range(1, 5000)} | dict.fromkeys(alike[:8])  # 0 hashes to 0
    for protocol in (0, 2, 4):
        assert safe_load.loads(pickle.dumps(big, protocol=protocol)) == big
    assert safe_load.loads(pickle.dumps(frozenset(alike[:8]), protocol=4)) == frozenset(alike[:8])
    flood = "keys of one hash"
    keys = alike[:9] + list(range(1, 8))  # counted from COUNTED_FROM (16) keys on
    for value in (dict.fromkeys(keys), set(keys), frozenset(keys)):
        for protocol in (0, 4) if isinstance(value, dict) else (4,):
            with pytest.raises(safe_load.UnsafeCheckpoint, match=flood):
                safe_load.loads(pickle.dumps(value, protocol=protocol))
    items = b"".join(b"I%d\nN" % k for k in keys)
    with pytest.raises(safe_load.UnsafeCheckpoint, match=flood):  # DICT: one opcode for all
        safe_load.loads(b"(" + items + b"d.")
    with pytest.raises(safe_load.UnsafeCheckpoint, match=flood):  # SETITEM, one at a time
        safe_load.loads(b"}" + b"".join(b"I%d\nNs" % k for k in keys) + b".")
    assert safe_load.loads(b"I1\np4294967295\n.") == 1
    with pytest.raises(pickle.UnpicklingError, match="PUT index"):
        safe_load.loads(b"I1\np4294967296\n.")
    with pytest.raises(pickle.UnpicklingError, match="ADDITEMS on a dict"):
        safe_load.loads(b"\x80\x04}(K\x01K\x02\x86\x94\x90.")


def test_a_tensor_archive_is_one_tensor_as_torch_reads_it(tmp_path):
    """A tensor chunk's archive passes when torch.load's own zip reader sees torch.save's
    records; refused with directory entries that share one record (each would be
    materialised), a second tensor record, or a large extra record."""
    import io
    import zipfile

    import torch

    from tests.helpers.hostile import zip_copies

    def records(archive: bytes) -> list:
        return dcp_layout.tensor_records(io.BytesIO(archive), 0, len(archive))

    from boost_titan.checkpoint import dcp_layout

    buffer = io.BytesIO()
    torch.save(torch.arange(16.0), buffer)
    clean = buffer.getvalue()
    assert dcp_layout.records_problem(records(clean)) is None
    assert dcp_layout.size_problem(records(clean), 64) is None
    assert dcp_layout.size_problem(records(clean), 128) == "64 bytes"
    assert dcp_layout.records_problem(records(zip_copies(clean, 2))) == (
        "2 tensor records (a chunk is one, data/0)"
    )
    assert "more than 16" in dcp_layout.records_problem(records(zip_copies(clean, 2000)))
    padded = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(clean)) as source, zipfile.ZipFile(padded, "w") as out:
        for name in source.namelist():
            out.writestr(name, source.read(name))
        out.writestr(f"{name.split('/')[0]}/extra", bytes(1 << 20))
    assert "extra of 1,048,576 bytes" in dcp_layout.records_problem(records(padded.getvalue()))
    with pytest.raises(ValueError, match="no tensor archive"):
        records(clean[:-30])


def test_a_tensor_in_more_chunks_than_any_run_has_ranks_is_refused(sources, monkeypatch):
    """A tensor's chunk list longer than `MAX_CHUNKS_PER_TENSOR` is refused from `.metadata`
    alone, before any chunk is looked up or read (65,536 chunks took check 88 s, export 145 s)."""
    from boost_titan.checkpoint import dcp_layout

    metadata = read_metadata(sources["cola"])
    fqn, entry = next(
        (k, v) for k, v in metadata.state_dict_metadata.items() if k.endswith("weight")
    )
    entry.chunks = entry.chunks * 3
    monkeypatch.setattr(dcp_layout, "MAX_CHUNKS_PER_TENSOR", 2)
    with pytest.raises(dcp_layout.BadCheckpoint, match=f"{fqn} is split into 3 chunks .most: 2,"):
        dcp_layout.check_types(metadata)
    monkeypatch.setattr(dcp_layout, "MAX_CHUNKS_PER_TENSOR", 3)  # then the coverage check
    with pytest.raises(dcp_layout.BadCheckpoint, match="hold .* elements"):
        dcp_layout.check_types(metadata)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_metadata_is_parsed_once_per_load(sources, tmp_path, monkeypatch):
    """The trainer's check before the load parses `.metadata` (through the allowlist) and
    the load itself reuses it (`GuardedReader`): one parse, then the values load."""
    folder = tmp_path / "checkpoint" / "step-3"
    shutil.copytree(sources["job"], folder)
    parsed = []
    unpickle = safe_load.unpickle

    def counted(data: bytes):
        value = unpickle(data)
        parsed.append(type(value))
        return value

    monkeypatch.setattr(safe_load, "unpickle", counted)
    checkpointer = SimpleNamespace(folder=str(folder.parent), initial_load_path="")
    metadata = check_checkpoint_to_load(checkpointer, Choice(str(folder.parent), True, 3))
    states = {"train_state": {"step": 0, "ntokens_seen": 0}}
    read_states(states, str(folder), metadata, str(folder), "fix")
    assert parsed.count(Metadata) == 1 and states["train_state"]["step"] == 3, parsed
