"""The one exception the user sees: a one-line problem and its fix, exit status 2."""

USAGE_EXIT_STATUS = 2


class UserError(Exception):
    """Bad input from the user (flags, paths, databases, services).

    The message is one line naming the problem and the fix. The command-line
    entry points print it and exit with USAGE_EXIT_STATUS, without a traceback.
    """


class RecordError(UserError):
    """A database record that cannot be parsed or decoded."""


class Diverged(Exception):
    """The run's loss or weights became non-finite; the message is one line."""
