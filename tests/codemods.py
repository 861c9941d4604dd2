"""One way to test a codemod: string in, string out, in milliseconds (pyupgrade's style).

Each patch's test module keeps its cases as module-level lists of ``pytest.param``:

- ``REWRITES``: ``(patch id, before, after)`` -- ``assert_codemod``;
- ``NOOPS``: ``(patch id, source)`` -- ``assert_noop``;
- ``REFUSALS``: ``(patch id, source, fragment of the reason)`` -- ``assert_refuses``.

Sources are small snippets in the shape of speculators' code, not whole files; they may be
written indented inside a triple-quoted string (they are dedented here). Every shipped patch
needs at least one rewrite and one refusal (tests/patches/test_pairs.py reads these lists from
every ``tests/patches/test_*.py``). The real files of each release are the audit's
(test_codemod_audit.py) and the registry's (test_registry.py)."""

from __future__ import annotations

import textwrap

import pytest

from patcher.engine import run_codemod
from patcher.fixes.patch import Patch
from patcher.fixes.registry import shipped_patches


def patch_of(patch: Patch | str) -> Patch:
    """The registered patch ``patch`` names (``"SP004"``), or ``patch`` itself."""
    if isinstance(patch, Patch):
        return patch
    return next(p for p in shipped_patches() if p.id == patch)


def codemod(patch: Patch | str, source: str) -> tuple[str, str, str]:
    """``(verdict, new source, detail)`` of ``patch``'s codemod on ``source`` as given (no
    dedent: real files go through unchanged), as ``apply`` runs it
    (``patcher.engine.run_codemod``)."""
    verdict, new, detail = run_codemod(patch_of(patch), source.encode())
    return verdict, new.decode(), detail


def assert_codemod(patch: Patch | str, before: str, after: str) -> None:
    """``before`` is rewritten into exactly ``after``, which compiles, and on which the codemod
    is then satisfied, byte for byte (applying twice equals applying once)."""
    patch = patch_of(patch)
    before, after = textwrap.dedent(before), textwrap.dedent(after)
    verdict, new, detail = codemod(patch, before)
    assert (verdict, new) == ("changed", after), detail
    compile(after, patch.file, "exec")
    verdict, again, detail = codemod(patch, after)
    assert (verdict, again) == ("satisfied", after), f"applying twice must equal applying once: {detail}"
    assert detail.startswith("already satisfied"), detail


def assert_noop(patch: Patch | str, source: str) -> None:
    """The codemod is satisfied on ``source`` and leaves it byte for byte."""
    source = textwrap.dedent(source)
    verdict, new, detail = codemod(patch, source)
    assert (verdict, new) == ("satisfied", source), detail
    assert detail.startswith("already satisfied"), detail


def assert_refuses(patch: Patch | str, source: str, reason: str) -> str:
    """The codemod refuses ``source``, changes nothing, and says so as ``apply`` reports it:
    ``FILE[:LINE]: unrecognised code, expected ...`` with ``reason`` in it. Returns the detail."""
    patch = patch_of(patch)
    source = textwrap.dedent(source)
    verdict, new, detail = codemod(patch, source)
    assert (verdict, new) == ("refused", source), detail
    assert detail.startswith(patch.file) and ": unrecognised code, expected " in detail, detail
    assert reason in detail, detail
    return detail


# The three tests every codemod test module runs over its lists, for the module to bind under
# its own names (pytest collects a test function by the name it has in the module):
#     test_pad_token_id = rewrite_test(REWRITES)


def _cases_test(cases: list, check):
    """A fast test of each ``pytest.param`` of ``cases``: ``check(*its values)``, under its id."""

    @pytest.mark.fast
    @pytest.mark.parametrize("case", [pytest.param(c.values, id=c.id, marks=c.marks) for c in cases])
    def test(case):
        check(*case)

    return test


def rewrite_test(rewrites: list):
    """The test of each ``(patch id, before, after)`` of ``rewrites`` (``assert_codemod``)."""
    return _cases_test(rewrites, assert_codemod)


def noop_test(noops: list):
    """The test of each ``(patch id, source)`` of ``noops`` (``assert_noop``)."""
    return _cases_test(noops, assert_noop)


def refusal_test(refusals: list):
    """The test of each ``(patch id, source, reason)`` of ``refusals`` (``assert_refuses``)."""
    return _cases_test(refusals, assert_refuses)


def transformers_evidence(patch: Patch | str, module: str, release: str | None) -> tuple[bool, str, str]:
    """``(holds, where, found)`` of ``patch``'s one fact, probed on ``module``
    (``transformers/configuration_utils.py``) as transformers ``release``'s wheel ships it
    (None: no transformers installed)."""
    import zipfile

    from sandbox import wheel

    from patcher.fixes.library_source import LibrarySource

    files = {module: None}
    if release is not None:
        with zipfile.ZipFile(wheel("transformers", release)) as z:
            files[module] = z.read(module)
    [fact] = patch_of(patch).facts
    found = fact.probe(LibrarySource(files, "0.34.0", {"transformers": release}))
    return found.holds, found.where, found.found
