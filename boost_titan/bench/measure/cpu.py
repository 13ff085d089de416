"""Wall-clock training steps on this CPU: each TP strategy on the same small model.

`tp` gloo processes (one thread each) build one model per strategy (megatron trains the
fullrank twin) with the real TP plan and AdamW, then time whole steps (forward,
loss-parallel cross-entropy, backward, optimizer step). Strategies are interleaved within
every repetition, in a rotating order, so drifting machine load hits them alike; a step's
time is that of the slowest rank. Warm-up repetitions are dropped.

The full-rank baseline runs TorchTitan's llama3 layout: separate q/k/v and gate/up GEMMs
(`group_linears=False`). Grouped, it would concatenate its large weights on every forward,
which measured slower here; the low-rank strategies keep grouping (one GEMM and one
all-reduce per group, BOOST's linear grouping).

`--compile` also builds each strategy's model with every block under `torch.compile`
(Inductor, fullgraph, as `[compile] enable` does) and times it interleaved with the eager
one: compile seconds (its first step less its median step) and the compiled / eager step
ratio come from the same run. `--overlap-chunks K` likewise adds each strategy with its
all-reduces in K overlapped row blocks (`[boost] overlap_chunks`); with `--profile N`
the time rank 0 spends in collectives (launching and waiting: the exposed communication)
is reported for 1 and K blocks side by side.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from boost_titan.boost_llama import BoostModelArgs, BoostTransformer
from boost_titan.boost_llama.strategies import STRATEGIES, build_plan, sizes
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize import apply_plan
from boost_titan.processes.local_ranks import run_on_ranks


@dataclass(frozen=True)
class CpuConfig:
    """The timed model and schedule (defaults: BOOST-like block with r = d/4)."""

    dim: int = 1024
    rank: int = 256
    n_heads: int = 16
    ffn_dim: int = 2816
    n_layers: int = 1
    vocab_size: int = 1024
    seq_len: int = 512
    micro_batch: int = 2
    arch: str = "cola"
    tp: int = 2
    repeats: int = 10
    warmup: int = 2
    profile_steps: int = 0
    compile: bool = False
    overlap_chunks: int = 1

    @staticmethod
    def group_linears(strategy: str) -> bool:
        """Low-rank plans group; the full-rank baseline runs TorchTitan's ungrouped layout."""
        return strategy != "megatron"

    def strategy_args(self, strategy: str) -> BoostModelArgs:
        """The model's args as `strategy` trains them (megatron: the fullrank twin)."""
        full_rank = strategy == "megatron"
        args = BoostModelArgs(
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            ffn_dim=self.ffn_dim,
            vocab_size=self.vocab_size,
            rank=self.rank,
            max_seq_len=self.seq_len,
            arch="fullrank" if full_rank else self.arch,
        )
        args.validate()
        return args


@dataclass
class CpuRecord:
    """Step times of one strategy. ratio_to_btp: this median / BTP's median in the same
    run; ratio_to_btp_paired: the median over repetitions of this step / BTP's step of
    the same repetition (robust to load that drifts between repetitions). profile_ms (with
    --profile N): rank 0's mean step under torch.profiler split into gemm, attention,
    comm (collectives and waiting for them) and other, in ms; they add up to step."""

    strategy: str
    arch: str
    tp: int
    seq_len: int
    micro_batch: int
    dtype: str
    dim: int
    rank: int
    n_heads: int
    ffn_dim: int
    n_layers: int
    vocab_size: int
    group_linears: bool
    warmup: int
    repeats: int
    step_ms_median: float
    step_ms_min: float
    step_ms_max: float
    step_ms: list[float]
    ratio_to_btp: float | None = None
    ratio_to_btp_paired: float | None = None
    profile_ms: dict[str, float] | None = None
    compiled_step_ms: list[float] | None = None
    compile_s: float | None = None
    compiled_to_eager_paired: float | None = None
    """--compile: median over repetitions of the compiled step / the eager step."""
    overlap_chunks: int = 1
    overlap_step_ms: list[float] | None = None
    overlap_to_one_paired: float | None = None
    """--overlap-chunks K: median over repetitions of the K-block step / the 1-block step."""
    overlap_profile_ms: dict[str, float] | None = None

    def to_json(self) -> dict:
        return asdict(self)


