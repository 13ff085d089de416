"""The auto-planner: every layout of a model on N GPUs, ranked by the performance model.

    python -m boost_titan.plan --auto --flavor 7B --gpus 8 --gpu h100 --global-batch 32

A layout is TP x PP x DP or TP x CP x DP (DP = FSDP2 over the rest,
`data_parallel_shard_degree = -1`; CP only where each rank keeps `MIN_CP_TOKENS`), a
strategy, an AC mode, a micro-batch and the micro-batches per step (gradient accumulation,
or 1F1B's micro-batches under PP), BTP's overlap chunks and the precision (the product's
bf16 with fp32 master weights; on float8 GPUs also torchao's tensorwise float8). Each is
feasible when TorchTitan can build it (TP divides every sharded size and stays in a node,
PP splits the layers with at least as many micro-batches as stages, DP divides the global
batch) and `memory.peak_memory` fits `USABLE` of the GPU. Feasible layouts are ranked by
`timing.step_time` plus the data-parallel traffic FSDP2 does not hide (`dp_exposed`).
Pure Python: a few thousand layouts take a second or two.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from boost_titan.boost_llama.archs import architecture
from boost_titan.boost_llama.shapes import FLAVORS, ModelShape
from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config import AC_MODES, OVERLAP_CHUNKS
from boost_titan.config.errors import ConfigError
from boost_titan.perf import layout, memory, timing
from boost_titan.perf.gpus import GPUS, GpuProfile, gpu_profile
from boost_titan.perf.job_plan import job_plan
from boost_titan.perf.layout import TrainingLayout

GPU_MEMORY_GIB = {"a100": 80.0, "a100-hgx4": 80.0, "h100": 80.0}
"""HBM per GPU of each `gpus.GPUS` profile (A100-80GB-SXM, H100-SXM)."""
USABLE = 0.9
"""Share of the GPU's memory the model's peak may take: the rest is the CUDA context,
NCCL's buffers and the caching allocator's fragmentation, which the model does not count."""
MICRO_BATCHES = (1, 2, 4, 8)
"""Micro-batch sizes (sequences) tried."""
FLOAT8_RECIPE = "tensorwise"
"""The float8 recipe tried on GPUs with float8 tensor cores."""
MIN_CP_TOKENS = 4096
"""Tokens of each sequence a context-parallel rank keeps at least: the model's attention
rate is a constant fraction of peak, measured on long sequences, and its ring on chunks
shorter than this is latency the model does not calibrate; so at the paper's 4096 tokens
the planner considers no CP."""
SHOWN_REJECTED = 5
REFINED = 20
"""The fastest base layouts (overlap chunks 1, no float8) also priced with every
overlap-chunk count and float8: their effect is small, so the winner is among them."""


@dataclass(frozen=True)
class Request:
    """What the user asks: a model, a GPU count and kind, and the batch."""

    flavor: str
    arch: str
    gpus: int
    gpu: str
    gpu_memory_gib: float
    seq_len: int
    global_batch: int
    overlap: bool = False
    """Also try BTP's overlap_chunks 2 and 4 (unmeasured on GPUs; off unless asked for)."""
    loro_exact_every: int = 0
    """Train with LORO, its exact step every K steps (`TrainingLayout.loro_exact_every`);
    0: AdamW."""


@dataclass(frozen=True)
class Candidate:
    """One candidate layout: the training layout, its data-parallel degree and what the model
    says."""

    plan: TrainingLayout
    dp: int
    memory: memory.StageMemory
    step_s: float = 0.0
    reason: str = ""
    """Why it is rejected ("" when feasible)."""

    @property
    def memory_gib(self) -> float:
        return self.memory.total / memory.GIB

    def tokens_per_gpu_s(self, request: Request) -> float:
        return request.global_batch * request.seq_len / self.step_s / request.gpus


@dataclass(frozen=True)
class Result:
    """Feasible layouts, fastest first, and the best rejected ones with their reasons."""

    request: Request
    args: ModelShape
    ranked: list[Candidate]
    rejected: list[Candidate]
    structural: list[str]
    """One line per reason a whole family of layouts is impossible (sizes, splits)."""


