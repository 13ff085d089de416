"""What runs inside the training workers around TorchTitan's Trainer: `trainer`
(BoostTrainer), `device` (CPU/gloo bring-up), `run_log` (losses, summary, checkpoint
folders), `restarts` (crash recovery), `saved_activations` (the activation bytes the
trainer logs), `rss` (process memory)."""
