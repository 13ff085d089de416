"""Seconds per kernel on a `GpuProfile`: GEMMs, memory-bound kernels, flash attention,
collectives and pipeline sends. Every constant comes from `gpus` (with its source).

GEMM efficiency, derived rather than assumed: a cuBLAS GEMM runs one thread block per
output tile (`gpus.GEMM_TILES`), in waves of one block per SM. A block's main loop walks
the reduction dim k at the main-loop rate (fraction `mainloop_efficiency` of peak); on
GPUs whose kernels do not overlap it (Ampere), the block then writes its tile, while every
other block of the wave does the same, so the epilogue moves tile bytes at the HBM rate.
Writing a tile costs as much time as `epilogue_k` steps of k, with

    epilogue_k = b * peak * e_main / (2 * hbm_bw * hbm_efficiency)

(b bytes per element; about 160 on A100 in bf16): a GEMM runs at e_main * k / (k + 160)
of peak, so the thin reductions of low-rank layers (k = r/tp in vanilla TP's up GEMMs)
cost more per FLOP than square ones. The last wave of blocks may leave SMs idle (wave
quantisation) and partial tiles compute padding (tile quantisation); cuBLAS also splits k
(split-K: s blocks per tile, each reducing k/s and writing a partial tile, reduced in fp32
afterwards). The model takes the fastest tile and split, as cuBLAS's heuristics aim to.
`mainloop_efficiency` is whatever makes this curve reproduce the measured maximum
achievable matmul rate at the shape it was measured.

Float8 GEMMs (dtype "fp8", `gpus.FLOAT8`) read 1-byte operands and write the training
dtype; they run the same schedule at the float8 peak with the same main-loop fraction as
bf16 (an assumption: our sources hold no float8 maximum-achievable measurement taken as
[MAMF]'s are), so the modelled float8 rate at [MAMF]'s shape is twice bf16's.
"""

from __future__ import annotations

import math

from boost_titan.perf.gpus import FLOAT8, GEMM_TILES, NCCL, GpuProfile
from boost_titan.perf.work import Gemm, Stream

MAX_SPLIT_K = 16
MIN_SPLIT_K_CHUNK = 256
"""Split-K keeps at least this much of k per block (a few main-loop iterations)."""
PARTIAL_BYTES = 4
"""Split-K partial tiles are reduced in fp32."""
FLOAT8_BYTES = 1
"""Bytes per element of a float8 GEMM operand (E4M3 / E5M2)."""
FLASH_BACKWARD_FLOPS = 2.5
"""Flash attention's backward executes 2.5x its forward FLOPs (five matmuls to the
forward's two: it recomputes QK^T)."""
FLASH_BACKWARD_LAUNCHES = 3
"""Preprocess (rowsum of dO * O), main kernel, dQ conversion."""


def hbm_time(nbytes: float, gpu: GpuProfile) -> float:
    return nbytes / (gpu.hbm_bw * gpu.hbm_efficiency)


def epilogue_k(gpu: GpuProfile, dtype: str, dtype_bytes: int, mainloop: float) -> float:
    """Main-loop steps of k that writing one output tile costs (0 when overlapped)."""
    if gpu.epilogue_overlapped:
        return 0.0
    return dtype_bytes * gpu.peak_flops[dtype] * mainloop / (2 * gpu.hbm_bw * gpu.hbm_efficiency)


def schedule_time(g: Gemm, dtype: str, dtype_bytes: int, gpu: GpuProfile, mainloop: float) -> float:
    """Fastest tile and split-K schedule: waves of blocks, each running its share of k
    plus its epilogue at the main-loop rate of one SM; a split adds an fp32 reduction of
    the partial tiles."""
    k0 = epilogue_k(gpu, dtype, dtype_bytes, mainloop)
    per_sm = gpu.peak_flops[dtype] * mainloop / gpu.sm_count
    best = math.inf
    for tm, tn in GEMM_TILES:
        tiles = math.ceil(g.m / tm) * math.ceil(g.n / tn)
        for split in range(1, MAX_SPLIT_K + 1):
            if split > 1 and g.k / split < MIN_SPLIT_K_CHUNK:
                break
            waves = math.ceil(tiles * split / gpu.sm_count)
            blocks = waves * 2 * tm * tn * (g.k / split + k0) / per_sm
            partials = (split * PARTIAL_BYTES + dtype_bytes) * g.m * g.n if split > 1 else 0
            best = min(best, blocks + hbm_time(partials, gpu))
    return best


def mainloop_efficiency(gpu: GpuProfile) -> float:
    """The main loop's fraction of bf16 peak that makes the modelled GEMM at the
    measured maximum-achievable-matmul shape run at the measured rate (a fixed point: the
    epilogue term itself depends on the main-loop rate)."""
    if gpu.name not in _MAINLOOP:
        _MAINLOOP[gpu.name] = _solve_mainloop(gpu)
    return _MAINLOOP[gpu.name]


