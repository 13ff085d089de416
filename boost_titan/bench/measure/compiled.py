"""torch.compile against eager: every strategy x AC mode x TP degree on a small random model,
each cell compiled twice against one cache folder.

Per TP degree, `tp` gloo processes build, per (strategy, AC mode), the same randomly
initialised model twice (megatron trains the fullrank twin), both through the trainer's
own `parallelize_boost` with that AC mode: once eager (the reference), once with
`[compile] enable` (AC, then `torch.compile(block, fullgraph=True)` per block), and the
loss compiled as TorchTitan compiles it (`compile.components` holds "loss" by default).
Every cell runs in two passes, each in fresh processes, against ONE compile cache folder
(`TORCHINDUCTOR_CACHE_DIR`): the cold pass compiles (after the cells before it filled the
folder: the loss graph, identical in every cell, is compiled by the first cell and loaded
by the others), the warm pass is what a rerun of a job gets. Each row reports:

* graph breaks (dynamo's counter; `fullgraph=True` turns a break into an error instead);
* per pass, the largest relative error of the loss and of every gradient against the
  reference (per tensor: max |compiled - eager| / max |eager|), and the warm pass's
  AOTAutograd cache hits (Inductor only: aot_eager caches nothing, so its two passes are
  the same computation);
* the collectives of one forward + backward, eager and compiled, counted by the profiler
  as process-group calls (`c10d::allreduce_`, ...), which eager code and compiled graphs
  reach alike; a collective that selective checkpointing serves from its cache during
  recomputation never gets there and is not counted;
* compile seconds per pass (the first compiled step less a later one) and the compiled /
  eager step time ratio (medians over `repeats` interleaved steps, slowest rank).

The default backend, Inductor, is what TorchTitan compiles with and what the warm pass
needs; `--backend aot_eager` traces and partitions exactly as Inductor does but runs the
aten ops: a quick check of tracing on CPU, with nothing cached.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config import AC_MODES
from boost_titan.config.errors import ConfigError
from boost_titan.processes.local_ranks import run_on_ranks

PG_COLLECTIVES = {
    "allreduce_": "all_reduce",
    "allgather_into_tensor_coalesced_": "all_gather",
    "_allgather_base_": "all_gather",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "alltoall_base_": "all_to_all",
}
"""Process-group ops (`c10d::`, what reaches gloo or NCCL) counted, by the name shown."""
AC_SETTINGS = {
    "none": ("none", False),
    "full": ("full", False),
    "selective": ("selective", False),
    "lowrank": ("none", True),
}
"""AC mode -> ([activation_checkpoint] mode, [boost] lowrank_ac); selective is op-level."""


@dataclass(frozen=True)
class MatrixConfig:
    """The small model and schedule every cell trains."""

    arch: str = "cola"
    dim: int = 64
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_dim: int = 128
    n_layers: int = 2
    vocab_size: int = 64
    batch: int = 2
    seq_len: int = 16
    backend: str = "inductor"
    repeats: int = 3


PASSES = ("cold", "warm")
"""The two passes of every cell against one cache folder, in order."""


@dataclass
class PassResult:
    """One cell in one pass (fresh processes)."""

    graph_breaks: int | None = None
    max_rel_error: float | None = None
    cache_hits: int = 0
    """AOTAutograd cache hits of the compiled model and loss."""
    eager_collectives: dict[str, int] = field(default_factory=dict)
    compiled_collectives: dict[str, int] = field(default_factory=dict)
    compile_s: float | None = None
    step_ratio: float | None = None
    error: str | None = None


@dataclass
class CompileRow:
    arch: str
    strategy: str
    ac: str
    tp: int
    backend: str
    cold: PassResult
    warm: PassResult

    @property
    def error(self) -> str | None:
        return self.cold.error or self.warm.error

    def ok(self) -> bool:
        """No graph break, eager's values within 1e-5 in both passes, eager's collectives
        or fewer, and with Inductor a warm pass that really read the cache."""
        passes = (self.cold, self.warm)
        return (
            not self.error
            and all(p.graph_breaks == 0 and p.max_rel_error <= 1e-5 for p in passes)
            and all(
                collectives_verdict(p.eager_collectives, p.compiled_collectives) != "DIFFER"
                for p in passes
            )
            and (self.backend != "inductor" or self.warm.cache_hits > 0)
        )


# ---- one rank ----------------------------------------------------------------------------
def _model(cfg: MatrixConfig, strategy: str):
    from boost_titan.boost_llama import BoostTransformer, flavor_args

    arch = "fullrank" if strategy == "megatron" else cfg.arch
    args = flavor_args(
        "debug",
        vocab_size=cfg.vocab_size,
        arch=arch,
        dim=cfg.dim,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads,
        ffn_dim=cfg.ffn_dim,
        n_layers=cfg.n_layers,
    )
    torch.manual_seed(0)
    model = BoostTransformer(args)
    model.init_weights()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # norm weights and biases far from their initial 1 and 0
        for param in model.parameters():
            noise = torch.rand(param.shape, generator=generator)
            param.copy_(0.5 + noise) if param.dim() == 1 else param.add_(
                (noise - 0.5) * 0.2 * param.abs().mean()
            )
    return model


def _job(strategy: str, arch: str, ac: str, compiled: bool, backend: str):
    """The JobConfig of a cell, parsed as the trainer parses its arguments (fp32)."""
    from boost_titan.config.cli import parse_job_config

    mode, lowrank = AC_SETTINGS[ac]
    args = [
        "--boost.arch",
        arch,
        "--boost.tp_strategy",
        strategy,
        "--activation_checkpoint.mode",
        mode,
        "--activation_checkpoint.selective_ac_option",
        "op",
        "--compile.backend",
        backend,
        "--training.mixed_precision_param",
        "float32",
        "--boost.lowrank_ac" if lowrank else "--boost.no_lowrank_ac",
        "--compile.enable" if compiled else "--compile.no_enable",
    ]
    return parse_job_config(args)


def _parallelize(model, dims, strategy: str, ac: str, compiled: bool, backend: str) -> None:
    """The trainer's `parallelize_boost` with this strategy, AC mode and compile setting."""
    from boost_titan.boost_llama.parallelize import parallelize_boost

    parallelize_boost(model, dims, _job(strategy, model.args.arch, ac, compiled, backend))


