"""Project tools run as `python scripts/NAME.py`; a package so that tests can import them."""
