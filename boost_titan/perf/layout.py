"""How one model is trained, as the analytic model sees it: `TrainingLayout`.

The parallel strategy and degrees (TP, PP, CP), the batch shape, the dtypes, recomputation,
float8 and how kernels are launched; the lists of choices the model prices (`STRATEGIES`,
`DTYPE_BYTES`; `AC_MODES` is `boost_titan.config`'s).
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.boost_llama.strategies import STRATEGIES as REGISTRY

STRATEGIES = tuple(REGISTRY)
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
DTYPE_ALIASES = {"bfloat16": "bf16", "float32": "fp32"}
"""TorchTitan's spellings (`training.mixed_precision_param`) of the DTYPE_BYTES names."""
BF16_WEIGHTS = "bf16-weights"
"""State of bf16 training without master weights (`training.dtype = "bfloat16"`)."""


@dataclass(frozen=True)
class TrainingLayout:
    """How one model is trained: parallel strategy, batch shape, dtype and recomputation."""

    strategy: str
    tp: int = 1
    pp: int = 1
    cp: int = 1
    """Context parallelism: each sequence split over `cp` ranks (head-tail load balanced),
    K/V all-gathered per block (`step_model.ring_bytes`)."""
    seq_len: int = 4096
    micro_batch: int = 1
    microbatches: int = 4
    dtype: str = "bf16"
    ac: str = "none"
    rmsnorm: str = "online"
    group_linears: bool = True
    overlap_chunks: int = 1
    master_weights: bool = True
    """bf16 keeps fp32 master weights (mixed precision); False: weights, grads and AdamW
    state all in bf16 (TorchTitan's `training.dtype = "bfloat16"`)."""
    float8: str | None = None
    """torchao float8 recipe (`[quantize.linear.float8] recipe_name`); None: off."""
    float8_filter: tuple[str, ...] = ()
    """TorchTitan's `filter_fqns` (with `auto_filter_small_kn`: torchao's size filter)."""
    float8_casts: str = "eager"
    """How the float8 casts run (`float8_costs.CASTS`): eager, or fused by torch.compile."""
    compiled: bool = False
    """Blocks under torch.compile (`[compile] enable`, off by TorchTitan's default): each
    memory-bound operation one fused kernel (`host.stream_kernels`); False: eager, as
    dispatched. Changes launches only: the GPU time prices eager traffic either way."""
    cuda_graphs: bool = False
    """`[boost] cuda_graphs`: a micro-batch is one graph launch (`host`)."""
    legacy_launches: bool = False
    """The launch pattern of commit 18fc3d3 (`host.weight_launches`), on which the H100 rows
    of `measured` were taken."""

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank (its 1/cp share of each sequence)."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def state(self) -> str:
        """Key of `step.STATE_BYTES`: the dtype, or BF16_WEIGHTS for bf16 without master
        weights."""
        return BF16_WEIGHTS if self.dtype == "bf16" and not self.master_weights else self.dtype

    @property
    def precision(self) -> str:
        """A short description: GEMM and state dtypes, float8 recipe and casts."""
        text = {"fp32": "fp32", "bf16": "bf16, fp32 master", BF16_WEIGHTS: "bf16, no master"}
        suffix = f", float8 {self.float8} ({self.float8_casts} casts)" if self.float8 else ""
        return text[self.state] + suffix
