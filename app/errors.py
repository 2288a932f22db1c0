"""The one exception type users see: a single line that says what is wrong and what to do."""


class SpecchatError(Exception):
    """An error caused by input or environment, reported as one line without a traceback."""


class ContextFull(SpecchatError):
    """The conversation no longer fits in the model's context window."""
