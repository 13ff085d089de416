"""The job's configuration: the `[boost]` TOML section and its choices (here), the parsing
of train's arguments into a JobConfig with one-line errors (`cli`), `ConfigError`
(`errors`), the run's precision (`precision`), the sane range of its numbers (`bounds`) and
the capped, confined reading of files from elsewhere (`files`), all importable without
torch or torchtitan.

The section is merged into TorchTitan's JobConfig, loaded through
`--job.custom_config_module boost_titan.config`, which `boost_titan.job.entry` adds itself.
TorchTitan requires the module to define a dataclass named `JobConfig` whose fields are the
new sections.
"""

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from boost_titan.config.errors import ConfigError

# The [boost] choices: each type is its check (the TOML's in `cli.check_toml`, the command
# line's in tyro, both one `error:` line naming the values).
Arch = Literal["fullrank", "svd", "cola", "lax"]
"""Projection families, each the `ARCH` of the module of its name in `boost_llama.archs`
(the architecture registry)."""
LaxBase = Literal["svd", "cola"]
TpStrategy = Literal["auto", "megatron", "vanilla", "btp"]
"""auto and the names of `boost_llama.strategies.STRATEGIES`."""
RmsNorm = Literal["online", "sync"]
"""The library's `parallelize.norm_modes.RMSNORM_MODES`."""
OverlapChunks = Literal[1, 2, 4]
DataOrder = Literal["sharded", "global"]


def check_choice(key: str, value: object, choices: object) -> None:
    """ConfigError (one line) for a `[boost] key` value that is not one of the `Literal`
    `choices`: for values that reach the model without a parse (a saved config.json)."""
    values = get_args(choices)
    if value not in values:
        raise ConfigError(
            f"unknown [boost] {key} {value!r}; choose one of {', '.join(map(str, values))}"
        )


ARCHS: tuple[str, ...] = get_args(Arch)
LAX_BASES: tuple[str, ...] = get_args(LaxBase)
AC_MODES = ("none", "full", "selective", "lowrank")
"""Activation checkpointing: none; TorchTitan's full and op-level selective; BOOST's low-rank
([activation_checkpoint] mode, or [boost] lowrank_ac with mode none)."""
OVERLAP_CHUNKS: tuple[int, ...] = get_args(OverlapChunks)
DATA_ORDERS: tuple[str, ...] = get_args(DataOrder)