def _forward_backward(model, loss_fn, tokens, labels) -> torch.Tensor:
    """One forward + backward from zeroed grads (they stay on the model); the loss, as
    TorchTitan's trainer computes it (summed cross-entropy over the tokens' count)."""
    from torch.distributed.tensor.parallel import loss_parallel

    model.zero_grad(set_to_none=True)
    with loss_parallel():
        loss = loss_fn(model(tokens), labels) / labels.numel()
        loss.backward()
    return loss


def _step(model, loss_fn, tokens, labels) -> tuple[float, torch.Tensor]:
    """(seconds on the slowest rank, loss) of one forward + backward."""
    from torch.distributed.tensor import DTensor

    dist.barrier()
    start = time.perf_counter()
    loss = _forward_backward(model, loss_fn, tokens, labels)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    return elapsed.item(), loss.detach()


def _grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")] = (
            g.detach().clone()
        )
    return out


def _collectives(model, loss_fn, tokens, labels) -> dict[str, int]:
    """Process-group collectives one forward + backward issues, by name (profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _forward_backward(model, loss_fn, tokens, labels)
    counts: Counter[str] = Counter()
    for event in prof.events():
        op = event.name.removeprefix("c10d::")
        if event.name.startswith("c10d::") and op in PG_COLLECTIVES:
            counts[PG_COLLECTIVES[op]] += 1
    return dict(sorted(counts.items()))


def _over_ranks(value: float, op: dist.ReduceOp) -> float:
    """`value` reduced over the ranks (the worst rank decides a cell)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.item()


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _cell(cfg: MatrixConfig, dims, strategy: str, ac: str, tokens, labels) -> PassResult:
    from torchtitan.components.loss import cross_entropy_loss

    result = PassResult()
    eager = _model(cfg, strategy)
    _parallelize(eager, dims, strategy, ac, compiled=False, backend=cfg.backend)
    compiled = _model(cfg, strategy)
    try:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        _parallelize(compiled, dims, strategy, ac, compiled=True, backend=cfg.backend)
        compiled_loss = torch.compile(cross_entropy_loss, backend=cfg.backend)
        first, loss = _step(compiled, compiled_loss, tokens, labels)
        result.graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
        hits = torch._dynamo.utils.counters["aot_autograd"]["autograd_cache_hit"]
        result.cache_hits = int(_over_ranks(hits, dist.ReduceOp.MIN))
    except Exception as e:  # a graph break under fullgraph, or a failed trace: the cell's result
        result.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        return result
    compiled_grads = _grads(compiled)
    _, eager_loss = _step(eager, cross_entropy_loss, tokens, labels)
    eager_grads = _grads(eager)
    if compiled_grads.keys() != eager_grads.keys():
        result.error = "compiled and eager models hold other parameters"
        return result
    errors = [_rel_error(loss, eager_loss)]
    errors += [_rel_error(compiled_grads[name], want) for name, want in eager_grads.items()]
    result.max_rel_error = _over_ranks(max(errors), dist.ReduceOp.MAX)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(cfg.repeats):
        times["eager"].append(_step(eager, cross_entropy_loss, tokens, labels)[0])
        times["compiled"].append(_step(compiled, compiled_loss, tokens, labels)[0])
    result.compile_s = max(first - statistics.median(times["compiled"]), 0.0)
    result.step_ratio = statistics.median(times["compiled"]) / statistics.median(times["eager"])
    result.eager_collectives = _collectives(eager, cross_entropy_loss, tokens, labels)
    result.compiled_collectives = _collectives(compiled, compiled_loss, tokens, labels)
    return result


