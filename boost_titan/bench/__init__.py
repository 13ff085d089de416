"""Benchmarks of boost-titan: `measure` (harnesses that run the real model and plans on
CPU) and the command line (`python -m boost_titan.bench`, `__main__`), whose `model`,
`precision`, `validate` and `plot` commands print the analytic model (`boost_titan.perf`).
`perf` never imports `bench`.
"""
