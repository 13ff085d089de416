"""The test suite (layout, markers and how to run it: tests/README.md)."""