def check_request(r: Request) -> None:
    """Raise ConfigError (one line, with the fix) for a request the planner cannot answer."""
    if r.flavor not in FLAVORS:
        raise ConfigError(f"unknown flavor {r.flavor!r}; choose one of {', '.join(FLAVORS)}")
    if r.gpu not in GPUS:
        raise ConfigError(f"unknown --gpu {r.gpu!r}; choose one of {', '.join(GPUS)}")
    for name, value in (("--gpus", r.gpus), ("--seq-len", r.seq_len)):
        if value < 1:
            raise ConfigError(f"{name} {value} must be a positive integer")
    if r.global_batch < 1:
        raise ConfigError(f"--global-batch {r.global_batch} must be a positive number of sequences")
    if not r.gpu_memory_gib > 0:
        raise ConfigError(f"--gpu-memory {r.gpu_memory_gib} must be a positive number of GiB")
    if r.loro_exact_every:
        args = layout.trained_shape(r.flavor, r.arch, strategies(r.arch)[0])
        layout.check(args, TrainingLayout(strategy="btp", loro_exact_every=r.loro_exact_every))


def strategies(arch: str) -> tuple[str, ...]:
    """The strategies that train `arch` itself, its default first (megatron trains the
    fullrank twin only)."""
    family = architecture(arch)
    fits = [name for name, s in STRATEGIES.items() if s.low_rank == family.low_rank]
    return tuple(sorted(fits, key=lambda name: name != family.default_strategy))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def dp_exposed(
    args: ModelShape, plan: TrainingLayout, dp: int, compute_s: float, gpu: GpuProfile
) -> float:
    """Seconds of FSDP2's data-parallel traffic not hidden behind compute: per micro-batch
    a bf16 all-gather of the stage's weights in forward and again in backward (once per
    step under PP, which keeps them) and an fp32 reduce-scatter of the gradients, each a
    ring over the network (over dp x cp ranks: FSDP2 shards over CP too); FSDP2 prefetches,
    so only what outlasts the compute shows."""
    shards = dp * plan.cp  # TorchTitan's FSDP mesh is dp_shard x cp
    if shards == 1:
        return 0.0
    n = memory.stage_params(args, plan, 0)
    gathers = 1 if plan.pp > 1 else plan.microbatches
    ring = (shards - 1) / shards
    traffic = ring * n * (2 * 2 * gathers + 4 * plan.microbatches)
    return max(0.0, traffic / gpu.net_bw - compute_s)


def _structural(args: ModelShape, plan: TrainingLayout, gpu: GpuProfile) -> str:
    """Why TorchTitan cannot build `plan` at all, or ""."""
    if plan.tp > gpu.gpus_per_node:
        return f"tp {plan.tp} exceeds the {gpu.gpus_per_node} GPUs of a node"
    try:
        layout.check(args, replace(plan, pp=1))
    except ConfigError as e:
        return str(e).split(";")[0]
    return memory.split_error(args.n_layers, plan.pp) or ""


