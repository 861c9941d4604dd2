"""SP009: capture hidden states with forward hooks on the decoder layers.

speculators 0.3.0 replaces the inner model's forward() with its own copy
(``_patched_forward``) that calls every layer as ``layer(hidden_states=, positions=,
residual=)``. That copy drifts from vLLM's: DeepseekV2Model.forward
(vllm/model_executor/models/deepseek_v2.py, >= 0.12) passes a fourth argument,
``llama_4_scaling`` (set by Kimi-K2.5's config), which the copy drops, silently changing
the hidden states; forwards also take extra keyword arguments (Qwen3-VL's deepstack
embeddings) the copy's signature rejects.

The emitted code leaves the model's forward alone and registers a forward hook on each
target decoder layer (only on tensor-parallel rank 0, as before). A layer returns
``(hidden_states, residual)``; the hook stores their sum, the residual stream after the
layer, exactly what the replacement forward captured. Captures keep 0.3.0's layout: one
list per target layer in ascending layer order, one tensor per forward pass. Works for any
model whose decoder layers sit in ``.layers`` (Llama/Qwen, DeepseekV2/V3, and the text
model of wrappers found through get_language_model() by SP008).
"""

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import RemoveImportsVisitor

from patcher.fixes.cst_helpers import calls_to, code_digest, same_code
from patcher.fixes.patch import Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import method_defined

REPLACEMENT_FORWARD = m.FunctionDef(name=m.Name("_patched_forward"))
STORE_METHOD = m.FunctionDef(name=m.Name("_store_captured_states"))
# base_model.forward = types.MethodType(_patched_forward, base_model)
BIND_FORWARD = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(value=m.Name("base_model"), attr=m.Name("forward")))])]
)
# base_model._extension = self  (only the replacement forward read it)
BIND_EXTENSION = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(value=m.Name("base_model"), attr=m.Name("_extension")))])]
)
REGISTER = "self._register_capture_hooks(base_model)\n"
# What the codemod deletes or replaces whole must be speculators 0.3.0's, unedited (a hand
# edit in it would be lost): the code_digest (patcher.fixes.cst_helpers) of each function,
# the forward as 0.3.0 ships it and as SP007 leaves it; and the two statements, exactly.
FORWARD_DIGESTS = ("808381b04673c9cc", "ab0bc91bd7e8408e")
STORE_DIGESTS = ("5f11eccb598f5bed",)
BIND_FORWARD_CODE = "base_model.forward = types.MethodType(_patched_forward, base_model)"
BIND_EXTENSION_CODE = "base_model._extension = self"

# Methods as they appear in the class (parsed inside it, so docstrings keep their indent).
HOOK_METHODS = '''\
class HiddenStatesWorkerExtension:
    def _register_capture_hooks(self, base_model):
        """Capture the target layers' outputs with forward hooks on the decoder layers.

        The model's own forward runs unchanged, so every argument it passes to its layers
        (e.g. DeepSeek's llama_4_scaling) keeps its effect. Only TP rank 0 captures: all
        ranks hold the same hidden states.
        """
        for handle in getattr(self, "_capture_hooks", ()):
            handle.remove()
        self._capture_hooks = []
        if get_tp_group().rank_in_group != 0:
            return
        start = getattr(base_model, "start_layer", 0)
        end = getattr(base_model, "end_layer", len(base_model.layers))

        def hook_for(layer_id):
            return lambda module, args, output: self._capture_layer_output(layer_id, output)

        for layer_id in sorted(self._layer_ids):
            if start <= layer_id < end:
                layer = base_model.layers[layer_id]
                self._capture_hooks.append(layer.register_forward_hook(hook_for(layer_id)))

    def _capture_layer_output(self, layer_id, output):
        """Store a decoder layer's output: hidden_states + residual (one tensor per pass)."""
        hidden_states, residual = output if isinstance(output, tuple) else (output, None)
        captured = hidden_states if residual is None else hidden_states + residual
        layer_ids = sorted(self._layer_ids)
        if self._captured_states is None:  # type: ignore[has-type]
            self._captured_states = [[] for _ in layer_ids]
        self._captured_states[layer_ids.index(layer_id)].append(captured)
'''