def _worker(
    rank: int, world_size: int, cfg: MatrixConfig, cells: list[tuple[str, str]]
) -> list[dict]:
    """One rank's row of every cell (every rank returns them; rank 0's are kept)."""
    from torchtitan.distributed import ParallelDims

    from boost_titan.runtime.device import use_cpu_if_no_accelerator

    use_cpu_if_no_accelerator()
    tp = world_size
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=tp, pp=1, ep=1, etp=1, world_size=tp)
    dims.build_mesh()
    generator = torch.Generator().manual_seed(1)
    tokens, labels = torch.randint(
        0, cfg.vocab_size, (2, cfg.batch, cfg.seq_len), generator=generator
    )
    return [asdict(_cell(cfg, dims, strategy, ac, tokens, labels)) for strategy, ac in cells]


# ---- the matrix --------------------------------------------------------------------------
def cells_of(strategies: list[str], acs: list[str]) -> list[tuple[str, str]]:
    """(strategy, AC mode) pairs; low-rank AC needs a low-rank model, so not megatron."""
    for name, value, choices in (("strategy", strategies, STRATEGIES), ("AC mode", acs, AC_MODES)):
        unknown = [v for v in value if v not in choices]
        if unknown:
            raise ConfigError(
                f"unknown {name} {', '.join(unknown)}; choose from {', '.join(choices)}"
            )
    return [(s, ac) for s in strategies for ac in acs if not (s == "megatron" and ac == "lowrank")]


def matrix(
    cfg: MatrixConfig, tps: list[int], cells: list[tuple[str, str]], cache_dir: str | None = None
) -> list[CompileRow]:
    """Every cell at every TP degree, in a cold then a warm pass (one spawn of `tp`
    processes per degree and pass) against one compile cache folder: `cache_dir`, else a
    new temporary folder."""
    for tp in tps:
        if tp < 1 or cfg.n_kv_heads % tp or cfg.dim % tp:
            raise ConfigError(
                f"--tp {tp} does not divide the model's {cfg.n_kv_heads} kv heads and dim {cfg.dim}"
            )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = cache_dir or os.path.join(tmp, "compile-cache")
        for tp in tps:
            results = {}
            for name in PASSES:
                with _env(TORCHINDUCTOR_CACHE_DIR=cache):
                    results[name] = run_on_ranks(_worker, tp, cfg=cfg, cells=cells)[0]
            for (strategy, ac), cold, warm in zip(
                cells, results["cold"], results["warm"], strict=True
            ):
                rows.append(
                    CompileRow(
                        cfg.arch,
                        strategy,
                        ac,
                        tp,
                        cfg.backend,
                        PassResult(**cold),
                        PassResult(**warm),
                    )
                )
    return rows


@contextlib.contextmanager
def _env(**values: str):
    """Environment variables set for the processes spawned inside the block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k} x{v}" for k, v in counts.items()) or "-"


def collectives_verdict(eager: dict[str, int], compiled: dict[str, int]) -> str:
    """same; fewer (compiled skips some of eager's, never adds: the partitioner drops the
    replay of a collective whose output backward does not need); or DIFFER."""
    if compiled == eager:
        return "same"
    if compiled.keys() <= eager.keys() and all(n <= eager[k] for k, n in compiled.items()):
        return "fewer"
    return "DIFFER"


def format_rows(rows: list[CompileRow]) -> str:
    lines = [
        "| strategy | AC | TP | graph breaks | max rel. error vs eager, cold / warm "
        "| warm cache hits | collectives per step, eager / compiled | compile s, cold / warm "
        "| compiled / eager step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.strategy} | {r.ac} | {r.tp} | {r.error} | | | | | |")
            continue
        cold, warm = r.cold, r.warm
        verdict = collectives_verdict(cold.eager_collectives, cold.compiled_collectives)
        if warm.compiled_collectives != cold.compiled_collectives:
            verdict += " (warm: " + _counts(warm.compiled_collectives) + ")"
        lines.append(
            f"| {r.strategy} | {r.ac} | {r.tp} | {cold.graph_breaks} | "
            f"{cold.max_rel_error:.1e} / {warm.max_rel_error:.1e} | {warm.cache_hits} | "
            f"{verdict}: {_counts(cold.eager_collectives)} / "
            f"{_counts(cold.compiled_collectives)} | "
            f"{cold.compile_s:.1f} / {warm.compile_s:.1f} | {cold.step_ratio:.2f} |"
        )
    return "\n".join(lines)
