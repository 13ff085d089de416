"""A trained `boost_llama` model from a DCP step folder or an export: what `eval` and
`generate` share.

`locate` tells the two kinds of folder apart and finds the model's args: an export's
`config.json` (checked against its weights), or a DCP checkpoint's tensor shapes plus the
flags shapes cannot tell (`boost_llama.export_format.infer_args`: `--arch`, `--lax-base`, ...).
`build` makes the model on the meta device, applies a TP plan when given a mesh,
materialises it and reads the weights with DCP (the checkpoint's `FileSystemReader` or the
export's `HuggingFaceStorageReader`), so each rank reads only its shards; a DCP folder's
pickles are read through the checkpoint allowlist (`boost_titan.checkpoint.safe_load`:
`locate` refuses a folder that asks for more, and DCP's own reads are guarded).
`load_tokenizer_for` checks a tokenizer against the model's vocabulary. `add_model_options`
/ `locate_from` are the command-line side.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torchtitan.components.tokenizer import BaseTokenizer

from boost_titan.boost_llama import FLAVORS, BoostModelArgs, BoostTransformer
from boost_titan.boost_llama.export_format import (
    CONFIG,
    WEIGHTS,
    infer_args,
    model_flags,
    model_metadata,
    read_config,
)
from boost_titan.boost_llama.state_dict_adapter import check_export
from boost_titan.boost_llama.strategies import build_plan, resolve_strategy
from boost_titan.checkpoint.files import is_complete_checkpoint, read_tensors
from boost_titan.checkpoint.reads import GuardedReader
from boost_titan.config import ARCHS, LAX_BASES, Boost
from boost_titan.config.cli import fail
from boost_titan.config.errors import ConfigError
from boost_titan.data.tokenizer import load_tokenizer
from boost_titan.parallelize import apply_plan

DCP, EXPORT = "dcp", "export"


@dataclass(frozen=True)
class Source:
    """Where a trained model is (`kind`: a DCP step folder or an export) and its args."""

    path: str
    kind: str
    args: BoostModelArgs


def _export_args(path: str, arch: str | None, lax_base: str | None) -> BoostModelArgs:
    """The args in an export's config.json, checked against its weights and the flags."""
    args = read_config(path, f"--checkpoint {path}")
    for flag, given, stored in (
        ("--arch", arch, args.arch),
        ("--lax-base", lax_base, args.lax_base),
    ):
        if given is not None and given != stored:
            raise ConfigError(
                f"{flag} {given} does not match the export {path}, whose {CONFIG} says "
                f"{stored}; drop {flag} (an export records its model)"
            )
    check_export(path, args, option="--checkpoint")
    return args


def locate(path: str, arch: str | None = None, lax_base: str | None = None, **flags) -> Source:
    """The model at `path`; `flags` are `infer_args`'s other keywords (DCP folders only).

    Raises ConfigError (one line) when `path` is neither kind or does not fit the flags.
    """
    if not os.path.isdir(path):
        raise ConfigError(
            f"--checkpoint {path} is not a folder; point it at a step-N checkpoint folder or "
            "a folder written by python -m boost_titan.export"
        )
    exported = all(os.path.isfile(os.path.join(path, name)) for name in (WEIGHTS, CONFIG))
    if exported and not is_complete_checkpoint(path):
        return Source(path, EXPORT, _export_args(path, arch, lax_base))
    shapes = {key: tuple(md.size) for key, md in model_metadata(path).items()}
    return Source(path, DCP, infer_args(shapes, arch=arch, lax_base=lax_base, **flags))