@dataclass
class Boost:
    arch: Arch = "cola"
    """Projection family: fullrank | svd | cola | lax (`boost_llama.archs`)."""

    rank: int = 0
    """Bottleneck rank r of every low-rank projection (0 = the flavor's default, d/4)."""

    lax_base: LaxBase = "cola"
    """For arch = lax: the underlying low-rank layer, cola (with SiLU) or svd (none)."""

    max_seq_len: int = 0
    """Longest sequence the model takes, the length of its RoPE table (0: the flavor's,
    4096 for the paper sizes); raise it to train on longer sequences (training.seq_len)."""

    tp_strategy: TpStrategy = "auto"
    """Tensor-parallel plan: auto (btp for low-rank, megatron for fullrank) or a name from
    `boost_titan.boost_llama.strategies.STRATEGIES` (megatron | vanilla | btp)."""

    rmsnorm: RmsNorm = "online"
    """RMSNorm in front of BTP down-projections: online (the statistic rides the down
    all-reduce) | sync."""

    group_linears: bool = True
    """Under TP, run the q/k/v and gate/up first GEMMs as one GEMM (and, in BTP, one
    all-reduce) each."""

    exact_grad_norm: bool = True
    """Clip by the global gradient norm summed in fp64: the same in every layout (TorchTitan
    sums in the gradients' dtype, which drifts with shard size)."""

    lowrank_ac: bool = False
    """Low-rank activation checkpointing: save only the bottleneck latents, recompute the rest."""

    overlap_chunks: OverlapChunks = 1
    """Under TP, split the tokens of every all-reduce that follows a GEMM (forward: the
    down-projections' latents, row-parallel outputs; backward: column-parallel input grads)
    into this many blocks, each launched before the next block's GEMM so that it runs behind
    it (1, 2 or 4; 1: one all-reduce each)."""

    data_order: DataOrder = "sharded"
    """Training batches: sharded (TorchTitan's: each data-parallel rank reads its own share
    of the documents) | global (every rank reads the one stream and keeps its rows of each
    global batch, so the batches do not depend on the DP degree; every rank tokenizes all)."""

    data_mix: str = ""
    """Blend prepared datasets (`python -m boost_titan.prepare`) by weight:
    "web=/data/web:0.7,code=/data/code:0.3" (instead of training.dataset_path; weights >= 0
    summing to a positive number, normalized). Prepared data is always read in the global
    order (`boost_titan.data.mix`)."""

    data_shuffle: bool = True
    """Read prepared data's windows shuffled: each source's in a seeded permutation per
    epoch (`boost_titan.data.window_order`); --boost.no_data_shuffle: in input order."""

    data_seed: int = 0
    """The seed of that shuffle: one seed, one sequence of windows at any data-parallel
    degree and across resumes."""

    eod_mask_loss: bool = False
    """Ignore the label that predicts a document's first token from the previous document's
    end-of-document token (Megatron-LM's `eod_mask_loss`; `boost_titan.data.document_masks`)."""

    reset_position_ids: bool = False
    """Number each document's tokens from 0 inside a training window (Megatron-LM's
    `reset_position_ids`); `boost_llama` only, refused with CP, PP and CUDA graphs."""

    reset_attention_mask: bool = False
    """Let each token attend only to earlier tokens of its own document (Megatron-LM's
    `reset_attention_mask`): SDPA with a boolean [b, 1, s, s] mask, s^2 bytes per sequence;
    `boost_llama` only, refused with CP, PP and CUDA graphs."""

    cuda_graphs: bool = False
    """On CUDA, capture each micro-batch's forward + loss + backward as a CUDA graph and
    replay it (`boost_titan.runtime.cuda_graphs`); no effect on CPU; refused with pipeline
    parallelism. Off by default until a CUDA run shows it equals eager bit for bit."""

    time_budget_minutes: float = 0.0
    """Wall-clock budget of one invocation, from the trainer's start (0: none). When it runs
    out, training stops after the current step with a checkpoint, as on SIGTERM
    (`boost_titan.runtime.stopping`); leave room for that save before the scheduler's limit."""

    skip_nonfinite_steps: int = 0
    """Steps with a NaN/inf loss or gradient norm that may be skipped (no optimizer step)
    before the run stops; 0: stop at the first (`boost_titan.runtime.nonfinite`)."""

    gradient_accumulation_steps: int = 0
    """Micro-batches of `training.local_batch_size` sequences that each data-parallel
    replica accumulates per step: the global batch is local_batch_size x this x DP degree,
    so it follows the GPU count (`global_batch`). 0: `training.global_batch_size` decides,
    as in TorchTitan (-1: local_batch_size x DP degree)."""

    loro_exact_every: int = 500
    """With `[optimizer] name = "LORO"`: every this many optimizer steps (step t with
    t % K == 0) the exact Riemannian step, then every Adam state zeroed (`config.optimizer`)."""

    loro_rewarm_steps: int = 5
    """With LORO: the steps after an exact step over which the LR re-warms linearly."""

    loro_approx_scale: float = 0.0
    """With LORO: the approximate step's LR scale on the factors (0: r / hidden size per
    pair, as the official code)."""

    allow_toy_corpus: bool = False
    """Let a model of 1B parameters or more train on the built-in toy corpus (the stdlib's
    Python sources) or its 4096-token tokenizer; refused otherwise
    (`boost_llama.spec.refuse_toy_corpus`)."""

    allow_custom_import: bool = False
    """Let the job import the module named by `[experimental] custom_import` or
    `--job.custom_config_module` (code from outside boost-titan, run by `check` or every
    worker); refused otherwise (`config.cli.check_module_imports`). Counts on the command
    line only: a TOML cannot allow its own imports."""


@dataclass
class JobConfig:
    boost: Boost = field(default_factory=Boost)


def data_parallel_degree(parallelism, world: int) -> int:
    """TorchTitan's batch degree (dp_replicate x dp_shard) of `world` processes: those
    that TP, PP and CP leave."""
    p = parallelism
    return world // (
        p.tensor_parallel_degree * p.pipeline_parallel_degree * p.context_parallel_degree
    )


