"""``verify``'s call-site and import-path findings, kept for the next run on the same target.

Those checks read some 600 files of speculators, vLLM and transformers (about 3 MB), and
the training half's check (``library_calls``) some 160 more of transformers and torch: the
agent parses them to follow imports, sends them, and the controller parses them again,
about 1.5 s on this 2-core machine. Their findings depend on nothing but those files, the
package roots and two directory listings, which the agent reports with its answer
(``reads``: every path with its sha256). The next ``verify`` on the same target sends that
record back as ``expect``; the agent re-reads and re-hashes the files (tens of ms) and, when
every digest and listing is the same, answers ``unchanged`` and the findings stored here
stand. Any difference, and the agent answers in full as before. ``verify --runtime``
always reads in full (it needs the parsed calls).

The cache entry is named by the target (its label, interpreter, site-packages and roots),
the request and the digest of the tool's code (``patcher.digest``); it lives in ``patcher.cache``.
The ``reads`` name the interpreter that parsed the files (its version), so an entry answers
only a target whose interpreter parses them alike; an answer from a partial read (a file
that interpreter could not parse) is never stored.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from patcher import cache
from patcher.checks.callsite import Checked, Finding
from patcher.checks.import_path import ImportFinding, ImportPathCheck
from patcher.digest import tool as tool_digest

if TYPE_CHECKING:
    from patcher.engine import Snapshot

KIND = "verify-calls"


def kept() -> tuple[str, ...]:
    """The vLLM files of the checks computed afresh on each run (``Check.reads``: they depend
    on more than these files, the job's environment, the patches applied), kept with the findings."""
    from patcher.checks.checklist import checks

    return tuple(path for check in checks() for path in check.reads)


def _key(snap: Snapshot, request: dict) -> str:
    return cache.key(
        {
            "code": tool_digest(),
            "request": request,
            "target": [snap.label, snap.python, snap.site_packages, snap.speculators_root, snap.vllm_root],
        }
    )


def _latest_key(request: dict) -> str:
    """The entry any target may try: the agent names what it read relative to the package
    roots, so a fresh copy of an environment or another host with the same files is
    answered ``unchanged`` by it (and a target with other files is read in full)."""
    return cache.key({"code": tool_digest(), "latest": {k: v for k, v in request.items() if k != "site_packages"}})


def lock(request: dict):
    """The controller cache's lock of the entry any target may try for ``request``
    (``cache.locked``; a context manager)."""
    return cache.locked(KIND, _latest_key(request))


def lookup(snap: Snapshot, request: dict) -> dict | None:
    """The stored entry for this target and request ({"reads", ...}), else the last one
    stored for the same request on any target, or None."""
    for key in (_key(snap, request), _latest_key(request)):
        entry = cache.load(KIND, key)
        if isinstance(entry, dict) and isinstance(entry.get("reads"), dict):
            return entry
    return None


def save(
    snap: Snapshot,
    request: dict,
    reads: dict | None,
    findings: list[Finding],
    checked: list[Checked],
    imports: ImportPathCheck,
    vllm: dict[str, bytes | None],
    unparsed: list[str] | None = None,
) -> None:
    """Store what was found, with the ``reads`` it was computed from. Nothing is stored
    without ``reads``, or from a partial read (``unparsed``: files the target's interpreter
    could not parse, whose imports were then not followed)."""
    if not reads or unparsed:
        return
    runner_files = {p: None if vllm.get(p) is None else base64.b64encode(vllm[p]).decode() for p in kept()}
    entry = {
        "reads": reads,
        "findings": [f.__dict__ for f in findings],
        "checked": [[c.file, c.line, c.label, list(c.target)] for c in checked],
        "imports": {
            "findings": [f.__dict__ for f in imports.findings],
            "modules": imports.modules,
            "checked": imports.checked,
        },
        "runner_files": runner_files,
    }
    cache.store(KIND, _key(snap, request), entry)
    cache.store(KIND, _latest_key(request), entry)


def restore(entry: dict) -> tuple[list[Finding], list[Checked], ImportPathCheck, dict[str, bytes | None]] | None:
    """(findings, checked calls, import-path check, the ``kept()`` vLLM files) of an entry, or
    None when it is not of the shape ``save`` writes. The checked calls carry no parsed call
    or signature (only ``verify --runtime`` needs them, and it never reads this cache)."""
    try:
        findings = [Finding(**f) for f in entry["findings"]]
        checked = [Checked(file, line, label, tuple(target), None) for file, line, label, target in entry["checked"]]
        imports = ImportPathCheck(
            [ImportFinding(**f) for f in entry["imports"]["findings"]],
            list(entry["imports"]["modules"]),
            int(entry["imports"]["checked"]),
        )
        vllm = {p: None if d is None else base64.b64decode(d) for p, d in entry["runner_files"].items()}
        if set(vllm) != set(kept()):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return findings, checked, imports, vllm
