"""What `boost_titan.runtime.titan_internals` (and the data room's subclasses of TorchTitan's
classes) rely on in TorchTitan 0.2.2: each private signature, attribute and module global,
compared with the installed TorchTitan, so that an upgrade fails here first, naming what
changed and the module to update."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect

import pytest

from tests.helpers import ROOT

ADAPTER = "boost_titan/runtime/titan_internals.py"
SUBCLASSES = ("boost_titan/data/text_stream.py", "boost_titan/data/loader.py")

SIGNATURES = {
    # "module:qualified name" -> its signature in TorchTitan 0.2.2
    "torchtitan.components.checkpoint:CheckpointManager._create_checkpoint_id": (
        "(self, step: int, folder: str = '') -> str"
    ),
    "torchtitan.components.checkpoint:CheckpointManager._should_save": (
        "(self, curr_step: int, last_step: bool = False) -> bool"
    ),
    "torchtitan.components.checkpoint:CheckpointManager._async_wait": "(self) -> None",
    "torchtitan.components.checkpoint:CheckpointManager._flattened_model_states_sd": (
        "(self, state_dict: dict[str, typing.Any] | None = None) -> dict[str, typing.Any]"
    ),
    "torchtitan.components.checkpoint:CheckpointManager._purge_stale_checkpoints": "(self)",
    "torchtitan.components.checkpoint:CheckpointManager._find_load_step": (
        "(self, folder: str = '') -> int"
    ),
    "torchtitan.components.checkpoint:CheckpointManager._states_to_load": (
        "(self, model_only: bool) -> dict[str, typing.Any]"
    ),
    "torchtitan.components.checkpoint:CheckpointManager.dcp_save": (
        "(self, state_dict: dict[str, typing.Any], checkpoint_id: str, async_mode: "
        "torchtitan.components.checkpoint.AsyncMode, enable_garbage_collection: bool = False, "
        "to_hf: bool = False) -> concurrent.futures._base.Future | "
        "torch.distributed.checkpoint.state_dict_saver.AsyncSaveResponse | None"
    ),
    "torchtitan.components.quantization:QuantizationConverter._validate": (
        "(job_config: torchtitan.config.job_config.JobConfig)"
    ),
    "torchtitan.distributed.utils:maybe_enable_amp": (
        "(parallel_dims: torchtitan.distributed.parallel_dims.ParallelDims, "
        "mixed_precision_param: str, device_type: str) -> "
        "contextlib.AbstractContextManager[None] | torch.amp.autocast_mode.autocast"
    ),
    "torchtitan.tools.utils:get_peak_flops": "(device_name: str) -> float",
    "torchtitan.distributed.parallel_dims:ParallelDims.build_mesh": (
        "(self) -> torch.distributed.device_mesh.DeviceMesh"
    ),
    "torchtitan.hf_datasets.text_datasets:HuggingFaceTextDataset._get_data_iter": "(self)",
}
ATTRIBUTES = {
    # "module:class" -> the private attributes its source assigns (TorchTitan 0.2.2)
    "torchtitan.distributed.parallel_dims:ParallelDims": ("_meshes", "_global_meshes"),
    "torchtitan.components.dataloader:ParallelAwareDataloader": ("_rank_id",),
    "torchtitan.hf_datasets.text_datasets:HuggingFaceTextDataset": (
        "_data",
        "_tokenizer",
        "_text_processor",
        "_sample_idx",
        "_token_buffer",
    ),
}
GLOBALS = {
    # module -> the globals read or rebound (TorchTitan 0.2.2)
    "torchtitan.tools.utils": ("device_module", "device_type", "get_peak_flops"),
    "torchtitan.distributed.utils": ("maybe_enable_amp",),
    "torchtitan.models.llama3.infra.parallelize": ("_op_sac_save_list",),
    "torchtitan.protocols.model_converter": ("_registry_model_converter_cls",),
}


def _pristine(module: str):
    """A fresh copy of TorchTitan's `module`, as its source defines it: the suite's other
    tests run code that rebinds module globals (`point_at_cpu` replaces `get_peak_flops`)."""
    spec = importlib.util.find_spec(module)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return fresh


def _resolve(where: str, pristine: bool = False):
    module, _, qualified = where.partition(":")
    target = _pristine(module) if pristine else importlib.import_module(module)
    for part in qualified.split(".") if qualified else ():
        target = getattr(target, part)
    return target


def _update_hint(name: str) -> str:
    """Which of our modules relies on `name`."""
    data_room = "dataloader" in name or "text_datasets" in name
    return f"update {' or '.join(SUBCLASSES) if data_room else ADAPTER}"


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_is_torchtitan_0_2_2s(name):
    module, _, qualified = name.partition(":")
    owner, _, attribute = qualified.rpartition(".")
    holder = _resolve(f"{module}:{owner}", pristine=True)
    assert hasattr(holder, attribute), (
        f"TorchTitan no longer has {qualified} ({module}); {_update_hint(name)}"
    )
    got = str(inspect.signature(getattr(holder, attribute)))
    assert got == SIGNATURES[name], (
        f"TorchTitan changed {qualified}: expected {SIGNATURES[name]}, got {got}; "
        f"{_update_hint(name)}"
    )


@pytest.mark.parametrize("name", list(ATTRIBUTES))
def test_private_attributes_are_still_assigned(name):
    cls = _resolve(name)
    assigned = {
        node.attr
        for node in ast.walk(ast.parse(inspect.getsource(cls)))
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
    } | set(getattr(cls, "__dataclass_fields__", {}))
    missing = [a for a in ATTRIBUTES[name] if a not in assigned]
    assert not missing, f"TorchTitan's {name} no longer sets {missing}; {_update_hint(name)}"


@pytest.mark.parametrize("module", list(GLOBALS))
def test_module_globals_still_exist(module):
    imported = importlib.import_module(module)
    missing = [name for name in GLOBALS[module] if not hasattr(imported, name)]
    assert not missing, f"TorchTitan's {module} no longer has {missing}; update {ADAPTER}"


def test_every_private_name_used_is_listed():
    """Each underscore attribute the adapter and the data subclasses use on TorchTitan's
    objects, and each underscore name they import, has its entry above."""
    listed = {name.rpartition(".")[2] for name in SIGNATURES}
    listed |= {a for attributes in ATTRIBUTES.values() for a in attributes}
    listed |= {g for names in GLOBALS.values() for g in names}
    from tests.unit.test_architecture import _titan_root, titan_private_names

    private = titan_private_names(_titan_root())
    used = set()
    for relative in (ADAPTER, *SUBCLASSES):
        for node in ast.walk(ast.parse((ROOT / relative).read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module and "torchtitan" in node.module:
                used |= {alias.name for alias in node.names if alias.name in private}
    assert used - listed == set(), f"add the signatures of {sorted(used - listed)} here"
    assert used, "found no use at all: the scan is broken"


REIMPLEMENTED = {
    # TorchTitan 0.2.2 code ours re-implements -> (sha256 of its source, first 16 hex; ours)
    "torchtitan.train:Trainer.train_step": (
        "471795acb90bf1df",
        "BoostTrainer.train_step (boost_titan/runtime/trainer.py)",
    ),
    "torchtitan.train:Trainer.train": ("6d9a39ca1238efbb", "BoostTrainer.run_steps"),
    "torchtitan.train:main": ("0d01bcc4e9ab533e", "boost_titan/job/entry.py's train"),
    "torchtitan.components.checkpoint:CheckpointManager.load": (
        "a739d1f0268402cd",
        "boost_titan/runtime/resume.py's load_checkpoint",
    ),
    "torchtitan.components.checkpoint:CheckpointManager.dcp_load": (
        "5862f9fc67420906",
        "boost_titan/runtime/resume.py's load_checkpoint and titan_internals.finish_load",
    ),
    "torchtitan.components.checkpoint:CheckpointManager._find_load_step": (
        "1cc58736c1d9eedf",
        "boost_titan/checkpoint/files.py's newest_step (test_newest_step_is_torchtitans)",
    ),
}


@pytest.mark.parametrize("name", list(REIMPLEMENTED))
def test_reimplemented_torchtitan_code_is_0_2_2s(name):
    """Our step, loop and worker main follow TorchTitan 0.2.2's line by line: a change there
    (a new metric, a hook, a context) must be carried over, so any change fails here."""
    expected, ours = REIMPLEMENTED[name]
    source = inspect.getsource(_resolve(name))
    got = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert got == expected, (
        f"TorchTitan changed {name} (source hash {got}, 0.2.2's is {expected}): carry the "
        f"change over to {ours}, then update the hash here"
    )


@pytest.mark.parametrize(
    "names",
    [
        [],
        ["step-3", "step-10", "step-20 (incomplete)"],
        ["step-0002", "old-step-5", "step-4.bak", "step-x"],
        ["step-7 (safetensors)", "step-6"],
        ["unrelated", "step-1 (incomplete)"],
    ],
)
def test_newest_step_is_torchtitans(names, tmp_path):
    """`checkpoint.files.newest_step`, the one definition of the newest complete step,
    picks what TorchTitan's own `_find_load_step` picks (its regex, its two markers)."""
    from torchtitan.components.checkpoint import CheckpointManager

    from boost_titan.checkpoint.files import newest_step

    for entry in names:
        name, _, kind = entry.partition(" ")
        (tmp_path / name).mkdir()
        if kind == "(safetensors)":
            (tmp_path / name / "model.safetensors.index.json").write_text("{}")
        elif kind != "(incomplete)":
            (tmp_path / name / ".metadata").write_text("")
    titan = CheckpointManager.__new__(CheckpointManager)  # only its folder is read
    titan.folder = str(tmp_path)
    assert newest_step(str(tmp_path)) == CheckpointManager._find_load_step(titan)
    assert newest_step(str(tmp_path / "missing")) == -1
