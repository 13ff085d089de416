"""Running a training job inside its workers, around TorchTitan's Trainer; below `job`
(which launches and enters the workers) and blind to our model (`boost_llama` imports this
room, never the other way). Every module and its job:

- `trainer`: `BoostTrainer`, TorchTitan's Trainer with our step, logging and fixes.
- `microbatches`: the run's micro-batch protocol (what happens around each micro-batch).
- `titan_internals`: every use of TorchTitan's private API, behind named functions.
- `device`: CPU/gloo bring-up when there is no accelerator.
- `family`: `ModelFamily`, the hooks a model family gives the checks before launch.
- `data_parallel`: FSDP2 / HSDP, compute copies or DDP, the last step of a parallelize
  function (the one table of which layout gets which).
- `context_parallel`: the job's CP checks and ring attention on a layout's attentions.
- `job_float8`: TorchTitan's float8 switch for a TrainSpec that applies float8 itself.
- `compute_copies`: bf16 compute copies of fp32 master weights where nothing is sharded.
- `accumulation`: gradient accumulation that casts each weight once per optimizer step.
- `cuda_graphs`: a micro-batch captured once as a CUDA graph and replayed.
- `grad_norm`: the exact global gradient norm on every layout, and clipping by it.
- `optimizers`: a TrainSpec's optimizers: TorchTitan's, or LORO around each part's pairs.
- `nonfinite`: NaN/inf steps never reach the optimizer.
- `stopping`: SIGTERM/SIGUSR1/time budget: stop with a checkpoint.
- `step_clock`: the time left and the time spent waiting for data, per step.
- `run_log`: losses, held-out results, the summary.
- `held_out_loss`: the held-out evaluation shared by training's validator and `eval`.
- `loss_owner`: which ranks of a layout count the loss (the step's and the held-out one).
- `saved_activations`: the activation bytes a forward keeps for backward (logged per step).
- `rss`: process memory.
- `resume`: every rank loads the checkpoint rank 0 picks, through the checkpoint allowlist
  (`boost_titan.checkpoint` reads it; TorchTitan's CheckpointManager through `titan_internals`).
- `saves`: which folder a failed asynchronous save was writing.
- `dump_lock`: one job per dump folder.
- `restarts`: crash recovery under torchrun restarts.

The end of the process groups and of the process is `boost_titan.processes.teardown`,
shared with every multi-process command."""
