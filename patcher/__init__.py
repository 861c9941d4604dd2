"""speculators-patch: make an installed speculators (0.3.0, 0.4.x) work with the installed vLLM.

The public API for patch authors (``--patch-file`` files and installed packs)::

    from patcher import Patch, PatchCodemod, VllmFact, AddKeyword, RemoveKeyword, Replace

``Patch``, ``PatchCodemod`` and ``VllmFact`` are in ``patcher.fixes.patch`` (``PatchRefused`` in
``patcher.errors``);
the declarative codemods ``AddKeyword``, ``RemoveKeyword`` and ``Replace`` in
``patcher.fixes.codemods``; ``run_codemod(patch, source_bytes) -> (verdict, new_bytes, detail)``
(for a patch's own tests) in ``patcher.engine``. They are imported on first use, so
``import patcher`` stays cheap for the command line.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "Patch": "patcher.fixes.patch",
    "PatchCodemod": "patcher.fixes.patch",
    "PatchRefused": "patcher.errors",
    "VllmFact": "patcher.fixes.patch",
    "AddKeyword": "patcher.fixes.codemods",
    "RemoveKeyword": "patcher.fixes.codemods",
    "Replace": "patcher.fixes.codemods",
    "run_codemod": "patcher.engine",
    "load_patch_file": "patcher.fixes.userpatches.loader",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """The public names above, imported lazily (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'patcher' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_PUBLIC[name])
    value = getattr(module, "load_file" if name == "load_patch_file" else name)
    globals()[name] = value
    return value
