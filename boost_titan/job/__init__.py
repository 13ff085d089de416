"""A job from its command line to its workers, above the runtime: `preflight` (every check
of a job in one process, before any worker starts: `python -m boost_titan.check`,
`run_train.sh`, `bench step`), `launch` (the torchrun command line of the product's own
launches) and `entry` (the training worker: one parse of the job, then TorchTitan's main
loop with `BoostTrainer`). The runtime below it imports nothing of `boost_llama`; this room
brings the two together."""
