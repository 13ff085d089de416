"""User-facing errors: raised for bad input, printed as one line without a traceback."""


class ConfigError(ValueError):
    """A user error in the configuration, data or environment.

    The message must name the problem and the fix in one line.
    """
