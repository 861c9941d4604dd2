"""What a patch is: metadata, the library facts it relies on (vLLM, transformers, torch), and
its libcst codemod.

A patch module in ``patches/`` defines one module-level ``PATCH = Patch(...)``. The engine
(``patcher.engine``) knows nothing about any particular patch: it only reads these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from patcher.errors import PatchRefused

# What a patch module imports from here (``PatchCodemod`` on first use: ``__getattr__`` below).
__all__ = ["Fact", "Patch", "PatchCodemod", "PatchRefused", "Uncovered", "VllmFact"]

if TYPE_CHECKING:
    from patcher.fixes.codemod_base import PatchCodemod
    from patcher.fixes.library_source import Evidence, LibrarySource


@dataclass(frozen=True)
class Fact:
    """One fact about an installed library's API (vLLM, transformers or torch) that a patch
    depends on.

    Attributes:
        summary: what changed in the library, one line (e.g. "SchedulerConfig requires the
            init-only field is_encoder_decoder").
        symbol: the library's symbol, e.g. ``SchedulerConfig.is_encoder_decoder``.
        first_release: first release of that library where the fact holds (so the patch is
            needed).
        probe: reads the static source and returns ``Evidence`` (holds, file, line, found).
        modules: library source files the probe reads, relative to the library's import root
            (``("vllm/config/scheduler.py",)``, ``("transformers/configuration_utils.py",)``);
            the first component names the library, and one fact reads one library. The probe
            may read no other file: the engine fetches exactly these, in one batch, locally or
            over SSH. Taken from the probe when it was built by ``patcher.fixes.probes`` (which
            knows the files it reads); a probe of your own names them here.
        of_serving: the fact is about the vLLM that will serve what speculators trains (the
            draft), which need not be installed where it trains. Where no vLLM is installed (an
            env that only trains) it is taken to hold, as it does on every release from
            ``first_release`` (its tests read each release 0.11-0.34), and the patch belongs
            to the training half.
    """

    summary: str
    symbol: str
    first_release: str
    probe: Callable[[LibrarySource], Evidence]
    modules: tuple[str, ...] = ()
    of_serving: bool = False

    def __post_init__(self) -> None:
        read = tuple(getattr(self.probe, "modules", ()))
        if not self.modules:
            if not read:
                raise ValueError(f"{self.symbol}: its probe names no library file; pass modules=(...) it reads")
            object.__setattr__(self, "modules", read)
        elif read and tuple(self.modules) != read:
            raise ValueError(
                f"{self.symbol}: modules {tuple(self.modules)} differ from the files its probe reads {read}"
            )
        if len({m.split("/", 1)[0] for m in self.modules}) != 1:
            raise ValueError(f"{self.symbol}: modules {tuple(self.modules)} name more than one library")

    @property
    def library(self) -> str:
        """The library the fact is about: ``vllm``, ``transformers`` or ``torch``."""
        return self.modules[0].split("/", 1)[0]


# The name patches (shipped and users') have always imported; every fact is a ``Fact``.
VllmFact = Fact


@dataclass(frozen=True)
class Uncovered:
    """A vLLM change a patch covers for the speculators it is written for, and no patch covers
    for another speculators (``speculators``, a PEP 440 specifier): recognised by the patch's
    own fact ``symbol`` holding in the installed vLLM; ``what``: what then breaks, in words.
    ``apply`` and ``diff`` refuse such a target rather than leave it half-fixed
    (``patcher.engine.check_covered``)."""

    speculators: str
    symbol: str
    what: str


@dataclass(frozen=True)
class CheckHooks:
    """What the checks that name a patch read of it, grouped apart from what the patch is;
    a patch no check names keeps the defaults.

    Attributes:
        engine_steps: set-up steps of vLLM's own engine core (executor methods that
            ``EngineCore`` calls, vllm/v1/engine/core.py) which this patch makes the generator
            account for, by making the call or by configuring vLLM so that the step has
            nothing to do; ``verify``'s life-cycle check (``patcher.checks.lifecycle``) names
            the patch when the step is skipped and the patch is not applied.
        runner_batch: the vLLM model runner whose per-step batch the patch makes capture split
            per request (``v1``: the V1 runner's ``input_batch``; ``v2``: Model Runner V2's
            ``InputBatch``). ``verify``'s model-runner check (``patcher.checks.model_runner``)
            names the ``v2`` patch written for the installed speculators as the way to capture
            under Model Runner V2. Empty: none.
        attribution: left out where the installed vLLM needs it, hidden states can be
            attributed to the wrong request; ``apply --help`` names these patches under
            ``--allow-partial``.
        uncovered: vLLM changes, recognised by this patch's facts, that no patch covers for
            another speculators (``Uncovered``); ``apply`` and ``diff`` refuse such a target.
        symptoms: regular expressions (``re.search``) of what the failure this patch fixes
            says where it is missing (an exception's type and message, a traceback line);
            ``selftest`` names the patch when its generator or its training stage fails with
            one. Empty: no symptom of its own (a silent error, or one another patch's names).
    """

    engine_steps: tuple[str, ...] = ()
    runner_batch: str = ""
    symptoms: tuple[str, ...] = ()
    attribution: bool = False
    uncovered: tuple[Uncovered, ...] = ()


@dataclass(frozen=True)
class Patch:
    """One versioned fix for one incompatibility, applied by a libcst codemod.

    Attributes:
        id: stable id users select with ``--only``/``--skip`` (``SP001`` ...).
        name: stable slug (``scheduler-config-init-fields``); also accepted by ``--only``.
        version: bumped whenever the emitted code changes.
        title: one line for tables.
        file: the speculators file it rewrites, relative to the import root
            (``speculators/data_generation/...``).
        codemod: a ``PatchCodemod`` subclass; it rewrites, raises ``SkipFile`` when the
            fix is already there, or raises ``PatchRefused`` on unknown code.
        facts: library facts (``Fact``: vLLM, transformers, torch) the patch depends on. The
            patch is needed when all hold; a patch without facts (a correctness fix in
            speculators' own logic) is always needed.
        speculators: the speculators versions the patch is written for (PEP 440 specifier);
            a speculators version no patch is written for is refused.
        order: position in the sequence applied to a file; lower runs first.
        portable: the emitted code is right on every vLLM release 0.11-0.33 and with
            transformers 4 and 5 (e.g. it checks ``hasattr`` or a signature at runtime), so it
            stays correct when vLLM is upgraded or downgraded under it. A non-portable patch
            targets the installed API: ``verify`` reports it stale once the installed vLLM no
            longer needs it.
        requires: ids of patches this one cannot work without (e.g. a generator change that
            calls an RPC a worker patch adds); ``--only``/``--skip`` must keep them together.
        depends_on: for a patch without facts, what its emitted code depends on, in words
            (what it reads from vLLM or transformers at run time, with module and release);
            ``list`` shows it. Empty: a fix of speculators' own logic.
        risk: what goes wrong where the installed vLLM needs this patch and it is left out
            (one line, e.g. "hidden states can be attributed to the wrong request"); ``apply``
            names it when ``--only``/``--skip`` leave a needed patch out. Empty: the title.
        checks: what the checks that name a patch read of it (``CheckHooks``).
        origin: where the patch comes from, set by the loader, not by its author:
            ``shipped`` (``patches/``), ``file`` (``--patch-file``), ``package`` (an installed
            pack, entry-point group ``speculators_patch.patches``) or ``recorded`` (named by
            a target's manifest; its source is not loaded in this run, so it cannot be re-run).
        source: for a user patch, the file's absolute path or ``<distribution> <version>``.
        source_sha256: sha256 (hex) of the file that defines a user patch, recorded in the
            manifest when it is applied; ``verify`` reports a source changed since.
    """

    id: str
    name: str
    version: int
    title: str
    file: str
    codemod: type[PatchCodemod]
    facts: tuple[Fact, ...] = ()
    speculators: str = "==0.3.0"
    order: int = 0
    portable: bool = False
    requires: tuple[str, ...] = ()
    depends_on: str = ""
    risk: str = ""
    checks: CheckHooks = CheckHooks()
    origin: str = "shipped"
    source: str = ""
    source_sha256: str = ""


# speculators' data-generation half: every module under it needs vLLM (the package's
# ``__init__`` imports the generator, which imports vLLM: speculators 0.3.0 and 0.4.x).
DATA_GENERATION = "speculators/data_generation/"


def needs_vllm(patch: Patch) -> bool:
    """Whether ``patch`` belongs to the data-generation half: it rewrites a module under
    ``DATA_GENERATION`` or a fact of it reads vLLM. Without vLLM such a patch can be neither
    judged nor run; the others (the training half: the draft's config, model and trainer)
    are judged on transformers and torch alone, and on facts about the serving vLLM
    (``Fact.of_serving``), taken to hold where none is installed."""
    return patch.file.startswith(DATA_GENERATION) or any(f.library == "vllm" and not f.of_serving for f in patch.facts)


def __getattr__(name: str):
    """``PatchCodemod`` on first use: it subclasses libcst's codemod command, and importing
    libcst (0.3-0.5 s) is left to the commands that really run a codemod (docs/speed.md)."""
    if name == "PatchCodemod":
        from patcher.fixes.codemod_base import PatchCodemod

        return PatchCodemod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
