"""User-facing errors: one sentence naming the problem and the fix; the CLI prints them without a traceback."""


class UserError(Exception):
    """Bad input from the user (paths, options, data). The CLI exits with status 2 and prints only the message."""
