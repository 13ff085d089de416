"""Runnable examples: `own_model` applies BTP to a decoder written in plain PyTorch."""
