"""The boost LLaMA family: one decoder, four projection families (fullrank/svd/cola/lax)."""

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
