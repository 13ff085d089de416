"""The `bench` subcommands, one module each: `HELP` (its line in `bench --help`),
`add_args(parser)` (its options) and `run(ns) -> exit code` (its measurement or model,
and its printing). Only `bench.__main__` imports them; the measurement harnesses they run
(`bench.measure`, torch) are imported inside `run` or `add_args`, so `bench --help` and
the analytic subcommands start at once.
"""
