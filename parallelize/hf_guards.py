"""What cannot work on a sharded Hugging Face model fails in one line naming the fix.

`apply_plan` calls `guard_sharded_hf_model` on every model it shards: transformers'
``save_pretrained`` cannot write DTensor shards, and HF's own loss cannot read the
vocab-sharded logits of a loss-parallel plan. A model without ``save_pretrained`` or a
``labels`` argument is left as it is; transformers is not imported.
"""

from __future__ import annotations

import inspect

from torch import nn
from torch.distributed.tensor import DTensor

from .styles import PlanError

LOSS_PARALLEL_MESSAGE = (
    "HF's own loss (labels=...) cannot read vocab-sharded logits: build the plan with "
    "loss_parallel=False, or compute the loss yourself inside "
    "torch.distributed.tensor.parallel.loss_parallel()"
)
SAVE_PRETRAINED_MESSAGE = (
    "save_pretrained cannot write the DTensor shards apply_plan made; call "
    "boost_titan.parallelize.save_hf(model, folder) on every rank (from_pretrained reads a "
    "full-rank folder, load_hf a low-rank one)"
)


def guard_sharded_hf_model(model: nn.Module, head: str | None) -> None:
    """After `apply_plan`: make what cannot work on a sharded transformers model fail in
    one line naming the fix. ``save_pretrained`` points to `save_hf`; with a head that
    returns vocab-sharded DTensor logits (`head`, a loss-parallel plan), a forward given
    ``labels`` (HF's own loss) raises `LOSS_PARALLEL_MESSAGE`. Installed once; a model
    without ``save_pretrained`` or a ``labels`` argument is left as it is."""
    if getattr(model, "_boost_titan_guarded", False):
        return
    if callable(getattr(model, "save_pretrained", None)):

        def save_pretrained(*args, **kwargs):
            raise PlanError(SAVE_PRETRAINED_MESSAGE)

        model.save_pretrained = save_pretrained
    if head is not None and "labels" in inspect.signature(model.forward).parameters:
        _guard_loss(model, model.get_submodule(head))
    model._boost_titan_guarded = True


def _guard_loss(model: nn.Module, head: nn.Module) -> None:
    """Hooks: the model notes whether `labels` were passed, `head` checks its output."""
    state = {"labels": False}

    def note_labels(module, args, kwargs) -> None:
        state["labels"] = kwargs.get("labels") is not None

    def check_logits(module, args, output) -> None:
        if state["labels"] and isinstance(output, DTensor):
            raise PlanError(LOSS_PARALLEL_MESSAGE)

    model.register_forward_pre_hook(note_labels, with_kwargs=True)
    head.register_forward_hook(check_logits)
