"""The engine's life cycle: set-up steps vLLM's own engine core performs that the generator skips.

speculators' generator is its own engine core: it builds a ``MultiprocExecutor`` and calls it
directly. A call it makes can be checked against vLLM's signatures (``patcher.checks.callsite``);
a step vLLM's engine core performs and the generator never makes cannot. vLLM 0.34 added one:
``EngineCore._initialize_kv_caches`` grows an extensible KV cache after set-up
(``extend_kv_cache``), and a generator that stops at ``initialize_from_config`` reads unmapped
KV blocks on a GPU while every signature still fits.

How (``ast`` only, nothing imported). The engine core's steps are the calls it makes on its
executor -- ``self.model_executor.X(...)``, a local bound to it, and ``self.collective_rpc("X")``
(``rpc:X``) -- in ``EngineCore.__init__`` and ``EngineCore.step`` and in every ``EngineCore``
method they call, in vllm/v1/engine/core.py. The generator's calls are the same forms on
``self.executor`` in ``VllmHiddenStatesGenerator``. An executor method of vllm/v1/executor/
abstract.py that only forwards to ``collective_rpc("Y")`` counts as ``rpc:Y`` too, on either
side (0.11-0.26's ``initialize_from_config`` also sends ``compile_or_warm_up_model``). Each step
of the core is then:
- made: the generator makes it;
- handled: a patch applied to this install lists it in ``CheckHooks.engine_steps`` (it makes the
  generator account for the step, e.g. the fixed-KV-cache patch (patches/sp026_fixed_kv_cache.py)
  turns off the cache that ``extend_kv_cache`` grows);
- not needed: a step with no work for the generator's configuration (``NOT_NEEDED``, with why);
- a finding (``error``): skipped, naming the patch that handles it, or "no patch covers it".
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

from patcher import cache
from patcher.checks.callsite import Finding
from patcher.checks.check import Check, Found, InstallCheck
from patcher.digest import tool as tool_digest
from patcher.ways import Way

if TYPE_CHECKING:
    from rich.console import Console

    from patcher.engine import Snapshot

CORE = "vllm/v1/engine/core.py"
EXECUTOR = "vllm/v1/executor/abstract.py"
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
KIND = "engine-step"
FILES = (CORE, EXECUTOR)  # the vLLM files this check reads (verify's sources request seeds them)

# Steps of vLLM's engine core that have no work to do for the generator's configuration: the
# generator's VllmConfig sets no KV or EC connector, no speculative decoding, enforce_eager=True
# and a fixed max_model_len, and it calls the executor itself.
_CONNECTORS = "KV/EC connectors (kv_transfer_config, ec_transfer_config), which the generator never configures"
NOT_NEEDED = {
    "register_failure_callback": "tells the engine's client that a worker died; the generator calls the "
    "executor itself and gets its exceptions",
    "rpc:initialize_cache": "copies the block counts into the workers' CacheConfig; their KV cache is "
    "built from the KVCacheConfig that initialize_from_config sends",
    "rpc:update_max_model_len": "only when vLLM's own KV cache planning shortened max_model_len to fit "
    "memory; the generator plans with get_kv_cache_config_from_groups, "
    "which keeps the max_model_len it was given",
    "compile_or_warm_up_model": "torch.compile, CUDA graph capture and kernel warm-up; the generator runs "
    "eager (enforce_eager=True), so only its first step is slower",
    "init_kv_output_aggregator": _CONNECTORS,
    "init_ec_output_aggregator": _CONNECTORS,
    "get_kv_connector_handshake_metadata": _CONNECTORS,
    "get_simple_cpu_offload_num_blocks": "the CPU offload connector (kv_transfer_config), which the "
    "generator never configures",
    "take_draft_token_ids": "speculative decoding (speculative_config), which the generator never configures",
}


@dataclass(frozen=True)
class Step:
    """One call vLLM's engine core makes on its executor. ``name``: the method, or ``rpc:X``
    for ``collective_rpc("X")``; ``line``: where in ``CORE``; ``when``: the condition of the
    innermost ``if`` around it ('' when none); ``how``: ``made`` | ``handled`` | ``not-needed``
    | ``skipped``; ``patch``: the patch that handles it ('' when none); ``why``: a sentence."""

    name: str
    line: int
    when: str
    how: str = ""
    patch: str = ""
    why: str = ""


@dataclass
class LifecycleCheck:
    """The engine core's steps as classified, the generator's own calls (name -> line), where
    its set-up ends (``setup_end``: the line and name of its last executor call in
    ``__init__``), and the findings (one per skipped step)."""

    steps: list[Step]
    generator_calls: dict[str, int]
    setup_end: tuple[int, str] | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "core": CORE,
            "steps": [asdict(s) for s in self.steps],
            "generator_calls": self.generator_calls,
            "findings": [f.as_dict() for f in self.findings],
        }


def _executor_call(node: ast.Call, executors: set[str]) -> str | None:
    """``X`` for ``<executor>.X(...)``, ``rpc:X`` for ``<executor or self>.collective_rpc("X", ...)``."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return None
    target = ast.unparse(func.value)
    if func.attr == "collective_rpc" and (target in executors or target == "self"):
        first = node.args[0] if node.args else None
        return f"rpc:{first.value}" if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    return func.attr if target in executors else None


