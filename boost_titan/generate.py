"""Continue a prompt with a trained model, on one process.

    python -m boost_titan.generate --checkpoint DIR --prompt "def " [--arch A]
        [--max-new-tokens 64] [--temperature 0] [--top-k 0] [--seed 0] [--tokenizer PATH]

DIR is a DCP step folder or an export (see `boost_llama.load_trained`). Temperature 0 (the
default) decodes greedily; above 0 it samples from the softmax of logits / temperature,
over the `top-k` most likely tokens when top-k > 0, with a generator seeded by `--seed`,
so a seed always gives the same text. Generation stops after `--max-new-tokens` or at the
tokenizer's end-of-text token; the context is the last `max_seq_len` tokens. Each new
token runs the whole context through the model (no KV cache: fine for the small models
this is meant for). Prints the prompt and its continuation on stdout. Runs on CUDA when
present, else on the CPU. The sampling is `boost_llama.sampling`'s.
"""

from __future__ import annotations

import sys

from boost_titan.boost_llama.load_trained import add_model_options
from boost_titan.boost_llama.sampling import continue_prompt
from boost_titan.config.cli import OneLineParser, fail
from boost_titan.config.errors import ConfigError


def parser() -> OneLineParser:
    p = OneLineParser(
        prog="python -m boost_titan.generate",
        description="Continue --prompt with a DCP checkpoint or an export (greedy or sampled).",
    )
    add_model_options(p)
    p.add_argument("--prompt", required=True, help="the text to continue (not empty)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=64,
        metavar="N",
        help="tokens to generate at most (default 64)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 (default): greedy; above 0: sample from softmax(logits / T)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=0,
        metavar="K",
        help="sample among the K most likely tokens only (default 0: all)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler (default 0)")
    return p


def main(argv: list[str] | None = None) -> None:
    """CLI entry: one `error:` line and exit 2 on bad input."""
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = continue_prompt(ns)
    except ConfigError as e:
        fail(str(e))
    print(text, flush=True)


if __name__ == "__main__":
    main()
