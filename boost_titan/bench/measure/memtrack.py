"""Peak memory of one training step as torch's `MemTracker` counts it, on the real model.

One CPU process plays rank 0 of a TP group (a fake process group of world size tp,
`fake_group`, as in `bench trace`) and, with `fake=True`, FakeTensorMode holds no real
memory, so a 13B stage at TP4 and seq 4096 costs seconds. The model is built as the trainer
builds it: fp32 weights, the real TP plan (`apply_plan`), the AC mode, then its mixed
precision (`runtime.data_parallel`): without PP the compute copies
(`runtime.compute_copies`, held for the step), under PP TorchTitan's `apply_fsdp` with bf16
parameters and fp32 reductions on a 1-rank "fsdp" mesh dim, never resharding, with the
accumulation switches a pipeline stage sets before every backward; each through its
micro-batch protocol (`runtime.microbatches`); and a fused AdamW. A pipeline stage
is the model with its stage's blocks (TorchTitan's split, `memory.stage_layers`) and without
the parts other stages hold; it runs 1F1B's order for its micro-batches (a stage s of pp
keeps pp - s of them in flight).

The tracked step is the second one (AdamW's state exists; fused AdamW updates in place, so
its step allocates nothing more): forward, loss (sum cross-entropy, loss-parallel under
TP) and backward of every micro-batch. `PeakTracker` is torch's `MemTracker` less its
per-module peaks (it walks every module on every op, 10x the run time); the global peak
is MemTracker's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor.parallel import loss_parallel

from boost_titan.boost_llama import BoostModelArgs, BoostTransformer
from boost_titan.config import AC_MODES
from boost_titan.config.errors import ConfigError
from boost_titan.perf import layout, memory
from boost_titan.perf.layout import TrainingLayout
from boost_titan.runtime.accumulation import Accumulation, fsdp_modules
from boost_titan.runtime.compute_copies import apply_compute_copies
from boost_titan.runtime.microbatches import FsdpSwitches, HeldCopies, MicrobatchProtocol

_TOTAL = "Total"


class PeakTracker(MemTracker):
    """torch's MemTracker keeping the global peak only (same storage accounting)."""

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL]:
                self._peak_mem[dev] = snap[_TOTAL]
                self._peak_mem_snap[dev] = dict(snap)

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True):
        # the compute copies are non-leaf tensors, which take no post-accumulate-grad hook;
        # their gradients are still allocations the peak counts
        leaf = all(p.is_leaf for p in module.parameters())
        with warnings.catch_warnings():  # MemTracker reads every parameter's .grad
            warnings.filterwarnings("ignore", "The .grad attribute of a Tensor that is not a leaf")
            return super()._track_module_params_and_buffers(module, install_grad_hooks and leaf)

    def peak(self) -> tuple[int, dict[str, int]]:
        """(peak bytes, its split by MemTracker's categories) on the one device."""
        dev, snap = next(iter(self._peak_mem_snap.items()))
        return self._peak_mem[dev], {str(k.value): v for k, v in snap.items() if k != _TOTAL}


@dataclass(frozen=True)
class Tracked:
    """One tracked configuration: peak bytes and MemTracker's split of it."""

    peak_bytes: int
    split: dict[str, int]
    seconds: float


def _apply_ac(model: nn.Module, ac: str, tp: int) -> None:
    """The trainer's AC for the model's `ac` (selective: every 2nd block, `job.AC`)."""
    from torchtitan.config.job_config import ActivationCheckpoint

    from boost_titan.boost_llama.parallelize import apply_ac_mode, apply_checkpointing

    if ac == "selective":
        every_2nd = ActivationCheckpoint(mode="selective", selective_ac_option="2")
        apply_checkpointing(model, every_2nd, lowrank=False, tp_degree=tp)
    else:
        apply_ac_mode(model, ac, tp_degree=tp)