class _Walker(ast.NodeVisitor):
    """Executor calls in a method, in source order, following ``self.<method>()`` into the class."""

    def __init__(self, methods: dict[str, ast.FunctionDef], executor: str) -> None:
        self.methods, self.executor = methods, executor
        self.found: list[tuple[str, int, str]] = []
        self._conditions: list[str] = []
        self._executors = [{executor}]
        self._active: set[str] = set()

    def walk(self, name: str) -> None:
        if name in self._active or name not in self.methods:
            return
        self._active.add(name)
        self._executors.append({self.executor})
        for statement in self.methods[name].body:
            self.visit(statement)
        self._executors.pop()
        self._active.discard(name)

    def visit_Assign(self, node: ast.Assign) -> None:  # executor = self.model_executor
        if ast.unparse(node.value) in self._executors[-1]:
            self._executors[-1].update(ast.unparse(t) for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._conditions.append(" ".join(ast.unparse(node.test).split()))
        for statement in node.body:
            self.visit(statement)
        self._conditions[-1] = f"not ({self._conditions[-1]})"
        for statement in node.orelse:
            self.visit(statement)
        self._conditions.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:  # nested functions run later, if ever
        return

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        name = _executor_call(node, self._executors[-1])
        if name is not None:
            self.found.append((name, node.lineno, self._conditions[-1] if self._conditions else ""))
        elif (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ):
            self.walk(node.func.attr)


def _class(tree: ast.Module, name: str) -> dict[str, ast.FunctionDef] | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return None


def engine_steps(core: bytes) -> list[tuple[str, int, str]]:
    """(name, line, condition) of every executor call ``EngineCore.__init__`` and
    ``EngineCore.step`` make, directly or through ``EngineCore`` methods; each name once, at its
    first line. Raises ``SyntaxError``/``ValueError`` on a file that is not Python."""
    methods = _class(ast.parse(core), "EngineCore") or {}
    walker = _Walker(methods, "self.model_executor")
    walker.walk("__init__")
    walker.walk("step")
    first: dict[str, tuple[str, int, str]] = {}
    for name, line, when in walker.found:
        first.setdefault(name, (name, line, when))
    return list(first.values())


def forwards(executor: bytes | None) -> dict[str, set[str]]:
    """``Executor`` method -> the ``rpc:Y`` it sends (``self.collective_rpc("Y")`` in its body)."""
    if executor is None:
        return {}
    methods = _class(ast.parse(executor), "Executor") or {}
    sent: dict[str, set[str]] = {}
    for name, fn in methods.items():
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                rpc = _executor_call(node, set())
                if rpc is not None:
                    sent.setdefault(name, set()).add(rpc)
    return sent


def generator_calls(generator: bytes) -> tuple[dict[str, int], tuple[int, str] | None]:
    """The generator's executor calls (name -> first line) in ``VllmHiddenStatesGenerator``, and
    the last one its ``__init__`` makes, in the order they run (line, name): where its set-up ends."""
    methods = _class(ast.parse(generator), "VllmHiddenStatesGenerator") or {}
    setup = _Walker(methods, "self.executor")
    setup.walk("__init__")
    calls: dict[str, int] = {}
    for name, fn in methods.items():
        walker = _Walker({name: fn}, "self.executor")
        walker.walk(name)
        for call, line, _ in walker.found:
            calls[call] = min(line, calls.get(call, line))
    end = (setup.found[-1][1], setup.found[-1][0]) if setup.found else None  # in the order they run
    return calls, end


def check(
    vllm: Mapping[str, bytes | None], generator: bytes | None, patches: Iterable, present: set[str]
) -> LifecycleCheck | None:
    """Classify the engine core's steps for the installed generator. ``vllm``: the sources read
    for verify (``CORE`` and ``EXECUTOR`` among them); ``patches``: the patches written for the
    installed speculators (``CheckHooks.engine_steps``); ``present``: ids of those applied to it or
    already satisfied. None when vLLM has no engine core to read (``CORE`` missing or not
    Python) or the generator is missing. Cached by the files' digests, like the model-runner check."""
    core, generator_src = vllm.get(CORE), generator
    if core is None or generator_src is None:
        return None
    handlers = {step: p.id for p in patches for step in p.checks.engine_steps}
    digests = [hashlib.sha256(s).hexdigest() if s is not None else None for s in (core, vllm.get(EXECUTOR), generator)]
    key = cache.key(["lifecycle", tool_digest(), digests, sorted(handlers.items()), sorted(present)])
    stored = cache.load("lifecycle", key)
    if isinstance(stored, dict) and "steps" in stored:
        try:
            return LifecycleCheck(
                [Step(**s) for s in stored["steps"]],
                dict(stored["generator_calls"]),
                tuple(stored["setup_end"]) if stored["setup_end"] else None,
                [Finding(**f) for f in stored["findings"]],
            )
        except (TypeError, KeyError):
            pass
    try:
        found = _check(core, vllm.get(EXECUTOR), generator_src, handlers, present)
    except (SyntaxError, ValueError):
        return None
    cache.store(
        "lifecycle",
        key,
        {
            "steps": [asdict(s) for s in found.steps],
            "generator_calls": found.generator_calls,
            "setup_end": found.setup_end,
            "findings": [f.__dict__ for f in found.findings],
        },
    )
    return found


def _check(
    core: bytes, executor: bytes | None, generator: bytes, handlers: dict[str, str], present: set[str]
) -> LifecycleCheck:
    sent = forwards(executor)
    calls, end = generator_calls(generator)
    made = set(calls) | {rpc for call in calls for rpc in sent.get(call, ())}
    steps, findings = [], []
    for name, line, when in engine_steps(core):
        if name in made or sent.get(name, set()) & made:
            steps.append(Step(name, line, when, "made", why="the generator makes this call"))
        elif handlers.get(name) in present:
            steps.append(Step(name, line, when, "handled", handlers[name], f"{handlers[name]} accounts for it"))
        elif name in NOT_NEEDED:
            steps.append(Step(name, line, when, "not-needed", why=NOT_NEEDED[name]))
        else:
            patch = handlers.get(name, "")
            fix = f"{patch} handles it: {Way('apply')}" if patch else "no patch covers it"
            steps.append(Step(name, line, when, "skipped", patch, fix))
            end_line, end_name = end if end is not None else (1, "none")
            findings.append(
                Finding(
                    KIND,
                    GENERATOR,
                    end_line,
                    name,
                    f"vLLM's engine core makes this step{f' (when {when})' if when else ''} and the generator, "
                    f"whose set-up ends with {end_name}, never does: {fix}",
                    CORE,
                    line,
                    f"self.model_executor.{name}(...)"
                    if not name.startswith("rpc:")
                    else f'self.collective_rpc("{name[4:]}", ...)',
                    "error",
                    name,
                )
            )
    return LifecycleCheck(steps, calls, end, findings)


class Lifecycle(Check):
    """The engine core's set-up steps against the generator's (``check``), as one of ``verify``'s checks."""

    key = "lifecycle"
    failing = "the engine's life cycle"
    reads = FILES

    def ask(self, snap: Snapshot) -> dict:
        return {"symbols": [["vllm.v1.engine.core", "EngineCore"], ["vllm.v1.executor.abstract", "Executor"]]}

    def judge(self, found: Found) -> LifecycleCheck | None:
        snap = found.snap
        if snap.training_only:  # no vLLM: no engine core to read
            return None
        return check(found.calls.vllm or {}, snap.files.get(GENERATOR), snap.applicable, found.present)

    def render(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        """vLLM's engine-core set-up steps against the generator's: a summary, then each
        skipped step with both file:lines and the patch that handles it."""
        from rich.markup import escape

        life = install.parts.get(self.key)
        if life is None:
            return
        count = {how: sum(s.how == how for s in life.steps) for how in ("made", "handled", "not-needed")}
        title = (
            f"engine life cycle ({len(life.steps)} steps vLLM's engine core makes on its executor, static): "
            f"{count['made']} made by the generator, {count['handled']} handled by patches, "
            f"{count['not-needed']} not needed for it"
        )
        console.print(f"{title}" + (f", [red]{len(life.findings)} skipped[/]" if life.findings else ""))
        for f in life.findings:
            console.print(f"  [red]break[/] {escape(f'{f.where}: {f.call}: {f.detail}')}")
            console.print(f"        vLLM {escape(f'{f.vllm_where}: {f.vllm_found}')}")

    def render_failed(self, console: Console, install: InstallCheck, snap: Snapshot) -> None:
        if not self.ok(install.parts.get(self.key)):
            self.render(console, install, snap)


CHECK = Lifecycle()
