"""Optimizers: neither parallelism nor our model, so a room of their own; imports torch only.

- `loro`: `LORO`, AdamW with LORO's approximate and exact steps on low-rank pairs.
- `loro_exact`: LORO's exact step on one pair of plain tensors (QRs, one small SVD).
- `loro_sharded`: the exact step on DTensor factors: gather, one owner per pair, broadcast.
"""

from .loro import LORO

__all__ = ["LORO"]
