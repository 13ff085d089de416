"""Benchmarks of boost-titan: `model` (the analytic step-time model, predictions only),
`measure` (harnesses that run the real model and plans on CPU), and the command line
(`python -m boost_titan.bench`, `__main__`). `measure` may import `model`, never the reverse.
"""
