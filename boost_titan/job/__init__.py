"""A job from its command line to its workers, above the runtime: `preflight` (every check
of a job in one process, before any worker starts: `python -m boost_titan.check`,
`run_train.sh`, `bench step`), `construction` (what a worker builds before its first step,
built by `check` through the job's TrainSpec without a process group), `launch` (the
torchrun command line of the product's own launches) and `entry` (the training worker: one
parse of the job, then TorchTitan's main loop with `BoostTrainer`), and `families` (the
one list of model families, `boost_llama` and `hf`: the only module of this room that
imports a family, through its hooks). The runtime below it imports nothing of a family;
this room brings them together."""
