"""How the installed vLLM serves an EAGLE-3 draft, read from its source with ``ast`` (no import):
which hidden state its verifier models hand the draft as auxiliary layer ``i``, the layers it
picks when the draft names none, and what it makes of a speculators-format draft.

Read from every vLLM release 0.11-0.34 (the wheels' ``.py`` files):

- **Numbering.** Auxiliary layer ``i`` is the hidden state (``hidden_states + residual``) that
  *enters* decoder layer ``i``: taken before the layer runs (``if idx in
  self.aux_hidden_state_layers`` ahead of ``layer(...)``: llama.py 0.11-0.17, deepseek_v2.py
  0.18-0.34) or after layer ``idx`` as ``idx + 1`` (``self._maybe_add_hidden_state(aux, idx + 1,
  ...)``: llama.py from 0.18, qwen2.py, qwen3_moe.py). Never the output of layer ``i``: no release
  changed it. Layer ``num_layers`` (the state after the last layer) exists only where a
  model takes one after its loop (the ``idx + 1`` form, or deepseek_v2.py's ``self.end_layer in
  self.aux_hidden_state_layers`` in 0.34). speculators' generator numbers by output
  (data_generation/custom_worker.py: captured after ``layer(...)``): its layer ``i`` is vLLM's
  ``i + 1``.
- **Defaults**, when the draft's config has no ``eagle_aux_hidden_state_layer_ids``:
  ``(2, num_layers // 2, num_layers - 3)``, from each model's
  ``get_eagle3_aux_hidden_state_layers`` up to 0.17 and from ``SupportsEagle3.
  get_eagle3_default_aux_hidden_state_layers`` (models/interfaces.py) from 0.18.
- **A speculators draft** (``config.json`` with ``speculators_model_type``):
  ``vllm/transformers_utils/configs/speculators/algos.py`` registers one function per method
  (``@register_speculator("eagle3")``), which names the draft's architecture
  (``Eagle3LlamaForCausalLM``; from 0.24 by the layer config's ``model_type``: llama or qwen3)
  and, from 0.12, copies ``eagle_aux_hidden_state_layer_ids`` into the config the engine reads
  (0.11 drops it: the draft is served vLLM's defaults whatever it records).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from patcher.fixes.library_source import LibrarySource

MODELS = "vllm/model_executor/models"
LLAMA = f"{MODELS}/llama.py"
INTERFACES = f"{MODELS}/interfaces.py"
REGISTRY = f"{MODELS}/registry.py"
SPECULATORS_ALGOS = "vllm/transformers_utils/configs/speculators/algos.py"
AUX_LAYERS = "aux_hidden_state_layers"
ADD_STATE = "_maybe_add_hidden_state"
DEFAULT_GETTERS = ("get_eagle3_default_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers")


@dataclass(frozen=True)
class AuxCapture:
    """Where one vLLM model module takes EAGLE-3 auxiliary hidden states.

    Attributes:
        file: the module, relative to site-packages (``vllm/model_executor/models/llama.py``).
        line: the line of its first capture in a layer loop (None: none found).
        numbering: ``input`` (layer ``i`` = the hidden state entering decoder layer ``i``),
            ``output`` (= the output of layer ``i``), ``mixed`` or ``none`` (no capture).
        final_state: layer ``num_layers``, the state after the last decoder layer, is taken.
        found: the capture's code, one line, for evidence.
    """

    file: str
    line: int | None
    numbering: str
    final_state: bool
    found: str


def _is_aux_layers(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == AUX_LAYERS


def _loop_names(loop: ast.For) -> tuple[str, str] | None:
    """(index, layer) of ``for idx, layer in enumerate(...)``, else None."""
    target, it = loop.target, loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate"):
        return None
    if isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(e, ast.Name) for e in target.elts):
        return target.elts[0].id, target.elts[1].id
    return None


def _offset(node: ast.AST, index: str) -> int | None:
    """``idx`` -> 0, ``idx + k`` -> k, anything else -> None."""
    if isinstance(node, ast.Name) and node.id == index:
        return 0
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and node.left.id == index
        and isinstance(node.right, ast.Constant)
        and isinstance(node.right.value, int)
    ):
        return node.right.value
    return None


def _captured_id(stmt: ast.stmt, index: str) -> int | None:
    """The offset from the loop index of the auxiliary layer ``stmt`` takes: ``if idx + k in
    self.aux_hidden_state_layers: ...`` or ``self._maybe_add_hidden_state(aux, idx + k, ...)``."""
    if isinstance(stmt, ast.If):
        test = stmt.test
        if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.In) and _is_aux_layers(test.comparators[0]):
            return _offset(test.left, index)
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == ADD_STATE:
            if len(node.args) >= 2:
                return _offset(node.args[1], index)
    return None


def _calls_layer(stmt: ast.stmt, layer: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == layer for n in ast.walk(stmt))


def _loop_captures(loop: ast.For) -> list[tuple[str, ast.stmt, bool]]:
    """The captures in one layer loop: (numbering ``input``/``output``/``mixed``, the statement,
    whether it takes the state after the layer that just ran as ``idx + 1``, which reaches
    ``num_layers`` on the last one)."""
    names = _loop_names(loop)
    if names is None:
        return []
    index, layer = names
    found, ran = [], False
    for stmt in loop.body:
        offset = _captured_id(stmt, index)
        if offset is None:
            ran = ran or _calls_layer(stmt, layer)
            continue
        entering = offset - (1 if ran else 0)  # the layer whose input the captured state is
        kind = "input" if entering == 0 else "output" if entering == -1 else "mixed"
        found.append((kind, stmt, ran and offset == 1))
    return found


def _takes_final_state(tree: ast.AST) -> bool:
    """A capture of the state after the last layer: ``self.end_layer in self.aux_hidden_state_layers``
    (or ``len(self.layers) in ...``) outside a loop."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) and _is_aux_layers(node.comparators[0]):
            left = node.left
            if isinstance(left, ast.Attribute) and left.attr == "end_layer":
                return True
            if isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "len":
                return True
    return False


