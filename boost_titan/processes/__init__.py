"""Processes of a process group, shared by every room that starts or ends them (the
trainer, the commands, the examples, the benchmarks); imports nothing of the product.

- `teardown`: the orderly end of a process in a process group.
- `local_ranks`: `run_on_ranks`, a function on N local gloo ranks.
"""
