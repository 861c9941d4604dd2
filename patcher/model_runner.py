"""Which model runner vLLM's GPU worker builds, and whether hidden-state capture can work.

The patched worker (SP010) lays out each step's captures by the model runner's
``input_batch``, which only the V1 runner (vllm/v1/worker/gpu_model_runner.py) has. vLLM's
GPU worker (vllm/v1/worker/gpu_worker.py, ``Worker.__init__``) builds Model Runner V2
(vllm/v1/worker/gpu/model_runner.py, no ``input_batch``) instead:
- 0.13-0.21: when ``VLLM_USE_V2_MODEL_RUNNER`` is a non-zero integer
  (``self.use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER``);
- 0.22 and later: when ``VllmConfig.use_v2_model_runner`` (vllm/config/vllm.py) says so: the
  variable when set (``1``/``0``), else vLLM's own choice, V2 for the architectures in
  ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` (0.22: Qwen3; 0.24: Llama, DeepSeek-V2/V3, ...).
vLLM's CPU worker always builds the V1 runner (it ignores the variable).

``verify`` cannot see the training job's environment, only its own (the agent's, on the
target). So the finding is a condition with evidence (file:line where vLLM reads the
switch): an error only when the variable selects V2 in verify's own environment; a warning
when vLLM may pick V2 by itself and the variable does not say ``0``; otherwise a note.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from patcher import cache

VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"
WORKER = "vllm/v1/worker/gpu_worker.py"
CONFIG = "vllm/config/vllm.py"
FIX = f"set {VARIABLE}=0 in the job's environment"
_CODE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # a cached answer is this code's


@dataclass(frozen=True)
class RunnerCheck:
    """``severity``: ``error`` (fails verify), ``warning`` or ``note`` (do not)."""

    severity: str
    message: str
    file: str
    line: int
    found: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def as_dict(self) -> dict:
        return {"severity": self.severity, "message": self.message, "file": self.file, "line": self.line,
                "found": self.found, "variable": VARIABLE}


def _switch(tree: ast.Module) -> ast.Assign | None:
    """``self.use_v2_model_runner = ...`` in the worker (the first one)."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "use_v2_model_runner"):
            return node
    return None


def _default_architectures(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"
                                                  for t in node.targets)):
            return sorted(n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return None


def _config_property(tree: ast.Module) -> ast.FunctionDef | None:
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == "VllmConfig":
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "use_v2_model_runner":
                    return fn
    return None


def _env_says(value: str | None) -> bool | None:
    """What vLLM makes of the variable: True (V2), False (V1), None (unset: vLLM decides)."""
    if value is None or value.strip() == "":
        return None
    return value.strip().lower() not in ("0", "false", "no", "off")


def check(files: Mapping[str, bytes | None], env_value: str | None) -> RunnerCheck | None:
    """None when this vLLM's worker has no V2 switch (0.11, 0.12) or it cannot be read.
    The answer is a function of the two files' bytes and ``env_value``; it is kept in the
    controller cache under their digests (parsing the worker took ~10 ms per host and run)."""
    digests = [None if files.get(f) is None else hashlib.sha256(files[f]).hexdigest() for f in (WORKER, CONFIG)]
    key = cache.key(["model-runner", _CODE, digests, env_value])
    stored = cache.load("model-runner", key)
    if isinstance(stored, dict) and "check" in stored:
        return None if stored["check"] is None else RunnerCheck(**stored["check"])
    found = _check(files, env_value)
    cache.store("model-runner", key, {"check": None if found is None else asdict(found)})
    return found


def _check(files: Mapping[str, bytes | None], env_value: str | None) -> RunnerCheck | None:
    data = files.get(WORKER)
    if data is None:
        return None
    try:
        switch = _switch(ast.parse(data))
    except SyntaxError:
        return None
    if switch is None:
        return None
    found = ast.unparse(switch).strip()
    chosen = _env_says(env_value)
    shown = f"{VARIABLE}={env_value}" if env_value is not None else f"{VARIABLE} unset"
    if chosen:
        return RunnerCheck("error", f"{shown} here: vLLM's GPU worker builds Model Runner V2, which has no "
                           f"input_batch; hidden-state capture stops at setup. {FIX}", WORKER, switch.lineno, found)
    prop, default = None, None
    config = files.get(CONFIG)
    if "vllm_config.use_v2_model_runner" in found and config is not None:
        try:
            tree = ast.parse(config)
            prop, default = _config_property(tree), _default_architectures(tree)
        except SyntaxError:
            pass
    if prop is not None and chosen is None:
        which = f"for {', '.join(default)}" if default else "for every model it supports"
        return RunnerCheck("warning", f"{shown} here: vLLM picks Model Runner V2 (no input_batch) by itself {which} "
                           f"on GPU; hidden-state capture then stops at setup. {FIX}", CONFIG, prop.lineno,
                           f"VllmConfig.use_v2_model_runner, read at {WORKER}:{switch.lineno}")
    return RunnerCheck("note", f"{shown} here: capture needs the V1 model runner; a job that sets {VARIABLE}=1 on "
                       "GPU stops at capture setup", WORKER, switch.lineno, found)