def global_batch(training, boost: Boost, dp: int) -> int:
    """Sequences per optimizer step of a job whose data-parallel degree is `dp`:
    local_batch_size x `[boost] gradient_accumulation_steps` x dp when that is set, else
    TorchTitan's `training.global_batch_size` (-1: local_batch_size x dp). ConfigError (one
    line) for a combination TorchTitan cannot split into whole micro-batches per rank."""
    local, fixed = training.local_batch_size, training.global_batch_size
    steps = boost.gradient_accumulation_steps
    if steps < 0:
        raise ConfigError(
            f"[boost] gradient_accumulation_steps {steps} must be >= 0; set it to the "
            "micro-batches per data-parallel replica and step (0: training.global_batch_size)"
        )
    if steps and fixed > 0:
        raise ConfigError(
            f"training.global_batch_size {fixed} and [boost] gradient_accumulation_steps "
            f"{steps} both set the batch; keep one (--boost.gradient_accumulation_steps 0 "
            "holds the global batch fixed, or drop global_batch_size to let it follow the GPUs)"
        )
    if steps:
        return local * steps * dp
    if fixed <= 0:
        return local * dp
    if fixed % (local * dp):
        raise ConfigError(
            f"training.global_batch_size {fixed} is not a multiple of local_batch_size {local} "
            f"x data-parallel degree {dp}; adjust one of them, or set "
            "--boost.gradient_accumulation_steps to let the global batch follow the GPU count"
        )
    return fixed


def check_run_limits(boost: Boost) -> None:
    """ConfigError for a `[boost]` time budget or non-finite-step limit that cannot work (the
    trainer and `boost_titan.check` both call this)."""
    budget, skips = boost.time_budget_minutes, boost.skip_nonfinite_steps
    if not (math.isfinite(budget) and budget >= 0):
        raise ConfigError(
            f"[boost] time_budget_minutes {budget} must be a number >= 0; set "
            "--boost.time_budget_minutes to the minutes one run may take (0: no budget)"
        )
    if skips < 0:
        raise ConfigError(
            f"[boost] skip_nonfinite_steps {skips} must be >= 0; set "
            "--boost.skip_nonfinite_steps to how many NaN/inf steps to skip (0: stop at the first)"
        )


def check_cuda_graphs(boost: Boost, pipeline_degree: int) -> None:
    """ConfigError for `[boost] cuda_graphs` under pipeline parallelism, whose schedule runs
    host-side bookkeeping between micro-batches (the trainer and `check` both call this)."""
    if boost.cuda_graphs and pipeline_degree > 1:
        raise ConfigError(
            "[boost] cuda_graphs does not support pipeline parallelism (its schedule runs "
            "host-side bookkeeping between micro-batches); drop --boost.cuda_graphs or set "
            "parallelism.pipeline_parallel_degree to 1"
        )


DOCUMENT_MODELS = ("boost_llama",)
"""Models whose forward takes `positions` and `documents` (`[boost] reset_position_ids`,
`reset_attention_mask`)."""


def check_documents(boost: Boost, model_name: str, parallelism) -> None:
    """ConfigError (one line) for `[boost] reset_position_ids` / `reset_attention_mask` on
    a job that cannot honour them: another model, context parallelism (TorchTitan numbers
    the positions itself and the ring attention takes no mask), pipeline parallelism (only
    the first stage would get them), CUDA graphs (the token input only). The trainer and
    `check` both call this; `eod_mask_loss` changes labels only and runs everywhere."""
    asked = [k for k in ("reset_position_ids", "reset_attention_mask") if getattr(boost, k)]
    if not asked:
        return
    refused = {
        f"model.name {model_name!r} (only {', '.join(DOCUMENT_MODELS)} takes them)": (
            model_name not in DOCUMENT_MODELS
        ),
        "context parallelism": parallelism.context_parallel_degree > 1,
        "pipeline parallelism": parallelism.pipeline_parallel_degree > 1,
        "[boost] cuda_graphs": boost.cuda_graphs,
    }
    for what, on in refused.items():
        if on:
            raise ConfigError(
                f"[boost] {' and '.join(asked)} cannot run with {what}; drop "
                f"{' and '.join('--boost.' + k for k in asked)} or that setting "
                "(eod_mask_loss alone works everywhere)"
            )
