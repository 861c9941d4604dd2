"""SP010: attribute captured rows to requests in vLLM's batch order, step by step (worker).

speculators 0.3.0 concatenates every forward pass's captured rows and the generator slices
them by prompt length in submission order. vLLM lays out a step's tokens in its own batch
order (the model runner's ``input_batch.req_id_to_index``, vllm/v1/worker/gpu_input_batch.py)
and, with chunked prefill (on by default since 0.12), splits a long prompt across steps.
Measured on vLLM 0.16 with a 24-prompt batch over the token budget: 9 of 72 (request,
layer) captures wrong, no error.

The emitted worker code records, for every step the model runner executes, the scheduled
requests and their token counts sorted by the batch's own index (an instance-level wrapper
around ``model_runner.execute_model``; forwards outside a step, such as warm-up, are not
recorded and are cleared by ``_reset_capture``). ``_get_captured_states(per_request=True)``
splits each step's rows by that layout and returns ``{request_id: [tensor per layer]}``;
it raises when the number of forward passes and steps differ, or a step has fewer rows than
tokens scheduled. Called without the argument it returns what it always did, so this patch
alone changes no result: SP012 makes the generator ask per request (and needs this patch).
Works with 0.3.0's replacement forward and with SP009's hooks alike (same storage layout).

Model Runner V2 (vllm/v1/worker/gpu/model_runner.py, built by vllm/v1/worker/gpu_worker.py
when VLLM_USE_V2_MODEL_RUNNER=1 from 0.13, by default for some architectures from 0.22, and
the only runner from 0.34) keeps no input_batch. SP010 reads V1's batch only: its
``_track_batch_layout`` stops at capture setup with one line naming a runner it cannot read,
instead of an AttributeError at the first step. SP022, applied after it, replaces that
method with one that reads Model Runner V2's batch too, and SP027 recognises V2 by the batch
state it keeps, so with them capture works under both runners. ``verify``'s model-runner
line says which runner a job gets (patcher/checks/model_runner.py). The methods SP010
writes are in capture_methods.py, which SP022 reads to recognise them.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import statements
from patcher.fixes.patch import CheckHooks, Patch, PatchCodemod
from speculators_patch_codemods import capture_methods

CLASS = m.ClassDef(name=m.Name("HiddenStatesWorkerExtension"))
# self._captured_states = None
RESET_LINE = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(value=m.Name("self"), attr=m.Name("_captured_states")))])]
)
AFTER_RESET = {
    "_setup_hidden_states_capture": "self._batch_layouts = []\nself._track_batch_layout()\n",
    "_reset_capture": "self._batch_layouts = []\n",
}
NEW_RPC = m.FunctionDef(name=m.Name("_get_captured_states_per_request"))
GET_STATES = m.FunctionDef(name=m.Name("_get_captured_states"), params=m.Parameters(params=[m.Param(m.Name("self"))]))
DELEGATE = """\
# Per request id, split by each step's batch layout (batch order, chunked prefill).
if per_request:
    return self._get_captured_states_per_request()
"""

# Methods as they appear in the class: written out in capture_methods, which SP022 reads too.
METHODS = capture_methods.PER_REQUEST


def _method(name: str) -> m.FunctionDef:
    return m.FunctionDef(name=m.Name(name), body=m.IndentedBlock(body=[m.ZeroOrMore(), RESET_LINE, m.ZeroOrMore()]))


class PerRequestCapture(PatchCodemod):
    DESCRIPTION = "record each step's batch layout; _get_captured_states(per_request=True) splits by it"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(tree, NEW_RPC):
            self.already_satisfied("captures are split per request by the batch layout")
        shape = (
            "class HiddenStatesWorkerExtension whose _setup_hidden_states_capture and "
            "_reset_capture set 'self._captured_states = None', and def _get_captured_states(self)"
        )
        found = m.findall(tree, CLASS) and m.findall(tree, GET_STATES)
        if not found or not all(m.findall(tree, _method(n)) for n in AFTER_RESET):
            self.refuse(None, shape)
        # What it edits, once each: the class it extends, the method it gives a parameter, and
        # the one reset line of each method it adds a line after; names it adds, not yet taken.
        once = [CLASS, GET_STATES, *(m.FunctionDef(name=m.Name(n)) for n in AFTER_RESET)]
        for matcher in once:
            for extra in m.findall(tree, matcher)[1:]:
                self.refuse(extra, shape + ", each once")
        for name in AFTER_RESET:
            for extra in m.findall(m.findall(tree, m.FunctionDef(name=m.Name(name)))[0], RESET_LINE)[1:]:
                self.refuse(extra, f"one 'self._captured_states = None' in {name}")
        for taken in m.findall(
            tree,
            m.FunctionDef(name=m.Name("_track_batch_layout"))
            | m.Attribute(value=m.Name("self"), attr=m.Name("_batch_layouts")),
        ):
            self.refuse(taken, "no _track_batch_layout or self._batch_layouts before this patch adds them")
        return tree.visit(_Rewrite(tree.default_newline))


class _Rewrite(cst.CSTTransformer):
    def __init__(self, newline: str) -> None:
        super().__init__()
        self.functions: list[str] = []
        self.newline = newline  # docstrings of the added methods span lines: keep CRLF files CRLF

    def visit_FunctionDef(self, node):
        self.functions.append(node.name.value)

    def leave_FunctionDef(self, original, updated):
        self.functions.pop()
        if not m.matches(original, GET_STATES):
            return updated
        param = cst.Param(
            cst.Name("per_request"),
            default=cst.Name("False"),
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        )
        params = updated.params.with_changes(params=[*updated.params.params, param])
        body = list(updated.body.body)
        at = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else 0
        body[at:at] = statements(DELEGATE).nodes
        return updated.with_changes(params=params, body=updated.body.with_changes(body=body))

    def leave_SimpleStatementLine(self, original, updated):
        if len(self.functions) == 1 and self.functions[0] in AFTER_RESET and m.matches(updated, RESET_LINE):
            added = cst.parse_module(AFTER_RESET[self.functions[0]]).body
            return cst.FlattenSentinel([updated, *added])
        return updated

    def leave_ClassDef(self, original, updated):
        if not m.matches(updated, CLASS):
            return updated
        code = METHODS.replace("\n", self.newline)
        methods = cst.ensure_type(cst.parse_module(code).body[0], cst.ClassDef).body.body
        return updated.with_changes(body=updated.body.with_changes(body=[*updated.body.body, *methods]))


PATCH = Patch(
    id="SP010",
    name="per-request-capture",
    version=2,
    title="Worker: split captures per request by vLLM's batch order and chunked steps",
    risk="hidden states can be attributed to the wrong request",
    file="speculators/data_generation/custom_worker.py",
    codemod=PerRequestCapture,
    order=100,
    portable=True,
    checks=CheckHooks(runner_batch="v1", attribution=True),
    # SP012 (generator side) calls the RPC this patch adds: it declares requires=("SP010",).
)
