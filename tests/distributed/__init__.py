"""Tests that launch processes (torchrun, run_train.sh, spawned gloo ranks); all marked slow."""
