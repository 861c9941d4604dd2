"""Which model runner vLLM's GPU worker builds, and whether hidden-state capture works with it.

vLLM's GPU worker (vllm/v1/worker/gpu_worker.py, ``Worker.__init__``) builds the V1 runner
(vllm/v1/worker/gpu_model_runner.py) or Model Runner V2 (vllm/v1/worker/gpu/model_runner.py):
- 0.11: V1 only (no switch);
- 0.12-0.21: V2 when ``VLLM_USE_V2_MODEL_RUNNER`` is set and true
  (``self.use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER``);
- 0.22-0.33: ``VllmConfig.use_v2_model_runner`` (vllm/config/vllm.py) decides: the
  variable when set, else vLLM's own choice -- V2 for the architectures in
  ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (0.22: Qwen3; 0.24: Llama, DeepSeek-V2, ...), and
  from 0.29 (no such list) V2 for every model unless a feature it lacks is used;
- 0.34 and later: V2 only. The V1 runner is removed, the worker imports V2's
  ``GPUModelRunner`` in ``_make_model_runner``, and vLLM refuses the variable at any value
  but 1 (``Platform.validate_environ``, vllm/platforms/interface.py).
A worker without the switch is read for the one runner it imports (``_only_runner``).
vLLM's CPU worker builds the V1 runner up to 0.33 (V2 with the variable at 1 from 0.24) and V2
from 0.34.

Capture splits each step per request from the runner's batch: V1's ``input_batch`` or V2's
per-step ``InputBatch`` in ``execute_model_state`` (the patches with ``runner_batch`` ``v1``
and ``v2``: patches/sp010_per_request_capture.py, patches/sp022_model_runner_v2_capture.py).
Whether the installed worker extension reads V2's batch is read from its source
(``reads_v2_batch``).

``verify`` cannot see the training job's environment, only its own (the agent's, on the
target), so the finding says which runner a job with that environment gets, with evidence
(file:line where vLLM decides), and whether capture works with it: an ``error`` only when
the variable selects V2 here and the worker cannot read V2's batch; a ``warning`` when vLLM
may pick V2 by itself and the worker cannot read it; otherwise a ``note``.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass
from typing import Mapping

from patcher import cache
from patcher.digest import tool as tool_digest
from patcher.ways import Way

VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"
WORKER = "vllm/v1/worker/gpu_worker.py"
CONFIG = "vllm/config/vllm.py"
EXTENSION = "speculators/data_generation/custom_worker.py"


def _fix(patch: str | None) -> str:
    """The way out when the worker extension cannot read V2's batch: ``patch`` makes it read
    it (the ``runner_batch="v2"`` patch written for the installed speculators: 0.3.0 has one), or
    none is written for the installed speculators."""
    if patch:
        return f"set {VARIABLE}=0 in the job's environment, or run {Way('apply')} ({patch})"
    return f"set {VARIABLE}=0 in the job's environment (no patch here reads V2's batch for this speculators)"


CANNOT = (
    "the installed worker extension does not split captures by Model Runner V2's batch, so under V2 "
    "capture stops at setup or returns hidden states attributed to the wrong prompts"
)


@dataclass(frozen=True)
class RunnerCheck:
    """``severity``: ``error`` (fails verify), ``warning`` or ``note`` (do not).
    ``runner``: what a GPU job with verify's environment gets: ``v1``, ``v2`` or ``by-model``
    (vLLM's choice per architecture, ``v2_for`` lists them; empty: every model it supports).
    ``capture_v2``: the installed worker extension reads Model Runner V2's batch."""

    severity: str
    message: str
    file: str
    line: int
    found: str
    runner: str = "v1"
    v2_for: tuple[str, ...] = ()
    capture_v2: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def as_dict(self) -> dict:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "found": self.found,
            "variable": VARIABLE,
            "runner": self.runner,
            "v2_for": list(self.v2_for),
            "capture_v2": self.capture_v2,
        }


