"""Context parallelism of a job: what it may combine it with, and its application to a
model whose `ModelLayout` names its attentions (the ring attention of
`boost_titan.parallelize.context_parallel`; `boost_llama` gives every block's
`attention.inner_attention`).

TorchTitan's trainer does the rest, as for its own llama3: each CP rank of a group gets
the same batch, and `post_dataloading_process` shards tokens, labels and `positions`
along the sequence (head-tail load balanced by default); the loss is summed over a rank's
tokens and divided by the batch's global token count; FSDP2 runs over dp_shard x cp with
gradient division off, so summing the ranks' gradients gives the global mean's.
"""

from __future__ import annotations

from torch import nn

from boost_titan.config.errors import ConfigError
from boost_titan.parallelize.plans import ModelLayout

LOAD_BALANCERS = ("headtail", None)
"""`parallelism.context_parallel_load_balancer` values for SDPA (None: no balancing)."""


def validate_context_parallel(job_config) -> None:
    """ConfigError (one line) for a CP job that cannot run."""
    p, training = job_config.parallelism, job_config.training
    cp = p.context_parallel_degree
    if cp <= 1:
        return
    lengths = {"training.seq_len": training.seq_len}
    if job_config.validation.enable:
        lengths["validation.seq_len"] = job_config.validation.seq_len
    for name, length in lengths.items():
        if length % (2 * cp):
            raise ConfigError(
                f"{name} {length} is not divisible by 2 x context_parallel_degree "
                f"({2 * cp}): each CP rank holds two equal chunks of every sequence; choose "
                "a length or CP degree that divides"
            )
    if p.context_parallel_load_balancer not in LOAD_BALANCERS:
        raise ConfigError(
            f"context_parallel_load_balancer {p.context_parallel_load_balancer!r} is for flex "
            "or varlen attention; CP runs causal SDPA: use headtail or None"
        )
    refused = {
        "pipeline parallelism": p.pipeline_parallel_degree > 1,
        "compile": job_config.compile.enable,
        "CUDA graphs": job_config.boost.cuda_graphs,
    }
    for what, on in refused.items():
        if on:
            raise ConfigError(
                f"context_parallel_degree {cp} is not supported with {what}; "
                "turn it off or set context_parallel_degree = 1"
            )


def apply_cp(model: nn.Module, cp_mesh, layout: ModelLayout, job_config) -> int:
    """Ring attention over `cp_mesh` in every attention `layout` names; returns how many."""
    from boost_titan.parallelize.context_parallel import apply_context_parallel

    return apply_context_parallel(
        model, cp_mesh, layout, rotate=job_config.parallelism.context_parallel_rotate_method
    )
