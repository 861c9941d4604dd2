"""One file planned: the chosen patches' codemods run in order on its bytes.

``plan_file`` parses the source with the target's grammar, and for each patch written for
the file decides whether the installed vLLM needs it (its facts, read by the probes), then
runs its codemod: ``Outcome`` per patch, ``FilePlan`` per file (bytes before and after).
libcst is imported only here, and only when a codemod really runs (docs/speed.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from patcher.errors import PatchRefused, UserError
from patcher.fixes.patch import Patch
from patcher.states import FileState

if TYPE_CHECKING:
    import libcst as cst

    from patcher.engine.snapshot import Snapshot


@dataclass
class Outcome:
    """What one patch does to one file's current source.

    state: ``pending`` (would change the file), ``applied`` (satisfied, recorded by us),
    ``satisfied`` (fix already present, not by us), ``not-needed`` (the installed vLLM
    does not have the incompatibility), ``fact-missing`` (a symbol its fact is about is not
    in the installed vLLM: ``fact_missing``), ``refused`` (unknown code; ``detail`` says where).
    """

    patch: Patch
    state: str
    detail: str = ""


@dataclass
class FilePlan:
    """One file: its bytes before and after the selected patches, and each patch's outcome."""

    path: str
    before: bytes
    after: bytes
    outcomes: list[Outcome] = field(default_factory=list)
    reused: bool = False  # the outcomes came from the plan cache or the manifest's record: no codemod ran
    # ``apply --adopt``: the new pristine copy of a file modified after patching (stock plus the
    # user's edit, ``engine.adopt``) and the patches ``after`` holds on top of it.
    adopted: bytes | None = None
    adopted_patches: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _parser_config(python_version: str) -> cst.PartialParserConfig:
    import libcst as cst

    known = cst.KNOWN_PYTHON_VERSION_STRINGS
    version = python_version if python_version in known else max(known, key=lambda v: tuple(map(int, v.split("."))))
    return cst.PartialParserConfig(python_version=version)


def parse(path: str, source: bytes, python_version: str = "3.10") -> cst.Module:
    """Parse with the target interpreter's grammar. Raises ``UserError`` on a syntax error."""
    import libcst as cst

    try:
        return cst.parse_module(source, config=_parser_config(python_version))
    except (UnicodeError, LookupError, ValueError, SyntaxError) as e:  # undecodable bytes, a bad coding cookie, NUL
        raise UserError(
            f"{path}: cannot be read as Python source ({type(e).__name__}: {e}); reinstall speculators"
        ) from None
    except cst.ParserSyntaxError as e:
        line = e.raw_line
        try:  # CPython names the offending line more precisely than libcst's parser
            compile(source, path, "exec", dont_inherit=True)
        except SyntaxError as exact:
            line = exact.lineno or line
        raise UserError(f"{path}:{line}: syntax error, cannot patch: {e.message}") from None


def transform(patch: Patch, module: cst.Module, original: str | None = None) -> tuple[str, cst.Module, str]:
    """Run one patch's codemod on a parsed module.

    Returns ``(verdict, module, detail)`` with verdict ``changed``, ``satisfied`` or
    ``refused`` (``detail`` then names file:line and the expected shape). ``original``: the
    file's text before earlier codemods rewrote ``module``; a refusal then names the line
    in it, the user's file, not in the rewritten text.
    """
    import libcst as cst
    from libcst.codemod import CodemodContext, SkipFile

    try:
        new = patch.codemod(CodemodContext(filename=patch.file)).transform_module(module)
        if not isinstance(new, cst.Module):
            raise TypeError(f"transform_module returned {type(new).__name__}, not a libcst Module")
    except SkipFile as e:
        return "satisfied", module, str(e)
    except PatchRefused:
        try:  # again, with positions resolved, to name the line
            patch.codemod.with_positions()(CodemodContext(filename=patch.file)).transform_module(module)
        except PatchRefused as e:
            if original is None or e.line is None or original == module.code:
                return "refused", module, str(e)
            return "refused", module, e.at(original_line(original, module.code, e.line))
        raise
    except Exception as e:
        if patch.origin == "shipped":  # our bug: the traceback is the report
            raise
        raise UserError(
            f"{patch.id} ({patch.origin} {patch.source}): its codemod raised {type(e).__name__}: {e} "
            f"on {patch.file}; nothing was changed"
        ) from None
    if new.code == module.code:
        return "satisfied", module, "already satisfied: no change"
    return "changed", new, ""


def original_line(original: str, current: str, line: int) -> int:
    """The line of ``original`` that line ``line`` of ``current`` (``original`` rewritten by
    earlier codemods) comes from: the same line where they left it as it was, else the first
    line of the original lines they rewrote (the line before, for lines they only added)."""
    import difflib

    a, b = original.splitlines(), current.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if j1 < line <= j2:
            return i1 + line - j1 if tag == "equal" else (i1 + 1 if i2 > i1 else max(i1, 1))
    return line