def _switch(tree: ast.Module) -> ast.Assign | None:
    """``self.use_v2_model_runner = ...`` in the worker (the first one)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
            and node.targets[0].attr == "use_v2_model_runner"
        ):
            return node
    return None


def _default_architectures(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES" for t in node.targets
        ):
            return sorted(
                n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            )
    return None


def _config_property(tree: ast.Module) -> ast.FunctionDef | None:
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "VllmConfig":
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "use_v2_model_runner":
                    return fn
    return None


V1_MODULE, V2_MODULE = "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"


def _only_runner(tree: ast.Module) -> tuple[str, ast.ImportFrom] | None:
    """``("v1" | "v2", the import)`` when the worker imports ``GPUModelRunner`` from one runner's
    module only (0.11: V1; 0.34 on: V2), else None."""
    found: dict[str, ast.ImportFrom] = {}
    for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in (V1_MODULE, V2_MODULE)
                and any(a.name == "GPUModelRunner" for a in node.names)
            ):
                # the import inside the method that builds the runner is the evidence, if any
                found["v1" if node.module == V1_MODULE else "v2"] = node
    return next(iter(found.items())) if len(found) == 1 else None


def _env_says(value: str | None) -> bool | None:
    """What vLLM makes of the variable: True (V2), False (V1), None (unset: vLLM decides)."""
    if value is None or value.strip() == "":
        return None
    return value.strip().lower() not in ("0", "false", "no", "off")


def reads_v2_batch(extension: bytes | None) -> bool:
    """Whether the worker extension's source reads Model Runner V2's per-step batch
    (``execute_model_state``, as an attribute or a ``getattr`` name), as the ``runner_batch="v2"``
    patch emits."""
    if extension is None:
        return False
    try:
        tree = ast.parse(extension)
    except SyntaxError:
        return False
    return any(
        (isinstance(n, ast.Attribute) and n.attr == "execute_model_state")
        or (isinstance(n, ast.Constant) and n.value == "execute_model_state")
        for n in ast.walk(tree)
    )


def check(
    files: Mapping[str, bytes | None], env_value: str | None, extension: bytes | None = None, fix: str | None = None
) -> RunnerCheck | None:
    """None when this vLLM's worker has no V2 switch (0.11) or it cannot be read.
    ``files``: vLLM's ``WORKER`` and ``CONFIG`` sources; ``extension``: the installed
    ``EXTENSION`` source; ``fix``: the patch that makes it read V2's batch for the installed
    speculators (None: there is none). The answer is a function of those and ``env_value``; it
    is kept in the controller cache under their digests (parsing the worker took ~10 ms per
    host and run)."""
    sources = [files.get(WORKER), files.get(CONFIG), extension]
    digests = [None if s is None else hashlib.sha256(s).hexdigest() for s in sources]
    key = cache.key(["model-runner", tool_digest(), digests, env_value, fix])  # a cached answer is this code's
    stored = cache.load("model-runner", key)
    if isinstance(stored, dict) and "check" in stored:
        found = stored["check"]
        return None if found is None else RunnerCheck(**{**found, "v2_for": tuple(found.get("v2_for", ()))})
    found = _check(files, env_value, reads_v2_batch(extension), _fix(fix))
    cache.store("model-runner", key, {"check": None if found is None else asdict(found)})
    return found


def _check(files: Mapping[str, bytes | None], env_value: str | None, capture_v2: bool, fix: str) -> RunnerCheck | None:
    data = files.get(WORKER)
    if data is None:
        return None
    try:
        tree = ast.parse(data)
    except SyntaxError:
        return None
    switch = _switch(tree)
    if switch is None:
        return _one_runner(tree, env_value, capture_v2, fix)
    found = ast.unparse(switch).strip()
    chosen = _env_says(env_value)
    shown = f"{VARIABLE}={env_value}" if env_value is not None else f"{VARIABLE} unset"
    if chosen is not None:
        return _chosen_by_variable(chosen, shown, switch.lineno, found, capture_v2, fix)
    return _chosen_by_vllm(files.get(CONFIG), shown, switch.lineno, found, capture_v2, fix)


def _chosen_by_variable(chosen: bool, shown: str, line: int, found: str, capture_v2: bool, fix: str) -> RunnerCheck:
    """The variable is set here: it picks the runner (``chosen``: V2) at the worker's switch
    (``WORKER``:``line``, whose code is ``found``)."""
    runner = "v2" if chosen else "v1"
    if not chosen:
        return RunnerCheck(
            "note",
            f"{shown} here: a GPU job with this environment gets the V1 model runner; "
            "hidden-state capture works with it",
            WORKER,
            line,
            found,
            runner,
            capture_v2=capture_v2,
        )
    if capture_v2:
        return RunnerCheck(
            "note",
            f"{shown} here: a GPU job with this environment gets Model Runner V2; hidden-state capture works with it",
            WORKER,
            line,
            found,
            runner,
            capture_v2=True,
        )
    return RunnerCheck(
        "error",
        f"{shown} here: a GPU job with this environment gets Model Runner V2, and {CANNOT}. {fix}",
        WORKER,
        line,
        found,
        runner,
    )


def _chosen_by_vllm(config: bytes | None, shown: str, line: int, found: str, capture_v2: bool, fix: str) -> RunnerCheck:
    """The variable is unset here: V1 where only the variable selects V2 (0.12-0.21), else
    what ``VllmConfig.use_v2_model_runner`` (``config``, vLLM's ``CONFIG``) picks by itself."""
    prop, default = None, None
    if "vllm_config.use_v2_model_runner" in found and config is not None:
        try:
            tree = ast.parse(config)
            prop, default = _config_property(tree), _default_architectures(tree)
        except SyntaxError:
            pass
    if prop is None:  # 0.12-0.21: V2 only when the variable says so
        tail = (
            "either runner works with capture"
            if capture_v2
            else f"a job that sets {VARIABLE}=1 on GPU stops at capture setup"
        )
        return RunnerCheck(
            "note",
            f"{shown} here: a GPU job gets the V1 model runner (Model Runner V2 only when {VARIABLE}=1); {tail}",
            WORKER,
            line,
            found,
            "v1",
            capture_v2=capture_v2,
        )
    which = (
        f"Model Runner V2 for {', '.join(default)} and V1 for other models"
        if default
        else "Model Runner V2 for every model (V1 where a feature V2 lacks is used)"
    )
    evidence = f"VllmConfig.use_v2_model_runner, read at {WORKER}:{line}"
    runner = "by-model" if default else "v2"
    if capture_v2:
        return RunnerCheck(
            "note",
            f"{shown} here: on GPU vLLM builds {which}; hidden-state capture works with both",
            CONFIG,
            prop.lineno,
            evidence,
            runner,
            tuple(default or ()),
            True,
        )
    return RunnerCheck(
        "warning",
        f"{shown} here: on GPU vLLM builds {which}; {CANNOT}. {fix}",
        CONFIG,
        prop.lineno,
        evidence,
        runner,
        tuple(default or ()),
    )


def _one_runner(tree: ast.Module, env_value: str | None, capture_v2: bool, fix: str) -> RunnerCheck | None:
    """A worker with no switch builds the one runner it imports: V1 (0.11) or Model Runner V2
    (0.34 on, where vLLM refuses ``VLLM_USE_V2_MODEL_RUNNER`` at any value but 1)."""
    only = _only_runner(tree)
    if only is None:
        return None
    kind, node = only
    found = " ".join(ast.unparse(node).split())
    if kind == "v1":
        return RunnerCheck(
            "note",
            "a GPU job gets the V1 model runner, the only one in this vLLM; hidden-state capture works with it",
            WORKER,
            node.lineno,
            found,
            "v1",
        )
    which = "a GPU job gets Model Runner V2, the only runner since vLLM 0.34"
    refused = (
        (
            f"; {VARIABLE}={env_value} here, which this vLLM refuses at start (any value but 1; "
            "vllm/platforms/interface.py): unset it"
        )
        if _env_says(env_value) is False
        else ""
    )
    if capture_v2:
        return RunnerCheck(
            "warning" if refused else "note",
            f"{which}; hidden-state capture works with it{refused}",
            WORKER,
            node.lineno,
            found,
            "v2",
            capture_v2=True,
        )
    way_out = fix.split(", or ", 1)[1] if ", or " in fix else "no patch here reads V2's batch for this speculators"
    return RunnerCheck("error", f"{which}, and {CANNOT}: {way_out}{refused}", WORKER, node.lineno, found, "v2")
