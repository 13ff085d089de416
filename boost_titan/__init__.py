"""boost-titan: bottleneck-aware tensor parallelism for low-rank LLMs on TorchTitan.

This package must stay importable without torchtitan: `boost_titan.job.entry` injects the
`[boost]` config section into torchtitan's argument parser before torchtitan is imported.
"""