def aux_capture(src: LibrarySource, path: str) -> AuxCapture:
    """How the model module ``path`` numbers EAGLE-3 auxiliary hidden states (``AuxCapture``);
    ``numbering`` ``none`` when the file is missing or takes none. Raises ``KeyError`` when
    ``path`` was not fetched (``LibrarySource.tree``)."""
    tree = src.tree(path)
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For)] if tree else []
    captures = [c for loop in loops for c in _loop_captures(loop)]
    if not captures:
        return AuxCapture(path, None, "none", False, "no EAGLE-3 auxiliary hidden-state capture in a layer loop")
    kinds = {kind for kind, _, _ in captures}
    numbering = kinds.pop() if len(kinds) == 1 else "mixed"
    first = captures[0][1]
    final = _takes_final_state(tree) or any(last for _, _, last in captures)
    code = ast.unparse(first.test if isinstance(first, ast.If) else first).strip().splitlines()[0]
    return AuxCapture(path, first.lineno, numbering, final, code)


@dataclass(frozen=True)
class DefaultLayers:
    """The auxiliary layers vLLM serves a draft whose config names none: ``expression`` (the
    returned tuple's source, e.g. ``(2, num_layers // 2, num_layers - 3)``) at ``file:line``."""

    file: str
    line: int
    expression: str
    node: ast.expr

    def for_depth(self, layers: int) -> tuple[int, ...] | None:
        """The tuple for a verifier of ``layers`` decoder layers (every name in the expression
        stands for that count); None when the expression is not plain integer arithmetic."""
        try:
            return tuple(_evaluate(e, layers) for e in self.node.elts) if isinstance(self.node, ast.Tuple) else None
        except ValueError:
            return None


def _evaluate(node: ast.expr, layers: int) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return layers
    if isinstance(node, ast.BinOp):
        a, b = _evaluate(node.left, layers), _evaluate(node.right, layers)
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.FloorDiv: a // b if b else None}
        value = ops.get(type(node.op))
        if value is not None:
            return value
    raise ValueError(ast.unparse(node))


def _returned_tuple(fn: ast.FunctionDef) -> ast.Return | None:
    return next(
        (n for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)),
        None,
    )


def default_layers(src: LibrarySource, modules: tuple[str, ...]) -> DefaultLayers | None:
    """The defaults vLLM gives a verifier defined in ``modules`` (its own module first, then
    those it builds on): ``get_eagle3_default_aux_hidden_state_layers`` there or in
    interfaces.py (vLLM 0.18 on), else the model's own ``get_eagle3_aux_hidden_state_layers``
    (up to 0.17); None when none returns a tuple. Every path must have been fetched."""
    for name in DEFAULT_GETTERS:
        for path in (*modules, INTERFACES):
            tree = src.tree(path)
            for node in ast.walk(tree) if tree else ():
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    ret = _returned_tuple(node)
                    if ret is not None:
                        return DefaultLayers(path, ret.lineno, ast.unparse(ret.value), ret.value)
    return None


