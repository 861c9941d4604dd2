"""What this tool supports, in one place: the speculators releases, and for each line the vLLM
releases its patches are checked on. README.md's and docs/matrix.md's support sentence, the
``list`` command's and the refusal of another speculators (``engine.check_supported``) are
all made here (``tests/docs/test_support_statements.py`` fails when a document says
otherwise, or when the ranges leave what the tests run).

Where the ranges come from (each a tested fact, not a wish):

- speculators 0.3.0 on vLLM 0.11-0.34: the support matrix runs ``apply`` and ``verify`` on
  every minor release's real files (``tests/matrix/test_matrix.py``: ``RELEASES``), and every
  static check passes after ``apply``.
- speculators 0.4.0 and 0.4.0.1 on vLLM 0.12-0.17: ``tests/test_speculators_04.py``
  (``COMBINATIONS``) applies, verifies and reverts them there. On 0.11 the 0.4.x generator
  calls APIs that do not exist yet (``verify`` exits 1); on 0.33 ``apply`` refuses it (no 0.4.x
  patch covers the moved KV cache helpers); 0.18-0.32 are not checked for 0.4.x.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class Line:
    """One speculators line: its ``releases`` (as published on the package index), the vLLM
    releases (``vllm``: oldest and newest minor, inclusive) it is checked on, and the test
    that checks them (``tested_by``)."""

    releases: tuple[str, ...]
    vllm: tuple[str, str]
    tested_by: str


LINES = (
    Line(("0.3.0",), ("0.11", "0.34"), "tests/matrix/test_matrix.py"),
    Line(("0.4.0", "0.4.0.1"), ("0.12", "0.17"), "tests/test_speculators_04.py"),
)
RELEASES = tuple(r for line in LINES for r in line.releases)
# The transformers releases (oldest and newest minor) the training half is checked on: the
# engine tier's envs (tests/e2e/test_training.py: 4.57.6 beside vLLM 0.16.0, 5.19.0 beside
# 0.32.0, 5.22.2 without vLLM) and tests/test_training_only.py (5.22.2). Where vLLM is
# installed, its range (``LINES``) speaks for the stack it brings.
TRANSFORMERS = ("4.57", "5.22")


def _and(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def sentence() -> str:
    """The support statement every document and ``list`` print: ``speculators 0.3.0 on vLLM
    0.11–0.34; 0.4.0 and 0.4.0.1 on vLLM 0.12–0.17``."""
    return "speculators " + "; ".join(f"{_and(list(line.releases))} on vLLM {'–'.join(line.vllm)}" for line in LINES)


def releases_for(specifiers: list[str]) -> list[str]:
    """The supported releases that any of ``specifiers`` (patches' PEP 440 specifiers) admits,
    in ``RELEASES`` order: what a refusal lists instead of the specifiers themselves."""
    return [r for r in RELEASES if any(Version(r) in SpecifierSet(s) for s in specifiers)]


def _outside(version: str, minors: tuple[str, str]) -> bool:
    """Whether release ``version`` falls outside ``minors`` (oldest and newest minor, inclusive);
    False for an unknown or unparsable version (nothing to say about it)."""
    try:
        minor = Version(version).release[:2]
    except ValueError:
        return False
    low, high = (Version(v).release[:2] for v in minors)
    return not low <= minor <= high


def outside_range(speculators: str, vllm: str) -> str:
    """A note when vLLM ``vllm`` is outside the releases the line of ``speculators`` is
    checked on (``LINES``), else "". Such a pair is not refused (each patch applies where its
    facts hold, and ``verify`` says what still breaks), but no verb calls it supported
    silently. Unknown or unparsable versions give ""."""
    line = next((line for line in LINES if speculators in line.releases), None)
    if line is None or not _outside(vllm, line.vllm):
        return ""
    return (
        f"speculators {speculators} is supported on vLLM {'–'.join(line.vllm)}; vLLM {vllm} is outside "
        f"that range, untested"
    )


def transformers_outside(version: str) -> str:
    """A note when transformers ``version`` is outside ``TRANSFORMERS``, else "" (also for an
    unknown or unparsable version). For an env that only trains, where transformers (and torch)
    is all the patches are judged against: such an env is not refused, but not called tested."""
    if not _outside(version, TRANSFORMERS):
        return ""
    return (
        f"the training half is tested on transformers {'–'.join(TRANSFORMERS)}; transformers {version} is "
        f"outside that range, untested"
    )