def _cp_pp(gpus: int, seq_len: int) -> list[tuple[int, int]]:
    """(cp, pp) degrees for `gpus` GPUs per TP group: every PP degree without CP, every CP
    degree that leaves each rank `MIN_CP_TOKENS` of a sequence, without PP (CP runs
    neither with pipeline parallelism nor under torch.compile: its layouts are eager)."""
    cps = [cp for cp in _divisors(gpus)[1:] if seq_len // cp >= MIN_CP_TOKENS]
    return [(1, pp) for pp in _divisors(gpus)] + [(cp, 1) for cp in cps]


def _plans(request: Request, args: ModelShape, gpu: GpuProfile):
    """(plan, dp, reason) for every base layout (overlap chunks 1, no float8); reason ""
    when TorchTitan can build it. At TP 1 the low-rank strategies are one layout (btp's)."""
    for strategy in strategies(request.arch):
        acs = [a for a in AC_MODES if not (a == "lowrank" and strategy == "megatron")]
        for tp in _divisors(request.gpus):
            if tp == 1 and strategy == "vanilla":
                continue
            for cp, pp in _cp_pp(request.gpus // tp, request.seq_len):
                dp = request.gpus // (tp * cp * pp)
                base = TrainingLayout(  # the written config compiles (float8's casts fuse)
                    strategy=strategy,  # except under CP, which runs eager
                    tp=tp,
                    pp=pp,
                    cp=cp,
                    seq_len=request.seq_len,
                    compiled=cp == 1,
                    float8_casts="fused" if cp == 1 else "eager",
                    loro_exact_every=request.loro_exact_every,
                )
                why = _structural(args, base, gpu)
                if not why and request.global_batch % dp:
                    why = f"global batch {request.global_batch} is not a multiple of dp {dp}"
                if why:
                    yield base, dp, why
                    continue
                per_replica = request.global_batch // dp
                for micro in (m for m in MICRO_BATCHES if per_replica % m == 0):
                    count = per_replica // micro
                    if pp > 1 and count < pp:
                        yield base, dp, f"pp {pp} needs at least {pp} micro-batches per step"
                        continue
                    for ac in acs:
                        yield replace(base, micro_batch=micro, microbatches=count, ac=ac), dp, ""


def _variants(plan: TrainingLayout, gpu: GpuProfile, overlap: bool) -> list[TrainingLayout]:
    """`plan` with every other overlap-chunk count (under TP, when asked for) and float8
    (where the GPU has it); the memory model prices them alike."""
    chunks = OVERLAP_CHUNKS if plan.tp > 1 and overlap else (1,)
    float8s = (None, FLOAT8_RECIPE) if gpu.has_float8 else (None,)
    return [
        replace(plan, overlap_chunks=c, float8=f)
        for c in chunks
        for f in float8s
        if (c, f) != (1, None)
    ]


def _timed(args: ModelShape, plan: TrainingLayout, dp: int, peak, gpu: GpuProfile) -> Candidate:
    compute = timing.step_time(args, plan, gpu, dp)["step"]
    return Candidate(plan, dp, peak, step_s=compute + dp_exposed(args, plan, dp, compute, gpu))


def plan_layouts(request: Request) -> Result:
    """Every base layout of `request` judged and the fastest `REFINED` of them also with
    their overlap-chunk and float8 variants; ConfigError (one line) when none fits."""
    check_request(request)
    gpu = gpu_profile(request.gpu)
    args = layout.trained_shape(request.flavor, request.arch, strategies(request.arch)[0])
    usable = USABLE * request.gpu_memory_gib * memory.GIB
    ranked, oom, structural = [], [], []
    for plan, dp, why in _plans(request, args, gpu):
        if why:
            if why not in structural:
                structural.append(why)
            continue
        peak = memory.peak_memory(args, plan, dp_shard=dp)
        if peak.total > usable:
            over = (peak.total - usable) / memory.GIB
            oom.append(Candidate(plan, dp, peak, reason=f"out of memory by {over:.1f} GiB"))
            continue
        ranked.append(_timed(args, plan, dp, peak, gpu))
    ranked.sort(key=lambda lay: lay.step_s)
    for lay in ranked[:REFINED]:
        variants = _variants(lay.plan, gpu, request.overlap)
        ranked += [_timed(args, v, lay.dp, lay.memory, gpu) for v in variants]
    ranked.sort(key=lambda lay: (lay.step_s, lay.memory.total))
    oom.sort(key=lambda lay: lay.memory.total)
    if not ranked:
        raise ConfigError(_infeasible(request, args, gpu, oom, structural))
    return Result(request, args, ranked, _distinct(oom)[:SHOWN_REJECTED], structural)


# ---- an infeasible request: its fix first --------------------------------------------------
MAX_GPUS = 4096
"""The largest GPU count `--gpus` fixes are searched up to."""


def _fits(request: Request, args: ModelShape, gpu: GpuProfile) -> bool:
    """Whether any layout of `request` can be built and fits the GPU's memory."""
    usable = USABLE * request.gpu_memory_gib * memory.GIB
    return any(
        not why and memory.peak_memory(args, plan, dp_shard=dp).total <= usable
        for plan, dp, why in _plans(request, args, gpu)
    )


def _batch_fix(request: Request, args: ModelShape, gpu: GpuProfile) -> int | None:
    """The smallest global batch above the request's that some layout on its GPUs takes."""
    candidates = set()
    for strategy in strategies(request.arch):
        for tp in _divisors(request.gpus):
            for pp in _divisors(request.gpus // tp):
                base = TrainingLayout(strategy=strategy, tp=tp, pp=pp, seq_len=request.seq_len)
                if _structural(args, base, gpu):
                    continue
                dp = request.gpus // (tp * pp)
                least = max(request.global_batch + 1, dp * pp)
                candidates.add(-(-least // dp) * dp)  # the next multiple of dp
    for batch in sorted(candidates):
        if _fits(replace(request, global_batch=batch), args, gpu):
            return batch
    return None


def _gpus_fix(request: Request, args: ModelShape, gpu: GpuProfile, more: bool) -> int | None:
    """The GPU count nearest the request's (more, or fewer) on which some layout fits."""
    counts = range(request.gpus + 1, MAX_GPUS + 1) if more else range(request.gpus - 1, 0, -1)
    return next((n for n in counts if _fits(replace(request, gpus=n), args, gpu)), None)


def _infeasible(
    request: Request, args: ModelShape, gpu: GpuProfile, oom: list[Candidate], structural: list[str]
) -> str:
    """One line for a request no layout serves, leading with what to change: a larger
    global batch or other GPU count for layouts that cannot be built, more GPUs or more
    memory per GPU for layouts that do not fit."""
    r = request
    if oom:
        best = oom[0]
        need = best.memory.total / USABLE / memory.GIB
        more = _gpus_fix(r, args, gpu, more=True)
        gpus = f"--gpus {more} (the fewest that fit it) or " if more else ""
        return (
            f"{r.flavor} fits no layout on {r.gpus} x {r.gpu_memory_gib:g} GiB; use {gpus}GPUs "
            f"of {need:.1f} GiB or more (--gpu-memory): the smallest layout ({describe(best)}) "
            f"needs {need:.1f} GiB per GPU ({best.memory_gib:.1f} GiB peak + "
            f"{1 - USABLE:.0%} reserve)"
        )
    fixes = []
    batch = _batch_fix(r, args, gpu)
    if batch:
        fixes.append(f"--global-batch {batch} (the smallest that a layout on {r.gpus} GPUs takes)")
    fewer = _gpus_fix(r, args, gpu, more=False)
    if fewer:
        fixes.append(f"--gpus {fewer} (the most that take global batch {r.global_batch})")
    if not fixes:
        return f"no layout of {r.flavor} on {r.gpus} GPUs can be built: " + "; ".join(structural)
    return (
        f"no layout of {r.flavor} on {r.gpus} GPUs takes a global batch of {r.global_batch} "
        f"sequences (data parallelism must divide it, a pipeline needs a micro-batch per "
        f"stage); pass {' or '.join(fixes)}"
    )


def _distinct(layouts: list[Candidate]) -> list[Candidate]:
    """One layout per (strategy, TP, CP, PP, DP), the first of each."""
    kept, seen = [], set()
    for lay in layouts:
        key = (lay.plan.strategy, lay.plan.tp, lay.plan.cp, lay.plan.pp, lay.dp)
        if key not in seen:
            seen.add(key)
            kept.append(lay)
    return kept


def describe(lay: Candidate) -> str:
    """One phrase: strategy, TP (x CP) x PP x DP, AC, micro-batches, chunks, float8."""
    p = lay.plan
    f8 = f", float8 {p.float8}" if p.float8 else ""
    return (
        f"{p.strategy} tp{p.tp}{_cp(p, ' x cp')} x pp{p.pp} x dp{lay.dp}, ac {p.ac}, "
        f"micro-batch {p.micro_batch} x {p.microbatches}, chunks {p.overlap_chunks}{f8}"
    )


def _cp(plan: TrainingLayout, prefix: str) -> str:
    """`prefix` and the CP degree, or "" without CP (layouts without CP read as before)."""
    return f"{prefix}{plan.cp}" if plan.cp > 1 else ""


# ---- output ----------------------------------------------------------------------------
HEADER = (
    "rank",
    "strategy",
    "TP x PP x DP",
    "AC",
    "micro x n",
    "chunks",
    "precision",
    "pred. step s",
    "pred. tok/s/GPU",
    "pred. mem GiB",
    "headroom GiB",
)


def _row(i: int, lay: Candidate, request: Request) -> list[str]:
    p = lay.plan
    usable = USABLE * request.gpu_memory_gib
    precision = "bf16+fp32 master" + (f", f8 {p.float8}" if p.float8 else "")
    return [
        str(i),
        p.strategy,
        f"{p.tp}{_cp(p, ' x cp')} x {p.pp} x {lay.dp}",
        p.ac,
        f"{p.micro_batch} x {p.microbatches}",
        str(p.overlap_chunks),
        precision,
        f"{lay.step_s:.3f}",
        f"{lay.tokens_per_gpu_s(request):,.0f}",
        f"{lay.memory_gib:.1f}",
        f"{usable - lay.memory_gib:.1f}",
    ]


def _render(header: tuple[str, ...], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in [list(header), *rows]
    )


def idle_note(request: Request) -> str | None:
    """A note when the global batch leaves data parallelism fewer replicas than GPUs (DP
    must divide it), so that every layout spreads a replica over several GPUs."""
    r = request
    replicas = max(d for d in _divisors(r.gpus) if r.global_batch % d == 0)
    if replicas == r.gpus:
        return None
    return (
        f"note: global batch {r.global_batch} allows at most {replicas} data-parallel "
        f"replicas on {r.gpus} GPUs, so each layout spreads a replica over {r.gpus // replicas}"
        f"+ GPUs (TP/PP); --global-batch {4 * r.gpus} (4 sequences per GPU) lets data "
        "parallelism use every GPU"
    )


def format_result(result: Result, top: int = 10, markdown: bool = False) -> str:
    """The ranked table (`top` rows), then the best rejected layouts with their reasons."""
    r = result.request
    title = (
        f"{r.flavor} {r.arch} on {r.gpus} x {r.gpu} ({r.gpu_memory_gib:g} GiB, "
        f"{USABLE:.0%} usable), seq {r.seq_len}, global batch {r.global_batch}"
        + (f", LORO exact step every {r.loro_exact_every}" if r.loro_exact_every else "")
        + f": {len(result.ranked)} feasible layouts; times and memory predicted "
        "(boost_titan.perf), not measured"
    )
    note = idle_note(r)
    rows = [_row(i + 1, lay, r) for i, lay in enumerate(result.ranked[:top])]
    lines = [
        title,
        *([note] if note else []),
        _render(HEADER, rows, markdown),
        "",
        "best rejected:",
    ]
    lines += [f"  {describe(lay)}: {lay.reason}" for lay in result.rejected]
    lines += [f"  {why}" for why in result.structural]
    if not result.rejected and not result.structural:
        lines.append("  none")
    return "\n".join(lines)


# ---- the winner as a training config -----------------------------------------------------
STEPS = 10_000
"""training.steps of a planned config."""
CHECKPOINT_MINUTES = 30
"""Predicted minutes of training between two checkpoints of a planned config."""
KEEP_CHECKPOINTS = 3
"""Checkpoints a planned config keeps (`checkpoint.keep_latest_k`): the last ~1.5 hours."""


def checkpoint_interval(step_s: float) -> int:
    """Steps in about `CHECKPOINT_MINUTES` of predicted time, to two significant digits
    (at most `STEPS`)."""
    steps = max(1, int(CHECKPOINT_MINUTES * 60 / step_s))
    unit = 10 ** max(0, len(str(steps)) - 2)
    return min(STEPS, steps // unit * unit)


def toml_text(result: Result, lay: Candidate) -> str:
    """`lay` as a training config `python -m boost_titan.check` accepts (its degrees,
    data parallelism's included, make the planned process count), naming
    the prediction and its assumptions in its header; checkpointing on."""
    r, p = result.request, lay.plan
    per_replica = r.global_batch // lay.dp
    local = per_replica if p.pp > 1 else p.micro_batch
    ac = "none" if p.ac == "lowrank" else p.ac
    model = f'name = "boost_llama"\nflavor = "{r.flavor}"'
    float8 = ""
    if p.float8:
        model += '\nconverters = ["quantize.linear.float8"]'
        float8 = f'\n[quantize.linear.float8]\nrecipe_name = "{p.float8}"\n'
    pipeline = ""
    if p.pp > 1:
        pipeline = (
            f"pipeline_parallel_degree = {p.pp}\n"
            'pipeline_parallel_schedule = "1F1B"\n'
            f"pipeline_parallel_microbatch_size = {p.micro_batch}\n"
        )
    if p.cp > 1:
        pipeline += f"context_parallel_degree = {p.cp}\n"
    eager = "  # context parallelism runs eager" if p.cp > 1 else ""
    longer = r.seq_len > FLAVORS[r.flavor].max_seq_len
    max_seq = f"\nmax_seq_len = {r.seq_len}  # RoPE table length" if longer else ""
    selective = 'selective_ac_option = "2"\n' if ac == "selective" else ""
    chunks = "  # asked for with plan --overlap; unmeasured on GPUs" if p.overlap_chunks > 1 else ""
    loro = f"\nloro_exact_every = {p.loro_exact_every}" if p.loro_exact_every else ""
    interval = checkpoint_interval(lay.step_s)
    minutes = interval * lay.step_s / 60
    return f"""# {r.flavor} {r.arch} on {r.gpus} x {r.gpu}: the pick of `boost_titan.plan --auto`.
# Layout: {describe(lay)}.
# Prediction (boost_titan.perf, {r.gpu} profile; not measured): {lay.step_s:.3f} s per step, \
{lay.tokens_per_gpu_s(r):,.0f} tokens/s per GPU, peak {lay.memory_gib:.1f} GiB per GPU.
# Assumptions: the model's kernel and link rates for the {r.gpu} profile (docs/performance.md);
# FSDP2's traffic hidden behind compute up to the step's length; {1 - USABLE:.0%} of the \
{r.gpu_memory_gib:g} GiB
# left for the CUDA context, NCCL and fragmentation. Time a few steps before a long run.
# Data: name your corpus and tokenizer (docs/gpus.md), e.g.
#   python -m boost_titan.check --nproc {r.gpus} --job.config_file THIS.toml \\
#       --training.dataset_path DATA --model.hf_assets_path TOKENIZER

[job]
dump_folder = "./outputs/{r.flavor}-auto"
description = "boost_llama {r.flavor}: {r.arch}, {p.strategy}, planned"

[model]
{model}

[boost]
arch = "{r.arch}"
tp_strategy = "{p.strategy}"
overlap_chunks = {p.overlap_chunks}{chunks}
lowrank_ac = {str(p.ac == "lowrank").lower()}{max_seq}{loro}

[optimizer]
name = "{"LORO" if p.loro_exact_every else "AdamW"}"
lr = 1e-3
weight_decay = 0.01

[lr_scheduler]
warmup_steps = 1000
decay_type = "cosine"
min_lr_factor = 0.1

[training]
local_batch_size = {local}
global_batch_size = {r.global_batch}
seq_len = {r.seq_len}
steps = {STEPS}
max_norm = 0.5
mixed_precision_param = "bfloat16"

[parallelism]
data_parallel_shard_degree = {lay.dp}  # x TP x PP: {r.gpus} processes
tensor_parallel_degree = {p.tp}
{pipeline}
[checkpoint]
# a save every {interval:,} steps: {minutes:.0f} minutes of predicted time (aim: \
{CHECKPOINT_MINUTES}, at most the run's
# {STEPS:,} steps); the newest {KEEP_CHECKPOINTS} kept, a rerun resumes from the newest
enable = true
interval = {interval}
keep_latest_k = {KEEP_CHECKPOINTS}
last_save_model_only = false

[activation_checkpoint]
mode = "{ac}"
{selective}
[compile]
enable = {str(p.compiled).lower()}{eager}
{float8}"""


# ---- documentation -----------------------------------------------------------------------
PAPER_SIZES = {"1B": 1, "3B": 2, "7B": 4, "13B": 8, "30B": 32}
"""The paper's flavors and GPU counts (train_configs/*.toml)."""
H100_RUNS = ((8, 32), (64, 256))
"""(GPUs, global batch in sequences) of the H100 tables: 4 sequences of 4096 per GPU."""
DOCS_TOP = 3


def paper_rows(gpu: str = "a100") -> list[list[str]]:
    """Per paper size: the shipped config (its TOML, as `bench model --config` reads it: the
    paper's TP and PP degrees, the planner's micro-batch) and the planner's pick, each with
    the predicted step and peak memory per GPU."""
    rows = []
    for flavor, gpus in PAPER_SIZES.items():
        job = job_plan(f"train_configs/{flavor}.toml", gpus)
        dp = gpus // (job.plan.tp * job.plan.pp)
        profile = gpu_profile(gpu)
        compute = timing.step_time(job.args, job.plan, profile)["step"]
        step = compute + dp_exposed(job.args, job.plan, dp, compute, profile)
        peak = job.peak_memory()
        paper = Candidate(job.plan, dp, peak, step_s=step)
        result = plan_layouts(
            Request(flavor, "cola", gpus, gpu, GPU_MEMORY_GIB[gpu], job.plan.seq_len, 4)
        )
        best = result.ranked[0]
        rank = next(
            (
                i + 1
                for i, lay in enumerate(result.ranked)
                if (lay.plan, lay.dp) == (paper.plan, dp)
            ),
            None,
        )
        rows.append(
            [
                f"{flavor} on {gpus}",
                describe(paper),
                f"{paper.step_s:.3f}",
                f"{paper.memory_gib:.1f}",
                describe(best),
                f"{best.step_s:.3f}",
                f"{best.memory_gib:.1f}",
                f"{paper.step_s / best.step_s:.2f}x",
                str(rank) if rank else "not ranked",
            ]
        )
    return rows


def docs_tables() -> str:
    """docs/planner.md's generated block: the paper's sizes on their A100 counts and on 8
    and 64 H100s (`DOCS_TOP` rows each), then paper vs planner."""
    parts = []
    runs = [(f, n, "a100", 4) for f, n in PAPER_SIZES.items()]
    runs += [(f, n, "h100", b) for n, b in H100_RUNS for f in PAPER_SIZES]
    for flavor, gpus, gpu, batch in runs:
        request = Request(flavor, "cola", gpus, gpu, GPU_MEMORY_GIB[gpu], 4096, batch)
        command = (
            f"python -m boost_titan.plan --auto --flavor {flavor} --gpus {gpus} --gpu {gpu} "
            f"--global-batch {batch}"
        )
        try:
            text = format_result(plan_layouts(request), top=DOCS_TOP, markdown=True)
        except ConfigError as e:
            text = f"error: {e}"
        parts.append(f"`{command}`\n\n{text.split(chr(10) + chr(10))[0]}")
    header = (
        "size on GPUs",
        "shipped config",
        "pred. step s",
        "pred. GiB/GPU",
        "planner's pick",
        "pred. step s",
        "pred. GiB/GPU",
        "shipped / pick",
        "shipped config's rank",
    )
    parts.append(
        "Shipped configs (train_configs/*.toml: the paper's TP x PP) vs planner, A100 "
        "(a100 profile), global batch 4:\n\n" + _render(header, paper_rows(), markdown=True)
    )
    return "\n\n".join(parts)
