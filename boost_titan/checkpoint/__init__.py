"""Checkpoints on disk and how they are read: the one owner of reading a DCP checkpoint,
below `data` and `runtime` (it imports `config` alone of the product; `safe_load`,
`dcp_layout`, `reads` and `sharded` import nothing of it but each other). Every module and
its job:

- `safe_load`: the allowlist every pickle of a checkpoint goes through (`.metadata`, byte
  items, the dataloader state in one), with its size, depth and hash-flood limits.
- `dcp_layout`: what a `.metadata` says, checked: DCP's types, files inside the folder and
  regular, tensor bytes as declared.
- `reads`: DCP's own loads through the allowlist (`GuardedReader`, `GuardedPlanner`, passed
  to each `dcp.load`; nothing of torch is patched).
- `files`: the `step-N` folders of a run, the one definition of the newest complete step
  (`newest_step`), and the checks a load needs first, as one-line ConfigErrors.
- `agree`: every rank resumes from rank 0's pick, and reads it through the allowlist first.
- `sharded`: `save_sharded` / `load_sharded`, a sharded model (any DTensor plan, e.g.
  `boost_titan.parallelize`'s) as a DCP checkpoint that loads at another TP degree, read
  through `dcp_layout` and `reads`.

The trainer loads through `boost_titan.runtime.resume` (TorchTitan's CheckpointManager is
reached through `runtime.titan_internals`).
"""
