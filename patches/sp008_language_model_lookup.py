"""SP008: reach the text model's decoder layers through get_language_model(), on every release.

speculators 0.3.0's worker (custom_worker.py, _setup_hidden_states_capture) gates on vLLM's
supports_eagle3() and then reads `model.model`. Both are wrong for some models, and which
ones changes with the vLLM release, so the fix is needed on every release:
- vLLM 0.11-0.17: supports_eagle3() is False for DeepseekV2ForCausalLM/DeepseekV3ForCausalLM
  (vllm/model_executor/models/deepseek_v2.py, no SupportsEagle3 base) and for
  KimiK25ForConditionalGeneration (from 0.15), whose decoder layers are captured like
  Llama's: speculators refuses them ("does not support hidden state extraction").
- vLLM 0.18 and later give DeepSeek and the vision-language wrappers SupportsEagle3, so the
  gate passes, and `model.model` then fails on a multimodal wrapper
  (AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute 'model'),
  whose text model is held behind SupportsMultiModal.get_language_model()
  (vllm/model_executor/models/interfaces.py, present in every release since 0.11;
  for Kimi-K2.5 the DeepseekV2Model in 0.15, a DeepseekV2ForCausalLM from 0.16).
The fact shown by `verify` is that interface method. The emitted code goes through
get_language_model() when the model has it, takes its inner .model when there is one, and
refuses only a model without decoder .layers.
"""

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import RemoveImportsVisitor

from patcher.fixes.cst_helpers import calls_to, replace_statements
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import method_defined

GATE = m.If(test=m.UnaryOperation(operator=m.Not(), expression=m.Call(func=m.Name("supports_eagle3"))))
# The gate it replaces, whole: ``if not supports_eagle3(model): raise ...`` and nothing else
# (LOOKUP rebinds ``model``: another argument, or other statements in the gate, would be lost).
EXACT_GATE = m.If(
    test=m.UnaryOperation(
        operator=m.Not(),
        expression=m.Call(func=m.Name("supports_eagle3"), args=[m.Arg(m.Name("model"), keyword=None, star="")]),
    ),
    body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Raise()])]),
    orelse=None,
)
BASE_MODEL = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Name("base_model"))], value=m.Attribute(m.Name("model"), m.Name("model")))]
)
LOOKUP = """\
# Not supports_eagle3(): its answer for DeepSeek-V2/V3 and Kimi-K2.5 changes across vLLM
# releases; their decoder layers are captured alike. Multimodal wrappers hold the text
# model behind get_language_model() and have no .model.
if hasattr(model, "get_language_model"):
    model = model.get_language_model()
"""
CHECK = """\
base_model = getattr(model, "model", model)
if not hasattr(base_model, "layers"):
    raise ValueError(
        f"Model {type(model).__name__} does not support hidden state extraction"
    )
"""


class LanguageModelLookup(PatchCodemod):
    DESCRIPTION = "supports_eagle3(model) gate -> get_language_model() + decoder layers check"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        has_gate, has_base = bool(m.findall(tree, GATE)), bool(m.findall(tree, BASE_MODEL))
        if not has_gate and calls_to(tree, "get_language_model"):
            self.already_satisfied("the language model is looked up without supports_eagle3()")
        if not (has_gate and has_base):
            self.refuse(None, "'if not supports_eagle3(model): raise ...' then 'base_model = model.model'")
        gates, bases = m.findall(tree, GATE), m.findall(tree, BASE_MODEL)
        for node in [*gates[1:], *bases[1:], *(g for g in gates[:1] if not m.matches(g, EXACT_GATE))]:
            self.refuse(
                node,
                "one 'if not supports_eagle3(model): raise ...' (nothing else in it) and one "
                "'base_model = model.model'",
            )
        RemoveImportsVisitor.remove_unused_import(
            self.context, "vllm.model_executor.models.interfaces", "supports_eagle3"
        )
        return replace_statements(tree, {GATE: LOOKUP, BASE_MODEL: CHECK})


PATCH = Patch(
    id="SP008",
    name="language-model-lookup",
    version=2,
    title="Capture setup: reach the text model via get_language_model() (DeepSeek-V2/V3, Kimi-K2.5), not supports_eagle3",
    risk="DeepSeek-V2/V3 and Kimi-K2.5 are refused, or a multimodal wrapper fails at capture setup",
    file="speculators/data_generation/custom_worker.py",
    codemod=LanguageModelLookup,
    facts=(
        VllmFact(
            summary="multimodal wrappers hold the text model behind get_language_model(), not .model",
            symbol="SupportsMultiModal.get_language_model",
            first_release="0.11.0",
            probe=method_defined("vllm/model_executor/models/interfaces.py", "SupportsMultiModal.get_language_model"),
        ),
    ),
    order=80,
    portable=True,
    checks=CheckHooks(symptoms=(r"does not support hidden state extraction|has no attribute 'model'",)),
)
