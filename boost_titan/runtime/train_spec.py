"""`recipe_spec`: a model family's TrainSpec, from what the family itself gives (its model,
flavors, parallelize function, pipelining, data loader, state-dict adapter, where its
parts keep LORO's settings) and the parts every family of the recipe shares: the optimizers
(TorchTitan's, or LORO: `runtime.optimizers`), TorchTitan's LR schedulers and cross-entropy
loss, our tokenizer and held-out validator. Change a shared part here, for every family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.protocols.train_spec import TrainSpec

from boost_titan.data import build_tokenizer
from boost_titan.runtime.held_out_loss import BoostValidator
from boost_titan.runtime.optimizers import LoroOf, optimizers_builder


def recipe_spec(
    *,
    model_cls: Any,
    model_args: Any,
    parallelize_fn: Callable[..., Any],
    build_dataloader_fn: Callable[..., Any],
    loro_of: LoroOf,
    pipelining_fn: Callable[..., Any] | None = None,
    state_dict_adapter: Any = None,
) -> TrainSpec:
    """The TrainSpec of a family: its own parts (TrainSpec's fields of the same names;
    `pipelining_fn` None: no pipeline parallelism, `state_dict_adapter` None: no HF
    conversion; `loro_of`: a model part's hidden size and LORO settings) and the recipe's
    shared ones."""
    return TrainSpec(
        model_cls=model_cls,
        model_args=model_args,
        parallelize_fn=parallelize_fn,
        pipelining_fn=pipelining_fn,
        build_optimizers_fn=optimizers_builder(loro_of),  # LORO, else TorchTitan's
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_dataloader_fn,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=BoostValidator,
        state_dict_adapter=state_dict_adapter,
    )
