"""FLOP formulas that `FlopCounterMode` lacks: CPU flash attention, counted like SDPA's."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count


def _cpu_flash_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


CPU_SDPA_FLOPS = {  # keyed by op packet, as FlopCounterMode looks them up
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
}