def run_codemod(patch: Patch, source: bytes, python_version: str = "3.10") -> tuple[str, bytes, str]:
    """``transform`` on bytes: returns ``(verdict, new_source, detail)``."""
    verdict, module, detail = transform(patch, parse(patch.file, source, python_version))
    return verdict, module.bytes, detail


def needed(snap: Snapshot, patch: Patch) -> bool:
    """A patch is needed when every vLLM fact it depends on holds in the installed vLLM."""
    return all(snap.evidence[(patch.id, f.symbol)].holds for f in patch.facts)


def fact_missing(snap: Snapshot, patch: Patch) -> str:
    """Why ``patch`` can be neither needed nor not needed here: a fact's symbol is not in
    the installed vLLM at all (``Evidence.missing``), one line; "" when every symbol is there."""
    for f in patch.facts:
        e = snap.evidence[(patch.id, f.symbol)]
        if e.missing:
            return (
                f"vLLM {snap.vllm_version or ''} has no {f.symbol} ({e.where}: {e.found}): "
                f"the code {patch.id} rewrites uses it, so it breaks with or without {patch.id}; "
                f"no patch here handles this vLLM yet (verify's call check names the calls)"
            )
    return ""


def need_state(snap: Snapshot, patch: Patch) -> str:
    """``needed`` | ``not-needed`` | ``fact-missing`` (see ``fact_missing``)."""
    if fact_missing(snap, patch):
        return "fact-missing"
    return "needed" if needed(snap, patch) else "not-needed"


NOT_NEEDED = "the installed vLLM does not need it"


def not_needed(snap: Snapshot, patch: Patch) -> str:
    """Why ``patch`` is ``not-needed`` here, naming the library whose fact does not hold (its
    first such fact): ``NOT_NEEDED`` for vLLM; for transformers or torch the installed
    release, or that the library is not installed."""
    fact = next((f for f in patch.facts if not snap.evidence[(patch.id, f.symbol)].holds), None)
    if fact is None or fact.library == "vllm":
        return NOT_NEEDED
    version = snap.libraries.version_of(fact.library)
    if not version or version == "not installed":
        return f"{fact.library} is not installed, so nothing here needs it"
    return f"the installed {fact.library} {version} does not need it"


def plan_file(
    snap: Snapshot,
    path: str,
    source: bytes,
    chosen: tuple[Patch, ...],
    recorded: dict[str, int],
    only_needed: bool = True,
    adopting: bool = False,
) -> FilePlan:
    """Run the chosen patches for ``path`` in order on ``source`` (deterministic).

    With ``only_needed`` (the default) a patch the installed vLLM does not need is skipped
    as ``not-needed``; ``revert --only`` replays the recorded patches regardless.
    ``adopting`` (``apply --adopt``): a modified file is planned afresh, so a recorded user
    patch whose source is not loaded refuses (it would have to run) instead of being shown
    as applied.
    """
    plan = FilePlan(path, source, source)
    module = parse(path, source, snap.python_version)
    original = module.code
    for patch in (p for p in chosen if p.file == path):
        gone = fact_missing(snap, patch) if only_needed else ""
        if gone:  # neither needed nor not needed: never shown as calm (verify's verdict fails)
            plan.outcomes.append(Outcome(patch, "fact-missing", gone))
            continue
        if only_needed and not needed(snap, patch):
            plan.outcomes.append(Outcome(patch, "not-needed", not_needed(snap, patch)))
            continue
        if patch.origin == "recorded" and patch.id in recorded:  # a user patch whose source is not at hand
            plan.outcomes.append(Outcome(patch, "applied", "recorded; source not loaded"))
            continue
        if (
            patch.origin == "recorded"
            and only_needed
            and not adopting
            and snap.file_state(path) == FileState.MODIFIED
            and patch.id in (snap.manifest.patches_of(path) if snap.manifest is not None else {})
        ):
            # edited since: the record is all there is to show; apply/verify say the file is modified
            plan.outcomes.append(Outcome(patch, "applied", "recorded; source not loaded; the file was modified since"))
            continue
        verdict, module, detail = transform(patch, module, original)
        if verdict == "changed":
            plan.outcomes.append(Outcome(patch, "pending"))
        elif verdict == "satisfied":
            state = "applied" if patch.id in recorded else "satisfied"
            plan.outcomes.append(Outcome(patch, state, detail))
        else:
            plan.outcomes.append(
                Outcome(patch, "refused", f"{detail} ({patch.id} {patch.name}; --skip {patch.id} leaves it out)")
            )
    plan.after = module.bytes
    return plan
