"""Benchmarks of boost-titan: `measure` (harnesses that run the real model and plans on
CPU, taking explicit arguments) and the command line (`python -m boost_titan.bench`:
`__main__` dispatches to `commands`, one module per subcommand with its options and its
printing; `options` holds the layout options several share, `report` the one `--json`
writer). Its `model`, `precision`, `validate` and `plot` commands print the analytic model
(`boost_titan.perf`). `perf` never imports `bench`.
"""
