"""The run's numeric precision, decided once from `[training]` and the same on every layout.

TorchTitan 0.2.2 casts for bf16 compute only where FSDP runs (dp_shard or cp > 1); it keeps
TP-only, PP-only and TP x PP layouts in fp32 and wraps one device and DDP in
`torch.autocast`, which BTP's hand-written backward functions do not fit. Here every layout
computes as FSDP2's `MixedPrecisionPolicy` does (`runtime.data_parallel`): bf16
parameters in compute, fp32 master weights and optimizer state, gradients accumulated and
reduced in fp32. Where no weight is sharded and no PP or dp_replicate runs, the compute
copies do it with autograd alone (`runtime.compute_copies`, the same bits); PP stages and
dp_replicate run FSDP2 on a 1-rank mesh (no collective: a cast-copy instead of the
all-gather, a copy instead of the reduce-scatter). No autocast wraps a forward
(`no_autocast` replaces TorchTitan's `maybe_enable_amp`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

DTYPE_SHORT_NAMES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}
"""Short names of TorchTitan's dtype spellings (`TORCH_DTYPE_MAP`'s keys, torch's dtype
names): the one map from a dtype's name to the short name the logs and the commands use."""


@dataclass(frozen=True)
class Precision:
    """`training.dtype` (weights, gradients, optimizer state), `mixed_precision_param`
    (what the GEMMs see) and `mixed_precision_reduce` (gradient accumulation and reduction),
    each a TorchTitan dtype spelling."""

    weights: str
    compute: str
    reduce: str

    @classmethod
    def of(cls, training) -> Precision:
        return cls(training.dtype, training.mixed_precision_param, training.mixed_precision_reduce)

    @property
    def casts_for_compute(self) -> bool:
        """fp32 weights computed in a narrower dtype: the compute copies or FSDP2's policy
        cast them (`runtime.data_parallel`)."""
        return self.weights == "float32" and self.compute != "float32"

    def describe(self, fsdp: bool) -> str:
        """One phrase for the logs and `check`; `fsdp`: data is sharded (dp_shard or cp > 1),
        so FSDP2 casts even bf16 weights to `mixed_precision_param`."""
        short = DTYPE_SHORT_NAMES
        if self.weights == "float32":
            if not self.casts_for_compute:
                return "fp32"
            if self.reduce == "float32":
                return f"{short[self.compute]} compute, fp32 master weights and gradient reductions"
            return (
                f"{short[self.compute]} compute, fp32 master weights, "
                f"{short[self.reduce]} gradient reductions"
            )
        upcast = fsdp and self.compute != self.weights
        compute = f", {short[self.compute]} compute" if upcast else ""
        return (
            f"{short[self.weights]} weights, gradients and optimizer state "
            f"(training.dtype, no fp32 master copy){compute}"
        )


def no_autocast(*_args, **_kwargs) -> contextlib.AbstractContextManager[None]:
    """Stands in for TorchTitan's `maybe_enable_amp`: no autocast and no log line (the
    trainer logs `Precision.describe`); the compute copies or FSDP2's policy do every cast."""
    return contextlib.nullcontext()


__all__ = ["DTYPE_SHORT_NAMES", "Precision", "no_autocast"]
