"""Analytic performance model and benchmark command line of boost-titan."""
