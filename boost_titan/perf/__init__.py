"""The analytic model of training: predictions only, every constant cited.

`gpus` (hardware constants, each with its source) -> `costs` (seconds per kernel) ->
`work` (GEMMs, collectives, memory-bound kernels as plain records), `streams` (the
memory-bound kernels of a block) -> `layout` (`TrainingLayout`: how a model is trained, the
shape a strategy trains, `check`) -> `block` (one block's GEMMs, collectives, widths,
FLOPs and parameters on one rank) -> `float8_costs` (which GEMMs run in float8, their
casts), `activations` (what a block keeps for backward), `host` (kernel launches and the
host's launch time) -> `timing` (seconds of a block, a stage, the step) and `memory` (peak
per GPU) -> `predict` (a layout's full record) -> `records` (the JSON record and its
tables) -> `paper` (against the BOOST authors' published measurements), `measured` (our
H100 rows), `plots`; `precision_table` (the paper's configurations per precision), `job_plan` (a
training TOML's layout), `fits` and `layout_search` (`plan --auto`: every layout on N GPUs,
ranked).
Imports no CLI module and no measurement harness (`bench`), and torch only when a layout
has float8 on (`float8_costs` asks the runtime's selection).
"""
