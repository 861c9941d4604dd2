"""The one error type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input or a refused operation; nothing on the target was changed."""


class Interrupted(UserError):
    """Ctrl-C during a commit, with what became of it (one line); the CLI exits 130."""