def _real_meshes(fake: bool) -> contextlib.AbstractContextManager:
    """FSDP2 joins the fsdp and tp meshes with index tensors FakeTensorMode cannot run;
    the parameters stay fake (their ops run under their own mode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily() if fake else contextlib.nullcontext()


def _stage_model(args: BoostModelArgs, plan: TrainingLayout, stage: int) -> BoostTransformer:
    """The blocks and ends that pipeline stage `stage` holds (all of them with pp 1)."""
    layers = memory.stage_layers(args.n_layers, plan.pp)[stage]
    model = BoostTransformer(dataclasses.replace(args, n_layers=layers))
    if stage > 0:
        model.tok_embeddings = None
    if stage < plan.pp - 1:
        model.norm = model.output = None
    return model


def _schedule(pp: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B's order on `stage`: pp - stage - 1 warm-up forwards, then one forward and one
    backward alternating, then the remaining backwards."""
    warmup = min(pp - stage - 1, microbatches)
    order = [("f", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("f", warmup + i), ("b", i)]
    return order + [("b", i) for i in range(microbatches - warmup, microbatches)]


def track(args: BoostModelArgs, plan: TrainingLayout, stage: int = 0, fake: bool = True) -> Tracked:
    """MemTracker's peak of one training step of pipeline stage `stage` on TP rank 0."""
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp

    from boost_titan.bench.measure.fake_group import (
        default_dtype,
        fake_tp_mesh,
        fused_rms_norm_saves,
        shard,
    )

    layout.check(args, plan)
    if plan.dtype != "bf16" or not plan.master_weights or plan.float8:
        raise ConfigError("the tracker runs the product's bf16 with fp32 master weights only")
    start = time.perf_counter()
    last = stage == plan.pp - 1
    width = args.dim // plan.tp if plan.strategy == "btp" else args.dim
    tensors = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with fake_tp_mesh(plan.tp, fsdp_dim=True) as mesh, tensors, fused_rms_norm_saves():
        with default_dtype(torch.float32):
            model = _stage_model(args, plan, stage)
            if plan.tp > 1:
                shard(
                    model,
                    mesh["tp"],
                    plan.strategy,
                    rmsnorm=plan.rmsnorm,
                    group_linears=plan.group_linears,
                )
            _apply_ac(model, plan.ac, plan.tp)
            if plan.pp == 1:
                copies = apply_compute_copies(model, torch.bfloat16, model.layers.values())
                protocol: MicrobatchProtocol = HeldCopies(copies)
            else:
                with _real_meshes(fake):
                    apply_fsdp(
                        model,
                        mesh["fsdp"],
                        param_dtype=torch.bfloat16,
                        reduce_dtype=torch.float32,
                        pp_enabled=True,
                        cpu_offload=False,
                        reshard_after_forward_policy="never",  # nothing sharded: kept
                    )
                keep = Accumulation.for_layout(shards_weights=False, reshard_policy="never")
                protocol = FsdpSwitches(fsdp_modules([model]), keep)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        shape = (plan.micro_batch, plan.seq_len)
        tokens = torch.randint(0, args.vocab_size, shape)
        inputs = tokens if stage == 0 else torch.randn(*shape, width, dtype=torch.bfloat16)

        # the copies begin before a forward; the switches must hold at each backward, and
        # 1F1B runs forwards ahead of the backwards of earlier micro-batches
        called_before = "f" if plan.pp == 1 else "b"

        def step(before_forward=lambda: None) -> None:
            outputs = {}
            protocol.start_step()
            for kind, i in _schedule(plan.pp, stage, plan.microbatches):
                if kind == called_before:
                    protocol.before_microbatch(i, plan.microbatches)
                if kind == "f":
                    before_forward()
                    out = model(inputs)
                    if last:
                        with loss_parallel():
                            out = F.cross_entropy(
                                out.flatten(0, 1).float(), tokens.flatten(), reduction="sum"
                            )
                    outputs[i] = out
                else:
                    out = outputs.pop(i)
                    with loss_parallel():
                        out.backward(None if last else torch.randn_like(out))
            protocol.end_step()

        step()
        optimizer.step()
        optimizer.zero_grad()
        tracker = PeakTracker()
        tracker.track_external(model, optimizer)
        with tracker:  # per-module stats allow one forward per module: cleared per micro-batch
            step(tracker.reset_mod_stats)
        peak, split = tracker.peak()
    return Tracked(peak, split, time.perf_counter() - start)


# ---- model vs tracker ----------------------------------------------------------------------
TOLERANCE = 0.10
"""Largest |model - tracker| / tracker the check accepts."""
CHECK_CASES = (
    ("1B", 1, 1, 0, True, 4096),
    ("3B", 2, 1, 0, True, 4096),
    ("7B", 4, 1, 0, True, 4096),
    ("13B", 4, 2, 0, True, 4096),
    ("13B", 4, 2, 1, True, 4096),
    ("debug", 1, 1, 0, False, 512),
    ("debug", 2, 1, 0, False, 512),
)
"""(flavor, tp, pp, stage, fake, seq): the paper's layouts of 1B-13B at seq 4096 on fake
tensors (13B: both ends of its TP4 x PP2 pipeline, 4 micro-batches), and the debug flavor
on real CPU tensors."""
QUICK_CASES = (("debug", 1, 1, 0, True, 256),)
"""A seconds-long subset (the unit test's)."""


@dataclass(frozen=True)
class CheckRow:
    """One configuration and AC mode: the model's peak and the tracker's."""

    flavor: str
    tp: int
    pp: int
    stage: int
    ac: str
    fake: bool
    predicted: int
    tracked: int
    seconds: float
    seq_len: int

    @property
    def error(self) -> float:
        return (self.predicted - self.tracked) / self.tracked


def check_plan(
    flavor: str, tp: int, pp: int, seq_len: int
) -> tuple[BoostModelArgs, TrainingLayout]:
    """The model and plan a check case runs: btp on CoLA, micro-batch 1, 4 micro-batches
    under PP (the paper's 13B), else 1."""
    from boost_titan.boost_llama import flavor_args

    args = flavor_args(flavor, arch="cola")
    args.vocab_size = args.vocab_size or 4096
    plan = TrainingLayout("btp", tp=tp, pp=pp, seq_len=seq_len, microbatches=4 if pp > 1 else 1)
    return args, plan


def check_rows(cases=CHECK_CASES, modes=AC_MODES) -> list[CheckRow]:
    """The model's and the tracker's peak for every case x AC mode."""
    rows = []
    for flavor, tp, pp, stage, fake, seq in cases:
        args, base = check_plan(flavor, tp, pp, seq)
        for ac in modes:
            plan = dataclasses.replace(base, ac=ac)
            tracked = track(args, plan, stage, fake=fake)
            predicted = memory.stage_memory(args, plan, stage).total
            rows.append(
                CheckRow(
                    flavor,
                    tp,
                    pp,
                    stage,
                    ac,
                    fake,
                    predicted,
                    tracked.peak_bytes,
                    tracked.seconds,
                    seq,
                )
            )
    return rows


def format_check(rows: list[CheckRow], timing: bool = True) -> str:
    """A markdown table of predicted vs tracked peak and the largest error."""
    gib = memory.GIB
    head = "| flavor | TP x PP (stage) | seq | AC | tensors | model GiB | MemTracker GiB | error |"
    lines = [head + (" s |" if timing else ""), "|" + "---|" * (8 + timing)]
    for r in rows:
        stage = f" ({'first' if r.stage == 0 else 'last'})" if r.pp > 1 else ""
        cells = [
            r.flavor,
            f"{r.tp} x {r.pp}{stage}",
            str(r.seq_len),
            r.ac,
            "fake" if r.fake else "real CPU",
            f"{r.predicted / gib:.2f}",
            f"{r.tracked / gib:.2f}",
            f"{r.error:+.1%}",
        ]
        lines.append("| " + " | ".join(cells + ([f"{r.seconds:.0f}"] if timing else [])) + " |")
    worst = max(rows, key=lambda r: abs(r.error))
    lines.append(
        f"\nlargest |model - MemTracker| / MemTracker: {abs(worst.error):.1%} "
        f"({worst.flavor} TP{worst.tp} PP{worst.pp} stage {worst.stage}, ac {worst.ac}; "
        f"limit {TOLERANCE:.0%})"
    )
    return "\n".join(lines)


def format_split(args: BoostModelArgs, plan: TrainingLayout) -> str:
    """The model's peak per pipeline stage, by part (GiB)."""
    stages = [memory.stage_memory(args, plan, s) for s in range(plan.pp)]
    head = f"{'stage':>5} " + " ".join(f"{p:>12}" for p in memory.PARTS) + f" {'total':>8}"
    lines = [head]
    for m in stages:
        cells = " ".join(f"{m.parts[p] / memory.GIB:>12.2f}" for p in memory.PARTS)
        lines.append(f"{m.stage:>5} {cells} {m.total / memory.GIB:>8.2f}")
    return "\n".join(lines)


def check_table() -> str:
    """The docs table (`scripts/readme_tables.py`'s memory-check), without run times."""
    return format_check(check_rows(), timing=False)
