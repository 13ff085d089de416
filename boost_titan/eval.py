"""Held-out loss and perplexity of a trained model over a dataset.

    python -m boost_titan.eval --checkpoint DIR [--arch A] [--dataset-path P] [--json OUT]
    torchrun --nproc_per_node=N -m boost_titan.eval --checkpoint DIR [--tp T] ...

DIR is a DCP step folder (any parallelism; the shapes give the model, `--arch` and friends
what they cannot, as for `boost_titan.export`) or an export. The data default to the
default corpus's held-out split; `--dataset-path` takes the training formats. The windows
and the loss are those of validation during training (`boost_titan.data.held_out`,
`boost_titan.runtime.held_out_loss.evaluate`): the same checkpoint, data, seq_len, batch size
and steps give the same number as the run's `validate` line. Under torchrun the model is
sharded with the training TP plan over `--tp` ranks (default: all of them), the rest
split the batches as data-parallel ranks. Rank 0 shows a progress bar on stderr and prints
the result as one JSON line on stdout (also written to `--json`). Bad input: one `error:`
line, exit 2. The evaluation is `boost_llama.eval_trained`'s.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import datasets

from boost_titan.boost_llama.eval_trained import evaluate_trained
from boost_titan.boost_llama.load_trained import add_model_options, fail_worker
from boost_titan.boost_llama.strategies import strategy_names
from boost_titan.config.cli import OneLineParser
from boost_titan.config.errors import ConfigError
from boost_titan.processes.teardown import run_to_end


def parser() -> OneLineParser:
    p = OneLineParser(
        prog="python -m boost_titan.eval",
        description=(
            "Loss and perplexity of a DCP checkpoint or an export over a dataset (default: "
            "the held-out split of the default corpus), on one process or under torchrun "
            "with tensor parallelism. Prints one JSON line."
        ),
    )
    add_model_options(p)
    p.add_argument(
        "--dataset-path",
        metavar="PATH",
        help="a .jsonl/.json/.parquet/.txt file or folder (as --training.dataset_path); "
        "default: the default corpus's held-out split",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=256,
        metavar="N",
        help="tokens per sequence (default 256, debug.toml's; use the run's "
        "validation.seq_len to reproduce its validation)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        metavar="N",
        help="sequences per data-parallel rank and batch (default 8)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=-1,
        metavar="N",
        help="evaluate the first N global batches (default -1: every sequence)",
    )
    p.add_argument(
        "--tp",
        type=int,
        metavar="N",
        help="tensor-parallel degree under torchrun (default: the world size)",
    )
    p.add_argument(
        "--tp-strategy",
        default="auto",
        choices=strategy_names(auto=True),
        help="TP plan (default auto: btp for low-rank archs, megatron for fullrank)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the result to FILE")
    return p


def main(argv: list[str] | None = None) -> None:
    """CLI entry: one `error:` line and exit 2 on bad input; one JSON line on success."""
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    datasets.disable_progress_bars()  # "Generating train split": our bar is the one to watch
    try:
        result = evaluate_trained(ns)
        if int(os.environ.get("RANK", 0)) == 0:
            write_result(result, ns.json)
    except ConfigError as e:
        fail_worker(str(e))


def write_result(result: dict[str, Any], path: str | None) -> None:
    """Print `result` as one JSON line, and write it to `path` if given."""
    line = json.dumps(result)
    if path:
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
        except OSError as e:
            raise ConfigError(
                f"cannot write --json {path} ({e.strerror}); choose a writable path"
            ) from None
    print(line, flush=True)


if __name__ == "__main__":
    run_to_end(main)  # under torchrun: the ranks meet, the groups end, no finalization
