"""User-facing errors: one sentence naming the problem and the fix; the CLI prints them without a traceback."""


class UserError(Exception):
    """Bad input from the user (paths, options, data). The CLI exits with status 2 and prints only the message.

    The message is folded onto one line (runs of whitespace, newlines included, become one space): it often quotes a
    library's multi-line error, and the promise is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