# ---- one rank ----------------------------------------------------------------------------
class _Trainee:
    """A model under one strategy's plan, its optimizer and one timed step."""

    def __init__(
        self,
        cfg: CpuConfig,
        strategy: str,
        mesh: DeviceMesh,
        compiled: bool = False,
        chunks: int = 1,
    ) -> None:
        args = cfg.strategy_args(strategy)
        torch.manual_seed(0)
        self.model = BoostTransformer(args)
        self.model.init_weights()
        plan = build_plan(strategy, args, group_linears=cfg.group_linears(strategy))
        apply_plan(self.model, mesh, plan, overlap_chunks=chunks)
        if compiled:
            for layer_id, block in self.model.layers.named_children():
                self.model.layers.register_module(layer_id, torch.compile(block, fullgraph=True))
        self.optimizer = torch.optim.AdamW(  # fused: TorchTitan's default implementation
            self.model.parameters(), lr=1e-4, weight_decay=0.01, fused=True
        )

    def step(self, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(tokens)
        with loss_parallel():
            F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
        self.optimizer.step()


def _timed(trainee: _Trainee, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Milliseconds of one step on the slowest rank."""
    dist.barrier()
    start = time.perf_counter()
    trainee.step(tokens, labels)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item() * 1e3


PROFILE_KINDS = {
    "gemm": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product",),
    "comm": ("c10d::", "_c10d_functional::"),
}
"""Profiler op-name prefixes of each kind of work; the rest of a step is `other`."""


def _profiled(trainee: _Trainee, tokens: torch.Tensor, labels: torch.Tensor, steps: int) -> dict:
    """Mean milliseconds per step of this rank, by kind of op (profiler self times)."""
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            trainee.step(tokens, labels)
        step_ms = (time.perf_counter() - start) * 1e3 / steps
    split = dict.fromkeys(PROFILE_KINDS, 0.0)
    for event in prof.key_averages():
        kind = next((k for k, names in PROFILE_KINDS.items() if event.key.startswith(names)), None)
        if kind:
            split[kind] += event.self_cpu_time_total / 1e3 / steps
    return {"step": step_ms, **split, "other": step_ms - sum(split.values())}


def _worker(rank: int, world_size: int, cfg: CpuConfig, strategies: tuple[str, ...]) -> dict:
    """One rank's timings (every rank returns them; rank 0's are kept)."""
    mesh = init_device_mesh("cpu", (world_size,))
    trainees = {s: _Trainee(cfg, s, mesh) for s in strategies}
    generator = torch.Generator().manual_seed(1)
    tokens, labels = torch.randint(
        0, cfg.vocab_size, (2, cfg.micro_batch, cfg.seq_len), generator=generator
    )
    runs = list(strategies)
    first_ms = {}
    if cfg.compile:
        for s in strategies:
            trainees[f"{s}:compiled"] = _Trainee(cfg, s, mesh, compiled=True)
            first_ms[s] = _timed(trainees[f"{s}:compiled"], tokens, labels)
            runs.append(f"{s}:compiled")
    if cfg.overlap_chunks > 1:
        for s in strategies:
            trainees[f"{s}:overlap"] = _Trainee(cfg, s, mesh, chunks=cfg.overlap_chunks)
            runs.append(f"{s}:overlap")
    times: dict[str, list[float]] = {s: [] for s in runs}
    for rep in range(cfg.warmup + cfg.repeats):
        shift = rep % len(runs)
        for run in runs[shift:] + runs[:shift]:
            ms = _timed(trainees[run], tokens, labels)
            if rep >= cfg.warmup:
                times[run].append(ms)
    profiles = {
        run: _profiled(trainees[run], tokens, labels, cfg.profile_steps)
        for run in (runs if cfg.profile_steps else ())
    }
    return {"times": times, "profiles": profiles, "first_ms": first_ms}


# ---- the measurement ---------------------------------------------------------------------
def measure(cfg: CpuConfig, strategies: tuple[str, ...] = tuple(STRATEGIES)) -> list[CpuRecord]:
    """Time every strategy on `cfg.tp` spawned gloo processes; one record each."""
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
        values = sizes(cfg.strategy_args(strategy))
        for name in ("dim", *STRATEGIES[strategy].divisible):
            if values[name] % cfg.tp:
                raise ConfigError(f"{name} {values[name]} is not divisible by tp {cfg.tp}")
    if cfg.repeats < 1 or cfg.warmup < 0 or cfg.profile_steps < 0 or cfg.overlap_chunks < 1:
        raise ConfigError(
            "--repeats and --overlap-chunks must be >= 1, --warmup and --profile >= 0"
        )
    result = run_on_ranks(_worker, cfg.tp, cfg=cfg, strategies=strategies)[0]
    records = [_record(cfg, s, result["times"][s]) for s in strategies]
    for r in records:
        r.profile_ms = result["profiles"].get(r.strategy)
        if cfg.compile:
            compiled = result["times"][f"{r.strategy}:compiled"]
            r.compiled_step_ms = compiled
            r.compile_s = (
                max(result["first_ms"][r.strategy] - statistics.median(compiled), 0.0) / 1e3
            )
            r.compiled_to_eager_paired = statistics.median(
                c / e for c, e in zip(compiled, r.step_ms, strict=True)
            )
        if cfg.overlap_chunks > 1:
            overlapped = result["times"][f"{r.strategy}:overlap"]
            r.overlap_chunks, r.overlap_step_ms = cfg.overlap_chunks, overlapped
            r.overlap_to_one_paired = statistics.median(
                o / e for o, e in zip(overlapped, r.step_ms, strict=True)
            )
            r.overlap_profile_ms = result["profiles"].get(f"{r.strategy}:overlap")
    if "btp" in strategies:
        btp = records[strategies.index("btp")]
        for r in records:
            r.ratio_to_btp = r.step_ms_median / btp.step_ms_median
            r.ratio_to_btp_paired = statistics.median(
                mine / theirs for mine, theirs in zip(r.step_ms, btp.step_ms, strict=True)
            )
    return records


def _record(cfg: CpuConfig, strategy: str, ms: list[float]) -> CpuRecord:
    args = cfg.strategy_args(strategy)
    return CpuRecord(
        strategy=strategy,
        arch=args.arch,
        tp=cfg.tp,
        seq_len=cfg.seq_len,
        micro_batch=cfg.micro_batch,
        dtype="fp32",
        dim=cfg.dim,
        rank=cfg.rank,
        n_heads=cfg.n_heads,
        ffn_dim=cfg.ffn_dim,
        n_layers=cfg.n_layers,
        vocab_size=cfg.vocab_size,
        group_linears=cfg.group_linears(strategy),
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        step_ms_median=statistics.median(ms),
        step_ms_min=min(ms),
        step_ms_max=max(ms),
        step_ms=ms,
    )
