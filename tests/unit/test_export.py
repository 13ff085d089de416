"""Export/import: `python -m boost_titan.export` and `--checkpoint.initial_load_in_hf`.

Fast tests build each arch's model in this process and save it with DCP (`no_dist`, the
layout TorchTitan writes: plain model FQNs next to optimizer / lr_scheduler / dataloader /
train_state entries). `tests/distributed/test_training_parity.py`'s
`test_trainer_starts_from_export` exports a real seed checkpoint and trains from it under
BTP TP=2 next to the run that loads the DCP checkpoint itself.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from boost_titan.boost_llama import BoostTransformer
from boost_titan.boost_llama.export_format import args_of, export, model_shapes
from boost_titan.boost_llama.state_dict_adapter import BoostStateDictAdapter
from boost_titan.config.errors import ConfigError
from boost_titan.export import main
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import (
    ARCHS,
    bits_equal,
    checkpoint_weights,
    debug_args,
    save_checkpoint,
)
from tests.helpers.commands import assert_one_error, check, run_module

DEFAULT_VOCAB = 4096  # the default tokenizer's: an export the debug job accepts


# ---- round trip --------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_round_trip(arch, tmp_path):
    """model.safetensors equals the checkpoint bit for bit (dtype kept); config.json
    rebuilds the same model: same keys and shapes, same outputs with the exported weights."""
    args = debug_args(arch)
    dtype = torch.bfloat16 if arch == "fullrank" else None  # the saved dtype is kept
    save_checkpoint(tmp_path / "step-3", args, dtype=dtype)
    flags = {"arch": arch, "lax_base": "svd"} if arch == "lax" else {"arch": arch}
    export(str(tmp_path / "step-3"), str(tmp_path / "out"), **flags)

    saved = checkpoint_weights(tmp_path / "step-3", tmp_path)
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert exported.keys() == saved.keys() == model_shapes(args).keys()
    assert all(bits_equal(exported[k], saved[k]) for k in saved)
    assert exported["tok_embeddings.weight"].dtype == (dtype or torch.float32)

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    rebuilt = args_of(config)
    for name in (
        "arch",
        "dim",
        "n_layers",
        "n_heads",
        "kv_heads",
        "ffn_dim",
        "effective_rank",
        "vocab_size",
        "norm_eps",
        "rope_theta",
        "max_seq_len",
        "activation",
    ):
        assert getattr(rebuilt, name) == getattr(args, name), name
    assert ("lax_base" in config) == (arch == "lax") and ("rank" in config) == (arch != "fullrank")
    assert model_shapes(rebuilt) == {k: tuple(v.shape) for k, v in exported.items()}

    original, model = BoostTransformer(args), BoostTransformer(rebuilt)
    original.load_state_dict({k: v.float() for k, v in saved.items()})
    model.load_state_dict({k: v.float() for k, v in exported.items()})
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    with torch.no_grad():
        assert bits_equal(model(tokens), original(tokens))


def test_model_only_checkpoint_and_flags(tmp_path):
    """A model-only checkpoint exports too; flags fill in what shapes cannot tell."""
    args = debug_args("cola", dim=128, n_heads=4, n_kv_heads=2, ffn_dim=256, rank=16)
    weights = save_checkpoint(tmp_path / "step-0", args, full=False)
    with pytest.raises(ConfigError, match="match no flavor.*--n-heads"):
        export(str(tmp_path / "step-0"), str(tmp_path / "a"), arch="cola")
    with pytest.raises(ConfigError, match="--n-heads 3 does not fit"):
        export(str(tmp_path / "step-0"), str(tmp_path / "a"), arch="cola", n_heads=3)
    assert not (tmp_path / "a").exists()
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is replaced
    export(str(tmp_path / "step-0"), str(out), arch="cola", n_heads=4, max_seq_len=512)
    config = json.loads((out / "config.json").read_text())
    inferred = [config[k] for k in ("n_heads", "n_kv_heads", "rank", "max_seq_len")]
    assert inferred == [4, 2, 16, 512]
    exported = load_file(out / "model.safetensors")
    assert all(bits_equal(exported[k], weights[k]) for k in weights)
    assert not list(tmp_path.glob(".*"))  # no temporary folder left


def test_adapter_is_identity_and_checks_the_job_model(tmp_path, export_folder):
    adapter = BoostStateDictAdapter(debug_args("cola", DEFAULT_VOCAB), hf_assets_path=None)
    state = {"norm.weight": torch.ones(2)}
    assert adapter.to_hf(state) == state and adapter.from_hf(state) == state
    assert adapter.fqn_to_index_mapping is None
    assert str(adapter.get_hf_storage_reader(str(export_folder)).path) == str(export_folder)
    other = BoostStateDictAdapter(debug_args("cola", DEFAULT_VOCAB, rank=32), hf_assets_path=None)
    with pytest.raises(ConfigError, match="rank 64 .* job's model has rank 32"):
        other.get_hf_storage_reader(str(export_folder))


# ---- bad export input: one line, exit 2, nothing written -----------------------------------
@pytest.fixture(scope="module")
def cola_checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cola") / "checkpoint" / "step-3"
    save_checkpoint(folder, debug_args("cola"))
    return folder


def _lax_checkpoint(tmp: Path) -> str:
    save_checkpoint(tmp / "lax", debug_args("lax"), full=False)
    return str(tmp / "lax")


def _foreign_checkpoint(tmp: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(
            {"encoder.weight": torch.ones(2, 2)}, checkpoint_id=str(tmp / "foreign"), no_dist=True
        )
    return str(tmp / "foreign")


def _damaged(what: str):
    def make(tmp: Path, checkpoint: Path) -> str:
        copy = tmp / f"damaged-{what}"
        shutil.copytree(checkpoint, copy)
        victim = copy / (".metadata" if what == "metadata" else "__0_0.distcp")
        victim.write_bytes(victim.read_bytes()[:4096])  # cut inside the first tensors
        return str(copy)

    return make


def _non_empty_out(tmp: Path) -> str:
    (tmp / "out").mkdir()
    (tmp / "out" / "keep.txt").write_text("mine")
    return str(tmp / "out")


def _given(tmp: Path, checkpoint: Path) -> str:
    return str(checkpoint)


COLA = ["--arch", "cola"]
# name -> (checkpoint maker, out maker or None for tmp/out, extra args, message fragments)
BAD_EXPORTS = {
    "missing checkpoint": (lambda t, c: str(t / "nope"), None, COLA, ["is not a folder"]),
    "run folder, not step-N": (
        lambda t, c: str(c.parents[1]),
        None,
        COLA,
        ["no DCP .metadata", "did you mean {c}?"],
    ),
    "damaged .metadata": (
        _damaged("metadata"),
        None,
        COLA,
        ["cannot read its .metadata", "damaged"],
    ),
    "truncated shard": (
        _damaged("shard"),
        None,
        COLA,
        ["__0_0.distcp is truncated (4,096 bytes, its .metadata needs", "damaged"],
    ),
    "not a boost checkpoint": (
        lambda t, c: _foreign_checkpoint(t),
        None,
        [],
        ["no boost_llama weights"],
    ),
    "arch not given": (_given, None, [], ["fit --arch svd or cola", "pass the [boost] arch"]),
    "no attention heads": (_given, None, [*COLA, "--n-heads", "0"], ["--n-heads 0 must be >= 1"]),
    "arch contradicts shapes": (
        _given,
        None,
        ["--arch", "fullrank"],
        ["--arch fullrank does not match", "use --arch svd or cola"],
    ),
    "lax without lax_base": (
        lambda t, c: _lax_checkpoint(t),
        None,
        ["--arch", "lax"],
        ["--lax-base svd or cola"],
    ),
    "flavor contradicts shapes": (
        _given,
        None,
        [*COLA, "--flavor", "60M"],
        ["--flavor 60M has dim 512 but the checkpoint has 256"],
    ),
    "out not empty": (_given, _non_empty_out, COLA, ["already exists and is not an empty folder"]),
    "out inside a file": (
        _given,
        lambda t: str(t / "file" / "out"),
        COLA,
        ["is not writable (a parent is a file)", "choose a writable folder"],
    ),
    "unknown option value": (
        _given,
        None,
        ["--arch", "lowrank"],
        ["invalid choice: 'lowrank'", "--help"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_EXPORTS))
def test_bad_export_input(case, tmp_path, cola_checkpoint, capsys):
    make_checkpoint, make_out, extra, fragments = BAD_EXPORTS[case]
    (tmp_path / "file").write_text("a file, not a folder")
    checkpoint = make_checkpoint(tmp_path, cola_checkpoint)
    out = make_out(tmp_path) if make_out else str(tmp_path / "out")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", checkpoint, "--out", out, *extra])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert exit_info.value.code == 2 and captured.out == "", captured
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    for fragment in fragments:
        assert fragment.format(c=cola_checkpoint) in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written or left
    if make_out is _non_empty_out:
        assert os.listdir(out) == ["keep.txt"]


def test_export_command_line_error(tmp_path):
    """Through `python -m`: one line, exit 2, no traceback."""
    result = run_module(
        "boost_titan.export", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "o")
    )
    assert_one_error(result, "is not a folder")
    assert result.returncode == 2


# ---- boost_titan.check on an export given as initial_load_path -----------------------------
@pytest.fixture(scope="module")
def export_folder(tmp_path_factory) -> Path:
    """An export of a debug CoLA model with the default tokenizer's vocab (debug.toml's)."""
    root = tmp_path_factory.mktemp("export")
    save_checkpoint(root / "step-0", debug_args("cola", DEFAULT_VOCAB), full=False)
    export(str(root / "step-0"), str(root / "export"), arch="cola")
    return root / "export"


def _check(tmp: Path, folder: Path | str | None, *args: str, in_hf: bool = True) -> str:
    load = ["--checkpoint.initial_load_path", str(folder)] if folder is not None else []
    return check(
        [
            "--nproc",
            "2",
            "--job.config_file",
            str(DEBUG_TOML),
            "--job.dump_folder",
            str(tmp / "dump"),
            *load,
            *(["--checkpoint.initial_load_in_hf"] if in_hf else []),
            *args,
        ]
    )


def _variant(tmp: Path, export_folder: Path, drop: str | None = None, **config) -> Path:
    """A copy of the export without `drop` and with `config` entries replaced."""
    folder = tmp / "variant"
    shutil.copytree(export_folder, folder)
    if drop:
        (folder / drop).unlink()
    if config:
        data = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(data | config))
    return folder


def test_check_accepts_export(tmp_path, export_folder):
    assert _check(tmp_path, export_folder).startswith("config ok")


BAD_LOADS = {
    "no model.safetensors": (
        dict(drop="model.safetensors"),
        [],
        ["has no model.safetensors", "boost_titan.export"],
    ),
    "no config.json": (dict(drop="config.json"), [], ["has no config.json", "boost_titan.export"]),
    "rank differs": (
        {},
        ["--boost.rank", "32"],
        ["rank 64 (config.json)", "has rank 32", "--boost.rank 64"],
    ),
    "arch differs": ({}, ["--boost.arch", "svd"], ["arch cola", "arch svd", "--boost.arch cola"]),
    "vocab differs": (dict(vocab_size=512), [], ["vocab_size 512", "vocab_size 4096", "tokenizer"]),
    "dims differ": (dict(dim=512), [], ["dim 512", "dim 256"]),
    "broken config.json": (dict(dim="wide"), [], ["has dim 'wide'", "export again"]),
}


@pytest.mark.parametrize("case", list(BAD_LOADS))
def test_check_rejects_bad_export(case, tmp_path, export_folder):
    variant, args, fragments = BAD_LOADS[case]
    folder = _variant(tmp_path, export_folder, **variant)
    with pytest.raises(ConfigError) as error:
        _check(tmp_path, folder, *args)
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)


def test_check_rejects_truncated_weights(tmp_path, export_folder):
    folder = _variant(tmp_path, export_folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ConfigError, match="model.safetensors is unreadable"):
        _check(tmp_path, folder)


def test_check_tells_dcp_from_export(tmp_path, export_folder, cola_checkpoint):
    with pytest.raises(
        ConfigError, match="is a DCP checkpoint, not an export; drop --checkpoint.init"
    ):
        _check(tmp_path, cola_checkpoint)
    with pytest.raises(ConfigError, match="is an export .* add --checkpoint.initial_load_in_hf"):
        _check(tmp_path, export_folder, in_hf=False)
    with pytest.raises(ConfigError, match="initial_load_in_hf needs checkpoint.initial_load_path"):
        _check(tmp_path, None)


def test_check_export_mismatch_command_line(tmp_path, export_folder):
    """The same through `python -m boost_titan.check`: one line, exit 2."""
    result = run_module(
        "boost_titan.check",
        "--nproc",
        "2",
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(tmp_path / "dump"),
        "--checkpoint.initial_load_path",
        str(export_folder),
        "--checkpoint.initial_load_in_hf",
        "--boost.rank",
        "32",
    )
    assert_one_error(result, "rank 64", "--boost.rank 64")
    assert result.returncode == 2
