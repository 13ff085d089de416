"""Continue a prompt with a trained model: what `python -m boost_titan.generate` runs.

`next_token` picks one token from one position's logits: the most likely at temperature 0,
else a sample from the softmax of logits / temperature, over the `top_k` most likely tokens
when top_k > 0, drawn with the caller's generator (so a seed always gives the same text).
`generate` feeds the last `max_seq_len` tokens through the model for each new token (no KV
cache: fine for the small models this is meant for) and stops after `max_new_tokens` or at
`stop_id`. `continue_prompt` loads the model (`load_trained`) and the tokenizer the
command line names, on CUDA when present, else on the CPU.
"""

from __future__ import annotations

import argparse

import torch

from boost_titan.boost_llama.load_trained import build, load_tokenizer_for, locate_from
from boost_titan.config.errors import ConfigError


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


def _check(ns: argparse.Namespace) -> None:
    if not ns.prompt:
        raise ConfigError('--prompt is empty; give some text to continue, e.g. --prompt "def "')
    if ns.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens {ns.max_new_tokens} must be >= 1")
    if ns.temperature < 0:
        raise ConfigError(f"--temperature {ns.temperature} must be >= 0 (0: greedy)")
    if ns.top_k < 0:
        raise ConfigError(f"--top-k {ns.top_k} must be >= 0 (0: no cut)")


def continue_prompt(ns: argparse.Namespace) -> str:
    """The prompt and its continuation as `ns` (`python -m boost_titan.generate`'s options)
    says; ConfigError for bad input."""
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
