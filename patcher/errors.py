"""The errors every layer may raise: ``UserError`` (the one the CLI turns into a one-line
message and exit code 2), ``Interrupted``, and a codemod's ``PatchRefused``."""


class UserError(Exception):
    """Bad input or a refused operation; nothing on the target was changed."""


class Unsupported(UserError):
    """A target no patch here is written for (its speculators or vLLM); nothing was changed."""


class Interrupted(UserError):
    """Ctrl-C during a commit, with what became of it (one line); the CLI exits 130."""


class PatchRefused(Exception):
    """A codemod met code it does not recognise and refuses to guess.

    The message names the file, the line and the shape the codemod expected.
    """
