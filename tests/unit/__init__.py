"""Tests that run in one process (no torchrun, spawned ranks or workers); see tests/README.md."""
