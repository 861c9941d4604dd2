"""What a verb may call an install: the target's own verdict, not the record's.

``status`` reads the manifest and the files; that every needed patch is recorded as applied
does not make the install work. An install whose record says "patched" is called so only
when verify's static checks agree (``broken`` otherwise). The engine proof is not a static
check: a patched install on a release nobody ran is still patched (``verify`` says "NOT
PROVEN").
"""

from __future__ import annotations

from patcher.states import InstallState
from patcher.ways import Way

# The state ``status`` gives a patched install whose static checks fail (docs/design.md,
# "a verb's verdict is what the target would do").
BROKEN = InstallState.BROKEN


def static_failures(failing: list[str], no_proof: str) -> list[str]:
    """The failed parts of verify's ``InstallCheck.failing`` that are static checks: every
    one but ``no_proof`` (the missing engine proof)."""
    return [what for what in failing if what != no_proof]


def broken_reason(failures: list[str]) -> str:
    """``status``'s reason for a ``broken`` install, in one clause: what failed and the
    command that names each break."""
    return (
        f"every needed patch is applied, but verify's static checks fail ({', '.join(failures)}): "
        f"the install would not run as patched; `{Way('verify')}` names each break"
    )
