"""GPU and interconnect profiles used by the analytic step-time model.

Hardware rates are vendor datasheet numbers; the efficiency factors are rough public
measurements, chosen once from first principles and never fitted to the BOOST paper.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.config.errors import ConfigError


@dataclass(frozen=True)
class GpuProfile:
    """Peak rates of one GPU and its links, plus the fraction of peak real kernels reach."""

    name: str
    peak_flops: dict[str, float]
    """Dense tensor-core FLOP/s by training dtype (fp32 = plain FP32, PyTorch's default)."""
    hbm_bw: float
    """HBM bandwidth, bytes/s."""
    nvlink_bw: float
    """NVLink bandwidth per GPU and direction, bytes/s (tensor parallelism, inside a node)."""
    ib_bw: float
    """InfiniBand bandwidth per GPU and direction, bytes/s (pipeline parallelism, across nodes)."""
    gemm_efficiency: float
    """Fraction of peak a large, well-shaped cuBLAS GEMM sustains."""
    attention_efficiency: float
    """Fraction of peak FlashAttention-2 sustains, forward and backward together."""
    link_efficiency: float = 0.8
    """Fraction of link rate NCCL reaches on large messages (nccl-tests bus bandwidth on
    DGX systems is typically 75-85 % of the per-direction NVLink rate)."""
    nvlink_alpha_s: float = 1.5e-6
    """Latency per ring step on NVLink: 2(p-1) steps give ~9 us per all-reduce at p=4 and
    ~21 us at p=8, the usual small-message NCCL all-reduce time inside a node."""
    ib_alpha_s: float = 5e-6
    """Latency of one inter-node send/recv (NIC, switch and NCCL proxy)."""


GPUS: dict[str, GpuProfile] = {
    # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 312 TFLOP/s BF16 dense, 19.5 TFLOP/s
    # FP32, 2,039 GB/s HBM2e, NVLink 600 GB/s (bidirectional aggregate: 300 GB/s each way).
    # HDR InfiniBand (NVIDIA ConnectX-6): 200 Gb/s per GPU = 25 GB/s each way.
    # GEMM: large bf16 cuBLAS GEMMs reach ~250 TFLOP/s (0.8). Attention: FlashAttention-2
    # (Dao 2023) reports 50-73 % of peak on A100 forward, less backward (0.55).
    "a100": GpuProfile(
        name="A100-80GB-SXM",
        peak_flops={"bf16": 312e12, "fp32": 19.5e12},
        hbm_bw=2.039e12,
        nvlink_bw=300e9,
        ib_bw=25e9,
        gemm_efficiency=0.8,
        attention_efficiency=0.55,
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOP/s BF16 dense, 67 TFLOP/s FP32,
    # 3.35 TB/s HBM3, NVLink 900 GB/s (450 GB/s each way). NDR InfiniBand (ConnectX-7):
    # 400 Gb/s per GPU = 50 GB/s each way. GEMM: large bf16 cuBLAS GEMMs reach ~700 TFLOP/s
    # (0.7, power-limited clocks). Attention: FlashAttention-3 (Shah et al. 2024) measures
    # FlashAttention-2, PyTorch's flash SDPA kernel, at ~35 % of H100 peak.
    "h100": GpuProfile(
        name="H100-SXM",
        peak_flops={"bf16": 989e12, "fp32": 67e12},
        hbm_bw=3.35e12,
        nvlink_bw=450e9,
        ib_bw=50e9,
        gemm_efficiency=0.7,
        attention_efficiency=0.35,
    ),
}


def gpu_profile(name: str) -> GpuProfile:
    """The profile called `name` (a key of GPUS)."""
    if name not in GPUS:
        raise ConfigError(f"unknown GPU profile {name!r}; choose one of {', '.join(GPUS)}")
    return GPUS[name]
