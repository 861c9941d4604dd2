"""Can speculators' data-generation and training modules still be imported? A static check, no import.

``from speculators.data_generation.vllm_hidden_states_generator import ...`` runs more than
that module: the package ``__init__``s, every speculators module they import, and the
modules speculators' registry imports by itself (``auto_package = "speculators.models"``
in speculators/config.py and speculators/model.py: every module of that package, e.g.
speculators/models/eagle.py). The agent follows that path (``patcher.agent.pysource.walk_import_path``,
in the same ``sources`` exchange as the call-site check) and sends the files of
transformers and vLLM those modules import; here each import is resolved against them:

- ``missing-module``: ``import transformers.X`` / ``from transformers.X import ...`` where
  no ``transformers/X.py`` or ``transformers/X/__init__.py`` exists (Python raises
  ModuleNotFoundError);
- ``missing-name``: ``from transformers.X import Y`` where module X neither binds Y (directly,
  by re-export or star import) nor has a submodule Y (ImportError). A package that builds
  its namespace lazily (transformers' ``_LazyModule``) is not checked by name.

The chain inside speculators is checked as the agent reads it, on the target's interpreter
(``walk_import_path``'s ``broken``): every package ``__init__.py`` on the path of each
module followed, ``speculators/__init__.py`` first, must parse (``syntax-error``, at the
error's line) and exist (``missing-init``: a package directory without it, whose names are
then gone; ``missing-module``: a module an import needs). The path starts at the generator
and at the training entry points (``speculators.train``, ``speculators.train.trainer``,
``speculators.models``).

An import inside ``try: ... except ImportError:`` has a fallback and is not a finding, nor
is one under ``if TYPE_CHECKING:`` or inside a function (not run at import). vLLM imports of
the data-generation modules themselves are the call-site check's (``missing-import``).
A package that is not installed at all is a note (vLLM requires transformers, so a real
environment has it; a bare test sandbox may not).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from patcher.agent.pysource import walk_import_path
from patcher.checks.callsite import SPECULATORS_DIR, Index

# The generator, then the training entry points (``speculators.train.trainer`` is what a
# training script imports; ``speculators.models``' registry already runs every model module).
START = (
    "speculators.data_generation.vllm_hidden_states_generator",
    "speculators.train",
    "speculators.train.trainer",
    "speculators.models",
)
PACKAGES = ("transformers", "vllm")


@dataclass(frozen=True)
class ImportFinding:
    """``severity``: ``error`` (the import fails) or ``note``."""

    kind: str
    file: str
    line: int
    statement: str
    detail: str
    severity: str = "error"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "file": self.file,
            "line": self.line,
            "statement": self.statement,
            "detail": self.detail,
        }


@dataclass
class ImportPathCheck:
    findings: list[ImportFinding]
    modules: list[str]  # speculators files on the path
    checked: int  # imports resolved

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "modules": self.modules,
            "checked": self.checked,
            "findings": [f.as_dict() for f in self.findings],
        }


def request() -> dict:
    """The ``import_path`` part of the agent's ``sources`` request."""
    return {"start": list(START), "packages": list(PACKAGES)}


def _unb64(files: dict) -> dict[str, bytes | None]:
    return {k: None if v is None else base64.b64decode(v) for k, v in files.items()}


def check(answer: dict) -> ImportPathCheck:
    """Resolve every import on the path against the files the agent sent."""
    spec = _unb64(answer["speculators"])

    def listdir(rel: str) -> list[str]:
        return sorted(p for p in spec if p.startswith(rel + "/"))

    _, external = walk_import_path(spec.get, listdir, list(START))
    findings = [_broken(*entry) for entry in answer.get("broken") or []]
    indexes = {name: None if files is None else Index(_unb64(files)) for name, files in answer["packages"].items()}
    absent: dict[str, tuple[str, int, str]] = {}
    checked = 0
    for importer, module, name, line, guarded in external:
        package = module.split(".")[0]
        if package not in indexes or guarded:
            continue
        if package == "vllm" and importer.startswith(SPECULATORS_DIR + "/"):
            continue  # the call-site check reads these
        statement = f"import {module}" if name is None else f"from {module} import {name}"
        index = indexes[package]
        if index is None:
            absent.setdefault(package, (importer, line, statement))
            continue
        checked += 1
        finding = _resolve(index, module, name)
        if finding is not None:
            findings.append(ImportFinding(finding[0], importer, line, statement, finding[1]))
    for package, (importer, line, statement) in absent.items():
        findings.append(
            ImportFinding(
                "not-installed",
                importer,
                line,
                statement,
                f"{package} is not installed in the target: its imports were not checked",
                "note",
            )
        )
    modules = sorted(p for p, d in spec.items() if d is not None)
    return ImportPathCheck(findings, modules, checked)


def _broken(path: str, line: int, kind: str, what: str, detail: str) -> ImportFinding:
    """A break of speculators' own chain, as the agent found it (``walk_import_path``'s
    ``broken``: ``what`` is the exception's name for a ``syntax-error``, else the statement
    that needs the module; ``detail`` the error's message, else the module's name)."""
    if kind == "syntax-error":
        return ImportFinding(kind, path, int(line), "does not parse", f"{what}: {detail}")
    if kind == "missing-init":
        return ImportFinding(
            kind,
            path,
            0,
            "missing",
            f"package {detail} has no __init__.py: it imports only as a namespace package, without "
            "the names its __init__ binds (the speculators wheel installs it: reinstall speculators)",
        )
    return ImportFinding(kind, path, int(line), what, f"ModuleNotFoundError: No module named '{detail}'")


def _resolve(index: Index, module: str, name: str | None) -> tuple[str, str] | None:
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if index.module(prefix) is None:
            return "missing-module", f"No module named '{prefix}'"
    if name is None or index.resolve(module, name) is not None:
        return None
    tree, _, path, names, _ = index.module(module)
    if name in names:  # bound by an import from outside the package (e.g. typing.Unpack)
        return None
    lazy = b"_LazyModule" in (index.files.get(path) or b"") or any(
        getattr(n, "name", None) == "__getattr__" for n in tree.body
    )
    if lazy:
        return None  # names made at runtime (transformers' _LazyModule, module __getattr__): not checked
    return "missing-name", f"cannot import name '{name}' from '{module}' ({path})"
