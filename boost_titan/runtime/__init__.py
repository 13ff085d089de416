"""What runs inside the training workers around TorchTitan's Trainer: `trainer`
(BoostTrainer), `device` (CPU/gloo bring-up), `run_log` (losses, summary),
`checkpoint_files` (step folders, DCP metadata and files, also read by `check` and
`export`), `dump_lock` (one job per dump folder), `resume` (every rank loads rank 0's
checkpoint), `restarts` (crash recovery), `saved_activations` (the activation bytes the
trainer logs), `rss` (process memory), `stopping` (SIGTERM/SIGUSR1/time budget: stop
with a checkpoint), `nonfinite` (NaN/inf steps never reach the optimizer). The end of the
process groups and of the process is `boost_titan.parallelize.teardown`, shared with every
multi-process command."""