def build(
    source: Source,
    device: torch.device,
    tp_mesh: DeviceMesh | None = None,
    tp_strategy: str = "auto",
) -> nn.Module:
    """The model of `source` in eval mode on `device`, TP-sharded over `tp_mesh` if given
    (the training plan of `tp_strategy`, logits vocab-sharded for loss parallel)."""
    args = source.args
    with torch.device("meta"):
        model = BoostTransformer(args)
    if tp_mesh is not None and tp_mesh.size() > 1:
        from torchtitan.config import Parallelism

        from boost_titan.boost_llama.spec import validate_parallelism

        boost = Boost(arch=args.arch, lax_base=args.lax_base, tp_strategy=tp_strategy)
        validate_parallelism(args, boost, Parallelism(tensor_parallel_degree=tp_mesh.size()))
        strategy = resolve_strategy(args.arch, tp_strategy).name
        apply_plan(model, tp_mesh, build_plan(strategy, args, loss_parallel=True))
    model.to_empty(device=device)
    model.init_weights(buffer_device=device)  # the RoPE table is not saved; weights come next
    load_weights(model, source)
    return model.eval()


def load_weights(model: nn.Module, source: Source) -> None:
    """Read `source`'s weights into `model` (plain or sharded parameters) with DCP, whose
    reads of a DCP folder's pickles go through the checkpoint allowlist (`GuardedReader`,
    `GuardedPlanner`; `locate` has vetted them already)."""
    if source.kind == DCP:
        reader = GuardedReader(source.path)
    else:
        reader = HuggingFaceStorageReader(source.path)
    state = get_model_state_dict(model)
    failure = (
        f"--checkpoint {source.path}: cannot read its weights ({{}}); the files are damaged, "
        "use another checkpoint"
    )
    read_tensors(state, reader, failure, no_dist=not dist.is_initialized())
    set_model_state_dict(model, state)


def load_tokenizer_for(assets: str, args: BoostModelArgs) -> BaseTokenizer:
    """The tokenizer named by `assets` (a `model.hf_assets_path` value); ConfigError when its
    vocabulary cannot be the one the model was trained with."""
    tokenizer = load_tokenizer(assets)
    vocab, model_vocab = tokenizer.get_vocab_size(), args.vocab_size
    fixed = {a.vocab_size for a in FLAVORS.values() if a.vocab_size}
    if vocab > model_vocab or (vocab < model_vocab and model_vocab not in fixed):
        raise ConfigError(
            f"--tokenizer {assets or 'default'} has {vocab} tokens but the checkpoint's model has "
            f"vocab {model_vocab}; pass --tokenizer with the run's model.hf_assets_path"
        )
    return tokenizer


# ---- command line ----------------------------------------------------------------------
def add_model_options(parser: argparse.ArgumentParser) -> None:
    """--checkpoint, --tokenizer and the DCP-only model flags (as `boost_titan.export`'s)."""
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="a step-N DCP checkpoint folder (any parallelism) or a folder "
        "written by python -m boost_titan.export",
    )
    parser.add_argument(
        "--tokenizer",
        default="default",
        metavar="PATH",
        help="the run's model.hf_assets_path (default: the project's tokenizer)",
    )
    dcp_only = parser.add_argument_group(
        "model flags for DCP folders (shapes cannot tell these; an export records them)"
    )
    dcp_only.add_argument(
        "--arch", choices=ARCHS, help="[boost] arch of the run; needed for svd/cola (same shapes)"
    )
    dcp_only.add_argument("--lax-base", choices=LAX_BASES, help="[boost] lax_base of a LaX run")
    dcp_only.add_argument(
        "--flavor",
        choices=list(FLAVORS),
        help="model.flavor of the run (default: the one whose sizes match)",
    )
    dcp_only.add_argument(
        "--n-heads", type=int, metavar="N", help="attention heads, when no flavor matches"
    )
    dcp_only.add_argument("--norm-eps", type=float, metavar="X", help="RMSNorm eps")
    dcp_only.add_argument("--rope-theta", type=float, metavar="X", help="RoPE theta")
    dcp_only.add_argument("--max-seq-len", type=int, metavar="N", help="maximum sequence length")


def locate_from(ns: argparse.Namespace) -> Source:
    """`locate` with the options of `add_model_options`."""
    return locate(ns.checkpoint, **model_flags(ns))


def fail_worker(message: str) -> NoReturn:
    """`fail`, and keep torchrun from replaying this worker's traceback for it."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and os.path.exists(error_file):
        os.remove(error_file)
    fail(message)
