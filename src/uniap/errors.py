"""One error type for bad input: the CLI turns it into one line on stderr and a non-zero exit."""


class UniapError(Exception):
    """A problem with the user's input or environment that deserves one clear line, not a traceback."""
