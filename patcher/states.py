"""The words the tool gives a file and an install, as values.

``FileState``: what one speculators file is, from its bytes, the record and pip's ``RECORD``
(``engine.snapshot.Snapshot.file_state``). ``InstallState``: what ``status`` calls the whole
install (``commands.status.install_state``). Each member is its word: it compares equal to,
prints as and serialises to JSON as that string, so the output is the same as with bare strings.
"""

import enum


class _Word(str, enum.Enum):
    def __str__(self) -> str:  # Python 3.12 formats a str-mixin enum by str(): keep the word
        return self.value


class FileState(_Word):
    """One speculators file (``Snapshot.file_state`` says how each is told apart)."""

    PRISTINE = "pristine"  # not recorded as patched, and not known to differ from pip's bytes
    PATCHED = "patched"  # the bytes this tool's commit wrote
    REINSTALLED = "reinstalled"  # recorded as patched, and now the bytes the installer put there
    MODIFIED = "modified"  # changed after patching
    EDITED = "edited"  # no valid record, and not the bytes pip installed


class InstallState(_Word):
    """The install as ``status`` reads it (exit 0 only for ``PATCHED``, 2 for ``UNSUPPORTED``)."""

    PATCHED = "patched"
    PRISTINE = "pristine"
    PARTIAL = "partial"
    STALE = "stale"
    MODIFIED = "modified"
    BROKEN = "broken"
    REINSTALLED = "reinstalled"
    UNSUPPORTED = "unsupported"
