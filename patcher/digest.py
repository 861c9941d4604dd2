"""The one digest of speculators-patch's own code, which names every cached answer it computes.

It covers every ``.py`` file of the installed ``patcher`` package and of its codemods
(``speculators_patch_codemods``), found on disk from the packages themselves rather than
from a list kept by hand, and libcst's ``_version.py``. So no edit of the tool, wherever it
falls (a codemod, the vLLM source reader the probes use, the agent, the checks), can let an
answer made by other code be reused: the patch index, plans, checked verdicts, vLLM
evidence, ``verify``'s call findings and the model-runner check are all keyed by it, and
so is the Ansible collection's use of the same caches.
"""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

CODEMODS = "speculators_patch_codemods"


def files() -> list[tuple[str, Path]]:
    """``(name, path)`` of every file the digest reads, in the order it reads them. Raises
    ``ImportError``/``ValueError`` when a package cannot be found."""
    found = []
    for package in ("patcher", CODEMODS):
        spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            raise ImportError(f"{package} not found")
        for location in locations:
            root = Path(location)
            found += sorted((f"{package}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*.py"))
    libcst = importlib.util.find_spec("libcst")
    if libcst is None or libcst.origin is None:
        raise ImportError("libcst not found")
    found.append(("libcst/_version.py", Path(libcst.origin).parent / "_version.py"))
    return found


@lru_cache(maxsize=1)
def tool() -> str | None:
    """sha256 of ``files()``, names and bytes; None when one cannot be found or read (then
    nothing is cached)."""
    h = hashlib.sha256()
    try:
        for name, path in files():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    except (OSError, ImportError, ValueError):
        return None
    return h.hexdigest()
