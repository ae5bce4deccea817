"""Errors that reach the user as one line and a non-zero exit code."""


class TracekitError(Exception):
    """A problem with the user's input or environment, shown as one line.

    ``exit_code`` is what the CLI exits with (2 for bad input, as the analyze issue asks).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class MissingDataError(TracekitError):
    """The trace lacks a table (or rows) that an analysis needs.

    The message names the table and the nsys option that records it.
    """
