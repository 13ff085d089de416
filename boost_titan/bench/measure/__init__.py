"""Measurement harnesses: run the real model and plans on CPU and compare with the model.

`trace` (one block under the real TP plan on a fake process group: collectives, FLOPs,
saved activations, checked against `perf`), `cpu` (wall-clock training steps per
strategy on gloo ranks), `compiled` (torch.compile against eager), `flops` (the FLOP
formulas FlopCounterMode lacks); LORO's exact step is timed by
`scripts/bench_loro_exact.py`. The gloo ranks come from `boost_titan.processes.local_ranks`,
which ends them in order.
"""
