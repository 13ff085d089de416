"""The export format of `boost_llama`: a folder with `model.safetensors` (the model's
state dict: our FQNs, their saved dtype) and `config.json` (everything `ModelShape` needs
to rebuild the model; `config_of` writes it, `read_config` reads it). `export` writes one
from a DCP checkpoint (`python -m boost_titan.export`); `state_dict_adapter` loads it into
the trainer. Importable without torch (torch is imported when a checkpoint is read).

A DCP checkpoint does not record the model config. `infer_args` takes the sizes (dim,
layers, ffn_dim, rank, vocab, kv width) and the family (full-rank / low-rank / LaX) from
the tensor shapes (`model_metadata`); what shapes cannot tell comes from flags: the arch
(svd and cola have the same shapes), the LaX base, and the head count, norm eps, RoPE theta
and maximum sequence length, which default to the flavor whose sizes match.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boost_titan.checkpoint.files import (
    check_readable,
    is_complete_checkpoint,
    latest_checkpoint,
    read_tensors,
)
from boost_titan.config import LAX_BASES
from boost_titan.config.errors import ConfigError

from .archs import ARCHITECTURES, architecture
from .shapes import FLAVORS, ModelShape

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
FORMAT_VERSION = 1
MODEL_NAME = "boost_llama"


# ---- config.json ---------------------------------------------------------------------
def model_fields(args: ModelShape) -> dict[str, Any]:
    """The model's fields in `config.json`, in their order (the architecture's own fields,
    LaX's lax_base, after arch; rank only for low-rank models)."""
    fields: dict[str, Any] = {"arch": args.arch}
    fields.update((name, getattr(args, name)) for name in args.architecture.fields)
    fields.update(
        dim=args.dim,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        n_kv_heads=args.kv_heads,
        ffn_dim=args.ffn_dim,
    )
    if args.low_rank:
        fields["rank"] = args.effective_rank
    fields.update(
        vocab_size=args.vocab_size,
        norm_eps=args.norm_eps,
        rope_theta=args.rope_theta,
        max_seq_len=args.max_seq_len,
    )
    return fields


def config_of(args: ModelShape, dtype: torch.dtype) -> dict[str, Any]:
    """The `config.json` of a model: everything ModelShape needs to rebuild it."""
    config: dict[str, Any] = {"model": MODEL_NAME, "format_version": FORMAT_VERSION}
    return {**config, **model_fields(args), "dtype": str(dtype).removeprefix("torch.")}


def read_config(path: str, where: str) -> ModelShape:
    """ModelShape from the `config.json` of the export at `path`; errors name it `where`."""
    try:
        config = json.loads(Path(path, CONFIG).read_text())
    except (OSError, ValueError) as e:
        reason = type(e).__name__
        raise ConfigError(f"{where}: {CONFIG} is unreadable ({reason}); export again") from None
    return args_of(config if isinstance(config, dict) else {}, source=f"{where}: {CONFIG}")


def args_of(config: dict[str, Any], source: str = CONFIG) -> ModelShape:
    """ModelShape from a `config.json` dict; ConfigError if it is not one of ours."""
    if config.get("model") != MODEL_NAME:
        raise ConfigError(
            f"{source} is not a {MODEL_NAME} export; export with python -m boost_titan.export"
        )
    for name in (
        "dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "ffn_dim",
        "rank",
        "vocab_size",
        "max_seq_len",
        "norm_eps",
        "rope_theta",
    ):
        value = config.get(name, 1)
        kind = float if name in ("norm_eps", "rope_theta") else int
        if isinstance(value, bool) or not isinstance(value, (int, kind)) or value <= 0:
            raise ConfigError(f"{source} has {name} {value!r}, not a positive number; export again")
    try:
        args = ModelShape(
            arch=config["arch"],
            lax_base=config.get("lax_base", "cola"),
            dim=config["dim"],
            n_layers=config["n_layers"],
            n_heads=config["n_heads"],
            n_kv_heads=config["n_kv_heads"],
            ffn_dim=config["ffn_dim"],
            rank=config.get("rank", 0),
            vocab_size=config["vocab_size"],
            norm_eps=config["norm_eps"],
            rope_theta=config["rope_theta"],
            max_seq_len=config["max_seq_len"],
        )
    except KeyError as e:
        raise ConfigError(f"{source} lacks {e.args[0]!r}; export the checkpoint again") from None
    args.validate()
    return args


def model_shapes(args: ModelShape) -> dict[str, tuple[int, ...]]:
    """Key -> shape of the model's state dict (built on the meta device, no memory)."""
    import torch

    from .model import BoostTransformer

    with torch.device("meta"):
        model = BoostTransformer(args)
    return {key: tuple(t.shape) for key, t in model.state_dict().items()}


def first_shape_mismatch(
    expected: dict[str, tuple[int, ...]], stored: dict[str, tuple[int, ...]]
) -> str | None:
    """The first key (sorted) missing from one side or with another shape; None if equal."""
    return next(
        (k for k in sorted(expected.keys() | stored.keys()) if expected.get(k) != stored.get(k)),
        None,
    )


