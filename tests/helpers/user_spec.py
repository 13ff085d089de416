"""TrainSpecs a user registers in their own module, named by `--experimental.custom_import
tests.helpers.user_spec` (with `--boost.allow_custom_import`): importing this module
registers them, as the training worker and `check` do before looking the model up.

* `user_decoder`: TorchTitan's llama3 parts under the user's own name and model class;
* `user_no_init`: the same with a model class that has no `init_weights`, which the trainer
  calls after `parallelize_fn` (`check` refuses it in one line).
"""

from __future__ import annotations

import dataclasses

from torchtitan.models.llama3 import Transformer, get_train_spec
from torchtitan.protocols.train_spec import register_train_spec


class UserDecoder(Transformer):
    """The user's model: TorchTitan's llama3 under another class name."""


class NoInitDecoder(Transformer):
    """A model the trainer cannot initialise (no `init_weights`)."""

    init_weights = None


register_train_spec("user_decoder", dataclasses.replace(get_train_spec(), model_cls=UserDecoder))
register_train_spec("user_no_init", dataclasses.replace(get_train_spec(), model_cls=NoInitDecoder))
