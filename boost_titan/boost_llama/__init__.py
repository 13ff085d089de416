"""`boost_llama`: the boost LLaMA family and its TorchTitan glue, kept together as
TorchTitan keeps `models/llama3/`.

- `archs`: the architecture registry (fullrank / svd / cola / lax): what a projection is,
  its sizes, layout hooks and pricing flags (no torch until a projection is built);
- `shapes`: `ModelShape`, the flavors (debug .. 30B) and closed-form sizes (no torch);
- `args`: `BoostModelArgs`, a shape with TorchTitan's model-args protocol;
- `layers`, `model`: the pure `nn.Module` decoder, blind to parallelism, its projections
  built by the registry (pairs are the library's `LowRankLinear`);
- `strategies`: the one registry of TP strategies, the model's `ModelLayout` and its plans;
- `parallelize`: the TrainSpec's parallelize function (TP -> CP -> float8 -> AC -> compile
  -> data parallelism: `runtime.data_parallel`, `context_parallel` and `job_float8`);
- `export_format`: the export format (`config.json` + `model.safetensors`) and what a
  checkpoint's shapes tell; `state_dict_adapter`: TorchTitan's adapter for it;
- `spec`: the TrainSpec (importing it registers nothing; `register_spec()` does) and the
  job checks;
- `family`: its hooks for the checks before launch (`runtime.family.ModelFamily`), which
  `boost_titan.job.families` lists.

    python -m boost_titan.boost_llama      # the flavor table

The names below are imported on first use, so `boost_titan.boost_llama.shapes` and
`.strategies` load without torch or torchtitan.
"""

import importlib

_EXPORTS = {
    "FLAVORS": "shapes",
    "PROJECTIONS": "shapes",
    "param_count": "shapes",
    "BoostModelArgs": "args",
    "flavor_args": "args",
    "BoostTransformer": "model",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
