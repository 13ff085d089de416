"""torch.compile against eager: every strategy x AC mode x TP degree on a small random model.

Per TP degree, `tp` gloo processes build, per (strategy, AC mode), the same randomly
initialised model twice (megatron trains the fullrank twin), both through the trainer's
own `parallelize_boost` with that AC mode: once eager (the reference), once with
`[compile] enable` (AC, then `torch.compile(block, fullgraph=True)` per block). Each row
reports:

* graph breaks (dynamo's counter; `fullgraph=True` turns a break into an error instead);
* the largest relative error of the loss and of every gradient against the reference
  (per tensor: max |compiled - eager| / max |eager|);
* the collectives of one forward + backward, eager and compiled, counted by the profiler
  as process-group calls (`c10d::allreduce_`, ...), which eager code and compiled graphs
  reach alike; a collective that selective checkpointing serves from its cache during
  recomputation never gets there and is not counted;
* compile seconds (the first compiled step less a later one) and the compiled / eager step
  time ratio (medians over `repeats` interleaved steps, slowest rank).

The default backend, `aot_eager`, traces and partitions exactly as Inductor does but runs
the aten ops, so the matrix is quick on CPU; `--backend inductor` adds code generation
(minutes per cell on CPU) and gives meaningful compile times and step ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import types
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from boost_titan.bench.perfmodel import AC_MODES, STRATEGIES
from boost_titan.config.errors import ConfigError

PG_COLLECTIVES = {"allreduce_": "all_reduce", "allgather_into_tensor_coalesced_": "all_gather",
                  "_allgather_base_": "all_gather", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
                  "_reduce_scatter_base_": "reduce_scatter", "alltoall_base_": "all_to_all"}
"""Process-group ops (`c10d::`, what reaches gloo or NCCL) counted, by the name shown."""
AC_SETTINGS = {"none": ("none", False), "full": ("full", False), "selective": ("selective", False),
               "lowrank": ("none", True)}
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
    backend: str = "aot_eager"
    repeats: int = 3


@dataclass
class CompileRow:
    arch: str
    strategy: str
    ac: str
    tp: int
    backend: str
    graph_breaks: int | None
    max_rel_error: float | None
    eager_collectives: dict[str, int]
    compiled_collectives: dict[str, int]
    compile_s: float | None
    step_ratio: float | None
    error: str | None = None


# ---- one rank ----------------------------------------------------------------------------
def _model(cfg: MatrixConfig, strategy: str):
    from boost_titan.boost_llama import BoostTransformer, flavor_args

    arch = "fullrank" if strategy == "megatron" else cfg.arch
    args = flavor_args("debug", vocab_size=cfg.vocab_size, arch=arch, dim=cfg.dim, n_heads=cfg.n_heads,
                       n_kv_heads=cfg.n_kv_heads, ffn_dim=cfg.ffn_dim, n_layers=cfg.n_layers)
    torch.manual_seed(0)
    model = BoostTransformer(args)
    model.init_weights()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # norm weights and biases far from their initial 1 and 0
        for param in model.parameters():
            noise = torch.rand(param.shape, generator=generator)
            param.copy_(0.5 + noise) if param.dim() == 1 else param.add_((noise - 0.5) * 0.2 * param.abs().mean())
    return model


def _parallelize(model, mesh, strategy: str, ac: str, compiled: bool, backend: str) -> None:
    """The trainer's `parallelize_boost` with this strategy, AC mode and compile setting."""
    from torchtitan.config.job_config import ActivationCheckpoint, Compile

    from boost_titan.boost_llama.parallelize import parallelize_boost
    from boost_titan.config import Boost

    mode, lowrank = AC_SETTINGS[ac]
    job = types.SimpleNamespace(
        boost=Boost(arch=model.args.arch, tp_strategy=strategy, lowrank_ac=lowrank),
        parallelism=types.SimpleNamespace(disable_loss_parallel=False),
        activation_checkpoint=ActivationCheckpoint(mode=mode, selective_ac_option="op"),
        compile=Compile(enable=compiled, backend=backend), job=types.SimpleNamespace(dump_folder=""),
    )
    dims = types.SimpleNamespace(tp_enabled=mesh.size() > 1, tp=mesh.size(), world_size=mesh.size(),
                                 get_mesh=lambda name: mesh,
                                 fsdp_enabled=False, dp_replicate_enabled=False)
    parallelize_boost(model, dims, job)


def _forward_backward(model, tokens, labels) -> torch.Tensor:
    """One forward + backward from zeroed grads (they stay on the model); the loss."""
    from torch.distributed.tensor.parallel import loss_parallel

    model.zero_grad(set_to_none=True)
    with loss_parallel():
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
    return loss


def _step(model, tokens, labels) -> tuple[float, torch.Tensor]:
    """(seconds on the slowest rank, loss) of one forward + backward."""
    from torch.distributed.tensor import DTensor

    dist.barrier()
    start = time.perf_counter()
    loss = _forward_backward(model, tokens, labels)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    return elapsed.item(), loss.detach()


def _grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")] = g.detach().clone()
    return out


