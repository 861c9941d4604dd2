"""SP007: embed tokens with embed_input_ids() where the model has it.

vLLM >= 0.12 renamed the inner models' get_input_embeddings() to embed_input_ids()
(e.g. LlamaModel in vllm/model_executor/models/llama.py, DeepseekV2Model). speculators
0.3.0's replacement forward calls get_input_embeddings() (AttributeError). The emitted
form picks whichever method the model has, so it serves every release.
Once SP009 replaces the forward with layer hooks, nothing embeds tokens: satisfied.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import calls_to
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod, VllmFact
from patcher.fixes.probes import method_defined

OLD_CALL = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("get_input_embeddings")))
EITHER = '(self.embed_input_ids if hasattr(self, "embed_input_ids") else self.get_input_embeddings)'
FORWARD = m.FunctionDef(m.Name("_patched_forward"))
ONE_POSITIONAL = m.Call(args=[m.Arg(keyword=None, star="")])
FIXED = m.Call(func=m.Name("hasattr"), args=[m.Arg(m.Name("self")), m.Arg(m.SimpleString('"embed_input_ids"'))])


class EmbedInputIds(PatchCodemod):
    DESCRIPTION = "self.get_input_embeddings(ids) -> embed_input_ids when the model has it"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(tree, FIXED):
            self.already_satisfied("the forward already prefers embed_input_ids()")
        if not m.findall(tree, OLD_CALL):
            if calls_to(tree, "embed_input_ids") or not m.findall(tree, FORWARD):
                self.already_satisfied("no replacement forward calls get_input_embeddings()")
            self.refuse(None, "self.get_input_embeddings(input_ids) in _patched_forward")
        # The rewrite keeps the arguments and swaps the method: only the call the forward makes,
        # with the token ids alone (what both methods take), is that call.
        in_forward = {id(c) for f in m.findall(tree, FORWARD) for c in m.findall(f, OLD_CALL)}
        for call in m.findall(tree, OLD_CALL):
            if id(call) not in in_forward or not m.matches(call, ONE_POSITIONAL):
                self.refuse(call, "self.get_input_embeddings(input_ids) in _patched_forward, one positional argument")
        return tree.visit(_Rewrite())


class _Rewrite(cst.CSTTransformer):
    def leave_Call(self, original, updated):
        if m.matches(updated, OLD_CALL):
            return updated.with_changes(func=cst.parse_expression(EITHER))
        return updated


PATCH = Patch(
    id="SP007",
    name="embed-input-ids",
    version=1,
    title="Replacement forward: use embed_input_ids() (renamed from get_input_embeddings)",
    risk="the replacement forward fails: get_input_embeddings() was renamed embed_input_ids()",
    file="speculators/data_generation/custom_worker.py",
    codemod=EmbedInputIds,
    facts=(
        VllmFact(
            summary="LlamaModel embeds with embed_input_ids (get_input_embeddings renamed)",
            symbol="LlamaModel.embed_input_ids",
            first_release="0.12.0",
            probe=method_defined("vllm/model_executor/models/llama.py", "LlamaModel.embed_input_ids"),
        ),
    ),
    order=70,
    portable=True,
    checks=CheckHooks(symptoms=(r"get_input_embeddings",)),
)
