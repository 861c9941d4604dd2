"""Each verb's exit codes, in one place: every ``--help`` ends with its verb's (``epilog``), and
docs/usage.md's table says the same. The codes come from each verb's ``exit_code``
(``patcher.commands``) and, for 2 and 130/143/129, from ``patcher.cli.say_error`` and
``patcher.errors.interrupted_exit``."""

from __future__ import annotations

# What 0, 1 and 3 mean per verb; 2 and the interruptions are the same for every verb.
OWN = {
    "apply": "0 applied (or nothing to do) and verify passes; 1 the install fails verify's checks after apply, or "
    "its clean-up could not finish; 3 every static check passes but this vLLM release has no engine proof",
    "diff": "0 nothing would change; 1 apply would change files (the diff), or a patched file was modified",
    "verify": "0 every check passes; 1 a check fails; 3 every static check passes but this vLLM release has no "
    "engine proof",
    "status": "0 the install is patched; 1 it is not (pristine, partial, stale, modified, broken, reinstalled); 2 "
    "also when it cannot tell (a damaged or lost record) or the install is unsupported",
    "revert": "0 restored (or nothing to revert); 1 its clean-up could not finish",
    "repair": "0 the record matches the files; 1 a file nothing kept restores",
    "selftest": "0 every stage passed; 1 a stage failed (named, with the patch that fixes it where one does)",
    "check-draft": "0 vLLM serves the draft on the hidden states it was trained on; 1 it will not (each reason "
    "shown); 3 nothing wrong found but a check could not be made (the verifier not on this machine)",
    "list": "0 listed",
    "new": "0 the files were written",
}
COMMON = (
    "2 bad input, a refused target or no answer (one line, nothing changed); 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP "
    "(one line saying whether anything changed)"
)


def epilog(verb: str) -> str:
    """The ``Exit codes: ...`` paragraph of ``verb``'s ``--help``. Raises ``KeyError`` for a verb
    not in ``OWN`` (a new verb must say its codes)."""
    return f"Exit codes: {OWN[verb]}; {COMMON}."