_MAINLOOP: dict[str, float] = {}


def _solve_mainloop(gpu: GpuProfile) -> float:
    m, n, k = gpu.mamf_shape
    target = gpu.mamf_flops / gpu.peak_flops["bf16"]
    probe, e = Gemm("mamf", m, n, k), target
    for _ in range(50):
        achieved = probe.flops / (schedule_time(probe, "bf16", 2, gpu, e) * gpu.peak_flops["bf16"])
        e *= target / achieved
    return e


def gemm_time(g: Gemm, dtype: str, dtype_bytes: int, gpu: GpuProfile) -> float:
    """Roofline: the slower of the fastest schedule's compute and the operands' HBM
    traffic, plus one launch. `dtype` is the GEMM's (the training dtype, or fp8 with
    float8 inputs), `dtype_bytes` the output's."""
    compute = schedule_time(g, dtype, dtype_bytes, gpu, mainloop_efficiency(gpu))
    inputs = FLOAT8_BYTES if dtype == FLOAT8 else dtype_bytes
    return max(compute, hbm_time(g.bytes(dtype_bytes, inputs), gpu)) + gpu.launch_s


def gemm_utilisation(g: Gemm, dtype: str, dtype_bytes: int, gpu: GpuProfile) -> float:
    """Achieved fraction of `dtype` peak (hardware FLOPs utilisation) of one GEMM."""
    return g.flops / (gemm_time(g, dtype, dtype_bytes, gpu) * gpu.peak_flops[dtype])


def stream_time(streams: list[Stream], gpu: GpuProfile, tokens: int = 1) -> float:
    """Memory-bound kernels: bytes (per token x `tokens`) at the sustained HBM rate, plus
    one launch each."""
    nbytes = sum(s.bytes for s in streams) * tokens
    return hbm_time(nbytes, gpu) + sum(s.launches for s in streams) * gpu.launch_s


def attention_time(flops: int, dtype: str, gpu: GpuProfile, backward: bool = False) -> float:
    """Causal flash attention: it skips masked tiles, executing half of the counted
    `flops` (QK^T and AV, mask not halved) forward and 2.5x that backward."""
    executed = flops / 2 * (FLASH_BACKWARD_FLOPS if backward else 1)
    efficiency = gpu.attention_bwd_efficiency if backward else gpu.attention_fwd_efficiency
    launches = FLASH_BACKWARD_LAUNCHES if backward else 1
    return executed / (gpu.peak_flops[dtype] * efficiency) + launches * gpu.launch_s


def collective_time(kind: str, nbytes: int, ranks: int, gpu: GpuProfile) -> float:
    """NCCL's ring model inside a node: base + steps * hop + bus bytes / bus bandwidth,
    on the faster of the Simple and LL protocols. `nbytes` is each rank's input: an
    all-reduce moves 2(p-1)/p of it over the bus, a reduce-scatter (p-1)/p, an all-gather
    (p-1)/p of its output (p inputs), a broadcast (the root's input, pipelined down the
    ring) all of it once."""
    if ranks == 1:
        return 0.0
    steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
    full = nbytes * ranks if kind == "all_gather" else nbytes
    bus_bytes = (ranks - 1) / ranks * full * (2 if kind == "all_reduce" else 1)
    if kind == "broadcast":
        bus_bytes = nbytes
    simple = NCCL.base_s + steps * NCCL.hop_s + bus_bytes / gpu.bus_bw(ranks)
    ll = (
        NCCL.ll_base_s
        + steps * NCCL.ll_hop_s
        + bus_bytes / (gpu.bus_bw(ranks) * NCCL.ll_bandwidth_fraction)
    )
    return min(simple, ll)


def gather_time(nbytes: int, ranks: int, gpu: GpuProfile, in_node: bool) -> float:
    """All-gather in which each of `ranks` ranks hands `nbytes`: NCCL's ring inside a
    node (`collective_time`), else over the network, (ranks - 1) hops each receiving
    `nbytes` at the NIC rate."""
    if in_node or ranks == 1:
        return collective_time("all_gather", nbytes, ranks, gpu)
    return NCCL.base_s + (ranks - 1) * (NCCL.net_hop_s + nbytes / gpu.net_bw)


def pass_time(nbytes: int, gpu: GpuProfile, in_node: bool) -> float:
    """One ring pass: every rank sends `nbytes` to the next, over NVLink at the bus
    bandwidth of a pair inside a node, else over the network (`send_time`)."""
    if in_node:
        return NCCL.base_s + NCCL.hop_s + nbytes / gpu.bus_bw(2)
    return send_time(nbytes, gpu)


def send_time(nbytes: int, gpu: GpuProfile) -> float:
    """One pipeline send to the next node: NCCL's base and network hop latency, then the
    bytes at the NIC rate."""
    return NCCL.base_s + NCCL.net_hop_s + nbytes / gpu.net_bw