# ---- reading a DCP checkpoint ----------------------------------------------------------
NON_MODEL_PREFIXES = ("optimizer.", "lr_scheduler.", "dataloader.", "train_state.")
"""Top-level keys of a TorchTitan checkpoint that are not model weights."""

_LAYER = re.compile(r"layers\.(\d+)\.")


def model_metadata(checkpoint: str) -> dict[str, TensorStorageMetadata]:
    """The model entries of a DCP checkpoint's `.metadata` (global shapes and dtypes)."""
    if not os.path.isdir(checkpoint):
        raise ConfigError(
            f"--checkpoint {checkpoint} is not a folder; point it at a step-N checkpoint folder"
        )
    if not is_complete_checkpoint(checkpoint):
        run_folder = os.path.join(checkpoint, "checkpoint")
        newest = latest_checkpoint(checkpoint) or latest_checkpoint(run_folder)
        hint = f"did you mean {newest}?" if newest else "use a complete step-N folder"
        raise ConfigError(
            f"--checkpoint {checkpoint} has no DCP .metadata "
            f"(incomplete or not a checkpoint); {hint}"
        )
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = check_readable(checkpoint, where=f"--checkpoint {checkpoint}")
    return {
        key: md
        for key, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and not key.startswith(NON_MODEL_PREFIXES)
    }


MODEL_FLAGS = ("arch", "lax_base", "flavor", "n_heads", "norm_eps", "rope_theta", "max_seq_len")
"""`infer_args`'s keywords: what a DCP folder's shapes cannot tell, given as command flags."""


def model_flags(ns: Any) -> dict[str, Any]:
    """The MODEL_FLAGS of parsed command options (`--arch` ... `--max-seq-len`), checked."""
    if ns.n_heads is not None and ns.n_heads < 1:
        raise ConfigError(f"--n-heads {ns.n_heads} must be >= 1")
    return {name: getattr(ns, name) for name in MODEL_FLAGS}


def _low_rank_fits(shapes: dict[str, tuple[int, ...]], n_layers: int) -> tuple[str, tuple]:
    """(what the checkpoint's pairs are, the low-rank archs they fit): a family's latent
    modules (LaX's crossing) show from the second block on; one block cannot tell."""
    names = {m for a in ARCHITECTURES.values() for m in a.latent_modules}
    found = {m for m in names if any(f".{m}." in key for key in shapes)}
    low_rank = [a for a in ARCHITECTURES.values() if a.low_rank]
    if n_layers == 1:
        return "low-rank projections", tuple(a.name for a in low_rank)
    fits = tuple(a.name for a in low_rank if set(a.latent_modules) == found)
    if not fits:
        raise ConfigError(
            f"the checkpoint's pairs hold {', '.join(sorted(found))}, which no arch has; "
            "export a checkpoint written by boost_titan.train"
        )
    if found:
        return f"low-rank projections with {' and '.join(sorted(found))}", fits
    return "low-rank projections without crossing", fits


