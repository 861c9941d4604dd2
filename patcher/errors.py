"""The errors every layer may raise: ``UserError`` (the one the CLI turns into a one-line
message and exit code 2), ``Interrupted``, and a codemod's ``PatchRefused``."""


class UserError(Exception):
    """Bad input or a refused operation; nothing on the target was changed."""


class Unsupported(UserError):
    """A target no patch here is written for (its speculators or vLLM); nothing was changed."""


class Interrupted(UserError):
    """Ctrl-C (or SIGTERM, SIGHUP) during a commit, with what became of it (one line); the CLI
    exits ``interrupted_exit()``."""


# What stopped this run when it was stopped: Ctrl-C (SIGINT, exit 130) unless the CLI's handler
# for SIGTERM or SIGHUP recorded that signal (exit 128 + its number, as a shell reports it).
_STOPPED_BY = {"name": "Ctrl-C", "exit": 130}


def stop_on_signal(signum: int, frame) -> None:
    """A signal handler for SIGTERM and SIGHUP: they end the run as Ctrl-C does (a commit in
    flight is finished first, one line says what changed), named as themselves.
    Raises KeyboardInterrupt."""
    import signal

    _STOPPED_BY.update(name=signal.Signals(signum).name, exit=128 + signum)
    raise KeyboardInterrupt


def interruption() -> str:
    """How the user stopped this run, for the message: ``Ctrl-C``, ``SIGTERM`` or ``SIGHUP``."""
    return _STOPPED_BY["name"]


def interrupted_exit() -> int:
    """The exit code of a stopped run: 130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP)."""
    return _STOPPED_BY["exit"]


class PatchRefused(Exception):
    """A codemod met code it does not recognise and refuses to guess.

    The message names the file, the line and the shape the codemod expected. ``where`` and
    ``line`` (when the codemod knew them) let a caller name the line again in another text
    (``at``): the user's file, when earlier codemods have rewritten the text this one read.
    """

    def __init__(self, message: str, where: str | None = None, line: int | None = None, rest: str = ""):
        super().__init__(message)
        self.where, self.line, self.rest = where, line, rest

    def at(self, line: int) -> str:
        """The message with ``line`` as the line it names (unchanged when it named none)."""
        return f"{self.where}:{line}: {self.rest}" if self.where and self.line else str(self)