@dataclass(frozen=True)
class SpeculatorsMethod:
    """What vLLM's ``algos.py`` does with a speculators draft of one ``speculators_model_type``.

    Attributes:
        name: the type (``eagle3``); vLLM serves it with the method of that name.
        line: its ``@register_speculator`` line in ``SPECULATORS_ALGOS``.
        architectures: layer ``model_type`` -> draft architecture (``""``: any model type).
        default_model_type: the ``model_type`` assumed when the layer config names none.
        architecture_line: where the architecture is set.
        aux_ids_line: where the draft's ``eagle_aux_hidden_state_layer_ids`` is passed on
            (None: dropped, vLLM then serves its defaults).
    """

    name: str
    line: int
    architectures: dict[str, str]
    default_model_type: str
    architecture_line: int | None
    aux_ids_line: int | None


def speculators_methods(src: LibrarySource) -> dict[str, SpeculatorsMethod]:
    """Every speculators draft type the installed vLLM registers ({} when algos.py is missing)."""
    tree = src.tree(SPECULATORS_ALGOS)
    found = {}
    for fn in tree.body if tree else ():
        if not isinstance(fn, ast.FunctionDef):
            continue
        for dec in fn.decorator_list:
            if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "register_speculator" and dec.args:
                name = getattr(dec.args[0], "value", None)
                if isinstance(name, str):
                    found[name] = _method(fn, name, dec.lineno)
    return found


def _method(fn: ast.FunctionDef, name: str, line: int) -> SpeculatorsMethod:
    maps = {
        t.id: n.value
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    archs: dict[str, str] = {}
    arch_line = aux_line = None
    for n in ast.walk(fn):
        if not (isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript)):
            continue
        key = getattr(n.targets[0].slice, "value", None)
        if key == "eagle_aux_hidden_state_layer_ids":
            aux_line = n.lineno
        if key == "architectures" and isinstance(n.value, ast.List) and len(n.value.elts) == 1:
            arch_line, elt = n.lineno, n.value.elts[0]
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                archs = {"": elt.value}
            elif isinstance(elt, ast.Subscript) and isinstance(elt.value, ast.Name) and elt.value.id in maps:
                table = maps[elt.value.id]
                archs = {
                    k.value: v.value
                    for k, v in zip(table.keys, table.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                }
    default = "llama"
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "get" and len(n.args) == 2:
            if getattr(n.args[0], "value", None) == "model_type" and isinstance(n.args[1], ast.Constant):
                default = n.args[1].value
    return SpeculatorsMethod(name, line, archs, default, arch_line, aux_line)


def model_module(src: LibrarySource, architecture: str) -> tuple[str, str, int] | None:
    """(module path, class, registry line) vLLM loads for a verifier ``architecture``
    (``LlamaForCausalLM`` -> ``vllm/model_executor/models/llama.py``), from the literal tables
    of registry.py; None when it names no such architecture."""
    tree = src.tree(REGISTRY)
    for node in ast.walk(tree) if tree else ():
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == architecture and isinstance(value, ast.Tuple):
                parts = [getattr(e, "value", None) for e in value.elts]
                if len(parts) == 2 and all(isinstance(p, str) for p in parts):
                    return f"{MODELS}/{parts[0]}.py", parts[1], key.lineno
    return None


def sibling_imports(src: LibrarySource, path: str) -> list[str]:
    """The model modules ``path`` imports from (``from .qwen2 import Qwen2Model``,
    ``from vllm.model_executor.models.llama import ...``), in order: where a model that only
    subclasses another takes its hidden states."""
    tree = src.tree(path)
    found: list[str] = []
    for node in tree.body if tree else ():
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.level == 1 and "." not in node.module:
            name = node.module
        elif node.level == 0 and node.module.startswith("vllm.model_executor.models."):
            name = node.module.rsplit(".", 1)[1]
        else:
            continue
        module = f"{MODELS}/{name}.py"
        if name not in ("interfaces", "utils", "registry") and module not in found:
            found.append(module)
    return found