def infer_args(
    shapes: dict[str, tuple[int, ...]],
    arch: str | None = None,
    lax_base: str | None = None,
    flavor: str | None = None,
    n_heads: int | None = None,
    norm_eps: float | None = None,
    rope_theta: float | None = None,
    max_seq_len: int | None = None,
) -> ModelShape:
    """The model shape of a checkpoint from its shapes plus the flags shapes cannot replace.

    Raises ConfigError when a flag is needed, contradicts the shapes, or the checkpoint's
    keys and shapes are not exactly those of the resulting model.
    """
    if "tok_embeddings.weight" not in shapes:
        raise ConfigError(
            f"the checkpoint holds no {MODEL_NAME} weights (no tok_embeddings.weight); "
            "export a checkpoint written by boost_titan.train"
        )
    vocab_size, dim = shapes["tok_embeddings.weight"]
    n_layers = 1 + max((int(m.group(1)) for k in shapes if (m := _LAYER.match(k))), default=-1)
    if "layers.0.attention.wq.weight" in shapes:
        family, rank = "full-rank linears", 0
        ffn_dim = shapes["layers.0.feed_forward.w1.weight"][0]
        kv_dim = shapes["layers.0.attention.wk.weight"][0]
        fits = tuple(name for name, a in ARCHITECTURES.items() if not a.low_rank)
    elif "layers.0.attention.wq.down.weight" in shapes:
        rank = shapes["layers.0.attention.wq.down.weight"][0]
        ffn_dim = shapes["layers.0.feed_forward.w1.up.weight"][0]
        kv_dim = shapes["layers.0.attention.wk.up.weight"][0]
        family, fits = _low_rank_fits(shapes, n_layers)
    else:
        raise ConfigError(
            "the checkpoint has no layers.0.attention.wq weights; export a checkpoint "
            "written by boost_titan.train"
        )
    if arch is None:
        if len(fits) > 1:
            raise ConfigError(
                f"the checkpoint's {family} fit --arch {' or '.join(fits)} (same shapes); "
                "pass the [boost] arch it was trained with"
            )
        arch = fits[0]
    elif arch not in fits:
        raise ConfigError(
            f"--arch {arch} does not match the checkpoint, whose projections are {family}; "
            f"use --arch {' or '.join(fits)}"
        )
    if "lax_base" in architecture(arch).fields and lax_base is None:
        raise ConfigError(
            f"a {arch} checkpoint fits --lax-base {' or '.join(LAX_BASES)} (same shapes); "
            "pass the [boost] lax_base it was trained with"
        )

    sizes = {"dim": dim, "n_layers": n_layers, "ffn_dim": ffn_dim}
    if flavor is not None:
        if flavor not in FLAVORS:
            raise ConfigError(f"unknown --flavor {flavor!r}; choose one of {', '.join(FLAVORS)}")
        base = FLAVORS[flavor]
        for name, value in sizes.items():
            if getattr(base, name) != value:
                raise ConfigError(
                    f"--flavor {flavor} has {name} {getattr(base, name)} but the checkpoint has "
                    f"{value}; pass the flavor it was trained with, or --n-heads without --flavor"
                )
    else:
        matches = [
            f for f, a in FLAVORS.items() if all(getattr(a, n) == v for n, v in sizes.items())
        ]
        base = FLAVORS[matches[0]] if len(matches) == 1 else None
        if base is None and n_heads is None:
            described = ", ".join(f"{n} {v}" for n, v in sizes.items())
            raise ConfigError(
                f"the checkpoint's sizes ({described}) match no flavor, and shapes cannot tell "
                "the head count; pass --n-heads (and --norm-eps, --rope-theta, --max-seq-len "
                "if not the defaults)"
            )
    defaults = base or ModelShape()
    n_heads = n_heads or defaults.n_heads
    if dim % n_heads or kv_dim % (dim // n_heads):
        raise ConfigError(
            f"--n-heads {n_heads} does not fit the checkpoint (dim {dim}, k/v width {kv_dim}); "
            "pass the head count it was trained with"
        )
    args = ModelShape(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=kv_dim // (dim // n_heads),
        ffn_dim=ffn_dim,
        vocab_size=vocab_size,
        rank=rank,
        arch=arch,
        lax_base=lax_base or "cola",
        norm_eps=defaults.norm_eps if norm_eps is None else norm_eps,
        rope_theta=defaults.rope_theta if rope_theta is None else rope_theta,
        max_seq_len=max_seq_len or defaults.max_seq_len,
    )
    args.validate()
    expected = model_shapes(args)
    for key in sorted(expected.keys() | shapes.keys()):
        if expected.get(key) != shapes.get(key):
            found = shapes.get(key, "missing")
            raise ConfigError(
                f"the checkpoint's {key} is {found} but a {arch} model with these sizes has "
                f"{expected.get(key, 'no such weight')}; export a checkpoint of one model written "
                "by boost_titan.train"
            )
    return args


def load_model_state(checkpoint: str) -> dict[str, torch.Tensor]:
    """The model weights of a DCP checkpoint as full tensors (one process, no process group)."""
    import torch

    from boost_titan.checkpoint.reads import GuardedReader

    metadata = model_metadata(checkpoint)  # its pickles vetted (check_readable)
    state = {key: torch.empty(md.size, dtype=md.properties.dtype) for key, md in metadata.items()}
    failure = (
        f"--checkpoint {checkpoint}: cannot read its tensors ({{}}); the checkpoint is "
        "damaged, use another step-N folder"
    )
    read_tensors(state, GuardedReader(checkpoint), failure)  # DCP's reads vetted alike
    return state


# ---- writing an export -------------------------------------------------------------------
def _prepare_out(out: Path) -> None:
    """`out` must be absent or an empty folder."""
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ConfigError(
            f"--out {out} already exists and is not an empty folder; choose a new folder"
        )


def export(checkpoint: str, out: str, **flags: Any) -> ModelShape:
    """Write `out/model.safetensors` + `out/config.json` for `checkpoint`; return the shape.

    `flags` are `infer_args`'s keywords. Nothing is left at `out` unless all succeeded.
    """
    from safetensors.torch import save_file

    target = Path(out)
    _prepare_out(target)
    shapes = {key: tuple(md.size) for key, md in model_metadata(checkpoint).items()}
    args = infer_args(shapes, **flags)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as e:
        in_file = isinstance(e, (FileExistsError, NotADirectoryError))
        reason = "a parent is a file" if in_file else e.strerror or type(e).__name__
        raise ConfigError(
            f"--out {out} is not writable ({reason}); choose a writable folder"
        ) from None
    try:
        state = load_model_state(checkpoint)
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        config = config_of(args, state["tok_embeddings.weight"].dtype)
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for made, mode in ((tmp / WEIGHTS, 0o666), (tmp, 0o777)):
            made.chmod(mode & ~umask)  # mkdtemp and safetensors make them private
        tmp.rename(target)  # POSIX rename replaces an empty folder
    except OSError as e:
        raise ConfigError(
            f"could not write --out {out} ({e.strerror or type(e).__name__}); nothing was "
            "written, free some space or choose another folder"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return args
