"""Print a TP plan as a table: every module it shards, how, and its collectives.

    python -m boost_titan.plan --strategy btp --flavor debug [--arch cola] [--tp 2]
    python -m boost_titan.plan --model mypkg.model:build --layout mypkg.model:LAYOUT --strategy btp
    python -m boost_titan.plan --auto --flavor 7B --gpus 8 --gpu h100 [--write-toml X.toml]

With `--flavor`, our `boost_llama` model (built on the meta device: any size is instant);
with `--model MODULE:FUNCTION` (called without arguments) and `--layout MODULE:NAME`, any
torch-native model. Per row: the plan key (and how many modules it matched), the style,
weight placements, activation layouts in and out, and the collectives one call issues
forward and backward (elements per token of each rank's buffer). Then the totals of one
block. Nothing is applied; the plan is checked against the model as `apply_plan` would.
`--auto` instead ranks every layout of a flavor on N GPUs (`perf.layout_search`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from boost_titan.boost_llama.shapes import flavor_named
from boost_titan.config.cli import OneLineParser, fail, reader_gone
from boost_titan.config.errors import ConfigError
from boost_titan.perf import layout_search
from boost_titan.perf.fits import DEFAULT_GPU
from boost_titan.perf.gpus import GPUS


def _load(spec: str, what: str):
    module, _, name = spec.partition(":")
    if not name:
        raise ConfigError(f"--{what} {spec!r} must be MODULE:NAME")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--{what} {spec!r}: {e}") from None


def _target(ns: argparse.Namespace):
    """(model, layout-or-None) for the arguments."""
    if ns.model:
        if not ns.layout:
            raise ConfigError("--model needs --layout MODULE:NAME (a ModelLayout)")
        try:
            model = _load(ns.model, "model")()
        except TypeError as e:
            raise ConfigError(
                f"--model {ns.model!r}: {e}; name a function that builds the model without "
                "arguments"
            ) from None
        return model, _load(ns.layout, "layout")
    import torch

    from boost_titan.boost_llama import BoostTransformer, flavor_args

    args = flavor_args(ns.flavor, arch=ns.arch)
    args.vocab_size = args.vocab_size or 4096
    args.validate()
    with torch.device("meta"):
        return BoostTransformer(args), None


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m boost_titan.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", default="btp", choices=("megatron", "vanilla", "btp"))
    parser.add_argument("--tp", type=int, default=2, help="TP degree (default 2)")
    parser.add_argument(
        "--flavor", default="debug", type=flavor_named, help="boost_llama flavor, any case"
    )
    parser.add_argument(
        "--arch", default=None, help="boost_llama arch (default: cola, fullrank for megatron)"
    )
    parser.add_argument("--rmsnorm", default="online", choices=("online", "sync"))
    parser.add_argument("--no-group-linears", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--model", help="MODULE:FUNCTION building any torch-native model")
    parser.add_argument("--layout", help="MODULE:NAME of its ModelLayout")
    parser.add_argument(
        "--auto", action="store_true", help="rank every layout of --flavor on --gpus GPUs"
    )
    _add_auto_args(parser)
    ns = parser.parse_args(argv)
    try:
        code = _auto(ns) if ns.auto else _show(ns)
        sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's last flush
        return code
    except ConfigError as e:
        fail(str(e))
    except BrokenPipeError:
        reader_gone()


def _add_auto_args(parser: argparse.ArgumentParser) -> None:
    """`--auto`'s options."""
    parser.add_argument("--gpus", type=int, help="GPUs in all (with --auto)")
    parser.add_argument(
        "--gpu",
        default=DEFAULT_GPU,
        type=str.lower,
        choices=tuple(GPUS),
        help=f"GPU profile, any case (default {DEFAULT_GPU})",
    )
    parser.add_argument("--gpu-memory", type=float, help="GiB per GPU (default: the profile's, 80)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument(
        "--global-batch", type=int, default=4, help="sequences per step (default 4, BOOST's)"
    )
    parser.add_argument("--top", type=int, default=10, help="rows of the ranked table")
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="also try BTP's overlap_chunks 2 and 4 (unmeasured on GPUs; off by default)",
    )
    parser.add_argument(
        "--loro-exact-every",
        type=int,
        default=0,
        metavar="K",
        help="train with LORO (arch svd), its exact step every K steps, priced amortised "
        "(default 0: AdamW)",
    )
    parser.add_argument("--write-toml", metavar="PATH", help="write the winner as a config")


def _auto(ns: argparse.Namespace) -> int:
    """`--auto`: rank the layouts, print them, write the winner's TOML if asked."""
    if ns.gpus is None:
        raise ConfigError("--auto needs --gpus N (the GPUs to plan for)")
    memory = layout_search.GPU_MEMORY_GIB[ns.gpu] if ns.gpu_memory is None else ns.gpu_memory
    request = layout_search.Request(
        flavor=ns.flavor,
        arch=ns.arch or "cola",
        gpus=ns.gpus,
        gpu=ns.gpu,
        gpu_memory_gib=memory,
        seq_len=ns.seq_len,
        global_batch=ns.global_batch,
        overlap=ns.overlap,
        loro_exact_every=ns.loro_exact_every,
    )
    result = layout_search.plan_layouts(request)
    print(layout_search.format_result(result, top=ns.top, markdown=ns.markdown))
    if ns.write_toml:
        try:
            with open(ns.write_toml, "w") as f:
                f.write(layout_search.toml_text(result, result.ranked[0]))
        except OSError as e:
            raise ConfigError(f"cannot write --write-toml {ns.write_toml}: {e.strerror}") from None
        best = result.ranked[0]
        winner = layout_search.describe(best)
        print(f"\nwrote {ns.write_toml}: {winner} (predicted {best.step_s:.3f} s per step)")
    return 0


def _show(ns: argparse.Namespace) -> int:
    from boost_titan.parallelize import PlanError
    from boost_titan.parallelize.describe import (
        collectives_under,
        format_collectives,
        plan_table,
    )

    ns.arch = ns.arch or ("fullrank" if ns.strategy == "megatron" else "cola")
    model, layout = _target(ns)
    options = {"group_linears": not ns.no_group_linears}
    if layout is None:
        from boost_titan.boost_llama.strategies import boost_layout, build_plan

        plan = build_plan(ns.strategy, model.args, rmsnorm=ns.rmsnorm, **options)
        layout = boost_layout(model.args)
    else:
        from boost_titan.boost_llama.strategies import STRATEGIES

        if ns.strategy == "btp":
            options["rmsnorm"] = ns.rmsnorm
        plan = STRATEGIES[ns.strategy].builder(layout, **options)
    try:
        print(plan_table(model, plan, ns.tp, markdown=ns.markdown))
        first = next(n for n, _ in model.named_modules() if _matches(n, layout.blocks))
        forward, backward = collectives_under(model, plan, ns.tp, first + ".")
    except PlanError as e:
        raise ConfigError(str(e)) from None
    print(f"\nper block ({first}), elements per token:")
    print(f"  forward  {len(forward)}: {format_collectives(forward)}")
    print(f"  backward {len(backward)}: {format_collectives(backward)}")
    return 0


def _matches(name: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, pattern)


if __name__ == "__main__":
    sys.exit(main())
