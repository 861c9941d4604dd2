"""SP008: find the decoder layers without vLLM's supports_eagle3() gate.

vLLM's supports_eagle3() (vllm/model_executor/models/interfaces.py) is False for
DeepseekV2ForCausalLM/DeepseekV3ForCausalLM (vllm/model_executor/models/deepseek_v2.py:
no SupportsEagle3 base) and for KimiK25ForConditionalGeneration, a vision-language
wrapper whose text model is reached through get_language_model() (0.15: the
DeepseekV2Model itself; 0.16: a DeepseekV2ForCausalLM). speculators 0.3.0 refuses these
models ("does not support hidden state extraction") although their decoder layers are
captured like Llama's. The emitted code goes through get_language_model() when the model
has it, takes its inner .model when there is one, and refuses only a model without
decoder .layers.
"""

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import RemoveImportsVisitor

from patcher.cst_helpers import calls_to, replace_statements
from patcher.patch import Patch, PatchCodemod, VllmFact
from patcher.probes import class_lacks_base

GATE = m.If(test=m.UnaryOperation(operator=m.Not(), expression=m.Call(func=m.Name("supports_eagle3"))))
BASE_MODEL = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Name("base_model"))], value=m.Attribute(m.Name("model"), m.Name("model")))]
)
LOOKUP = '''\
# Not supports_eagle3(): vLLM says False for DeepSeek-V2/V3 and Kimi-K2.5, whose
# decoder layers are captured the same way. Multimodal wrappers hold the text model.
if hasattr(model, "get_language_model"):
    model = model.get_language_model()
'''
CHECK = '''\
base_model = getattr(model, "model", model)
if not hasattr(base_model, "layers"):
    raise ValueError(
        f"Model {type(model).__name__} does not support hidden state extraction"
    )
'''


class LanguageModelLookup(PatchCodemod):
    DESCRIPTION = "supports_eagle3(model) gate -> get_language_model() + decoder layers check"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        has_gate, has_base = bool(m.findall(tree, GATE)), bool(m.findall(tree, BASE_MODEL))
        if not has_gate and calls_to(tree, "get_language_model"):
            self.already_satisfied("the language model is looked up without supports_eagle3()")
        if not (has_gate and has_base):
            self.refuse(None, "'if not supports_eagle3(model): raise ...' then 'base_model = model.model'")
        RemoveImportsVisitor.remove_unused_import(self.context, "vllm.model_executor.models.interfaces", "supports_eagle3")
        return replace_statements(tree, {GATE: LOOKUP, BASE_MODEL: CHECK})


PATCH = Patch(
    id="SP008",
    name="language-model-lookup",
    version=1,
    title="Capture setup: reach DeepSeek-V2/V3 and Kimi-K2.5 decoder layers (not supports_eagle3)",
    file="speculators/data_generation/custom_worker.py",
    codemod=LanguageModelLookup,
    facts=(
        VllmFact(
            summary="DeepseekV2ForCausalLM does not implement SupportsEagle3",
            modules=("vllm/model_executor/models/deepseek_v2.py",),
            symbol="DeepseekV2ForCausalLM",
            first_release="0.11.0",
            probe=class_lacks_base("vllm/model_executor/models/deepseek_v2.py", "DeepseekV2ForCausalLM", "SupportsEagle3"),
        ),
    ),
    order=80,
    portable=True,
)
