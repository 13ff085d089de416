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

With `--hf-model FOLDER` (a `--model.name hf` run's `model.hf_assets_path`) it writes a
Hugging Face folder instead: FOLDER's config (with the low-rank pairs recorded), the
trained weights under transformers' names, FOLDER's tokenizer files
(`boost_titan.hf_family.export`); `boost_titan.parallelize.load_hf` loads it.

The format and the export itself are `boost_titan.boost_llama.export_format`; its loading
by the trainer (`--checkpoint.initial_load_in_hf`) is
`boost_titan.boost_llama.state_dict_adapter`.
"""

from __future__ import annotations

import argparse
import os
import sys

from boost_titan.boost_llama.export_format import CONFIG, WEIGHTS, export, model_flags
from boost_titan.boost_llama.shapes import FLAVORS
from boost_titan.config import ARCHS, LAX_BASES
from boost_titan.config.cli import OneLineParser, fail
from boost_titan.config.errors import ConfigError


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
        "--hf-model",
        metavar="FOLDER",
        help="the Hugging Face folder a --model.name hf run trained from (its "
        "model.hf_assets_path): write OUT as a Hugging Face folder of that model",
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
    if ns.hf_model:
        export_hf_folder(ns)
        return
    try:
        args = export(ns.checkpoint, ns.out, **model_flags(ns))
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


def export_hf_folder(ns: argparse.Namespace) -> None:
    """`--hf-model`: the checkpoint as a Hugging Face folder (module docstring)."""
    from boost_titan.boost_llama.export_format import load_model_state
    from boost_titan.hf_family.export import export_hf

    try:
        state = load_model_state(ns.checkpoint)
        args = export_hf(state, ns.out, ns.hf_model, ns.arch, ns.lax_base)
    except ConfigError as e:
        fail(str(e))
    rank = f", rank {args.rank}" if args.low_rank else ""
    rank += f", lax_base {args.lax_base}" if args.crossing else ""
    print(
        f"exported {ns.checkpoint} -> {ns.out} (a Hugging Face folder of {ns.hf_model}'s "
        f"model: {args.arch}{rank}); load it with boost_titan.parallelize.load_hf",
        flush=True,
    )


if __name__ == "__main__":
    main()