def _collectives(model, tokens, labels) -> dict[str, int]:
    """Process-group collectives one forward + backward issues, by name (profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _forward_backward(model, tokens, labels)
    counts: Counter[str] = Counter()
    for event in prof.events():
        op = event.name.removeprefix("c10d::")
        if event.name.startswith("c10d::") and op in PG_COLLECTIVES:
            counts[PG_COLLECTIVES[op]] += 1
    return dict(sorted(counts.items()))


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _cell(cfg: MatrixConfig, mesh, strategy: str, ac: str, tokens, labels) -> CompileRow:
    row = CompileRow(cfg.arch, strategy, ac, mesh.size(), cfg.backend, None, None, {}, {}, None, None)
    eager = _model(cfg, strategy)
    _parallelize(eager, mesh, strategy, ac, compiled=False, backend=cfg.backend)
    compiled = _model(cfg, strategy)
    try:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        _parallelize(compiled, mesh, strategy, ac, compiled=True, backend=cfg.backend)
        first, loss = _step(compiled, tokens, labels)
        row.graph_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    except Exception as e:  # a graph break under fullgraph, or a failed trace: the cell's result
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        return row
    compiled_grads = _grads(compiled)
    _, eager_loss = _step(eager, tokens, labels)
    eager_grads = _grads(eager)
    if compiled_grads.keys() != eager_grads.keys():
        row.error = "compiled and eager models hold other parameters"
        return row
    errors = [_rel_error(loss, eager_loss)]
    errors += [_rel_error(compiled_grads[name], want) for name, want in eager_grads.items()]
    row.max_rel_error = max(errors)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(cfg.repeats):
        times["eager"].append(_step(eager, tokens, labels)[0])
        times["compiled"].append(_step(compiled, tokens, labels)[0])
    row.compile_s = max(first - statistics.median(times["compiled"]), 0.0)
    row.step_ratio = statistics.median(times["compiled"]) / statistics.median(times["eager"])
    row.eager_collectives = _collectives(eager, tokens, labels)
    row.compiled_collectives = _collectives(compiled, tokens, labels)
    return row


def _worker(rank: int, tp: int, port: int, cfg: MatrixConfig, cells: list[tuple[str, str]], out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    try:
        mesh = init_device_mesh("cpu", (tp,))
        generator = torch.Generator().manual_seed(1)
        tokens, labels = torch.randint(0, cfg.vocab_size, (2, cfg.batch, cfg.seq_len), generator=generator)
        rows = [asdict(_cell(cfg, mesh, strategy, ac, tokens, labels)) for strategy, ac in cells]
        if rank == 0:
            torch.save(rows, out)
    finally:
        dist.destroy_process_group()


# ---- the matrix --------------------------------------------------------------------------
def cells_of(strategies: list[str], acs: list[str]) -> list[tuple[str, str]]:
    """(strategy, AC mode) pairs; low-rank AC needs a low-rank model, so not megatron."""
    for name, value, choices in (("strategy", strategies, STRATEGIES), ("AC mode", acs, AC_MODES)):
        unknown = [v for v in value if v not in choices]
        if unknown:
            raise ConfigError(f"unknown {name} {', '.join(unknown)}; choose from {', '.join(choices)}")
    return [(s, ac) for s in strategies for ac in acs if not (s == "megatron" and ac == "lowrank")]


def matrix(cfg: MatrixConfig, tps: list[int], cells: list[tuple[str, str]]) -> list[CompileRow]:
    """Every cell at every TP degree; one spawn of `tp` processes per degree."""
    from boost_titan.bench.cpu import _free_port

    rows = []
    for tp in tps:
        if tp < 1 or cfg.n_kv_heads % tp or cfg.dim % tp:
            raise ConfigError(f"--tp {tp} does not divide the model's {cfg.n_kv_heads} kv heads and dim {cfg.dim}")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.pt")
            mp.start_processes(_worker, args=(tp, _free_port(), cfg, cells, out), nprocs=tp, join=True,
                               start_method="spawn")
            rows += [CompileRow(**r) for r in torch.load(out, weights_only=False)]
    return rows


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
    lines = ["| strategy | AC | TP | graph breaks | max rel. error vs eager | collectives per step, eager / compiled "
             "| compile s | compiled / eager step |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.strategy} | {r.ac} | {r.tp} | {r.error} | | | | |")
            continue
        verdict = collectives_verdict(r.eager_collectives, r.compiled_collectives)
        lines.append(f"| {r.strategy} | {r.ac} | {r.tp} | {r.graph_breaks} | {r.max_rel_error:.1e} | "
                     f"{verdict}: {_counts(r.eager_collectives)} / {_counts(r.compiled_collectives)} | "
                     f"{r.compile_s:.1f} | {r.step_ratio:.2f} |")
    return "\n".join(lines)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", default="cola", choices=("cola", "svd", "lax"),
                        help="low-rank arch of btp/vanilla; megatron trains the fullrank twin")
    parser.add_argument("--strategy", default=",".join(STRATEGIES), help="comma list of " + ", ".join(STRATEGIES))
    parser.add_argument("--ac", default=",".join(AC_MODES), help="comma list of " + ", ".join(AC_MODES))
    parser.add_argument("--tp", default="1,2,4", help="comma list of TP degrees")
    parser.add_argument("--backend", default="aot_eager", choices=("aot_eager", "inductor"))
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each, interleaved")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")


def run(ns: argparse.Namespace) -> int:
    import json

    try:
        tps = [int(t) for t in ns.tp.split(",") if t]
    except ValueError:
        raise ConfigError(f"--tp takes comma-separated integers, got {ns.tp!r}") from None
    if ns.repeats < 1:
        raise ConfigError("--repeats must be >= 1")
    cells = cells_of([s for s in ns.strategy.split(",") if s], [a for a in ns.ac.split(",") if a])
    cfg = MatrixConfig(arch=ns.arch, backend=ns.backend, repeats=ns.repeats)
    rows = matrix(cfg, tps, cells)
    print(format_rows(rows))
    if ns.json:
        Path(ns.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    ok = all(not r.error and r.graph_breaks == 0 and r.max_rel_error <= 1e-5
             and collectives_verdict(r.eager_collectives, r.compiled_collectives) != "DIFFER" for r in rows)
    print(f"\n{'every cell' if ok else 'NOT every cell'} compiles without a graph break, equals eager "
          "within 1e-5 and issues eager's collectives or fewer")
    return 0 if ok else 1