UNUSED_AFTER = (
    ("types", None),
    ("itertools", "islice"),
    ("vllm.distributed", "get_pp_group"),
    ("vllm.sequence", "IntermediateTensors"),
)


class LayerHookCapture(PatchCodemod):
    DESCRIPTION = "replacement _patched_forward -> forward hooks on the target decoder layers"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        has_forward = bool(m.findall(tree, REPLACEMENT_FORWARD))
        if not has_forward and calls_to(tree, "_register_capture_hooks"):
            self.already_satisfied("hidden states are captured by forward hooks on the layers")
        shape = (
            "def _patched_forward(...), a method _store_captured_states and "
            "'base_model.forward = types.MethodType(_patched_forward, base_model)'"
        )
        if not (has_forward and m.findall(tree, STORE_METHOD) and m.findall(tree, BIND_FORWARD)):
            self.refuse(None, shape)
        for node in m.findall(tree, REPLACEMENT_FORWARD):
            if code_digest(node) not in FORWARD_DIGESTS:
                self.refuse(node, "speculators 0.3.0's _patched_forward, unedited (SP009 removes it)")
        for node in m.findall(tree, STORE_METHOD):
            if code_digest(node) not in STORE_DIGESTS:
                self.refuse(node, "speculators 0.3.0's _store_captured_states, unedited (SP009 replaces it)")
        for matcher, code in ((BIND_FORWARD, BIND_FORWARD_CODE), (BIND_EXTENSION, BIND_EXTENSION_CODE)):
            for node in m.findall(tree, matcher):
                if not same_code(node, code):
                    self.refuse(node, f"'{code}'")
        for module, name in UNUSED_AFTER:
            if name is None:
                RemoveImportsVisitor.remove_unused_import(self.context, module)
            else:
                RemoveImportsVisitor.remove_unused_import(self.context, module, name)
        return tree.visit(_Rewrite(tree.default_newline))


class _Rewrite(cst.CSTTransformer):
    def __init__(self, newline: str) -> None:
        super().__init__()
        self.newline = newline  # the docstrings span lines: keep CRLF files CRLF

    def leave_FunctionDef(self, original, updated):
        if m.matches(updated, REPLACEMENT_FORWARD):
            return cst.RemoveFromParent()
        if m.matches(updated, STORE_METHOD):
            code = HOOK_METHODS.replace("\n", self.newline)
            methods = list(cst.ensure_type(cst.parse_module(code).body[0], cst.ClassDef).body.body)
            methods[0] = methods[0].with_changes(leading_lines=updated.leading_lines)
            return cst.FlattenSentinel(methods)
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if m.matches(updated, BIND_EXTENSION):
            return cst.RemoveFromParent()
        if m.matches(updated, BIND_FORWARD):
            return cst.parse_statement(REGISTER).with_changes(leading_lines=updated.leading_lines)
        return updated


PATCH = Patch(
    id="SP009",
    name="layer-hook-capture",
    version=1,
    title="Capture via forward hooks on the decoder layers (no replacement forward)",
    risk="DeepSeek's llama_4_scaling is dropped by the replacement forward: hidden states silently differ",
    file="speculators/data_generation/custom_worker.py",
    codemod=LayerHookCapture,
    facts=(
        VllmFact(
            summary="DeepseekV2DecoderLayer.forward takes llama_4_scaling (a replacement forward drops it)",
            symbol="DeepseekV2DecoderLayer.forward",
            first_release="0.12.0",
            probe=method_defined(
                "vllm/model_executor/models/deepseek_v2.py", "DeepseekV2DecoderLayer.forward", "llama_4_scaling"
            ),
        ),
    ),
    order=90,
    portable=True,
)
