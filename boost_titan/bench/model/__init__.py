"""The analytic model of a training step: predictions only, every constant cited.

`gpus` (hardware constants, each with its source) -> `costs` (seconds per kernel) ->
`work` (GEMMs, collectives, memory-bound kernels as plain records), `streams` (the
memory-bound kernels of a block), `float8` (which GEMMs run in float8) -> `perfmodel`
(one configuration's step) -> `records` (the JSON record and its tables) -> `validation`
(against the BOOST authors' published measurements), `plots`; `precisions` (the paper's
configurations per precision) and `job` (a training TOML's plan). Imports no measurement
harness, and torch only when a plan has float8 on (`float8` asks the runtime's selection).
"""
