"""Export a DCP checkpoint as one `model.safetensors` + `config.json`, and load it back.

    python -m boost_titan.export --checkpoint RUN/checkpoint/step-N --out DIR [--arch A] ...

Reads a TorchTitan DCP checkpoint folder (full or model-only, saved under any
parallelism: DCP stores global tensors under plain FQNs) in one process, without a
process group, and writes the model weights (plain FQNs, their saved dtype) to
`DIR/model.safetensors` and the model's shape to `DIR/config.json`. The folder is
written under a temporary name and renamed when complete.

A DCP checkpoint does not record the model config. The sizes (dim, layers, ffn_dim,
rank, vocab, kv width) and the family (full-rank / low-rank / LaX) come from the tensor
shapes; what shapes cannot tell comes from flags: `--arch` (svd and cola have the same
shapes), `--lax-base`, and the head count, norm eps, RoPE theta and maximum sequence
length, which default to the flavor whose sizes match (or `--flavor`).

The format and its loading by the trainer (`--checkpoint.initial_load_in_hf`) are
`boost_titan.boost_llama.state_dict_adapter`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boost_titan.boost_llama.export_format import (
    CONFIG,
    MODEL_NAME,
    WEIGHTS,
    config_of,
    model_shapes,
)
from boost_titan.boost_llama.shapes import FLAVORS, ModelShape
from boost_titan.config import ARCHS, LAX_BASES
from boost_titan.config.cli import OneLineParser, fail
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.checkpoint_files import (
    check_readable,
    is_complete_checkpoint,
    latest_checkpoint,
)

if TYPE_CHECKING:  # torch is imported when a checkpoint is read, not for --help
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

NON_MODEL_PREFIXES = ("optimizer.", "lr_scheduler.", "dataloader.", "train_state.")
"""Top-level keys of a TorchTitan checkpoint that are not model weights."""

_LAYER = re.compile(r"layers\.(\d+)\.")


# ---- reading a DCP checkpoint ----------------------------------------------------------
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
        family, fits, rank = "full-rank linears", ("fullrank",), 0
        ffn_dim = shapes["layers.0.feed_forward.w1.weight"][0]
        kv_dim = shapes["layers.0.attention.wk.weight"][0]
    elif "layers.0.attention.wq.down.weight" in shapes:
        rank = shapes["layers.0.attention.wq.down.weight"][0]
        ffn_dim = shapes["layers.0.feed_forward.w1.up.weight"][0]
        kv_dim = shapes["layers.0.attention.wk.up.weight"][0]
        if "layers.1.attention.wq.cross.weight" in shapes:
            family, fits = "LaX low-rank projections (with latent crossing)", ("lax",)
        elif n_layers > 1:
            family, fits = "low-rank projections without crossing", ("svd", "cola")
        else:  # one block: LaX has no crossing to tell it apart
            family, fits = "low-rank projections", ("svd", "cola", "lax")
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
    if arch == "lax" and lax_base is None:
        raise ConfigError(
            "a LaX checkpoint fits --lax-base svd or cola (same shapes); pass the [boost] "
            "lax_base it was trained with"
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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException

    from boost_titan.parallelize.safe_load import guard_dcp

    metadata = model_metadata(checkpoint)  # its pickles vetted (check_readable)
    guard_dcp()  # and DCP's own reads through the same allowlist
    state = {key: torch.empty(md.size, dtype=md.properties.dtype) for key, md in metadata.items()}
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=FileSystemReader(checkpoint), no_dist=True)
    except (Exception, CheckpointException) as e:  # a short read fails inside DCP's reader
        failures = getattr(e, "failures", None)
        cause = next(iter(failures.values()))[0] if failures else e
        raise ConfigError(
            f"--checkpoint {checkpoint}: cannot read its tensors ({type(cause).__name__}); the "
            "checkpoint is damaged, use another step-N folder"
        ) from None
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


# ---- command line ----------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m boost_titan.export",
        description=(
            "Write a DCP checkpoint's model weights as OUT/model.safetensors (plain FQNs, "
            "saved dtype) plus OUT/config.json. Sizes, vocab, rank and the projection "
            "family come from the tensor shapes; pass what shapes cannot tell. Train from "
            "the export with --checkpoint.initial_load_path OUT --checkpoint.initial_load_in_hf."
        ),
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="a step-N DCP checkpoint folder (full or model-only, any parallelism)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="new (or empty) folder to write; written under a temporary name, then renamed",
    )
    p.add_argument(
        "--arch",
        choices=ARCHS,
        help="[boost] arch of the run; needed for low-rank checkpoints (svd and cola "
        "have the same shapes), inferred for fullrank",
    )
    p.add_argument(
        "--lax-base", choices=LAX_BASES, help="[boost] lax_base of a LaX run (required for lax)"
    )
    p.add_argument(
        "--flavor",
        choices=list(FLAVORS),
        help="model.flavor of the run; default: the flavor whose dim, n_layers and "
        "ffn_dim match the checkpoint. Gives the values below",
    )
    p.add_argument(
        "--n-heads",
        type=int,
        metavar="N",
        help="attention heads (needed when no flavor matches; n_kv_heads follows from the shapes)",
    )
    p.add_argument(
        "--norm-eps", type=float, metavar="X", help="RMSNorm eps (default: the flavor's, else 1e-5)"
    )
    p.add_argument(
        "--rope-theta",
        type=float,
        metavar="X",
        help="RoPE theta (default: the flavor's, else 10000)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        metavar="N",
        help="maximum sequence length (default: the flavor's, else 4096)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    """CLI entry: one `error:` line and exit 2 on bad input; a summary line on success."""
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if ns.n_heads is not None and ns.n_heads < 1:
            raise ConfigError(f"--n-heads {ns.n_heads} must be >= 1")
        args = export(
            ns.checkpoint,
            ns.out,
            arch=ns.arch,
            lax_base=ns.lax_base,
            flavor=ns.flavor,
            n_heads=ns.n_heads,
            norm_eps=ns.norm_eps,
            rope_theta=ns.rope_theta,
            max_seq_len=ns.max_seq_len,
        )
    except ConfigError as e:
        fail(str(e))
    size = os.path.getsize(os.path.join(ns.out, WEIGHTS))
    rank = f", rank {args.effective_rank}" if args.low_rank else ""
    print(
        f"exported {ns.checkpoint} -> {ns.out}/{WEIGHTS} ({size / 2**20:.1f} MiB) + {CONFIG}: "
        f"{args.arch}, dim {args.dim}, {args.n_layers} layers{rank}, vocab {args.vocab_size}; "
        f"train from it with --checkpoint.initial_load_path {ns.out} "
        "--checkpoint.initial_load_in_hf",
        flush=True,
    )


if __name__ == "__main__":
    main()
