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
present, else on the CPU.
"""

from __future__ import annotations

import sys

import torch

from boost_titan.boost_llama.load_trained import (
    add_model_options,
    build,
    load_tokenizer_for,
    locate_from,
)
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


def next_token(
    logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator
) -> int:
    """The next token id from one position's logits (see the module docstring)."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.float() / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probabilities = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    seed: int = 0,
    stop_id: int | None = None,
) -> list[int]:
    """The new token ids after `prompt_ids` (without `stop_id`, where generation ended)."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    window = model.args.max_seq_len
    tokens = torch.tensor([prompt_ids], device=device)
    new: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(tokens[:, -window:])[0, -1]
        token = next_token(logits, temperature, top_k, generator)
        if token == stop_id:
            break
        new.append(token)
        tokens = torch.cat([tokens, torch.tensor([[token]], device=device)], dim=1)
    return new


def _check(ns) -> None:
    if not ns.prompt:
        raise ConfigError('--prompt is empty; give some text to continue, e.g. --prompt "def "')
    if ns.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {ns.max_new_tokens} must be >= 1")
    if ns.temperature < 0:
        raise ConfigError(f"--temperature {ns.temperature} must be >= 0 (0: greedy)")
    if ns.top_k < 0:
        raise ConfigError(f"--top-k {ns.top_k} must be >= 0 (0: no cut)")


def run(ns) -> str:
    """The prompt and its continuation as `ns` says."""
    _check(ns)
    source = locate_from(ns)
    tokenizer = load_tokenizer_for(ns.tokenizer, source.args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build(source, device)
    prompt_ids = tokenizer.encode(ns.prompt, add_bos=True, add_eos=False)
    new = generate(
        model,
        prompt_ids,
        max_new_tokens=ns.max_new_tokens,
        temperature=ns.temperature,
        top_k=ns.top_k,
        seed=ns.seed,
        stop_id=tokenizer.eos_id,
    )
    return ns.prompt + tokenizer.decode(new)


def main(argv: list[str] | None = None) -> None:
    """CLI entry: one `error:` line and exit 2 on bad input."""
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = run(ns)
    except ConfigError as e:
        fail(str(e))
    print(text, flush=True)


if __name__ == "__main__":
    main()
