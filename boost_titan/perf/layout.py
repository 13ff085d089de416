"""How one model is trained, as the analytic model sees it: `TrainingLayout`, the model
shape a strategy trains (`trained_shape`) and whether the model can price the pair (`check`).

The parallel strategy and degrees (TP, PP, CP), the batch shape, the dtypes, recomputation,
float8 and how kernels are launched; the lists of choices the model prices (`DTYPE_BYTES`,
`FLOAT8_CASTS`; strategies are `boost_llama.strategies`', `AC_MODES` `boost_titan.config`'s,
`RMSNORM_MODES` the library's `parallelize.norm_modes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.boost_llama.archs import ARCHITECTURES
from boost_titan.boost_llama.shapes import PAPER_VOCAB, ModelShape, flavor_shape
from boost_titan.boost_llama.strategies import STRATEGIES, sizes, strategy_names
from boost_titan.config import AC_MODES
from boost_titan.config.errors import ConfigError
from boost_titan.config.precision import DTYPE_SHORT_NAMES
from boost_titan.parallelize.norm_modes import RMSNORM_MODES

DTYPE_BYTES = {"bf16": 2, "fp32": 4}
DTYPE_ALIASES = {name: short for name, short in DTYPE_SHORT_NAMES.items() if short in DTYPE_BYTES}
"""TorchTitan's spellings (`training.mixed_precision_param`) of the DTYPE_BYTES names."""
FLOAT8_CASTS = ("eager", "fused")
"""How float8 casts run: torchao's eager kernels, or fused by torch.compile."""
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
    K/V all-gathered per block (`block.ring_bytes`)."""
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
    """How the float8 casts run (`FLOAT8_CASTS`): eager, or fused by torch.compile."""
    compiled: bool = False
    """Blocks under torch.compile (`[compile] enable`, off by TorchTitan's default): each
    memory-bound operation one fused kernel (`host.stream_kernels`); False: eager, as
    dispatched. Changes launches only: the GPU time prices eager traffic either way."""
    cuda_graphs: bool = False
    """`[boost] cuda_graphs`: a micro-batch is one graph launch (`host`)."""
    legacy_launches: bool = False
    """The launch pattern of commit 18fc3d3 (`host.weight_launches`), on which the H100 rows
    of `measured` were taken."""
    loro_exact_every: int = 0
    """LORO (`[optimizer] name = "LORO"`): its exact step every K optimizer steps
    (`[boost] loro_exact_every`, `perf.loro`); 0: AdamW."""
    interleaved_rope: bool = False
    """RoPE priced as the stride-2 decomposition the product ran until issue 47
    (`streams.INTERLEAVED_ROPE_FORWARD`): the runs the model was calibrated on, the H100
    rows of `measured` and the BOOST paper's rows of `paper`, are priced with it."""

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank (its 1/cp share of each sequence)."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def state(self) -> str:
        """Key of `timing.STATE_BYTES`: the dtype, or BF16_WEIGHTS for bf16 without master
        weights."""
        return BF16_WEIGHTS if self.dtype == "bf16" and not self.master_weights else self.dtype

    @property
    def precision(self) -> str:
        """A short description: GEMM and state dtypes, float8 recipe and casts."""
        text = {"fp32": "fp32", "bf16": "bf16, fp32 master", BF16_WEIGHTS: "bf16, no master"}
        suffix = f", float8 {self.float8} ({self.float8_casts} casts)" if self.float8 else ""
        return text[self.state] + suffix


def trained_shape(flavor: str, arch: str, strategy: str) -> ModelShape:
    """The flavor's arguments as `strategy` trains them: megatron always trains the fullrank
    twin; a flavor without a vocabulary gets the paper's 32000."""
    args = flavor_shape(flavor, arch="fullrank" if strategy == "megatron" else arch)
    if not args.vocab_size:
        args.vocab_size = PAPER_VOCAB
    args.validate()
    return args


def check(args: ModelShape, plan: TrainingLayout) -> None:
    """Raise ConfigError (one line, with the fix) for a plan the model cannot describe."""
    choices = {
        "strategy": (plan.strategy, strategy_names()),
        "ac": (plan.ac, AC_MODES),
        "dtype": (plan.dtype, tuple(DTYPE_BYTES)),
        "rmsnorm": (plan.rmsnorm, RMSNORM_MODES),
        "float8 casts": (plan.float8_casts, FLOAT8_CASTS),
    }
    for option, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"unknown {option} {value!r}; choose one of {', '.join(allowed)}")
    if not args.architecture.priced:
        priced = ", ".join(name for name, a in ARCHITECTURES.items() if a.priced)
        raise ConfigError(
            f"the perf model covers {priced}; {args.arch} ({args.architecture.summary}) is "
            "not modelled, use --arch cola"
        )
    if plan.loro_exact_every < 0:
        raise ConfigError(f"loro_exact_every {plan.loro_exact_every} must be >= 0 (0: AdamW)")
    if plan.loro_exact_every and plan.strategy == "megatron":
        raise ConfigError(
            "LORO needs low-rank pairs; strategy megatron trains the full-rank twin, use "
            "--strategy btp or vanilla"
        )
    if plan.loro_exact_every and (not args.low_rank or args.activation != "none"):
        has = f"{args.activation} between the factors" if args.low_rank else "no factor pairs"
        raise ConfigError(
            f"LORO needs SVD-style pairs; arch {args.arch} has {has} (the exact step "
            "re-balances B and A), use --arch svd"
        )
    if plan.loro_exact_every and plan.state == BF16_WEIGHTS:
        raise ConfigError(
            "LORO updates fp32 master factors; keep master weights (no --no-master-weights, "
            'training.dtype "float32")'
        )
    if plan.strategy != "megatron" and not args.low_rank:
        raise ConfigError(
            f"strategy {plan.strategy} needs a low-rank arch (svd or cola); "
            "fullrank trains with megatron"
        )
    if plan.ac == "lowrank" and plan.strategy == "megatron":
        raise ConfigError(
            "ac lowrank keeps bottleneck latents, which megatron's fullrank model lacks; "
            "use --ac full or selective"
        )
    if not 1 <= plan.tp <= 8:
        raise ConfigError(
            f"tp {plan.tp} must be 1..8: tensor parallelism stays inside one NVLink node"
        )
    if not 1 <= plan.pp <= args.n_layers:
        raise ConfigError(f"pp {plan.pp} must be 1..{args.n_layers} (the number of layers)")
    if min(plan.seq_len, plan.micro_batch, plan.microbatches) < 1:
        raise ConfigError("seq_len, micro_batch and microbatches must be positive")
    if plan.cp < 1:
        raise ConfigError(f"cp {plan.cp} must be >= 1")
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        raise ConfigError(
            f"seq_len {plan.seq_len} is not divisible by 2 x cp {plan.cp} (head-tail load "
            "balancing gives each rank two chunks); pick a cp that divides seq_len / 2"
        )
    strategy_sizes = sizes(args)
    for name in STRATEGIES[plan.strategy].divisible:
        if strategy_sizes[name] % plan.tp:
            size = strategy_sizes[name]
            raise ConfigError(
                f"{name} {size} is not divisible by tp {plan.tp}; pick a tp that divides it"
            )
