"""Hardware constants of the analytic step-time model, each with its source.

Every number is a vendor specification, a published microbenchmark, or a constant of
NCCL's own cost model; none is fitted to the BOOST paper's measurements. `costs` turns
them into kernel times.

Sources (cited below by their tag):
- [A100]  NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB) and architecture whitepaper.
- [H100]  NVIDIA H100 Tensor Core GPU datasheet (SXM5) and architecture whitepaper. Its
          table gives FP8 Tensor Core 3,958 and BF16 1,979 TFLOPS "with sparsity"; dense
          rates are half: 1,979 FP8, 989 BF16.
- [MAMF]  S. Bekman, "Machine Learning Engineering", compute/accelerator, "Maximum
          Achievable Matmul FLOPS comparison table" (brute-force search over matmul shapes).
- [COPY]  Device-to-device copy measured at 1,355 GB/s on an A100-40GB (1,555 GB/s spec):
          PTsolvers/gpu-workshop-JuliaCon23, issue #7 (the workshop's reference bandwidth).
- [HGX]   NVIDIA HGX A100 and DGX A100 / DGX H100 system descriptions: an A100 has 12
          NVLink3 links, an H100 18 NVLink4 links; DGX systems join 8 GPUs through
          NVSwitches (every link to the switch fabric); the 4-GPU HGX A100 board has no
          switch and joins each pair of GPUs by 4 links.
- [BOOST] BOOST paper, Sec. 6: up to 8 nodes / 32 A100-80GB, i.e. 4 GPUs per node.
- [NCCL]  NCCL source, src/graph/topo.h (SM80_NVLINK_BW 20.0, SM90_NVLINK_BW 20.6 GB/s per
          link; NET_BW 12.0 GB/s per 100 Gb/s NIC) and src/graph/tuning.cc (ring base
          latency 8.4 us Simple / 6.6 us LL; per-hop latency over NVLink 3.4 us Simple /
          0.6 us LL, over the network 6.6 us Simple; LL runs at 1/4 of the bus bandwidth
          for all-reduce; bus bandwidth capped at 235 GB/s on Ampere, 370 GB/s on Hopper).
- [GEMM]  NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background":
          cuBLAS tiles of 256x128 / 128x256 / 128x128 outputs, one thread block per tile,
          tiles run in waves of one per SM (wave quantisation).
- [FA2]   T. Dao, "FlashAttention-2" (2023), Sec. 4.1: on A100 the forward pass reaches
          50-73 % of peak, the backward pass less (causal, head dim 64/128, seq 512-16k).
- [FA3]   J. Shah et al., "FlashAttention-3" (2024): FlashAttention-2 (PyTorch's flash SDPA
          kernel) reaches about 35 % of H100 peak.
- [GRAPH] NVIDIA developer blog, "Getting Started with CUDA Graphs" (2019): launching a
          kernel costs a few microseconds, which short kernels cannot hide.
- [CUTL]  CUTLASS 3.x documentation, Hopper warp-specialized persistent ("ping-pong")
          kernels: the epilogue of one tile overlaps the main loop of the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.config.errors import ConfigError

FLOAT8 = "fp8"
"""`GpuProfile.peak_flops` key of the float8 tensor-core rate."""

GEMM_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128))
"""Output tile shapes cuBLAS chooses among for large bf16 GEMMs [GEMM]."""


@dataclass(frozen=True)
class Nccl:
    """NCCL's ring cost model inside a node and for one inter-node send [NCCL]: a
    collective of n ring steps takes base + n * hop + bus bytes / bus bandwidth, on the
    faster of the Simple and LL protocols."""

    base_s: float = 8.4e-6
    hop_s: float = 3.4e-6
    ll_base_s: float = 6.6e-6
    ll_hop_s: float = 0.6e-6
    ll_bandwidth_fraction: float = 0.25
    net_hop_s: float = 6.6e-6


NCCL = Nccl()


@dataclass(frozen=True)
class GpuProfile:
    """Rates of one GPU and its links, and the fraction of them real kernels reach."""

    name: str
    peak_flops: dict[str, float]
    """Dense tensor-core FLOP/s by GEMM dtype (fp32 = plain FP32, no TF32; fp8 = FP8
    E4M3/E5M2 inputs, present only where the GPU has float8 tensor cores)."""
    mamf_flops: float
    """Maximum achievable bf16 matmul FLOP/s, measured [MAMF]."""
    mamf_shape: tuple[int, int, int]
    """The (m, n, k) at which `mamf_flops` was measured [MAMF]."""
    sm_count: int
    hbm_bw: float
    """HBM bandwidth, bytes/s (datasheet)."""
    hbm_efficiency: float
    """Fraction of `hbm_bw` a streaming kernel sustains [COPY]."""
    epilogue_overlapped: bool
    """GEMM kernels overlap a tile's epilogue (writing C) with the next tile's main loop
    [CUTL]; on Ampere each block writes its tile after its main loop [GEMM]."""
    attention_fwd_efficiency: float
    attention_bwd_efficiency: float
    """Fraction of peak the flash-attention forward / backward kernels reach."""
    gpus_per_node: int
    nvlink_links: int
    """NVLink links per GPU [HGX]."""
    nvlink_link_bw: float
    """Bytes/s NCCL models per link and direction [NCCL]."""
    nvswitch: bool
    """Links go to a switch fabric (any set of GPUs of the node uses all of them); else
    every pair of GPUs of the node is joined by nvlink_links / (gpus_per_node - 1)."""
    nccl_bus_cap: float
    """NCCL's cap on the modelled bus bandwidth for this GPU generation [NCCL]."""
    net_bw: float
    """Inter-node bandwidth per GPU, bytes/s, as NCCL models the NIC [NCCL]."""
    launch_s: float = 4e-6
    """Fixed cost of one kernel launch [GRAPH]."""
    host_launch_s: float = 4.2e-5
    """Host seconds per kernel the training step launches (Python, dispatch, autograd,
    FSDP2's hooks, the launch itself), fitted to one H100 row measured with the product
    (`measured.HOST_FIT`, `measured.fit_host_launch`: 41.9 us); the other profiles assume a
    host as fast as that machine's."""

    @property
    def has_float8(self) -> bool:
        return FLOAT8 in self.peak_flops

    def bus_bw(self, ranks: int) -> float:
        """NCCL bus bandwidth of a ring over `ranks` GPUs of one node: every link through
        a switch; without one, the links to the other ranks (rings in several orders)."""
        links = self.nvlink_links
        if not self.nvswitch:
            links = min(links, (ranks - 1) * (links // (self.gpus_per_node - 1)))
        return min(links * self.nvlink_link_bw, self.nccl_bus_cap)


_A100 = dict(
    peak_flops={"bf16": 312e12, "fp32": 19.5e12},
    mamf_flops=271.2e12,
    mamf_shape=(1024, 10240, 5120),
    sm_count=108,
    hbm_bw=2.039e12,
    hbm_efficiency=1355 / 1555,
    epilogue_overlapped=False,
    attention_fwd_efficiency=0.65,
    attention_bwd_efficiency=0.55,
    nvlink_links=12,
    nvlink_link_bw=20.0e9,
    nccl_bus_cap=235e9,
    net_bw=2 * 12.0e9,
)
"""[A100] 312 TFLOP/s BF16 dense, 19.5 TFLOP/s FP32, no FP8 tensor cores (float8 GEMMs
need SM89+), 108 SMs, 2,039 GB/s HBM2e, 12 NVLink3
links (NCCL: 20.0 GB/s each, bus bandwidth capped at 235 GB/s). Inter-node: one HDR
200 Gb/s NIC per GPU = 24 GB/s at NCCL's 12.0 GB/s per 100 Gb/s. [MAMF] 271.2 TFLOP/s at
1024x10240x5120. [COPY] 1,355 / 1,555 = 0.87. [FA2] forward 0.65, backward 0.55 (causal,
head dim 128, seq 4k lies inside the quoted 50-73 % forward band)."""

GPUS: dict[str, GpuProfile] = {
    # DGX A100: 8 GPUs per node behind NVSwitches [HGX].
    "a100": GpuProfile(
        name="A100-80GB-SXM, 8 per node (NVSwitch)", gpus_per_node=8, nvswitch=True, **_A100
    ),
    # The paper's nodes [BOOST]: 4 GPUs per node, the 4-GPU HGX board, each pair joined by
    # 4 links: TP2 gets 4 links (80 GB/s), TP4 all 12 (capped at 235 GB/s).
    "a100-hgx4": GpuProfile(
        name="A100-80GB-SXM, 4 per node (HGX, no switch)", gpus_per_node=4, nvswitch=False, **_A100
    ),
}
GPUS["h100"] = GpuProfile(
    # [H100] DGX H100, 8 per node behind NVSwitches: 989 TFLOP/s BF16 dense, 1,979 FP8
    # dense, 67 TFLOP/s FP32, 132 SMs, 3.35 TB/s HBM3, 18 NVLink4 links (NCCL: 20.6 GB/s
    # each, bus bandwidth capped at 370 GB/s). NDR 400 Gb/s NIC per GPU = 48 GB/s. [MAMF]
    # 794.5 TFLOP/s at 2048x2048x13312. HBM fraction as [COPY] (no H100 copy measurement among our
    # sources). [CUTL] epilogue overlapped. [FA3] 0.35.
    name="H100-SXM, 8 per node (NVSwitch)",
    peak_flops={"bf16": 989e12, "fp32": 67e12, FLOAT8: 1979e12},
    mamf_flops=794.5e12,
    mamf_shape=(2048, 2048, 13312),
    sm_count=132,
    hbm_bw=3.35e12,
    hbm_efficiency=1355 / 1555,
    epilogue_overlapped=True,
    attention_fwd_efficiency=0.35,
    attention_bwd_efficiency=0.35,
    gpus_per_node=8,
    nvlink_links=18,
    nvlink_link_bw=20.6e9,
    nvswitch=True,
    nccl_bus_cap=370e9,
    net_bw=4 * 12.0e9,
)


def gpu_profile(name: str) -> GpuProfile:
    """The profile called `name` (a key of GPUS)."""
    if name not in GPUS:
        raise ConfigError(f"unknown GPU profile {name!r}; choose one of {', '.join(GPUS)}")
    return GPUS[name]
