"""`boost_llama`: the boost LLaMA family and its TorchTitan glue, kept together as
TorchTitan keeps `models/llama3/`.

- `args`: `BoostModelArgs`, the flavors (debug .. 30B) and closed-form sizes;
- `layers`, `model`: the pure `nn.Module` decoder (fullrank / svd / cola / lax), blind to
  parallelism;
- `strategies`: the one registry of TP strategies, the model's `ModelLayout` and its plans;
- `parallelize`: the TrainSpec's parallelize function (TP -> AC -> compile -> FSDP2 / DDP);
- `state_dict_adapter`: the export format and TorchTitan's adapter for it;
- `spec`: the TrainSpec, registered on import, and the job checks.

    python -m boost_titan.boost_llama      # the flavor table
"""

from .args import FLAVORS, PROJECTIONS, BoostModelArgs, flavor_args, param_count
from .model import BoostTransformer

__all__ = [
    "FLAVORS",
    "PROJECTIONS",
    "BoostModelArgs",
    "BoostTransformer",
    "flavor_args",
    "param_count",
]
